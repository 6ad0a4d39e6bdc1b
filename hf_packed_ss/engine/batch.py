"""Many sequences, one model call per round. `decode_batch` chooses, in one place (`tensorised`), between two
paths that give every row exactly its batch-1 tokens: the lockstep one (`lockstep.py`: every row's state a row of
a tensor) when every row can take it, else `decode_rows`: every row runs the one loop (`loop.decoding`)
unchanged, and each round packs the rows' calls into one batched call over one KV cache (`batch_cache.pack`).

Why a row stays exactly its batch-1 self: its call is laid out as at batch size 1, and its columns keep their
order in the batched call: the rows before its proposal start (the cacheable ones first) from column 0, its
proposal rows from one column shared by every row (so the proposal-only adapter has one start and one crop
removes proposals for all rows). The columns a row does not fill are padding rows that see only themselves.
Every row sees only its own cache slots: a per-row validity mask over the cache is folded into the boolean 4D
mask, so a masked slot contributes exactly nothing. The slots a row's verdict rejects become holes of that
row; columns no row keeps are cropped at once, and when the cache is more than `slack` columns longer than
the longest row's own cache it is compacted (each row's slots gathered, left-padded). A finished row leaves
the batch: no compute is spent on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import torch

from . import lockstep as tensors
from .acceptance import Greedy
from .batch_cache import Arrival, BatchCache, BatchForward, RowCache, pack
from .contract import PackedCall
from .loop import _sync, decoding, new_stats, timed
from .schedules import ARSchedule, PackedSSSchedule
from .stats import DecodingStats


def tensorised(schedules: Sequence, layouts: Sequence, processors, stop) -> bool:
    """Whether the batch can decode in lockstep (`lockstep.py`): greedy AR or Packed-SS of one width in
    left-to-right order, stopped only by EOS and the length limit, on layouts that describe their steady call
    (`steady_call`: both families' layouts; a test drafter that rewrites its calls sets it to None). The one rule:
    `decode_batch` and the static-cache front ask it."""
    first = schedules[0]
    return (not processors and stop is None and type(first) in (ARSchedule, PackedSSSchedule)
            and all(type(s) is type(first) and s.width == first.width and type(s.acceptance) is Greedy
                    and not s.scores_order and s.stop_at_eos and s.context_length is None for s in schedules)
            and all(type(layout) is type(layouts[0]) for layout in layouts) and describes_its_calls(layouts[0]))


def describes_its_calls(layout) -> bool:
    """Whether `layout.steady_call` describes the calls `layout.build` makes: both come from one class, so a
    subclass that changes `build` (and not `steady_call`) decodes row by row, never on a template it does not
    make."""
    def owner(name: str):
        return next((k for k in type(layout).__mro__ if name in vars(k)), None)

    return callable(getattr(layout, "steady_call", None)) and owner("steady_call") is owner("build")


def decode_batch(forward: BatchForward, schedules: Sequence, layouts: Sequence, prompts: Sequence[torch.Tensor],
                 max_new_tokens: int, eos_token_ids: Iterable[int] = (), processors=None,
                 stop: Callable[[torch.Tensor], bool] | None = None, pad_token_id: int = 0,
                 slack: int | None = None, trace: Callable[[BatchCache, PackedCall], None] | None = None,
                 lockstep: bool | None = None, cache=None, streamers: Sequence | None = None,
                 admit: Callable[[], Sequence[Arrival]] | None = None) -> tuple[list[torch.Tensor], DecodingStats]:
    """Decode `prompts` (1D LongTensors) together, row b with `schedules[b]` on `layouts[b]` (one of each per
    row: they hold that row's draft and mask buffer). Returns every row's prompt + output, as `decode` would
    return it alone, and the batch's statistics: `nfe` batched calls, `rows_per_call` the rows each computed
    (padding included), `accepted_per_iteration` the tokens all rows accepted per call, `new_tokens` over all
    rows, and `per_row` each row's own (its calls and rows as at batch 1; charged the model time of every
    call it is in; its decoder time ends when it finishes). `slack`: compact the cache once it is that many
    columns longer than the longest row's own cache (default 8 blocks of the widest schedule).
    `trace(batch_cache, call)` sees every call after its commit (tests). `lockstep`: decode every row in the same
    tensors (`lockstep.py`; by default whenever the batch can, `tensorised`: greedy AR or Packed-SS, left to right,
    stopped by EOS and the length limit only, on either family), else each row in its own loop (`decode_rows`).
    `cache`: the batch's KV cache (default a fresh DynamicCache; a `SlotCache` for a compiled lockstep batch).
    `streamers`: one streamer (or None) per row, fed as `decode` feeds its one; a row whose streamer turns
    `cancelled` leaves the batch after the round, with the tokens it has (a server's client that disconnected
    frees its row). `admit()` is asked after every round for `Arrival`s that join the running batch (continuous
    batching: a server's new requests; each decodes as alone, with its own limit; over a `SlotCache` they take its
    free rows, and wait for one when none is free); their outputs and `per_row` statistics follow the batch's own
    rows', in the order they joined."""
    slack = 8 * (max(s.width for s in schedules) + 1) if slack is None else slack
    can = tensorised(schedules, layouts, processors, stop)
    if lockstep and not can:
        raise ValueError("lockstep=True needs greedy AR or Packed-SS rows of one width in left-to-right order, "
                         "stopped by EOS and the length limit only, on a layout with a steady call.")
    streamers = [None] * len(prompts) if streamers is None else list(streamers)
    rows = [Arrival(*x) for x in zip(schedules, layouts, prompts, [max_new_tokens] * len(prompts), streamers,
                                     strict=True)]
    if can if lockstep is None else lockstep:
        return tensors.decode_lockstep(forward, rows, eos_token_ids, pad_token_id, slack, trace, cache, admit)
    if cache is not None:
        raise ValueError("Only a lockstep batch decodes over a given cache.")
    return decode_rows(forward, rows, eos_token_ids, processors, stop, pad_token_id, slack, trace, admit)


def decode_rows(forward: BatchForward, arrivals: Sequence[Arrival], eos_token_ids: Iterable[int], processors,
                stop, pad_token_id: int, slack: int, trace=None, admit=None
                ) -> tuple[list[torch.Tensor], DecodingStats]:
    """Every row in its own loop (see the module docstring); the arguments and result are `decode_batch`'s."""
    device = arrivals[0].prompt.device
    eos = tuple(eos_token_ids)
    batch = BatchCache(0, slack, device)
    first = new_stats(arrivals[0].schedule)
    stats: list[DecodingStats] = []
    total = DecodingStats(schedule=first.schedule, width=first.width, speculative_branches=first.speculative_branches,
                          per_row=stats)
    out: list[torch.Tensor | None] = []
    start = time.perf_counter()
    _sync(device)
    active, calls, steps = [], [], []

    def finish(b: int, done: StopIteration) -> None:
        out[b] = done.value[0]
        stats[b].decoder_time_s = time.perf_counter() - start

    def join(arrivals: Sequence[Arrival]) -> None:
        """Start each arrival's loop; one that has something to decode gets an empty row of the cache."""
        for a in arrivals:
            b, row = len(out), RowCache()
            out.append(None)
            stats.append(new_stats(a.schedule))
            run = decoding(a.schedule, a.layout, a.prompt, a.max_new_tokens, eos, processors, stop, a.streamer, row,
                           None, stats[b])
            try:
                calls.append(next(run))
            except StopIteration as done:  # nothing to decode (max_new_tokens=0)
                finish(b, done)
                continue
            active.append(b)
            steps.append(run)
            batch.add(row)

    join(arrivals)
    if admit is not None:
        join(admit())
    while active:
        batch.drop()  # what a row cropped before its call (a sliding context) is gone before the call
        call, columns, reads = pack(calls, batch.valid, pad_token_id)
        logits, spent = timed(forward, call, batch.cache)
        total.count_call(call.input_ids.numel(), spent)
        old, accepted, kept, stay = batch.length, 0, [], []
        for i, b in enumerate(active):
            row, s = batch.rows[i], stats[b]
            iterations = len(s.accepted_per_iteration)
            row.slots += [old + c for c in columns[i]]
            s.model_time_s += spent
            try:
                calls[i] = steps[i].send(logits[i] if reads[i] is None else logits[i, reads[i]])
                stay.append(i)
            except StopIteration as done:
                finish(b, done)
            accepted += sum(s.accepted_per_iteration[iterations:])
            # the call's columns the row still holds are a prefix of them, less any it dropped from the left
            kept.append(row.slots[-1] - old + 1 if row.slots and row.slots[-1] >= old else 0)
        total.accepted_per_iteration.append(accepted)
        batch.commit(kept, call.rows)
        if trace is not None:
            trace(batch, call)
        batch.leave(stay)
        active, calls, steps = [active[i] for i in stay], [calls[i] for i in stay], [steps[i] for i in stay]
        if admit is not None:
            join(admit())
    _sync(device)
    total.decoder_time_s = time.perf_counter() - start
    total.new_tokens = sum(s.new_tokens for s in stats)
    return out, total
