"""Proposal-only LoRA: an adapter (PEFT) that shapes the diffusion drafter without touching the
verifier, so decoding stays exact (paper appendix F.2).

While `proposal_only_adapters(model)` is active, every LoRA layer's update is multiplied by a row
mask that is True only on proposal rows of the current packed call (`proposal_rows`); verifier rows,
and any call outside `proposal_rows`, see the base model. As in the paper, the update is *computed*
for every input row and *applied* to proposal rows only: a packed call of 2B rows pays the adapter's
FLOPs on all 2B rows (Linear-SS pays them only in its drafting call). Outside the context the model
behaves as PEFT made it (adapter on every row).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # PEFT not installed: no adapter can be loaded either
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


class _RowGate:
    """Holds the current row mask; multiplies a LoRA branch's output by it."""

    def __init__(self):
        self.rows: torch.Tensor | None = None  # (batch, seq) bool; None = no row gets the update

    def __call__(self, module, inputs, output):
        if self.rows is None or self.rows.shape[-1] != output.shape[-2]:
            return output * 0
        return output * self.rows[..., None].to(output.dtype)


class _MaskEmbeddingGate:
    """Adds a learned MASK embedding offset (`smollm2.MaskEmbedding`) on proposal rows that hold MASK."""

    def __init__(self, embedding: nn.Module, gate: _RowGate):
        self.embedding, self.gate = embedding, gate

    def __call__(self, module, inputs, output):
        rows, ids = self.gate.rows, inputs[0]
        if rows is None or rows.shape[-1] != ids.shape[-1]:
            return output
        where = (ids == self.embedding.token_id) & rows
        return output + where[..., None].to(output.dtype) * self.embedding.delta.to(output.dtype)


def install_gate(model: nn.Module):
    """Gate every LoRA layer of `model` (and a learned MASK embedding, if attached) to proposal rows until
    the returned `remove()` is called; outside a marked forward no row gets the update, so a plain forward
    (stock `generate`) is the untouched base model. Returns None when there is nothing to gate or a gate is
    already installed."""
    layers = _lora_layers(model)
    mask_embedding = getattr(model, "_hf_packed_ss_mask_embedding", None)
    if (not layers and mask_embedding is None) or getattr(model, "_hf_packed_ss_gate", None) is not None:
        return None
    if any(any(getattr(m, "use_dora", {}).values()) for m in layers):
        raise ValueError("DoRA adapters cannot be restricted to proposal rows; use a plain LoRA adapter.")
    gate = _RowGate()
    handles = [b.register_forward_hook(gate) for m in layers for b in m.lora_B.values()]
    handles += [e.register_forward_hook(gate) for m in layers for e in getattr(m, "lora_embedding_B", {}).values()
                if isinstance(e, nn.Module)]
    if mask_embedding is not None:
        hook = _MaskEmbeddingGate(mask_embedding, gate)
        handles.append(model.get_input_embeddings().register_forward_hook(hook))
    model._hf_packed_ss_gate = gate

    def remove() -> None:
        for h in handles:
            h.remove()
        del model._hf_packed_ss_gate

    return remove


@contextmanager
def proposal_only_adapters(model: nn.Module):
    """`install_gate` for the duration of the block (a gate installed before, e.g. by a drafter, stays)."""
    remove = install_gate(model)
    try:
        yield
    finally:
        if remove is not None:
            remove()


@contextmanager
def proposal_rows(model: nn.Module, rows: torch.Tensor):
    """Mark `rows` (`(batch, seq)` bool) as the proposal rows of the next forward."""
    gate = getattr(model, "_hf_packed_ss_gate", None)
    if gate is None:
        yield
        return
    gate.rows = rows
    try:
        yield
    finally:
        gate.rows = None
