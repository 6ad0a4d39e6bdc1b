"""Choose a SmolLM2 drafter on dev prompts: greedy Packed-SS tokens/NFE of adapter folders at several widths.

Dev prompts are never trained on and never reported as held-out: GSM8K train questions past every training run's
(`DEV_TRAIN`, in the benchmark's 4-shot chat prompt) and the dev split of the stdlib code prompts
(`code_prompts("dev")`, as the user turn). Folders come from `hf-packed-ss train --export` (a checkpoint) or a
finished run. Tokens/NFE is all new tokens over all calls of a set.

    python docs/experiments/drafter_dev.py runs/drafter3/step-600 runs/drafter3/step-1200 --widths 3 5 7
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_packed_ss.models import smollm2
from hf_packed_ss.tools.base_answers import train_questions
from hf_packed_ss.tools.bench.suites import chat_ids, question_ids
from hf_packed_ss.tools.code_prompts import code_prompts
from hf_packed_ss.tools.paths import gsm8k_split

DEV_TRAIN = 2000  # GSM8K train questions from here on (after the worked examples) are dev: no run trains on them


def prompt_sets(tokenizer, gsm8k: int, code: int, held_out: bool) -> dict[str, list[torch.Tensor]]:
    """Dev sets; with `held_out` the held-out ones instead (report only, never choose on them): GSM8K test
    1299-1318 (`quality.HELD_OUT`), the held-out split of the code prompts, and the first HumanEval problems."""
    if held_out:
        from hf_packed_ss.tools.bench.suites import load_suite
        from hf_packed_ss.tools.quality import held_out_questions

        return {"gsm8k_held_out": [question_ids(tokenizer, q) for q in held_out_questions(gsm8k)],
                "code_held_out": [chat_ids(tokenizer, p) for p in code_prompts("held_out", code)],
                "humaneval": [chat_ids(tokenizer, p.text) for p in load_suite("humaneval", limit=code)]}
    questions = train_questions(gsm8k_split("train"), DEV_TRAIN + gsm8k)[DEV_TRAIN:]
    return {"gsm8k": [question_ids(tokenizer, q) for q in questions],
            "code": [chat_ids(tokenizer, p) for p in code_prompts("dev", code)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--widths", type=int, nargs="+", default=[5])
    p.add_argument("--gsm8k", type=int, default=10)
    p.add_argument("--code", type=int, default=10)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--held-out", action="store_true", help="the held-out sets instead of dev (report only)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for folder in args.folders:
        model, tokenizer = smollm2.load(folder, getattr(torch, args.dtype))
        sets = prompt_sets(tokenizer, args.gsm8k, args.code, args.held_out)
        for width in args.widths:
            for name, prompts in sets.items():
                tic, tokens, nfe = time.perf_counter(), 0, 0
                for ids in prompts:
                    out = model.generate(ids, assistant_mode="packed_ss", speculative_width=width, do_sample=False,
                                         max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
                    tokens += out.decoding_stats.new_tokens
                    nfe += out.decoding_stats.nfe
                print(json.dumps({"folder": folder, "width": width, "set": name, "prompts": len(prompts),
                                  "tokens_per_nfe": round(tokens / nfe, 3), "s": round(time.perf_counter() - tic)}),
                      flush=True)


if __name__ == "__main__":
    main()
