#!/usr/bin/env bash
# Usage: docs/results/bf16.sh [gsm8k|humaneval|code:held_out ...] -- the fast CPU path against every stock configuration, on
# SmolLM2-135M + the drafter: our AR and Packed-SS (bfloat16, eager and static cache + torch.compile with frozen
# weights) against stock generate in float32 eager, bfloat16 eager and bfloat16 static cache + compile (the same
# inductor options), interleaved per prompt in one run, one thread; ratios to the fastest stock variant with
# bootstrap intervals. 10 GSM8K test questions, 10 HumanEval problems and 10 held-out standard-library code stubs
# (LIMIT=N for N), 128 new tokens; about 20 minutes a suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
for suite in "${@:-gsm8k humaneval code:held_out}"; do
    for s in $suite; do
        hf-packed-ss bench --model smollm2-135m-drafter --suite "$s" --limit "${LIMIT:-10}" --max-new-tokens 128 --dtype bfloat16 \
            --compile --schedules ar packed_ss stock --stock-dtypes float32 --baseline best-stock \
            --out "docs/results/bf16-smollm2-135m-drafter-$(echo "$s" | tr ':_' '--')" --no-progress
    done
done
