"""The timing primitives of the probe, the batched bench, the compiled table and the cost curve: model forwards of
n new rows after a cached prompt (`time_rows`, `time_batched`), a bare compiled forward and a real packed call as
no-argument callables (`bare_call`, `packed_call`), timed in rotating order (`time_interleaved`), and the least
squares tau + delta * n (`fit`)."""

from __future__ import annotations

import statistics as stats
import time
import types

import numpy as np
import torch
from transformers import DynamicCache

from ...front.forward import InductorOptions
from ...modeling import cache_keyword
from .measure import sync


def time_rows(model, rows: list[int], context: int = 128, iters: int = 10, warmup: int = 2,
              seed: int = 0) -> dict[int, float]:
    """Median seconds of one forward of n new rows after a cached `context`-token prompt, per n. Row counts are
    interleaved within each round, so drift of the machine hits all alike."""
    latency = time_batched(model, [(1, n) for n in rows], context, iters, warmup, seed)
    return {n: latency[1, n] for n in rows}


def time_batched(model, shapes: list[tuple[int, int]], context: int = 128, iters: int = 10, warmup: int = 2,
                 seed: int = 0) -> dict[tuple[int, int], float]:
    """Median seconds of one forward of a batch of b sequences of n new rows each, after a cached `context`-token
    prompt per sequence, per (b, n) in `shapes` (interleaved within each round, as `time_rows`)."""
    decoder = getattr(model, "_hf_packed_ss_twin", model)  # a released model decodes through its twin
    device, cache_kw = decoder.device, cache_keyword(decoder)
    g = torch.Generator().manual_seed(seed)
    vocab = decoder.config.vocab_size
    caches, calls = {}, {}
    with torch.no_grad():
        for b in sorted({b for b, _ in shapes}):
            caches[b] = DynamicCache()
            decoder(input_ids=torch.randint(vocab, (b, context), generator=g).to(device), use_cache=True,
                    **{cache_kw: caches[b]})
    for b, n in shapes:  # inputs built once: only the forward is timed
        ids = torch.randint(vocab, (b, n), generator=g).to(device)
        positions = torch.arange(context, context + n, device=device)[None].expand(b, -1)
        new = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask = torch.cat([torch.ones(n, context, dtype=torch.bool, device=device), new], dim=1)
        calls[b, n] = dict(input_ids=ids, position_ids=positions, attention_mask=mask[None, None].expand(b, 1, -1, -1),
                           use_cache=True)
    times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    with torch.no_grad():
        for round_ in range(warmup + iters):
            for b, n in shapes[round_ % len(shapes):] + shapes[:round_ % len(shapes)]:
                sync(device)
                tic = time.perf_counter()
                decoder(**calls[b, n], **{cache_kw: caches[b]})
                sync(device)
                if round_ >= warmup:
                    times[b, n].append(time.perf_counter() - tic)
                caches[b].crop(-n)  # back to the prompt (5.24 takes the rows to remove)
    return {shape: stats.median(t) for shape, t in times.items()}


def bare_call(model, rows: int, capacity: int, compile_kwargs: dict | None, context: int = 128, seed: int = 0):
    """A bare forward of `rows` new rows, as a no-argument callable: the model alone over transformers'
    `StaticCache` of `capacity` slots holding a `context`-token prompt, a plain causal 4D mask built once, the
    cache moved back after each call; compiled with `compile_kwargs` (None: eager). The floor a packed call of as
    many rows is held to."""
    from transformers import StaticCache

    decoder = getattr(model, "_hf_packed_ss_twin", model)
    device, cache_kw = decoder.device, cache_keyword(decoder)
    g = torch.Generator().manual_seed(seed)
    vocab = decoder.config.vocab_size
    cache = StaticCache(config=decoder.config, max_cache_len=capacity)
    columns = torch.arange(capacity, device=device)

    def causal(start: int, n: int) -> torch.Tensor:
        return (columns[None] <= torch.arange(start, start + n, device=device)[:, None])[None, None]

    def forward(input_ids, position_ids, attention_mask):
        return decoder(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
                       **{cache_kw: cache}).logits

    # a code object of its own per call: dynamo counts graphs per code object, and a curve of many row counts and
    # configurations in one process would pass its recompile limit (8) and time the rest eagerly
    forward = types.FunctionType(forward.__code__.replace(), forward.__globals__, "forward", None, forward.__closure__)
    graph = forward if compile_kwargs is None else torch.compile(forward, **compile_kwargs)
    options = InductorOptions(compile_kwargs, decoder.dtype)  # what our compiled forwards run under
    with torch.inference_mode():
        prompt = torch.randint(vocab, (1, context), generator=g).to(device)
        forward(prompt, torch.arange(context, device=device)[None], causal(0, context))
    inputs = (torch.randint(vocab, (1, rows), generator=g).to(device),
              torch.arange(context, context + rows, device=device)[None], causal(context, rows))

    def call() -> None:
        with torch.inference_mode(), options:
            graph(*inputs)
            cache.crop(-rows)  # back to the prompt: the static layers move their position back
            sync(device)

    return call


def packed_call(model, width: int, capacity: int, compile_kwargs: dict | None, prompt: torch.Tensor,
                new_tokens: int = 64, mode: str = "packed_ss"):
    """A real steady call of schedule `mode` (Packed-SS by default) at `width`, as a no-argument callable, with its
    rows, cached context and cache slots: a greedy decode of `prompt` runs through the very `StaticForward` and
    slot cache `generate` uses (static shapes: padding, in-graph mask, slot bookkeeping and a proposal-only
    adapter included; compiled with `compile_kwargs`, None: eager), and a call from mid-decode is replayed at
    its own cache length."""
    from ...engine import Greedy, decode
    from ...engine.static import steady_rows
    from ...front.families import family
    from ...front.forward import static_forward
    from ...models.lora import proposal_only_adapters

    decoder = getattr(model, "_hf_packed_ss_twin", model)
    fam, config = family(decoder.config), decoder.config
    schedule = fam.schedules[mode](width, Greedy())
    layout = fam.layout(config.mask_token_id, static_shapes=True)
    rows = steady_rows(schedule, layout)
    forward, cache = static_forward(decoder, rows, capacity, compile_kwargs)
    calls = []
    with torch.inference_mode(), proposal_only_adapters(decoder):
        decode(forward, schedule, layout, prompt, new_tokens, cache=cache,
               trace=lambda step: calls.append((step.call, cache.length - step.call.rows)))
    steady = [(c, at) for c, at in calls[1:] if c.rows == rows] or calls[1:]
    call, context = steady[len(steady) // 2]  # mid-decode

    def replay() -> None:
        with torch.inference_mode(), proposal_only_adapters(decoder):
            cache.length = context
            forward(call, cache)
            sync(decoder.device)

    return replay, rows, context, cache.capacity


def time_interleaved(calls: dict, iters: int = 200, warmup: int = 3) -> dict:
    """Median seconds of each no-argument callable in `calls`, run in rotating order every round (device-
    synchronised by the caller's callables), so drift of the machine hits all alike."""
    names = list(calls)
    times: dict = {name: [] for name in names}
    for round_ in range(warmup + iters):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            tic = time.perf_counter()
            calls[name]()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - tic)
    return {name: stats.median(t) for name, t in times.items()}


def fit(latency: dict[int, float]) -> tuple[float, float, float]:
    """Least squares latency = tau + delta * n; returns (tau, delta, R^2)."""
    n = np.array(list(latency), dtype=float)
    y = np.array(list(latency.values()))
    delta, tau = np.polyfit(n, y, 1) if len(n) > 1 else (0.0, float(y[0]))
    residual = y - (tau + delta * n)
    total = ((y - y.mean()) ** 2).sum()
    return float(tau), float(delta), float(1 - (residual**2).sum() / total) if total > 0 else 1.0
