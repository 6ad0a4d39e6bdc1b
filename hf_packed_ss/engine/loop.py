"""The one decoding loop: it drives every schedule on every layout.

Each iteration takes the active window from the layout, lets the schedule plan one call, lays it out, calls
the model, applies the user's logits processors, lets the schedule decide, commits the KV cache (the pending
rows N plus the accepted draft rows: one crop) and applies the stopping rule: an accepted EOS at j, a stop
criterion met by a run of accepted tokens ending at j, or the length limit sets E = min(E, j) (Algorithm 1,
lines 7-8; Algorithm 3, lines 11-13; appendix E.2). Positions after E are dropped and unresolved ones before
it are still filled. The output is the prompt followed by positions 0..E. It counts NFE, rows and time.

The loop is a coroutine (`decoding`): it yields each call and is sent that call's logits, so the same code
decodes one sequence (`decode`, which calls the model itself) and every row of a batch (`batch.decode_batch`,
one batched forward per round over the rows' calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .contract import CallResult, PackedCall, Plan, Verdict
from .state import DecoderState
from .stats import DecodingStats

# forward(call, cache) -> (r, V) logits of the call's kept rows (`call.logit_rows`)
Forward = Callable[[PackedCall, DynamicCache], torch.Tensor]
# `decoding(...)`: yields calls, is sent their logits, returns (prompt + output, stats)
Steps = Generator[PackedCall, torch.Tensor, tuple[torch.Tensor, DecodingStats]]


@dataclass(frozen=True)
class Step:
    """One call as the trace hook sees it: the plan, the built call, the logits, the processed result and
    the verdict."""

    plan: Plan
    call: PackedCall
    logits: torch.Tensor
    result: CallResult
    verdict: Verdict


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(forward, call: PackedCall, cache) -> tuple[torch.Tensor, float]:
    """One device-synchronised model call: its logits and the seconds it took (model time)."""
    tic = time.perf_counter()
    logits = forward(call, cache)
    _sync(logits.device)
    return logits, time.perf_counter() - tic


def ask(call: PackedCall, stats: DecodingStats):
    """One counted call (NFE, rows) of a `decoding` coroutine: yields it, returns the logits sent back."""
    stats.count_call(call.rows)
    return (yield call)


def plan_call(schedule, layout, state: DecoderState, stats: DecodingStats) -> tuple[Plan, PackedCall]:
    """An iteration's ask: the schedule plans the call over the layout's window (an auto schedule picks its width
    first), the layout lays it out."""
    schedule.choose(stats)
    plan = schedule.plan(layout.window(state.left, state.end, schedule.width, state.ahead))
    return plan, layout.build(plan, state)


def end_stream(streamer, stats: DecodingStats) -> None:
    """A sequence ended: its streamer gets its statistics (if it takes them: a server answers a row as soon as it
    ends) and `end()`."""
    if streamer is None:
        return
    if hasattr(streamer, "put_stats"):
        streamer.put_stats(stats)
    streamer.end()


def stream(streamer, tokens: torch.Tensor, kinds: list[str]) -> None:
    """Streamers get `put(tokens)`; one that defines `put_iteration(tokens, kinds)` also gets provenance."""
    if hasattr(streamer, "put_iteration"):
        streamer.put_iteration(tokens.cpu(), kinds)
    else:
        streamer.put(tokens.cpu())


def process(processors, result: CallResult, plan: Plan, state: DecoderState) -> CallResult:
    """Apply a `LogitsProcessorList` to every verifier and proposal row with the ids it conditions on, exactly
    as stock `generate` would at that position: the prompt and the known tokens (accepted, or the draft at
    earlier ranks) that continue it without a gap (P + d^(<r) under left-to-right order). Any processing of a
    proposal keeps exactness, since each draft token is verified against the Q it was drawn from."""
    if not processors:
        return result
    kappa = plan.available
    state.write(plan.order[:kappa], plan.draft.tolist())  # the draft, in the scratch after P
    ends: dict[int, int] = {}

    def ids(rank: int, before: int) -> torch.Tensor:
        """Context of the row scoring `rank` that knows the draft at ranks < `before`."""
        if before not in ends:
            known, j = set(plan.order[: min(before, kappa)]), state.left
            while state.accepted(j) or j in known:
                j += 1
            ends[before] = j
        return state.prefix(min(ends[before], plan.position(rank)))

    def rows(logits: torch.Tensor, ranks: range, before: Callable[[int], int]) -> torch.Tensor:
        if not logits.shape[0]:
            return logits
        return torch.cat([processors(ids(r, before(r))[None], logits[i : i + 1]) for i, r in enumerate(ranks)])

    verifier = None if result.verifier is None else rows(result.verifier, range(plan.verify_ranks), lambda r: r)
    proposals = [rows(logits, ranks, lambda r, b=p.branch: b)
                 for p, logits, ranks in zip(plan.proposals, result.proposals, result.proposal_ranks, strict=True)]
    return CallResult(verifier=verifier, proposals=proposals, proposal_ranks=result.proposal_ranks)


def crop_left(cache: DynamicCache, rows: int) -> None:
    """Drop the `rows` oldest rows of every layer of a DynamicCache (the release's `_crop_kv_cache_left`); a
    batch row's cache drops them itself."""
    if hasattr(cache, "crop_left"):
        cache.crop_left(rows)
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[..., rows:, :]
            layer.values = layer.values[..., rows:, :]


def fit_context(schedule, layout, plan: Plan, call: PackedCall, state: DecoderState, cache, stats: DecodingStats):
    """Keep cache + call rows within `schedule.context_length` (SetDLM's sliding context): a first call that
    would not fit processes the prompt in a call of its own, then the oldest cache rows are dropped."""
    limit = schedule.context_length
    if limit is None or state.cache_len + call.rows <= limit:
        return call
    if not state.cache_len:  # the prompt first, in a call of its own
        yield from ask(layout.build(Plan(order=()), state), stats)
        state.commit(len(state.pending), (), ())
        call = layout.build(plan, state)
    overflow = state.cache_len + call.rows - limit
    if overflow >= state.cache_len:
        raise ValueError(f"A call of {call.rows} rows does not fit a context of {limit} rows: use a smaller "
                         "speculative_width or native_context='full'.")
    if overflow > 0:
        crop_left(cache, overflow)
        state.evicted += overflow
        state.cache_len -= overflow
        call = layout.build(plan, state)
    return call


def stop_end(state: DecoderState, new, floor: int, stop) -> int:
    """The earliest j <= E where a run of accepted tokens meets `stop` (or E). `stop(sequence)` is asked about
    every accepted run that ends at or after a newly accepted position; a run from position 0 carries the
    prompt in front, so under left-to-right order this is exactly stock generate's check after every token.
    `floor`: every position below it was accepted before this call."""
    last = max([*new, *state.ahead, state.left - 1])  # the reach of the runs through a new position
    for j in range(min(new), min(last, state.end) + 1):
        if not state.accepted(j):
            continue
        start = state.run_start(j, floor)
        run = state.prefix(j + 1) if start == 0 else state.buffer[state.origin + start : state.origin + j + 1]
        if stop(run):
            return j
    return state.end


def decoding(schedule, layout, prompt: torch.Tensor, max_new_tokens: int, eos_token_ids: Iterable[int] = (),
             processors=None, stop: Callable[[torch.Tensor], bool] | None = None, streamer=None, cache=None,
             trace: Callable[[Step], None] | None = None, stats: DecodingStats | None = None) -> Steps:
    """The loop for one sequence, as a coroutine: yields each `PackedCall`, is sent its logits (the kept rows,
    ``(r, V)``), returns (prompt + output as a 1D tensor, stats). The arguments are `decode`'s; `cache` is what
    the forward fills (a DynamicCache, or a batch row's view of the batch's cache): the loop only crops it.
    Timing is the driver's."""
    eos = frozenset(int(e) for e in eos_token_ids) if schedule.stop_at_eos else frozenset()
    if stats is None:
        stats = new_stats(schedule)
    origin = prompt.numel()
    limit = schedule.context_length
    if limit is not None and origin > limit:
        raise ValueError(f"The prompt ({origin} tokens) is longer than the context of {limit} rows the cache is "
                         "cropped to: shorten the prompt or use native_context='full'.")
    state = DecoderState(prompt, max_new_tokens, 2 * (schedule.width + 1))
    schedule.begin(layout, max_new_tokens, prompt.device)
    kinds: dict[int, str] = {}  # how each accepted position was produced (for provenance streamers)
    streamed = 0
    if streamer is not None:
        streamer.put(prompt.cpu())
    while state.left <= state.end and not cancelled(streamer):  # a consumer that left ends it early
        # 1. ask: the schedule plans the call over the window, the layout lays it out
        plan, call = plan_call(schedule, layout, state, stats)
        if limit is not None:
            call = yield from fit_context(schedule, layout, plan, call, state, cache, stats)
        # 2. one model call
        logits = yield from ask(call, stats)
        # 3. verify and draft
        result = process(processors, call.read(logits), plan, state)
        verdict = schedule.advance(plan, result)
        if trace is not None:
            trace(Step(plan, call, logits, result, verdict))
        # 4. commit the cache: N and the accepted draft rows (cacheable rows come first: one crop)
        h = verdict.h
        if call.rows_to_cache(h) < call.rows:  # the rows that stay are first: one crop drops the rest
            cache.crop(call.rows_to_cache(h) - call.rows)
        state.commit(call.cache_rows_before_draft, verdict.positions[:h], verdict.positions[h:])
        if not verdict.verified:
            continue
        # 5. stop exactly at EOS / length / stopping criteria (Algorithm 1, lines 7-8)
        floor, before = state.left, state.end
        new = state.accept(verdict.positions, verdict.tokens, verdict.values)
        if streamer is not None:
            kinds.update(zip(verdict.positions, verdict.kinds, strict=True))
        if eos:
            state.end = min([before] + [j for j, t in zip(verdict.positions, verdict.tokens, strict=True)
                                        if t in eos and j <= before])
        end = state.end
        if stop is not None and new:
            end = stop_end(state, new, floor, stop)
        stats.count_iteration(len(new) if end == before else sum(1 for j in new if j <= end), *schedule.current())
        if end < before:
            roll_back(state, state.drop_after(end), cache)
        if streamer is not None and state.left > streamed:
            run = state.prefix()[origin + streamed :].clone()
            stream(streamer, run, [kinds[j] for j in range(streamed, state.left)])
            streamed = state.left
    stats.new_tokens = state.left
    end_stream(streamer, stats)
    return state.prefix().clone(), stats


def cancelled(streamer) -> bool:
    """A streamer whose `cancelled` is true wants no more tokens: its sequence ends after the current
    iteration (with the tokens accepted so far), and in a batch it leaves, freeing its row."""
    return bool(getattr(streamer, "cancelled", False))


def new_stats(schedule) -> DecodingStats:
    return DecodingStats(schedule=schedule.name, width=schedule.width if schedule.speculative else 0,
                         speculative_branches=schedule.speculative_branches)


def decode(
    forward: Forward,
    schedule,
    layout,
    prompt: torch.Tensor,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    processors=None,
    stop: Callable[[torch.Tensor], bool] | None = None,
    streamer=None,
    cache: DynamicCache | None = None,
    trace: Callable[[Step], None] | None = None,
) -> tuple[torch.Tensor, DecodingStats]:
    """Decode one sequence. `prompt` is a 1D LongTensor; returns (prompt + output as a 1D tensor, stats).

    `processors` is a transformers `LogitsProcessorList` (or None); sampling vs greedy is the schedule's
    acceptance policy. `stop(sequence)` is asked after every accepted token. `streamer` gets the prompt, then
    each newly contiguous run of output; one that turns `cancelled` ends the decode early (`cancelled`).
    `trace(step)` sees every call (tests, the candidate generator)."""
    cache = DynamicCache() if cache is None else cache
    stats = new_stats(schedule)
    device = prompt.device
    start = time.perf_counter()
    _sync(device)
    steps = decoding(schedule, layout, prompt, max_new_tokens, eos_token_ids, processors, stop, streamer, cache,
                     trace, stats)
    try:
        call = next(steps)
        logits, stats.prompt_time_s = timed(forward, call, cache)
        stats.model_time_s += stats.prompt_time_s
        while True:
            call = steps.send(logits)
            logits, spent = timed(forward, call, cache)
            stats.model_time_s += spent
    except StopIteration as done:
        sequence, stats = done.value
    _sync(device)
    stats.decoder_time_s = time.perf_counter() - start
    return sequence, stats


def roll_back(state: DecoderState, dropped: int | None, cache: DynamicCache) -> None:
    """A stop dropped the cached row at index `dropped` of `state.cached`: the rows cached after it attended to
    it, so they leave the cache and are processed again (before the pending ones)."""
    if dropped is None:
        return
    if state.origin + dropped < state.evicted:
        raise ValueError("A stop dropped a token the sliding context had already evicted; use a block_size of at "
                         "least 4 * speculative_width, stop_at_eos=False or native_context='full'.")
    keep = state.origin + dropped - state.evicted
    cache.crop(keep - state.cache_len)
    state.cache_len = keep
    state.pending = [j for j in state.cached[dropped:] if j <= state.end] + list(state.pending)
    state.cached = list(state.cached[:dropped])
