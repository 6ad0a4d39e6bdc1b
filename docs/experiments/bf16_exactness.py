"""Which exactness contract holds in bfloat16: each schedule's greedy tokens against our AR mode and stock `generate`.

In float32/float64 every exact schedule is token-identical to AR (the test suite). In bfloat16 a call of many rows
may round differently from a one-row call, so a verifier row can see logits a rounding away from AR's. This
decodes held-out prompts (the last GSM8K test questions, `tools/bench/data/gsm8k_heldout.jsonl`, and the last
HumanEval problems) with every schedule and stock `generate`, eager and/or compiled (static cache +
`torch.compile`), and for every response that leaves our AR's tokens reports the first differing step and the AR
logits' top-2 margin there, in logits and in bfloat16 ulps at that magnitude: a divergence at a margin of a few
ulps is rounding, one at a wide margin a bug. Writes a JSON file and prints a table.

    python docs/experiments/bf16_exactness.py --limit 8 --max-new-tokens 96 --out docs/results/bf16-exactness.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from hf_packed_ss import bundled
from hf_packed_ss.tools.bench.measure import Settings
from hf_packed_ss.tools.bench.suites import load_suite
from hf_packed_ss.tools.loading import encode
from hf_packed_ss.tools.quality import HELD_OUT_FILE

SCHEDULES = ["ar", "linear_ss", "quadratic_ss", "packed_ss", "hybrid_ss"]


def margin(model, ids: torch.Tensor, prefix: list[int]) -> tuple[float, float]:
    """The AR logits' top-2 gap after `prefix` (one plain forward, as stock computes a prompt), in logits and in
    ulps of the model's dtype at the top logit's magnitude."""
    full = torch.cat([ids[0], torch.tensor(prefix, dtype=ids.dtype)])[None]
    with torch.inference_mode():
        top = model(input_ids=full, logits_to_keep=1).logits[0, -1].float().topk(2).values
    gap = float(top[0] - top[1])
    ulp = torch.finfo(model.dtype).eps * 2.0 ** math.floor(math.log2(max(abs(float(top[0])), 1e-30)))
    return gap, gap / ulp


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-drafter")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--limit", type=int, default=8, help="prompts per suite (the last ones)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=("eager", "compiled"))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = bundled.load(args.model, getattr(torch, args.dtype))
    prompts = (load_suite("gsm8k", str(HELD_OUT_FILE))[-args.limit:]
               + load_suite("humaneval")[-args.limit:])
    rows = []
    for mode in args.modes:
        extra = {} if mode == "eager" else Settings(args.max_new_tokens).compiled("stock")  # as the bench compiles
        for prompt in prompts:
            ids = encode(tokenizer, prompt, None)
            n = ids.shape[1]

            def tokens(assistant_mode, ids=ids, n=n, extra=extra):
                out = model.generate(ids, assistant_mode=assistant_mode, max_new_tokens=args.max_new_tokens,
                                     do_sample=False, **extra)  # ours freezes its graphs; stock's runs unfrozen
                return out[0, n:].tolist()

            stock, ar = tokens(None), tokens("ar")
            for schedule in SCHEDULES:
                ours = ar if schedule == "ar" else tokens(schedule)
                row = {"mode": mode, "prompt": prompt.id, "schedule": schedule, "equals_ar": ours == ar,
                       "equals_stock": ours == stock}
                for name, ref in (("ar", ar), ("stock", stock)):
                    step = first_difference(ref, ours)
                    if step is not None and step < min(len(ref), len(ours)):
                        row[f"first_difference_from_{name}"] = step
                        row[f"margin_vs_{name}"], row[f"margin_ulps_vs_{name}"] = margin(model, ids, ref[:step])
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.model} in {args.dtype}, {len(prompts)} held-out prompts, {args.max_new_tokens} new tokens")
    print(f"{'mode':<9}{'schedule':<14}{'= ar':>6}{'= stock':>9}  first differences from ar (step, top-2 margin ulps)")
    for mode in args.modes:
        for schedule in SCHEDULES:
            mine = [r for r in rows if r["mode"] == mode and r["schedule"] == schedule]
            diffs = [(r["first_difference_from_ar"], round(r["margin_ulps_vs_ar"], 1)) for r in mine
                     if "first_difference_from_ar" in r]
            print(f"{mode:<9}{schedule:<14}{sum(r['equals_ar'] for r in mine):>3}/{len(mine):<2}"
                  f"{sum(r['equals_stock'] for r in mine):>6}/{len(mine):<2}  {diffs}")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "dtype": args.dtype,
                                              "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
