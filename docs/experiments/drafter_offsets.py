"""Where a SmolLM2 drafter's tokens/NFE goes: how often its block drafts the base's own greedy token, by offset.

A Packed-SS call accepts at least one token, and the block it drafted from the older prefix keeps only the
proposals past those (Algorithm 1, line 10), so tokens/NFE rests on offsets 2, 3, ...: tokens drafted that many
positions past the verified prefix without the tokens in between. Here: the base's greedy answers (our AR mode) to
the dev prompts of `drafter_dev.py`, a block `[answer token, MASK x (B - 1)]` at every answer position (the
training objective's `drafter_logits`, teacher-forced), each offset's argmax against the base's, and how often the
offsets 2..j are all right (a draft made after one accepted token is accepted that far). One plus the sum of those
is what a call would accept if every draft started at offset 2; `replayed` runs greedy Packed-SS at W = B - 1 over
the same blocks (a call accepting A tokens leaves the next a draft from offset A + 1 of the block anchored where it
started, Algorithm 1, line 10), which is what a decode makes, up to the first call and the answer's last B tokens.

    python docs/experiments/drafter_offsets.py runs/pF --block-size 5     # docs/training.md, run 6
"""

from __future__ import annotations

import argparse
import json

import torch
from drafter_dev import prompt_sets

from hf_packed_ss.models import smollm2
from hf_packed_ss.tools.train import DrafterExample, drafter_logits


def replay(right: torch.Tensor) -> tuple[int, int]:
    """(tokens, calls) of greedy Packed-SS over one answer, from `right[a, j - 1]`: whether the block anchored at
    the answer's a-th position (0: the prompt's last token) drafts the token j past it right."""
    end, calls, prefix, draft = len(right), 0, 0, range(0)  # draft: the offsets kept, from the block at `anchor`
    anchor = 0
    while prefix < end:
        h = next((i for i, j in enumerate(draft) if not right[anchor, j - 1]), len(draft))
        accepted = min(h + 1, end - prefix)
        anchor, draft = prefix, range(accepted + 1, right.shape[1] + 1)  # this call's block, past what it accepted
        prefix, calls = prefix + accepted, calls + 1
    return end, calls


def agreement(drafter: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    return drafter.argmax(-1) == base.argmax(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--block-size", type=int, default=8, help="the block's rows: [token, MASK x (B - 1)]")
    p.add_argument("--prompts", type=int, default=10, help="per set (dev GSM8K, dev code)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    b = args.block_size
    for folder in args.folders:
        model, tokenizer = smollm2.load(folder, torch.bfloat16, block_size=b)
        for name, prompts in prompt_sets(tokenizer, args.prompts, args.prompts, held_out=False).items():
            right, tokens, calls = [], 0, 0
            for ids in prompts:
                with torch.no_grad():
                    out = model.generate(ids, assistant_mode="ar", max_new_tokens=args.max_new_tokens, do_sample=False)
                    example = DrafterExample(out, ids.shape[1], 0, [])
                    anchors = torch.arange(ids.shape[1] - 1, out.shape[1] - b + 1)
                    answer = torch.cat([agreement(*drafter_logits(model, example, chunk, b)).view(-1, b - 1)
                                        for chunk in anchors.split(64)])
                right.append(answer)
                t, c = replay(answer)
                tokens, calls = tokens + t, calls + c
            right = torch.cat(right).float()
            chain = right[:, 1:].cumprod(1).mean(0)  # offsets 2..j all right
            print(json.dumps({"folder": folder, "set": name, "blocks": len(right),
                              "offset_accuracy": [round(v, 3) for v in right.mean(0).tolist()],
                              "offsets_2_to_j_right": [round(v, 3) for v in chain.tolist()],
                              "one_plus_their_sum": round(1 + chain.sum().item(), 3),
                              "replayed_tokens_per_nfe": round(tokens / calls, 3)}), flush=True)


if __name__ == "__main__":
    main()
