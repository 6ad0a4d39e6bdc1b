"""``hf-packed-ss``: the command-line entry point.

``hf-packed-ss train`` trains a model of either format (`train.py`). ``hf-packed-ss bench`` measures every
schedule on a prompt suite and writes a report; ``hf-packed-ss probe`` fits the tau + delta * n call cost
(`bench/`). ``hf-packed-ss run`` decodes one
prompt with every schedule on one loaded model and prints the text
and a table of tokens, NFE, tokens/NFE and wall time per schedule. Timings here are single runs for
orientation; speed claims belong to the benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from .generation import MODES
from .schedules import SCHEDULES

QUESTION = "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"
DRAFTER, TINY = "smollm2-135m-drafter", "tiny-nemotron-gsm8k"


def default_model() -> str:
    """The SmolLM2 drafter when its base model is installed, else the tiny trained checkpoint (with a hint)."""
    from . import bundled, smollm2

    if smollm2.installed() and DRAFTER in bundled.names():
        return DRAFTER
    print(f"(using {TINY}; for the SmolLM2-135M drafter: {smollm2.HINT})", file=sys.stderr)
    return TINY


def encode_prompt(tokenizer, prompt: str | None) -> torch.Tensor:
    """`prompt` as given, or the default question in the model's own prompt format."""
    from .bench.suites import question_ids

    return question_ids(tokenizer, QUESTION) if prompt is None else tokenizer(prompt, return_tensors="pt").input_ids


def load_model(name_or_path: str, dtype: torch.dtype):
    """A bundled checkpoint name or a local folder; never the network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import bundled

    if name_or_path in bundled.names():
        return bundled.load(name_or_path, dtype)
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise SystemExit(f"--model {name_or_path!r} is neither a bundled checkpoint {bundled.names()} "
                         "nor a local folder.")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _table(rows: list[dict]) -> str:
    head = f"{'schedule':<14}{'tokens':>8}{'NFE':>6}{'tokens/NFE':>12}{'wall s':>9}{'same as ar':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['schedule']:<14}{r['tokens']:>8}{r['nfe']:>6}{r['tokens_per_nfe']:>12.2f}"
                     f"{r['wall_s']:>9.3f}{r['same']:>12}")
    return "\n".join(lines)


def run_command(args: argparse.Namespace) -> int:
    import hf_packed_ss  # noqa: F401

    model, tokenizer = load_model(args.model or default_model(), getattr(torch, args.dtype))
    ids = encode_prompt(tokenizer, args.prompt)
    rows, reference = [], None
    for mode in args.schedules:
        out = model.generate(ids, assistant_mode=mode, speculative_width=args.width,
                             max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:]
        reference = new if mode == "ar" else reference
        stats = out.decoding_stats
        same = "-" if reference is None or mode == "ar" else ("yes" if torch.equal(new, reference) else "NO")
        print(f"[{mode}] {tokenizer.decode(new)!r}")
        rows.append(dict(schedule=mode, tokens=stats.new_tokens, nfe=stats.nfe, tokens_per_nfe=stats.tokens_per_nfe,
                         wall_s=stats.decoder_time_s, same=same))
    print()
    print(_table(rows))
    return 0 if all(r["same"] != "NO" for r in rows) else 1


# Subcommands with their own parser: name -> (module, help).
DELEGATES = {
    "train": ("train", "train a model of either format, or the SmolLM2 drafter"),
    "bench": ("bench", "benchmark the schedules and peer baselines"),
    "probe": ("bench.probe", "fit the tau + delta * n call cost and predict the fastest schedule"),
    "publish": ("publish", "assemble (and upload) the Hub folder of a bundled checkpoint"),
    "demo": ("demo", "start the Gradio app in which the schedules race side by side (pip install -e '.[demo]')"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in DELEGATES:
        module = importlib.import_module(f".{DELEGATES[argv[0]][0]}", __package__)
        return module.main(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="hf-packed-ss", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, text) in DELEGATES.items():
        sub.add_parser(name, help=f"{text} (see `hf-packed-ss {name} --help`)")
    run = sub.add_parser("run", help="decode one prompt with every schedule and compare")
    run.add_argument("--model", default=None, help=f"bundled checkpoint name or local folder (default: {DRAFTER} "
                     f"when the SmolLM2 base is installed, else {TINY})")
    run.add_argument("--prompt", default=None, help="raw prompt text (default: a GSM8K question, in the chat "
                     "template when the tokenizer has one)")
    run.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=MODES)
    run.add_argument("--width", type=int, default=None, help="speculative width W (default: the model's)")
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    return {"run": run_command}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
