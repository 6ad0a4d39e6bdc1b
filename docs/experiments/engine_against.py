"""Is this engine slower than an older one end to end? Whole greedy decodes of the tiny checkpoints, both engines.

`hf-packed-ss overhead --against` compares the decoder's own time per call; this compares what a user waits for
(prefill, model calls and bookkeeping), so a change to how the model is called (e.g. issue 35's plain causal AR
calls) counts too. Each repeat runs every engine in a fresh process of its own, in rotating order; each process
loads the checkpoints, warms every schedule up once, then times `generate` over the bundled sample questions
(float32, one thread). Reported: the median repeat's tokens/s per engine and their ratio, with the range.

    git worktree add /tmp/old b9f17b8     # the engine before issue 35 (the same bundled tiny weights)
    OMP_NUM_THREADS=1 python docs/experiments/engine_against.py /tmp/old --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
from hf_packed_ss import bundled
from hf_packed_ss.tools.bench.suites import SAMPLE, read_jsonl
torch.set_num_threads(1)
models, schedules, n, new = json.loads(sys.argv[1])
questions = [r["question"] for r in read_jsonl(SAMPLE)][:n]
out = {}
for name in models:
    model, tokenizer = bundled.load(name)
    prompts = [tokenizer(f"Question: {q}\nAnswer:", return_tensors="pt").input_ids for q in questions]
    for mode in schedules:
        model.generate(prompts[0], assistant_mode=mode, max_new_tokens=new)  # warm-up
        tokens, tic = 0, time.perf_counter()
        for ids in prompts:
            tokens += model.generate(ids, assistant_mode=mode, max_new_tokens=new).shape[1] - ids.shape[1]
        out[f"{name} {mode}"] = tokens / (time.perf_counter() - tic)
print(json.dumps(out))
"""


def one_repeat(tree: Path, job: list) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], env=env, cwd=tree, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"The engine in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("other", type=Path, help="the other source checkout")
    p.add_argument("--models", nargs="+", default=["tiny-nemotron-gsm8k", "tiny-setdlm-gsm8k"])
    p.add_argument("--schedules", nargs="+", default=["ar", "linear_ss", "quadratic_ss", "packed_ss"])
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    trees = {"this": Path(__file__).resolve().parents[2], "other": args.other.resolve()}
    job = [args.models, args.schedules, args.prompts, args.max_new_tokens]
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name in list(trees)[r % 2:] + list(trees)[: r % 2]:
            runs[name].append(one_repeat(trees[name], job))
    print(f"| checkpoint, schedule | this engine tokens/s | {args.other} tokens/s | this / other, median [range] |")
    print("|---|---|---|---|")
    for key in runs["this"][0]:
        a = [run[key] for run in runs["this"]]
        b = [run[key] for run in runs["other"]]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        print(f"| {key} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")


if __name__ == "__main__":
    main()
