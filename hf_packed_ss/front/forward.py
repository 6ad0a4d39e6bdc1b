"""The engine-to-model adapter: the engine speaks `PackedCall`s, models speak transformers `forward` kwargs."""

from __future__ import annotations

import time
import types

import torch
from torch._dynamo.utils import counters

from ..engine import Forward
from ..engine.static import SlotCache, cache_mask, pad_rows, pad_template, slot_mask
from ..modeling import cache_keyword
from ..models.lora import proposal_rows


def model_forward(model: torch.nn.Module, batched: bool = False) -> Forward:
    """Adapt a model whose forward takes a 4D boolean mask and `logits_to_keep` to the Runner: the logits of
    the one sequence, ``(r, V)``, or with `batched` of every row, ``(batch, r, V)``.

    A proposal-only adapter (see `models/lora.py`) is told which rows are proposal rows for each call."""
    from .families import family

    cache_kw = cache_keyword(model)
    fam = family(model.config)
    stock_causal = not batched and fam is not None and not fam.any_order  # a SetDLM plain forward lays out more
    causal: dict[int, tuple[torch.Tensor, bool]] = {}  # per template (held, so its id is not reused)

    def plain_causal(call) -> bool:
        """Whether the call is what stock `generate` would make: rows that each see the cache and the rows before
        them, no proposal rows (AR's calls, a prefill)."""
        template = call.new_rows_mask
        if not stock_causal or template is None or call.proposal_start < call.rows:
            return False
        held = causal.get(id(template))
        if held is None or held[0] is not template:
            if len(causal) > 64:
                causal.clear()
            held = causal[id(template)] = template, bool(torch.equal(template, template.tril()))
        return held[1]

    def forward(call, cache):
        # A plain causal call goes without our 4D mask, so transformers picks the kernels stock `generate` runs
        # (one row: SDPA with GQA in the kernel; a prompt: is_causal): bit for bit stock's AR in every dtype,
        # where in bfloat16 the masked kernel rounds differently now and then.
        with proposal_rows(model, call.proposal_start):
            out = model(
                input_ids=call.input_ids,
                position_ids=call.position_ids,
                attention_mask=None if plain_causal(call) else call.attention_mask,
                use_cache=True,
                logits_to_keep=call.logit_rows,
                **{cache_kw: cache},
            )
        return out.logits if batched else out.logits[0]

    return forward


_GRAPHS = counters["stats"]  # dynamo's own count of the graphs it compiled


def _step(model: torch.nn.Module, cache_kw: str):
    """The compiled function: one call of a constant number of rows written at the cache's position, its mask
    derived in the graph and its kept rows gathered there (so reading them back copies nothing). Its code object
    is its own: dynamo keeps graphs, guards and its recompile limit per code object, and every `StaticForward`
    compiles one graph of its own shape."""

    def step(input_ids, position_ids, template, kept, cache: SlotCache) -> torch.Tensor:
        mask = slot_mask(template, cache.position, cache.columns)[None, None]
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True,
                     logits_to_keep=kept, **{cache_kw: cache}).logits

    return types.FunctionType(step.__code__.replace(), step.__globals__, "step", None, step.__closure__)


class InductorOptions:
    """A `with` that sets inductor's global config to the `options` of `compile_kwargs` (`torch.compile`'s) and
    restores it after. torch 2.13 reads `freezing` from the global config when a graph is first run, not from
    `torch.compile(options=...)`: given only there, the weights stay graph inputs and every linear runs as
    `aten::mm`, never as a prepacked oneDNN linear (in bfloat16 on this CPU a frozen call of 12 rows costs about
    0.7x an unfrozen one). Freezing applies to a reduced-precision model (`dtype`) only: in float32 the packed
    kernels round otherwise than eager's (a compiled stock `generate` then leaves our AR mode's tokens), and
    there the promise is every schedule token-identical to stock. Two attribute writes per call."""

    def __init__(self, compile_kwargs: dict | None, dtype: torch.dtype):
        kwargs = compile_kwargs or {}
        inductor = kwargs.get("backend", "inductor") == "inductor"
        self.options = dict(kwargs.get("options") or {}) if inductor else {}
        if dtype not in (torch.bfloat16, torch.float16):
            self.options.pop("freezing", None)
        self.saved: dict = {}

    def __enter__(self) -> None:
        if self.options:
            from torch._inductor import config

            self.saved = {k: getattr(config, k) for k in self.options}
            for k, v in self.options.items():
                setattr(config, k, v)

    def __exit__(self, *exc) -> None:
        if self.options:
            from torch._inductor import config

            for k, v in self.saved.items():
                setattr(config, k, v)


class _Compiled:
    """What both static forwards share: the compiled graph, its compile time, and a proposal-only adapter's rows."""

    def __init__(self, model: torch.nn.Module, step, compile_kwargs: dict | None):
        self.model, self.cache_kw = model, cache_keyword(model)
        self.mask_token_id = model.config.mask_token_id
        self.graph = None if compile_kwargs is None else torch.compile(step(model, self.cache_kw), **compile_kwargs)
        self.options = InductorOptions(compile_kwargs, model.dtype)
        self.compile_time_s = 0.0
        self._gates: dict[tuple[int, int], torch.Tensor] = {}

    def compiled(self, *inputs, rows: int, start: int) -> torch.Tensor:
        """The graph on `inputs`; a compiled call marks an adapter's proposal rows (`start:` of `rows`) with a cached
        bool tensor, as a changing `start` would be a new graph (a call without any runs the base alone). Counts
        the time of a call that compiled."""
        gate = getattr(self.model, "_hf_packed_ss_gate", None)
        if start >= rows:  # no proposal rows (AR): the graph of the base model alone, no adapter computed
            gate = None
        if gate is not None:
            gate.rows = self._gates.get((rows, start))
            if gate.rows is None:
                gate.rows = self._gates[rows, start] = torch.arange(rows, device=inputs[0].device) >= start
        graphs, tic = _GRAPHS["unique_graphs"], time.perf_counter()
        try:
            with self.options:
                logits = self.graph(*inputs)
        finally:
            if gate is not None:
                gate.rows = None
        if _GRAPHS["unique_graphs"] != graphs:  # this call compiled a graph
            self.compile_time_s += time.perf_counter() - tic
        return logits


class StaticForward(_Compiled):
    """The forward of one sequence over a `SlotCache`: every call after the prompt's, padded to `rows` rows, runs
    one compiled graph (`compile_kwargs`: `torch.compile`'s, None to run it eagerly); the prompt's call, and any
    call larger than `rows`, run eagerly over the same cache. `compile_time_s` is the time of the calls that
    compiled."""

    def __init__(self, model: torch.nn.Module, rows: int, compile_kwargs: dict | None):
        super().__init__(model, _step, compile_kwargs)
        self.rows = rows
        self._padded: dict = {}  # per layout template / kept rows (the same objects every call of a shape)

    def _pad(self, tensor: torch.Tensor, pad) -> torch.Tensor:
        """`pad(tensor)`, made once per tensor (held beside its padding, so its id is not reused)."""
        held = self._padded.get(id(tensor))
        if held is None:
            if len(self._padded) > 256:
                self._padded.clear()
            held = self._padded[id(tensor)] = tensor, pad(tensor)
        return held[1]

    def __call__(self, call, cache: SlotCache) -> torch.Tensor:
        q, rows = call.rows, self.rows
        if self.graph is None or not cache.length or q > rows or call.new_rows_mask is None:
            return self.eager(call, cache)
        cache.begin_call(rows)
        ids, positions = call.input_ids, call.position_ids
        if q < rows:
            ids, positions = pad_rows(ids, positions, rows, self.mask_token_id)
        template = self._pad(call.new_rows_mask, lambda t: pad_template(t, rows))
        kept = self._pad(call.logit_rows, lambda k: torch.cat([k, k[-1:].expand(rows - k.numel())]))
        logits = self.compiled(ids, positions, template, kept, cache, rows=rows, start=call.proposal_start)
        cache.end_call(q)
        return logits[0, : call.logit_rows.numel()]

    def eager(self, call, cache: SlotCache) -> torch.Tensor:
        """The call as it is, over every slot (the prompt's, or one larger than `rows`)."""
        cache.begin_call(call.rows)
        with proposal_rows(self.model, call.proposal_start):
            logits = self.model(input_ids=call.input_ids, position_ids=call.position_ids,
                                attention_mask=cache_mask(call, cache.capacity), use_cache=True,
                                logits_to_keep=call.logit_rows, **{self.cache_kw: cache}).logits
        cache.end_call(call.rows)
        return logits[0]


def _batch_step(model: torch.nn.Module, cache_kw: str):
    """The compiled function of a lockstep batch: every row's call, its mask over every slot given."""

    def step(input_ids, position_ids, attention_mask, kept, cache: SlotCache) -> torch.Tensor:
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
                     logits_to_keep=kept, **{cache_kw: cache}).logits

    return types.FunctionType(step.__code__.replace(), step.__globals__, "step", None, step.__closure__)


class StaticBatchForward(_Compiled):
    """The forward of a lockstep batch (`engine/lockstep.py`) over a `SlotCache` of `batch` rows: each call is
    padded back to `batch` rows (the rows that finished leave the lockstep state; their cache rows stay, and their
    stand-ins see only their own new slots) and its mask widened to every slot, so every steady call has one shape
    and runs one compiled graph (the prompt's call runs eagerly, as does the prompt call of rows that join the
    batch, over a DynamicCache of their own)."""

    def __init__(self, model: torch.nn.Module, batch: int, compile_kwargs: dict | None):
        super().__init__(model, _batch_step, compile_kwargs)
        self.batch = batch
        self.joining = model_forward(model, batched=True)

    def __call__(self, call, cache: SlotCache) -> torch.Tensor:
        if not isinstance(cache, SlotCache):  # rows joining the running batch: their prompt call, over their own
            return self.joining(call, cache)  # DynamicCache, which then joins the SlotCache (`stack_rows`)
        m, q = call.input_ids.shape
        ids, positions, mask = call.input_ids, call.position_ids, cache_mask(call, cache.capacity)
        cache.begin_call(q)
        if m < self.batch:  # rows that left: stand-ins that see only their own new slots
            extra = self.batch - m
            ids = torch.cat([ids, ids.new_full((extra, q), self.mask_token_id)])
            positions = torch.cat([positions, positions.new_zeros(extra, q)])
            alone = torch.zeros(extra, 1, q, cache.capacity, dtype=torch.bool, device=mask.device)
            alone[:, 0, torch.arange(q), cache.length + torch.arange(q)] = True
            mask = torch.cat([mask, alone])
        if self.graph is None or not cache.length:
            with proposal_rows(self.model, call.proposal_start):
                logits = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                                    logits_to_keep=call.logit_rows, **{self.cache_kw: cache}).logits
        else:
            logits = self.compiled(ids, positions, mask, call.logit_rows, cache, rows=q, start=call.proposal_start)
        cache.end_call(q)
        return logits[:m]


def static_batch_forward(model: torch.nn.Module, batch: int, rows: int, capacity: int, compile_kwargs: dict | None
                         ) -> tuple[StaticBatchForward, SlotCache]:
    """`static_forward` for a lockstep batch of `batch` rows whose steady calls have `rows` rows."""
    return _kept(model, ("batch", batch, rows, compile_kwargs), capacity,
                 lambda: StaticBatchForward(model, batch, compile_kwargs))


def static_forward(model: torch.nn.Module, rows: int, capacity: int, compile_kwargs: dict | None
                   ) -> tuple[StaticForward, SlotCache]:
    """The model's `StaticForward` for calls of `rows` rows and a `SlotCache` of at least `capacity` slots."""
    return _kept(model, (rows, compile_kwargs), capacity, lambda: StaticForward(model, rows, compile_kwargs))


def _kept(model: torch.nn.Module, key: tuple, capacity: int, make):
    """A forward (made by `make` once per `key`: one per shape and compile options, so each compiles one graph of
    its own) and its `SlotCache`, both kept on the model, as stock `generate` keeps its static cache: a later decode
    that fits reuses them and the graph already compiled (a larger cache is allocated, rounded up to 128 slots so
    nearby lengths share it, and is a new graph)."""
    kept = model.__dict__.setdefault("_hf_packed_ss_static", {})
    key = tuple(repr(sorted(k.items())) if isinstance(k, dict) else k for k in key)
    forward, cache = kept.get(key, (None, None))
    if forward is None:
        forward = make()
    if cache is None or cache.capacity < capacity:
        capacity = -(-capacity // 128) * 128
        cache = SlotCache(model.config.get_text_config(decoder=True).num_hidden_layers, capacity, model.device)
    cache.reset()
    kept[key] = forward, cache
    return forward, cache
