"""The engine-to-model adapter: the engine speaks `PackedCall`s, models speak transformers `forward` kwargs."""

from __future__ import annotations

import torch

from ..engine import Forward
from ..modeling import cache_keyword
from ..models.lora import proposal_rows


def model_forward(model: torch.nn.Module, batched: bool = False) -> Forward:
    """Adapt a model whose forward takes a 4D boolean mask and `logits_to_keep` to the Runner: the logits of
    the one sequence, ``(r, V)``, or with `batched` of every row, ``(batch, r, V)``.

    A proposal-only adapter (see `models/lora.py`) is told which rows are proposal rows for each call."""
    cache_kw = cache_keyword(model)

    def forward(call, cache):
        with proposal_rows(model, call.proposal_start):
            out = model(
                input_ids=call.input_ids,
                position_ids=call.position_ids,
                attention_mask=call.attention_mask,
                use_cache=True,
                logits_to_keep=call.logit_rows,
                **{cache_kw: cache},
            )
        return out.logits if batched else out.logits[0]

    return forward
