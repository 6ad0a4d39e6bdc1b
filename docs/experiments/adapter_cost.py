"""What a SmolLM2-135M Packed-SS call costs against an AR call, by adapter shape (issue 21).

A Packed-SS call at width W holds 2W + 2 rows: the verifier block (P's last token and W draft tokens) and the
proposal block `[anchor, MASK x W]`, whose W + 1 rows get the LoRA update. This times that call shape over a
cached 4-shot-length context (700 tokens) for several adapters (random weights: cost does not depend on
training) and no adapter at all (the floor any adapter design has), interleaved round by round so the
machine's drift hits every configuration alike; medians over rounds, as ratios to the 1-row AR call.

    OMP_NUM_THREADS=1 python docs/experiments/adapter_cost.py [--rounds 30] [--widths 1 2 3 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, DynamicCache

from hf_packed_ss.models import smollm2
from hf_packed_ss.models.lora import proposal_rows

ADAPTERS = {  # name: (target modules, rank); None: the base model alone
    "none": None,
    "o_proj r=32": (["o_proj"], 32),
    "q,v,o r=16": (["q_proj", "v_proj", "o_proj"], 16),
    "all 7 r=8": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 8),
    "all 7 r=32 (bundled)": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 32),
}


def model_with(adapter):
    base = AutoModelForCausalLM.from_pretrained(smollm2.base_folder(), dtype=torch.float32).eval()
    if adapter is None:
        return base, base
    targets, rank = adapter
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False))
    smollm2.attach_drafter(model, block_size=8)
    return model, model.get_base_model()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 5])
    p.add_argument("--context", type=int, default=700)
    args = p.parse_args()
    torch.set_num_threads(1)
    ctx = torch.randint(100, 5000, (1, args.context))
    models = {}
    for name, adapter in ADAPTERS.items():
        _, inner = model_with(adapter)
        cache = DynamicCache(config=inner.config)
        with torch.no_grad():
            inner(input_ids=ctx, past_key_values=cache, use_cache=True)
        models[name] = (inner, cache)

    def call(name: str, rows: int, start: int | None) -> float:
        inner, cache = models[name]
        ids = torch.randint(100, 5000, (1, rows))
        pos = torch.arange(args.context, args.context + rows)[None]
        tic = time.perf_counter()
        with torch.no_grad(), proposal_rows(inner, start):
            inner(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        took = time.perf_counter() - tic
        cache.crop(-rows)
        return took

    shapes = [("ar", "none", 1, None)] + [(f"W={w}", name, 2 * w + 2, w + 1) for w in args.widths for name in models]
    times = {s: [] for s in shapes}
    for r in range(args.rounds + 3):
        for s in shapes:
            t = call(s[1], s[2], s[3])
            if r >= 3:  # warm-up rounds
                times[s].append(t)
    ar = statistics.median(times[shapes[0]])
    print(f"AR call (1 row over {args.context} cached tokens): {ar * 1e3:.1f} ms, median of {args.rounds} rounds\n")
    print("| width | rows | " + " | ".join(models) + " |")
    print("|---|---|" + "---|" * len(models))
    for w in args.widths:
        cells = [f"{statistics.median(times[(f'W={w}', name, 2 * w + 2, w + 1)]) / ar:.2f}x" for name in models]
        print(f"| {w} | {2 * w + 2} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
