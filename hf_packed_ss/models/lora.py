"""Proposal-only LoRA: an adapter (PEFT) that shapes the diffusion drafter without touching the
verifier, so decoding stays exact (paper appendix F.2).

While `proposal_only_adapters(model)` is active, every LoRA layer adds its update to the proposal rows
of the current packed call only (`proposal_rows`); verifier rows, and any call outside `proposal_rows`,
see the base model. Every layout puts its proposal rows last, so the update is computed on that tail
alone: a call without proposal rows (AR, stock `generate`, prompt lookup) runs the base layers and pays
nothing for the adapter. Outside the context the model behaves as PEFT made it (adapter on every row).

Under transformers' tensor parallelism (`from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))`)
PEFT shards each adapter with its base layer; the gate then calls the adapter's sharded modules, so every rank
adds its slice of the update to its slice of the proposal rows' output.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # PEFT not installed: no adapter can be loaded either
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def _lora_update(layer: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """Adapter `name`'s update for rows `x` (the input the layer's forward got, after any dropout).

    On a tensor-parallel base layer PEFT shards the adapter with it (lora_B colwise under a colwise layer, lora_A
    rowwise under a rowwise one) and installs transformers' TP forwards on those modules, so their calls return
    this rank's output columns and all-reduce a rowwise partial product; otherwise two functional calls (cheaper
    than module calls, and this runs for every projection of every layer)."""
    a, b = layer.lora_A[name], layer.lora_B[name]
    if hasattr(a.weight, "device_mesh") or hasattr(b.weight, "device_mesh"):  # DTensor: PEFT's TP adapter
        return b(a(x.to(a.weight.dtype)))
    return F.linear(F.linear(x.to(a.weight.dtype), a.weight), b.weight)


# Projections that read one input, in the order a decoder layer calls them (Llama-style names): their adapters'
# down-projections run as one matmul and their up-projections as one block-diagonal matmul, so a packed call
# makes 2 small matmuls per group instead of 2 per projection (what the adapter costs is these calls, not FLOPs).
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Group:
    """The adapters of sibling projections that share an input (or of one projection), fused: ``A`` stacked, ``B``
    block-diagonal with each adapter's scaling folded in, both in the base layer's dtype (a bfloat16 model's
    adapter matmuls run as bfloat16 ones, prepacked when compiled, not as float32 ones beside a cast of their
    input). The first sibling computes every update and holds them for the others (checked by the input's
    identity: a model that feeds them different inputs falls back to its own)."""

    def __init__(self, layers: list[nn.Module], name: str):
        self.layers = layers
        a = [layer.lora_A[name].weight for layer in layers]
        b = [layer.lora_B[name].weight * layer.scaling[name] for layer in layers]
        base = getattr(layers[0].base_layer, "weight", None)
        dtype = base.dtype if base is not None and base.dtype.is_floating_point else a[0].dtype
        self.a = torch.cat(a).detach().to(dtype)
        self.b = torch.block_diag(*b).detach().to(dtype)
        self.sizes = [w.shape[0] for w in b]
        self.name = name
        self.held: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None

    def update(self, layer: nn.Module, x: torch.Tensor, start: int = 0) -> torch.Tensor | None:
        """`layer`'s scaled update for rows `start:` of `x`, or None when this group cannot serve it."""
        if layer.active_adapters != [self.name] or self.a.device != x.device:
            return None
        if layer is self.layers[0]:
            h = F.linear(F.linear(x[..., start:, :].to(self.a.dtype), self.a), self.b)
            self.held = x, h.split(self.sizes, dim=-1)
        if self.held is None or self.held[0] is not x:
            return None
        i = self.layers.index(layer)
        update = self.held[1][i]
        if i == len(self.layers) - 1:  # the last sibling: nothing stays held (alive) past the layer
            self.held = None
        return update


def _groups(model: nn.Module, layers: list[nn.Module]) -> dict[int, _Group]:
    """Each LoRA layer of `model` in a group, by id: with its siblings that share an input (`SHARED_INPUT`), else
    alone; plain single-adapter LoRA on unsharded weights only."""
    wanted = {id(m) for m in layers}
    by_parent: dict[tuple[str, tuple], list[tuple[int, nn.Module]]] = {}
    for qualified, layer in model.named_modules():
        if id(layer) not in wanted:
            continue
        parent, _, leaf = qualified.rpartition(".")
        group = next((g for g in SHARED_INPUT if leaf in g), (leaf,))
        by_parent.setdefault((parent, group), []).append((group.index(leaf), layer))
    out = {}
    for members in by_parent.values():
        members = [m for _, m in sorted(members, key=lambda pair: pair[0])]
        adapters = {tuple(m.active_adapters) for m in members}
        if len(adapters) != 1 or len(next(iter(adapters))) != 1:
            continue
        name = members[0].active_adapters[0]
        if any(name not in m.lora_A or hasattr(m.lora_A[name].weight, "device_mesh")
               or hasattr(m.lora_B[name].weight, "device_mesh") for m in members):
            continue  # a tensor-parallel adapter goes through PEFT's sharded modules
        fused = _Group(members, name)
        out.update({id(m): fused for m in members})
    return out


class _RowGate:
    """Where the current call's proposal rows start (None: no row gets the update), or, for a compiled call of a
    constant number of rows, which rows are proposal rows (`rows`, a bool tensor: a graph input, where a changing
    `start` would be a new graph)."""

    def __init__(self, groups: dict[int, _Group] | None = None):
        self.start: int | None = None
        self.rows: torch.Tensor | None = None
        self.groups = groups or {}

    def linear_forward(self, layer: nn.Module):
        """A PEFT LoRA `Linear.forward` that adds the update to rows `start:` only."""

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            result = layer.base_layer(x, *args, **kwargs)
            if self.rows is not None and not layer.disable_adapters:  # every row computed, proposal rows kept
                gate = self.rows[:, None].to(result.dtype)
                group = self.groups.get(id(layer))
                fused = group.update(layer, x) if group is not None else None
                if fused is not None:
                    return result + fused.to(result.dtype) * gate
                for name in layer.active_adapters:
                    if name in layer.lora_A:
                        update = _lora_update(layer, name, x).to(result.dtype)  # PEFT may keep it float32
                        result = result + update * (layer.scaling[name] * gate)
                return result
            start = self.start
            if start is None or start >= x.shape[-2] or layer.disable_adapters:
                return result
            tail = x[..., start:, :].reshape(-1, x.shape[-1])  # rows as one matrix: a view at batch size 1
            out = result[..., start:, :]
            group = self.groups.get(id(layer)) if not layer.training else None
            fused = group.update(layer, x, start) if group is not None else None
            if fused is not None:
                out.add_(fused.to(out.dtype))
                return result
            for name in layer.active_adapters:
                if name in layer.lora_A:  # functional calls: this runs for every projection of every layer
                    h = layer.lora_dropout[name](tail) if layer.training else tail
                    update = _lora_update(layer, name, h)
                    out.add_(update.view(out.shape), alpha=layer.scaling[name])
            return result

        return forward


class _MaskEmbeddingGate:
    """Adds a learned MASK embedding offset (`smollm2.MaskEmbedding`) on proposal rows that hold MASK."""

    def __init__(self, embedding: nn.Module, gate: _RowGate):
        self.embedding, self.gate = embedding, gate

    def __call__(self, module, inputs, output):
        start, ids = self.gate.start, inputs[0]
        if self.gate.rows is not None:
            where = (ids == self.embedding.token_id) & self.gate.rows
            return output + where[..., None].to(output.dtype) * self.embedding.delta.to(output.dtype)
        if start is None or start >= ids.shape[-1]:
            return output
        where = (ids == self.embedding.token_id) & (torch.arange(ids.shape[-1], device=ids.device) >= start)
        return output + where[..., None].to(output.dtype) * self.embedding.delta.to(output.dtype)


def install_gate(model: nn.Module):
    """Gate every LoRA layer of `model` (and a learned MASK embedding, if attached) to proposal rows until
    the returned `remove()` is called; outside a marked forward no row gets the update, so a plain forward
    (stock `generate`) is the untouched base model. Returns None when there is nothing to gate or a gate is
    already installed."""
    if getattr(model, "_hf_packed_ss_gate", None) is not None:  # before walking the modules: a decode's calls ask
        return None
    layers = _lora_layers(model)
    mask_embedding = getattr(model, "_hf_packed_ss_mask_embedding", None)
    if not layers and mask_embedding is None:
        return None
    for m in layers:  # LoRA on linear layers (plain or quantized bases), no DoRA or other variant
        linear = all(isinstance(a, nn.Linear) for a in m.lora_A.values()) and not getattr(m, "lora_embedding_A", {})
        if not linear or getattr(m, "lora_variant", None) or any(getattr(m, "use_dora", {}).values()):
            raise ValueError(f"{type(m).__name__} LoRA layers cannot be restricted to proposal rows; use a plain "
                             "LoRA adapter on linear layers (no DoRA or other variants).")
        if m.merged:
            raise ValueError("A merged LoRA adapter changes the verifier; call unmerge_adapter() before decoding.")
    gate = _RowGate(_groups(model, layers))
    for m in layers:
        m.forward = gate.linear_forward(m)  # instance attribute: shadows PEFT's forward until removed
    handles = []
    if mask_embedding is not None:
        hook = _MaskEmbeddingGate(mask_embedding, gate)
        handles.append(model.get_input_embeddings().register_forward_hook(hook))
    model._hf_packed_ss_gate = gate

    def remove() -> None:
        for m in layers:
            del m.forward
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
def proposal_rows(model: nn.Module, start: int):
    """Mark rows `start:` (of every sequence in the batch) as the proposal rows of the next forward."""
    gate = getattr(model, "_hf_packed_ss_gate", None)
    if gate is None:
        yield
        return
    gate.start = start
    try:
        yield
    finally:
        gate.start = None
