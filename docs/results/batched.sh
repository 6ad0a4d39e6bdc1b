#!/usr/bin/env bash
# Usage: docs/results/batched.sh -- the batched benchmark (16 GSM8K test prompts, batches of 1, 4 and 16, against
# stock batched generate) on the tiny Nemotron checkpoint and the SmolLM2 drafter, one at a time with nothing else
# running (about 25 minutes on 2 CPU cores), then regenerate the results block of docs/results.md. Float32: every
# batched row must be the stock row's tokens, and a bfloat16 GEMM is not row-invariant.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
hf-packed-ss bench --model tiny-nemotron-gsm8k --suite gsm8k --limit 16 --batch-size 1 4 16 --repeats 3 \
    --max-new-tokens 128 --dtype float32 --out docs/results/batched-tiny-nemotron-gsm8k --no-progress
hf-packed-ss bench --model smollm2-135m-drafter --suite gsm8k --limit 16 --shots 0 --batch-size 1 4 16 --repeats 2 \
    --max-new-tokens 64 --dtype float32 --out docs/results/batched-smollm2-135m-drafter --no-progress
python -m hf_packed_ss.tools.bench.readme docs/results/*/results.json docs/results/batched-*/batched.json --readme docs/results.md
