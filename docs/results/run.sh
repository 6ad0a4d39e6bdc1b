#!/usr/bin/env bash
# Usage: [LIMIT=N] [REPEATS=R] docs/results/run.sh NAME... -- benchmark trained bundled checkpoints (one at a time, nothing else running), then regenerate the results blocks of
# docs/results.md and the model cards from the results.json files. Float32, where every schedule is token-identical to
# AR (`--dtype auto` would pick bfloat16 on a CPU with AVX512-BF16; bf16.sh measures that).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
for name in "$@"; do
    hf-packed-ss bench --model "$name" --suite gsm8k --limit "${LIMIT:-10}" --repeats "${REPEATS:-1}" --max-new-tokens 128 --dtype float32 --out "docs/results/$name" --no-progress
    hf-packed-ss probe --results "docs/results/$name/results.json" --json "docs/results/$name/probe.json"
    python -m hf_packed_ss.tools.bench.readme "docs/results/$name/results.json" --readme "model_cards/$name/README.md"
done
python -m hf_packed_ss.tools.bench.readme docs/results/*/results.json docs/results/batched-*/batched.json --readme docs/results.md  # every model benched so far
