#!/usr/bin/env bash
# Usage: docs/results/compiled-gpu.sh -- `bench --compile` on one CUDA GPU: bfloat16, torch.compile with
# mode="reduce-overhead" (CUDA graphs), every schedule of each tiny bundled checkpoint and stock generate (with
# prompt lookup) eager and compiled side by side, on the 10 first bundled GSM8K test questions (`--suite sample`:
# nothing outside the checkout is read), 128 new tokens. Sized to finish in under 8 minutes on one H200, most of
# it compiling. Writes docs/results/gpu-compiled-NAME; regenerates the results block of docs/results.md only when it wrote
# into docs/results (a real run on this checkout).
#
# On the lent device machine (torch 2.11 + CUDA, transformers 5.17): carry a transformers >= 5.23 wheel (and its
# missing dependencies) in .whl, as the device README says, and run from the repository root
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
#   PYTHONPATH=/tmp/site:. OUT_DIR=$OUT docs/results/compiled-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT_DIR:-docs/results}
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)  # a cold compile cache: the compile times reported are a first run's
export TORCHINDUCTOR_CACHE_DIR
for name in tiny-nemotron-gsm8k tiny-setdlm-gsm8k; do
    python -m hf_packed_ss.tools.bench --model "$name" --suite sample --limit 10 --max-new-tokens 128 --compile \
        --device cuda --dtype bfloat16 --compile-mode reduce-overhead --out "$out/gpu-compiled-$name" --no-progress
done
if [ "$out" = docs/results ]; then
    python -m hf_packed_ss.tools.bench.readme docs/results/*/results.json docs/results/batched-*/batched.json \
        --readme docs/results.md
fi
