#!/usr/bin/env bash
# Usage: docs/results/auto.sh -- the auto-width benchmark of issue 20 on every bundled checkpoint (one at a time,
# nothing else running): AR, Packed-SS at W = 1, 2, 4, 8 (7 on SmolLM2, whose widest is 7) and its default, auto and
# stock generate, interleaved in one run per checkpoint and suite; the `auto` section of each report.md has auto
# against the best of those and against stock (paired bootstrap intervals) and the cost model against every
# schedule's measured time per NFE.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
fixed="ar packed_ss@1 packed_ss@2 packed_ss@4 packed_ss@8 packed_ss auto stock"
for name in tiny-nemotron-gsm8k tiny-setdlm-gsm8k tiny-nemotron-random; do
    hf-packed-ss bench --model "$name" --suite gsm8k --limit 20 --max-new-tokens 128 --schedules $fixed \
        --out "docs/results/auto/$name" --no-progress
done
for suite in gsm8k humaneval; do
    hf-packed-ss bench --model smollm2-135m-drafter --suite "$suite" --limit 6 --max-new-tokens 128 \
        --schedules ${fixed//packed_ss@8/packed_ss@7} --out "docs/results/auto/smollm2-135m-drafter-$suite" --no-progress
done
python -m hf_packed_ss.tools.bench.readme --auto docs/results/auto/*/results.json --readme docs/auto.md  # the auto figures block
