#!/usr/bin/env bash
# Usage: docs/results/compiled.sh -- every bundled checkpoint eager and compiled side by side (bench --compile: a
# static cache and torch.compile for every schedule, stock generate and prompt lookup; GSM8K test prompts), one
# checkpoint at a time with nothing else running (about 40 minutes on 2 CPU cores, half of it SmolLM2), then
# regenerate the results block of docs/results.md. Float32 (bf16.sh is the bfloat16 comparison).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # a cold compile cache: the compile times reported are a first run's
export TORCHINDUCTOR_CACHE_DIR
for name in tiny-nemotron-random tiny-nemotron-gsm8k tiny-setdlm-gsm8k; do
    hf-packed-ss bench --model "$name" --suite gsm8k --limit 10 --max-new-tokens 128 --dtype float32 --compile \
        --out "docs/results/compiled-$name" --no-progress
done
hf-packed-ss bench --model smollm2-135m-drafter --suite gsm8k --limit 5 --max-new-tokens 128 --dtype float32 --compile \
    --out docs/results/compiled-smollm2-135m-drafter --no-progress
python -m hf_packed_ss.tools.bench.readme docs/results/*/results.json docs/results/batched-*/batched.json --readme docs/results.md
