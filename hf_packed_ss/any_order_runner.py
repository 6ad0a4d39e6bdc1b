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


class Output:
    """The accepted tokens P_t by output position: a dict for membership, and the sequence [prompt | output] in one
    buffer, so that a contiguous run from position 0 is a view (stopping criteria, logits processors) and no
    iteration scans the whole output. `left` is the leftmost unresolved position, kept incrementally."""

    def __init__(self, prompt: torch.Tensor, max_new_tokens: int):
        self.origin = prompt.numel()
        self._sequence = torch.cat([prompt, prompt.new_zeros(max_new_tokens)])
        self._unwritten: list[tuple[int, int]] = []  # accepted pairs not yet in the buffer (written when read)
        self.tokens: dict[int, int] = {}
        self.left = 0

    @property
    def sequence(self) -> torch.Tensor:
        if self._unwritten:  # one write for every pair accepted since the last read
            positions, tokens = zip(*self._unwritten, strict=True)
            self._sequence[torch.tensor(positions) + self.origin] = torch.tensor(tokens, dtype=self._sequence.dtype)
            self._unwritten = []
        return self._sequence

    def accept(self, pairs: list[tuple[int, int]]) -> None:
        self._unwritten += pairs
        self.tokens.update(pairs)
        while self.left in self.tokens:
            self.left += 1

    def drop_after(self, end: int) -> None:
        """Forget every position past `end` (a stop at `end`); the buffer keeps stale ids there, never read."""
        for j in [j for j in self.tokens if j > end]:  # only positions of the last windows can lie past `end`
            del self.tokens[j]
        self.left = min(self.left, end + 1)

    def run_start(self, j: int, floor: int) -> int:
        """The first position of the contiguous run of accepted positions that ends at `j`; every position below
        `floor` is accepted, so the walk takes at most j - floor steps."""
        start = j
        while start > 0 and start - 1 in self.tokens:
            if start - 1 < floor:
                return 0
            start -= 1
        return start

    def prefix(self, length: int) -> torch.Tensor:
        """The prompt and output positions 0..length-1 (a view; they must all be accepted)."""
        return self.sequence[: self.origin + length]


def _context(output: Output, drafts: dict[int, int], position: int) -> torch.Tensor:
    """Ids a logits processor sees for a row at `position`: the prompt and the known tokens (accepted, or the
    draft tokens of earlier ranks) that continue it without a gap (exactly P + d^(<r) under LTR order). Positions
    below `left` are all accepted, so only the window is walked."""
    j, extra = output.left, []
    while j < position and (j in output.tokens or j in drafts):
        extra.append(output.tokens[j] if j in output.tokens else drafts[j])
        j += 1
    head = output.prefix(output.left)
    return torch.cat([head, torch.tensor(extra, dtype=torch.long, device=head.device)]) if extra else head


def process(processors, result: CallResult, plan: WindowPlan, output: Output):
    """Apply a `LogitsProcessorList` to every verifier and proposal row with the ids it conditions on."""
    if not processors:
        return result

    def known(before_rank: int) -> dict[int, int]:
        return {j: d for j, d in zip(plan.order[:before_rank], plan.draft or (), strict=False) if d is not None}

    def rows(logits: torch.Tensor, ranks: range, before: Callable[[int], int]) -> torch.Tensor:
        """Row i holds rank ranks[i]; a region may have no rows at all."""
        if not logits.shape[0]:
            return logits
        return torch.cat([
            processors(_context(output, known(before(r)), plan.order[r])[None], logits[i : i + 1])
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


def _stop_end(output: Output, new: list[int], floor: int, last: int, end: int, stop) -> int:
    """The earliest j <= end where a stop marker whose tokens are all accepted ends (or `end`).

    `stop(sequence)` is asked about every accepted run that ends at or after a newly accepted position;
    a run starting at position 0 carries the prompt in front, so under LTR order this is exactly
    stock generate's check after every token. `floor`: every position below it was accepted before this call;
    `last`: the window's last position (no accepted position lies beyond it)."""
    for j in range(min(new), min(last, end) + 1):
        if j not in output.tokens:
            continue
        start = output.run_start(j, floor)
        run = output.prefix(j + 1) if start == 0 else output.sequence[output.origin + start : output.origin + j + 1]
        if stop(run):
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
    stats = DecodingStats(schedule=schedule.name, width=schedule.width if schedule.speculative else 0,
                          speculative_branches=getattr(schedule, "speculative_branches", None))
    device, origin = prompt.device, prompt.numel()
    cache = DynamicCache() if cache is None else cache
    limit = schedule.context_length
    if limit is not None and origin > limit:
        raise ValueError(f"The prompt ({origin} tokens) is longer than the context of {limit} rows the cache is "
                         "cropped to: shorten the prompt or use native_context='full'.")
    evicted = 0  # rows dropped from the left of [prompt, cached] (only with context_length)
    schedule.begin(max_new_tokens, device)
    output = Output(prompt, max_new_tokens)  # dom(P_t) -> token, output positions
    end = max_new_tokens - 1  # E
    pending = [(i - origin, int(t)) for i, t in enumerate(prompt.tolist())]  # N: accepted, not yet in the cache
    cached: list[tuple[int, int]] = []  # cache rows after the prompt, in cache order
    streamed = 0
    kinds: dict[int, str] = {}  # how each accepted position was produced (for provenance streamers)
    start = time.perf_counter()
    _sync(device)
    if streamer is not None:
        streamer.put(prompt.cpu())
    while output.left <= end:
        left = output.left
        window = [j for j in range(left, min(end, left + schedule.width - 1) + 1) if j not in output.tokens]
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
        result = process(processors, call.read(logits), plan, output)
        outcome = schedule.advance(plan, result)
        accepted, h = outcome if outcome is not None else ([], 0)
        # 4. commit the cache: N and the accepted draft rows
        cache.crop(call.rows_to_cache(h) - call.rows)
        cached += [(j, t) for j, t in pending if j >= 0] + accepted[:h]
        pending = accepted[h:]
        if outcome is None:
            continue
        # 5. stopping (Algorithm 3, lines 11-13; appendix E.2 markers)
        output.accept(accepted)
        rest = "committed" if not plan.verify else "correction" if plan.available else "verifier"
        kinds.update((j, "draft" if r < h else rest) for r, (j, _) in enumerate(accepted))
        new = [j for j, _ in accepted]
        before = end
        end = min([end] + [j for j, t in accepted if t in eos])
        if stop is not None and new:
            end = _stop_end(output, new, left, left + schedule.width - 1, end, stop)
        stats.accepted_per_iteration.append(sum(1 for j in new if j <= end))
        dropped = None
        if end < before:  # a stop: forget what lies past E (scans here happen once per stop, not per iteration)
            output.drop_after(end)
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
        if streamer is not None and output.left > streamed:
            span = range(streamed, output.left)
            stream(streamer, output.prefix(output.left)[origin + streamed :].clone(), [kinds[j] for j in span])
            streamed = output.left
    _sync(device)
    stats.new_tokens = len(output.tokens)
    stats.decoder_time_s = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    return output.prefix(stats.new_tokens).clone(), stats
