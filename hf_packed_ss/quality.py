"""Drafting quality of a checkpoint: tokens per NFE on real prompts, counted only on non-degenerate output.

A model that loops drafts itself trivially, so every figure comes with the two checks that rule that
out: how many answers end with EOS within the token budget, and the most times any 6-gram repeats.
Speed (wall time) is the benchmark's job; this module counts calls and tokens only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from .bench.suites import GSM8K_TEST, SAMPLE, question_ids, read_jsonl


def gsm8k_questions(file: Path | None = None, limit: int = 10) -> list[str]:
    """The first `limit` GSM8K test questions (bare; `question_ids` puts them in each model's format), from the
    shared test split, else from the bundled sample (its first 20 questions) when the repository stands alone."""
    file = file or (GSM8K_TEST if GSM8K_TEST.is_file() else SAMPLE)
    return [row["question"] for row in read_jsonl(Path(file))[:limit]]


def max_ngram_repeats(tokens: list[int], n: int = 6) -> int:
    """How many times the most frequent n-gram occurs (0 for sequences shorter than n)."""
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return max(grams.values(), default=0)


def measure(model, tokenizer, questions: list[str], schedules: list[str], width: int | None = None,
            max_new_tokens: int = 128, **generate_kwargs) -> dict:
    """Greedy-decode every question (in the model's prompt format) with every schedule; per schedule:
    tokens/NFE (total tokens over total NFE), EOS rate, worst 6-gram repeat count, and how many outputs
    differ from the first schedule."""
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    report: dict = {}
    reference: list[list[int]] = []
    for mode in schedules:
        tokens = nfe = ended = differ = 0
        repeats = []
        for i, question in enumerate(questions):
            ids = question_ids(tokenizer, question).to(model.device)
            with torch.no_grad():
                out = model.generate(ids, assistant_mode=mode, speculative_width=width, max_new_tokens=max_new_tokens,
                                     do_sample=False, return_dict_in_generate=True, **generate_kwargs)
            new = out.sequences[0, ids.shape[1]:].tolist()
            tokens, nfe = tokens + out.decoding_stats.new_tokens, nfe + out.decoding_stats.nfe
            ended += bool(new) and new[-1] in eos
            repeats.append(max_ngram_repeats(new))
            if mode == schedules[0]:
                reference.append(new)
            else:
                differ += new != reference[i]
        report[mode] = {"tokens_per_nfe": tokens / max(nfe, 1), "tokens": tokens, "nfe": nfe, "ended_with_eos": ended,
                        "max_6gram_repeats": max(repeats), "differs_from_" + schedules[0]: differ}
    return report


START, END = "<!-- quality:start -->", "<!-- quality:end -->"


def table(report: dict, width: int, reference: str) -> str:
    lines = [f"| schedule | W | tokens/NFE | ended with EOS | max 6-gram repeats | differs from {reference} |",
             "|---|---|---|---|---|---|"]
    for mode, r in report.items():
        w = 0 if mode == "ar" else width
        lines.append(f"| {mode} | {w} | {r['tokens_per_nfe']:.2f} | {r['ended_with_eos']}/{r['n']} | "
                     f"{r['max_6gram_repeats']} | {r.get('differs_from_' + reference, '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m hf_packed_ss.quality NAME [--card FILE]`: measure and (optionally) rewrite the card's block."""
    import argparse
    import shlex
    import sys

    from .cli import load_model
    from .generation import default_width

    p = argparse.ArgumentParser(prog="python -m hf_packed_ss.quality", description=__doc__.splitlines()[0])
    p.add_argument("model", help="bundled checkpoint name or local folder")
    p.add_argument("--schedules", nargs="+", default=["ar", "linear_ss", "quadratic_ss", "packed_ss"])
    p.add_argument("--width", type=int, default=None, help="default: the checkpoint's generation config")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--card", type=Path, default=None, help=f"rewrite the block between {START} and {END}")
    args = p.parse_args(argv)
    model, tokenizer = load_model(args.model, torch.float32)
    width = args.width or model.generation_config.speculative_width or default_width(model.config, "packed_ss")
    questions = gsm8k_questions(limit=args.limit)
    report = measure(model, tokenizer, questions, args.schedules, width, args.max_new_tokens)
    for r in report.values():
        r["n"] = len(questions)
    text = "\n".join([
        f"{len(questions)} GSM8K test questions, {args.max_new_tokens} new tokens, greedy, float32, "
        f"Packed-SS at the checkpoint's width (W = {width}):", "", "```bash",
        "python -m hf_packed_ss.quality " + shlex.join(a for a in (argv if argv is not None else sys.argv[1:])
                                                       if a != str(args.card) and a != "--card"),
        "```", "", table(report, width, args.schedules[0])])
    print(text)
    if args.card is not None:
        card = args.card.read_text()
        if START not in card or END not in card:
            raise SystemExit(f"{args.card} has no {START} ... {END} block.")
        args.card.write_text(card[: card.index(START)] + f"{START}\n{text}\n{END}" + card[card.index(END) + len(END):])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
