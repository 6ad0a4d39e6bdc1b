"""The any-order Runner: Algorithm 3's outer loop for same-position models (SetDLM).

It owns the accepted position/token pairs P, the last output position E, the pending inputs N and the
KV cache. Each iteration takes the active window (the leftmost unresolved position and the next
W - 1, minus accepted ones, never past E), lets the schedule plan and advance one call, commits the
cache (N plus the accepted draft rows: one crop), and applies the stopping rule: an accepted EOS at j
or a stop marker whose tokens are all accepted and end at j sets E = min(E, j) (appendix C, E.2);
positions after E are dropped and the unresolved ones before it are still filled. The output is the
prompt followed by positions 0..E in textual order.

A schedule may opt out of the EOS rule (`stop_at_eos = False`) and may set `context_length`: then
before each call the oldest cache rows are dropped so that cache + call rows <= context_length, and a
first call that would not fit processes the prompt in a call of its own (the release's native decoder).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from transformers import DynamicCache

from .layouts.setdlm import SetDLMLayout
from .plan import CallResult, WindowPlan
from .runner import Forward, _sync, call_model, stream
from .schedules.any_order import WindowSchedule
from .stats import DecodingStats


def _context(prompt: torch.Tensor, known: dict[int, int], position: int) -> torch.Tensor:
    """Ids a logits processor sees for a row at `position`: the prompt and the known tokens that
    continue it without a gap (exactly P + d^(<r) under LTR order)."""
    tokens = []
    for j in range(position):
        if j not in known:
            break
        tokens.append(known[j])
    return torch.cat([prompt, torch.tensor(tokens, dtype=torch.long, device=prompt.device)])


def process(processors, result: CallResult, plan: WindowPlan, prompt: torch.Tensor, accepted: dict[int, int]):
    """Apply a `LogitsProcessorList` to every verifier and proposal row with the ids it conditions on."""
    if not processors:
        return result

    def known(before_rank: int) -> dict[int, int]:
        drafts = {j: d for j, d in zip(plan.order[:before_rank], plan.draft or (), strict=False) if d is not None}
        return {**accepted, **drafts}

    def rows(logits: torch.Tensor, ranks: range, before: Callable[[int], int]) -> torch.Tensor:
        """Row i holds rank ranks[i]; a region may have no rows at all."""
        if not logits.shape[0]:
            return logits
        return torch.cat([
            processors(_context(prompt, known(before(r)), plan.order[r])[None], logits[i : i + 1])
            for i, r in enumerate(ranks[: logits.shape[0]])
        ])

    verifier = None if result.verifier is None else rows(result.verifier, range(len(plan.order)), lambda r: r)
    proposals = [rows(logits, plan.region_ranks(b), lambda r, b=b: b)
                 for b, logits in zip(plan.regions, result.proposals, strict=True)]
    return CallResult(verifier=verifier, proposals=proposals)


def crop_left(cache: DynamicCache, rows: int) -> None:
    """Drop the `rows` oldest rows of every layer of a DynamicCache (the release's `_crop_kv_cache_left`)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[..., rows:, :]
            layer.values = layer.values[..., rows:, :]


def _stop_end(prompt, tokens: dict[int, int], new: list[int], end: int, stop) -> int:
    """The earliest j <= end where a stop marker whose tokens are all accepted ends (or `end`).

    `stop(sequence)` is asked about every accepted run that ends at or after a newly accepted position;
    a run starting at position 0 carries the prompt in front, so under LTR order this is exactly
    stock generate's check after every token."""
    for j in sorted(t for t in tokens if t <= end and t >= min(new)):
        start = j
        while start - 1 in tokens:
            start -= 1
        run = torch.tensor([tokens[i] for i in range(start, j + 1)], dtype=torch.long, device=prompt.device)
        if stop(torch.cat([prompt, run]) if start == 0 else run):
            return j
    return end


def run_any_order(
    forward: Forward,
    schedule: WindowSchedule,
    layout: SetDLMLayout,
    prompt: torch.Tensor,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    processors=None,
    stop: Callable[[torch.Tensor], bool] | None = None,
    streamer=None,
    cache: DynamicCache | None = None,
) -> tuple[torch.Tensor, DecodingStats]:
    """Decode one sequence with an any-order schedule; same contract as `runner.run`."""
    eos = frozenset(int(e) for e in eos_token_ids) if schedule.stop_at_eos else frozenset()
    stats = DecodingStats(schedule=schedule.name, width=schedule.width if schedule.speculative else 0)
    device, origin = prompt.device, prompt.numel()
    cache = DynamicCache() if cache is None else cache
    limit = schedule.context_length
    if limit is not None and origin > limit:
        raise ValueError(f"The prompt ({origin} tokens) is longer than the context of {limit} rows the cache is "
                         "cropped to: shorten the prompt or use native_context='full'.")
    evicted = 0  # rows dropped from the left of [prompt, cached] (only with context_length)
    schedule.begin(max_new_tokens, device)
    tokens: dict[int, int] = {}  # dom(P_t) -> token, output positions
    end = max_new_tokens - 1  # E
    pending = [(i - origin, int(t)) for i, t in enumerate(prompt.tolist())]  # N: accepted, not yet in the cache
    cached: list[tuple[int, int]] = []  # cache rows after the prompt, in cache order
    streamed = 0
    kinds: dict[int, str] = {}  # how each accepted position was produced (for provenance streamers)
    start = time.perf_counter()
    _sync(device)
    if streamer is not None:
        streamer.put(prompt.cpu())
    while True:
        left = next((j for j in range(end + 1) if j not in tokens), None)
        if left is None:
            break
        window = [j for j in range(left, min(end, left + schedule.width - 1) + 1) if j not in tokens]
        # 1. ask
        plan = schedule.plan(window)
        n_tokens = torch.tensor([t for _, t in pending], dtype=torch.long, device=device)
        n_positions = torch.tensor([j for j, _ in pending], dtype=torch.long, device=device) + origin
        call = layout.build(plan, n_tokens, n_positions, origin, cache.get_seq_length())
        if limit is not None and cache.get_seq_length() + call.rows > limit:
            if not cache.get_seq_length():  # the prompt first, in a call of its own
                call_model(forward, layout.build(WindowPlan(order=()), n_tokens, n_positions, origin, 0), cache, stats)
                cached += [(j, t) for j, t in pending if j >= 0]
                pending, n_tokens, n_positions = [], n_tokens[:0], n_positions[:0]
                call = layout.build(plan, n_tokens, n_positions, origin, cache.get_seq_length())
            overflow = cache.get_seq_length() + call.rows - limit
            if overflow >= cache.get_seq_length():
                raise ValueError(f"A call of {call.rows} rows does not fit a context of {limit} rows: use a "
                                 "smaller speculative_width or native_context='full'.")
            if overflow > 0:
                crop_left(cache, overflow)
                evicted += overflow
                call = layout.build(plan, n_tokens, n_positions, origin, cache.get_seq_length())
        # 2. one model call
        logits = call_model(forward, call, cache, stats)
        # 3. verify and draft
        result = process(processors, call.read(logits), plan, prompt, tokens)
        outcome = schedule.advance(plan, result)
        accepted, h = outcome if outcome is not None else ([], 0)
        # 4. commit the cache: N and the accepted draft rows
        cache.crop(call.rows_to_cache(h) - call.rows)
        cached += [(j, t) for j, t in pending if j >= 0] + accepted[:h]
        pending = accepted[h:]
        if outcome is None:
            continue
        # 5. stopping (Algorithm 3, lines 11-13; appendix E.2 markers)
        tokens.update(accepted)
        rest = "committed" if not plan.verify else "correction" if plan.available else "verifier"
        kinds.update((j, "draft" if r < h else rest) for r, (j, _) in enumerate(accepted))
        new = [j for j, _ in accepted]
        end = min([end] + [j for j, t in accepted if t in eos])
        if stop is not None and new:
            end = _stop_end(prompt, tokens, new, end, stop)
        stats.accepted_per_iteration.append(sum(1 for j in new if j <= end))
        tokens = {j: t for j, t in tokens.items() if j <= end}
        pending = [(j, t) for j, t in pending if j <= end]
        dropped = next((i for i, (j, _) in enumerate(cached) if j > end), None)
        if dropped is not None:  # rows cached after a dropped one attended to it: process them again
            if origin + dropped < evicted:
                raise ValueError("A stop dropped a token the sliding context had already evicted; use a "
                                 "block_size of at least 4 * speculative_width, stop_at_eos=False or "
                                 "native_context='full'.")
            cache.crop(origin + dropped - evicted - cache.get_seq_length())
            pending = [(j, t) for j, t in cached[dropped:] if j <= end] + pending
            cached = cached[:dropped]
        if streamer is not None:
            ready = streamed
            while ready in tokens:
                ready += 1
            if ready > streamed:
                span = range(streamed, ready)
                stream(streamer, torch.tensor([tokens[j] for j in span]), [kinds[j] for j in span])
                streamed = ready
    _sync(device)
    stats.new_tokens = len(tokens)
    stats.decoder_time_s = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    out = torch.tensor([tokens[j] for j in range(len(tokens))], dtype=torch.long, device=device)
    return torch.cat([prompt, out]), stats
