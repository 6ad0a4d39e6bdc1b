#!/usr/bin/env bash
# Prices the SmolLM2 drafter recipe (the card's "Training") on this machine without running it: the same commands on
# 128 GSM8K and 128 code answers, 100 steps of stage 1's block (B = 5) and 60 of stage 4's (B = 8), each output line
# stamped with the Unix time it appeared. Run it alone: the rates times the recipe's counts (1,600 + 888 answers,
# 5,000 steps of B = 5-6, 600 of B = 8) are the recipe's time. About 8 minutes on two threads.
#
#     bash docs/experiments/recipe_time.sh > recipe_time.log 2>&1
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
out=${OUT:-runs/recipe-time}
rm -rf "$out"
C="--format drafter --out $out --seq-len 512 --warmup 40 --save-every 200 --threads 2 --base-dtype bfloat16 \
   --code-answers 128 --answer-batch 32 --lora-rank 64 --hard-targets 0.5 \
   --lora-targets q_proj,k_proj,v_proj,gate_proj,up_proj"
stamp() { while IFS= read -r line; do echo "$(date +%s.%N | cut -c1-14) $line"; done; }
echo "$(date +%s) start"
hf-packed-ss train $C --lr 1e-3 --base-answers 128 --block-size 5 --blocks 28 --steps 100 2>&1 \
    | grep --line-buffered -E "answers:|step" | stamp
hf-packed-ss train $C --lr 5e-3 --base-answers 128 --block-size 8 --blocks 18 --steps 160 --resume 2>&1 \
    | grep --line-buffered -E "step" | stamp
echo "$(date +%s) end"
