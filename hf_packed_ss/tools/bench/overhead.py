"""``hf-packed-ss overhead``: the decoder's own time per call (everything but the model forward) against the
context length.

A decoder whose bookkeeping scans or copies the whole sequence every call gets slower per call as the context
grows, even when the model does not; the Runner keeps P in one buffer and hands out views, and the layouts keep
the mask in one buffer, so this figure should stay flat. Each context is a prefix of real text (the bundled
GSM8K questions, MIT licence, joined) cut to that many tokens; every schedule decodes the same number of new
tokens after it. As everywhere in the benchmark: a warm-up, repeats interleaved in rotating order, the median
repeat and the range of the repeats, and the ratio of the longest context to the shortest.

``--against DIR`` measures another source checkout's engine too (e.g. ``git worktree add ../old <commit>``):
each repeat runs both engines, in rotating order, each in a fresh process of its own with one repeat, and the
table puts them side by side with the ratio of this engine's time to the other's.

``--evict-mb N`` is the control for the one thing that still grows on a small model: the CPU caches. A forward
over a longer context touches more memory (its KV cache), so the decoder's own code runs after it with colder
caches and takes a few microseconds more, although it does the same work. With the flag every forward ends
(inside the timed model call) by writing N MiB, so every call's decoder work starts equally cold: what still
grows then is work the decoder does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .repeats import spread
from .statistics import rotation
from .suites import SAMPLE, read_jsonl


def context_ids(tokenizer, length: int) -> torch.Tensor:
    """`length` tokens of GSM8K question text (repeated if the sample is too short)."""
    text = "\n\n".join(row["question"] for row in read_jsonl(SAMPLE))
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    ids = ids.repeat(-(-length // ids.numel()))
    return ids[:length][None]


def non_model_ms_per_call(model, ids: torch.Tensor, mode: str, max_new_tokens: int, **options) -> float:
    out = model.generate(ids, assistant_mode=mode, max_new_tokens=max_new_tokens, return_dict_in_generate=True,
                         eos_token_id=None, **options)
    stats = out.decoding_stats
    return 1e3 * stats.non_model_time_s / stats.nfe


def measure(model, tokenizer, contexts: list[int], schedules: list[str], max_new_tokens: int, repeats: int,
            **options) -> dict:
    """{schedule: {context: [non-model ms per call, one per repeat]}} after one untimed warm-up per cell (so
    that no cell pays the process's first allocations at its size, which a long-running server never sees)."""
    prompts = {n: context_ids(tokenizer, n) for n in contexts}
    for mode in schedules:
        for n in contexts:
            non_model_ms_per_call(model, prompts[n], mode, 8, **options)
    times = {mode: {n: [] for n in contexts} for mode in schedules}
    cells = [(mode, n) for mode in schedules for n in contexts]
    for r in range(repeats):
        for mode, n in rotation(cells, r):
            times[mode][n].append(non_model_ms_per_call(model, prompts[n], mode, max_new_tokens, **options))
    return times


def table(times: dict, contexts: list[int]) -> str:
    lo, hi = contexts[0], contexts[-1]
    head = "| schedule | " + " | ".join(f"ms/call at {n} [range]" for n in contexts) + f" | {hi} / {lo} |"
    lines = [head, "|---" * (len(contexts) + 2) + "|"]
    for mode, by in times.items():
        cells = [spread(by[n]) for n in contexts]
        ratio = cells[-1].value / cells[0].value
        lines.append(f"| {mode} | " + " | ".join(f"{c.value:.3f} [{c.low:.3f}, {c.high:.3f}]" for c in cells)
                     + f" | {ratio:.2f} |")
    return "\n".join(lines)


def one_repeat(tree: Path, args, contexts: list[int]) -> dict:
    """One repeat of every cell, measured by the engine of the source checkout `tree` in a process of its own.
    Returns {schedule: {context: [ms]}}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        command = [sys.executable, "-m", "hf_packed_ss.tools.bench.overhead", "--model", args.model, "--repeats", "1",
                   "--contexts", *map(str, contexts), "--schedules", *args.schedules, "--threads", str(args.threads),
                   "--max-new-tokens", str(args.max_new_tokens), "--json", str(out)]
        if args.evict_mb:
            command += ["--evict-mb", str(args.evict_mb)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
        if done.returncode:
            raise SystemExit(f"The engine in {tree} failed:\n{done.stderr[-2000:]}")
        times = json.loads(out.read_text())["times"]
    return {mode: {int(n): t for n, t in by.items()} for mode, by in times.items()}


def against(args, contexts: list[int], other: Path) -> str:
    """Both engines, repeats interleaved in rotating order; a table of this one's and the other's ms/call."""
    ours = Path(__file__).resolve().parents[3]
    trees = {"ours": ours, "other": other.resolve()}
    times = {name: {mode: {n: [] for n in contexts} for mode in args.schedules} for name in trees}
    for r in range(args.repeats):
        for name in rotation(list(trees), r):
            for mode, by in one_repeat(trees[name], args, contexts).items():
                for n, t in by.items():
                    times[name][mode][n] += t
    lines = [f"| schedule | context | this engine ms/call [range] | {other} ms/call [range] | this / other |",
             "|---|---|---|---|---|"]
    for mode in args.schedules:
        for n in contexts:
            a, b = spread(times["ours"][mode][n]), spread(times["other"][mode][n])
            lines.append(f"| {mode} | {n} | {a.value:.3f} [{a.low:.3f}, {a.high:.3f}] | {b.value:.3f} "
                         f"[{b.low:.3f}, {b.high:.3f}] | {a.value / b.value:.2f} |")
    growth = {name: table(by, contexts) for name, by in times.items()}
    return "\n".join(lines) + "\n\nThis engine:\n\n" + growth["ours"] + f"\n\n{other}:\n\n" + growth["other"]


def evict_after_forward(model, mib: int) -> None:
    """Make every forward of `model` end by writing `mib` MiB (counted as model time: the hook runs inside the
    model's call), so the decoder code after it starts with caches as cold at every context length."""
    sweep = torch.zeros(mib * 2**18)

    def write(module, args, output) -> None:  # returns None: the forward's output stays as it is
        sweep.add_(1)

    model.register_forward_hook(write)


def main(argv: list[str] | None = None) -> int:
    from ..loading import load_model

    parser = argparse.ArgumentParser(prog="hf-packed-ss overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-nemotron-gsm8k", help="bundled checkpoint name or local folder")
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 1024], help="prompt lengths in tokens")
    parser.add_argument("--schedules", nargs="+", default=["ar", "linear_ss", "quadratic_ss", "packed_ss"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repetition-penalty", type=float, default=None,
                        help="also run a logits processor that reads the whole sequence (e.g. 1.1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--evict-mb", type=int, default=0,
                        help="end every forward by writing this many MiB, so each call's decoder work starts with "
                             "equally cold CPU caches at every context (e.g. 16; 0 = off)")
    parser.add_argument("--json", default=None, help="also write every repeat to this file")
    parser.add_argument("--against", type=Path, default=None,
                        help="also measure the engine of this source checkout, side by side (each repeat in a fresh "
                             "process per engine, rotating order)")
    args = parser.parse_args(argv)
    contexts = sorted(args.contexts)
    if args.against is not None:
        print(f"Non-model decoder time per call, {args.model}, {args.max_new_tokens} new tokens, median of "
              f"{args.repeats} repeats per engine:\n")
        print(against(args, contexts, args.against))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, torch.float32)
    if args.evict_mb:
        evict_after_forward(model, args.evict_mb)
    options = {} if args.repetition_penalty is None else {"repetition_penalty": args.repetition_penalty}
    with torch.inference_mode():
        times = measure(model, tokenizer, contexts, args.schedules, args.max_new_tokens, args.repeats, **options)
    evict = f", {args.evict_mb} MiB written after every forward" if args.evict_mb else ""
    print(f"Non-model decoder time per call, {args.model}, {args.max_new_tokens} new tokens, median of "
          f"{args.repeats} repeats{', ' + str(options) if options else ''}{evict}:\n")
    print(table(times, contexts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "options": options, "times": times}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
