"""The auto chooser judged without the machine's noise: real decodes (so real acceptance, with its dependence on
the width and its correlation between calls), timed by a virtual clock that charges every call a cost from a
fixed table of milliseconds by rows. Throughput = tokens / virtual time for AR, Packed-SS at fixed widths and
`auto`; `auto / best` then measures the quality of the choice alone (no timing noise, no chooser overhead).

    python docs/experiments/auto_sim.py tiny-nemotron-gsm8k --table cpu --noise 0.05 \
        --configs "" "margin=1.03" "fade=1.0"

`--noise` adds Gaussian relative noise and 3% of calls at twice the cost to what the chooser observes (never to
the throughput it is judged by), `--drift` a machine speed that changes now and then; `--configs` sets fields of
`engine.policy.AutoPolicy` (comma-separated NAME=VALUE), one decode set per config and seed.
Research tool, not a benchmark: speed claims come from `hf-packed-ss bench`.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

import numpy as np
import torch

from hf_packed_ss.engine import width
from hf_packed_ss.engine.policy import AUTO_POLICY
from hf_packed_ss.front.measured import decoder_of, forget, measured_for
from hf_packed_ss.tools.bench.suites import load_suite
from hf_packed_ss.tools.loading import encode, load_model

TABLES = {  # (AR calls, drafting calls): ms by rows
    "cpu": ({1: 1.49}, {3: 1.66, 6: 2.05, 10: 2.2, 14: 2.35, 18: 2.6, 31: 2.84, 64: 3.76}),  # tiny, 2-core CPU
    "flat": ({1: 1.0}, {3: 1.05, 18: 1.1, 64: 1.3}),  # a GPU-like curve: rows nearly free
    "steep": ({1: 1.0}, {3: 1.5, 10: 2.0, 18: 2.6, 64: 5.0}),
}


def cost(table: dict[int, float], rows: int) -> float:
    xs = sorted(table)
    ys = [table[x] for x in xs]
    if len(xs) == 1 or rows <= xs[-1]:
        return float(np.interp(rows, xs, ys))
    return ys[-1] + (rows - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])


class Clock:
    """Stands in for `time` in `engine.width`: the chooser reads the virtual time."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--table", choices=sorted(TABLES), default="cpu")
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--widths", default="2,3,4,5,6,8,10,15")
    p.add_argument("--drift", type=float, default=0.0,
                   help="the machine's speed drifts: every ~200 calls (exponential) the observed times are scaled "
                        "by a new factor exp(N(0, drift)) (all row counts alike)")
    p.add_argument("--configs", nargs="*", default=[""])
    args = p.parse_args()
    torch.set_num_threads(1)
    ar_table, draft_table = TABLES[args.table]
    clock, rng = Clock(), random.Random(0)
    width.time = clock
    original = width.WidthChooser.choose

    speed = [1.0]

    def choose(self, last_rows):
        if self.tic is not None and last_rows is not None:
            seconds = cost(ar_table if self.arm == 0 else draft_table, last_rows) * 1e-3
            spike = 2.0 if args.noise and rng.random() < 0.03 else 1.0
            if args.drift and rng.random() < 1 / 200:
                speed[0] = float(np.exp(rng.gauss(0, args.drift)))
            clock.now += seconds * spike * speed[0] * (1 + args.noise * rng.gauss(0, 1))
        return original(self, last_rows)

    width.WidthChooser.choose = choose
    model, tokenizer = load_model(args.model, torch.float32)
    inputs = [encode(tokenizer, prompt, None) for prompt in load_suite("gsm8k", None, args.limit, None)]

    def run(**kwargs) -> tuple[float, list[int]]:
        tokens, ms, chosen = 0, 0.0, []
        for ids in inputs:
            stats = model.generate(ids, max_new_tokens=128, return_dict_in_generate=True, **kwargs).decoding_stats
            tokens += stats.new_tokens - 1  # the prompt call's token: the same for every schedule
            ms += sum(cost(ar_table if mode == "ar" else draft_table, rows)
                      for rows, mode in zip(stats.rows_per_call[1:], stats.schedule_per_iteration[1:], strict=False))
            chosen += stats.width_per_iteration[1:]
        return tokens / ms, chosen

    fixed = {0: run(assistant_mode="ar")[0]}
    for w in map(int, args.widths.split(",")):
        fixed[w] = run(assistant_mode="packed_ss", speculative_width=w)[0]
    best = max(fixed, key=fixed.get)
    print("fixed tokens/ms", {w: round(t, 4) for w, t in fixed.items()}, "best", best)
    for config in args.configs:
        items = [item.split("=") for item in filter(None, config.split(","))]
        policy = replace(AUTO_POLICY, **{name: type(getattr(AUTO_POLICY, name))(float(v)) for name, v in items})
        scores = []
        for seed in range(args.seeds):
            rng.seed(seed)
            speed[0] = 1.0
            forget()
            measured_for(decoder_of(model), policy=policy)  # the decodes below learn under this policy
            model.generate(inputs[0], max_new_tokens=128, assistant_mode="auto")  # the bench's warm-up
            throughput, chosen = run(assistant_mode="auto")
            scores.append(throughput / fixed[best])
            arms, counts = np.unique(chosen, return_counts=True)
            print(f"{config or 'as shipped'} seed {seed}: auto/best {scores[-1]:.4f}, chose",
                  dict(zip(arms.tolist(), (counts / counts.sum()).round(2).tolist(), strict=True)), flush=True)
        print(f"{config or 'as shipped'}: mean {np.mean(scores):.4f}, worst {min(scores):.4f}")


if __name__ == "__main__":
    main()
