"""Many sequences, one model call per round: every row runs the one loop (`loop.decoding`) unchanged, and each
round packs the rows' calls into one batched call over one KV cache.

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
from .batch_cache import Arrival, BatchCache, BatchForward, RowCache
from .contract import PackedCall
from .loop import _sync, decoding, new_stats, timed
from .stats import DecodingStats


def pack(calls: Sequence[PackedCall], valid: torch.Tensor, pad_token_id: int) -> tuple[PackedCall, list, list]:
    """One batched call from the rows' calls. Returns it, each row's column map (its call row i sits at column
    `columns[b][i]`, a host list) and, per row, the indices of its kept logit rows among the batched call's kept
    rows (None: all of them, in order)."""
    first = calls[0]
    n, cached = len(calls), valid.shape[1]
    if all(c.new_rows_mask is first.new_rows_mask and c.logit_rows is first.logit_rows for c in calls[1:]) and (
            first.new_rows_mask is not None):  # one call shape (the steady state): concatenate
        q = first.rows
        ids = torch.cat([c.input_ids for c in calls])
        positions = torch.cat([c.position_ids for c in calls])
        new = first.new_rows_mask.expand(n, q, q)
        mask = torch.cat([valid[:, None, :].expand(n, q, cached), new], dim=2)[:, None]
        batched = PackedCall(input_ids=ids, position_ids=positions, attention_mask=mask,
                             logit_rows=first.logit_rows, verifier_rows=None, proposal_rows=[],
                             cache_rows_before_draft=0, proposal_start=first.proposal_start)
        return batched, [range(q)] * n, [None] * n
    device = valid.device
    starts = [c.proposal_start for c in calls]
    head = max(starts)  # the shared proposal start
    q = head + max(c.rows - s for c, s in zip(calls, starts, strict=True))
    ids = torch.full((n, q), pad_token_id, dtype=torch.long, device=device)
    positions = torch.zeros(n, q, dtype=torch.long, device=device)
    new = torch.eye(q, dtype=torch.bool, device=device).repeat(n, 1, 1)  # a padding row sees itself only
    columns, kept = [], []
    for b, (call, s) in enumerate(zip(calls, starts, strict=True)):
        rows, tail = call.rows, call.rows - s
        template = call.new_rows_mask if call.new_rows_mask is not None else call.attention_mask[0, 0, :, -rows:]
        ids[b, :s], ids[b, head : head + tail] = call.input_ids[0, :s], call.input_ids[0, s:]
        positions[b, :s], positions[b, head : head + tail] = call.position_ids[0, :s], call.position_ids[0, s:]
        new[b, :s, :s], new[b, :s, head : head + tail] = template[:s, :s], template[:s, s:]
        new[b, head : head + tail, :s] = template[s:, :s]
        new[b, head : head + tail, head : head + tail] = template[s:, s:]
        column = [*range(s), *range(head, head + tail)]
        columns.append(column)
        kept.append(torch.tensor(column, device=device)[call.logit_rows])
    union = torch.unique(torch.cat(kept))  # sorted
    reads = [torch.searchsorted(union, k) for k in kept]
    mask = torch.cat([valid[:, None, :].expand(n, q, cached), new], dim=2)[:, None]
    batched = PackedCall(input_ids=ids, position_ids=positions, attention_mask=mask, logit_rows=union,
                         verifier_rows=None, proposal_rows=[], cache_rows_before_draft=0, proposal_start=head)
    return batched, columns, reads


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
    tensors (`lockstep.py`; by default whenever the batch can: greedy AR or Packed-SS on the plain shifted-block
    layout, stopped by EOS and the length limit only), else each row in its own loop. `cache`: the batch's KV
    cache (default a fresh DynamicCache; a `SlotCache` for a compiled lockstep batch). `streamers`: one streamer
    (or None) per row, fed as `decode` feeds its one; a row whose streamer turns `cancelled` leaves the batch
    after the round, with the tokens it has (a server's client that disconnected frees its row). `admit()` is
    asked after every round for `Arrival`s that join the running batch (continuous batching: a server's new
    requests; each decodes as alone, with its own limit; over a `SlotCache` they take its free rows, and wait for
    one when none is free); their outputs and `per_row`
    statistics follow the batch's own rows', in the order they joined."""
    device = prompts[0].device
    slack = 8 * (max(s.width for s in schedules) + 1) if slack is None else slack
    can = tensors.eligible(schedules, layouts, processors, stop)
    if lockstep and not can:
        raise ValueError("lockstep=True needs greedy AR or Packed-SS rows of one width on the plain shifted-block "
                         "layout, stopped by EOS and the length limit only.")
    if can if lockstep is None else lockstep:
        return tensors.decode_lockstep(forward, schedules, prompts, max_new_tokens, eos_token_ids, pad_token_id,
                                       layouts[0].mask_token_id, slack, trace, cache, streamers, admit)
    streamers = [None] * len(prompts) if streamers is None else list(streamers)
    eos = tuple(eos_token_ids)
    if cache is not None:
        raise ValueError("Only a lockstep batch decodes over a given cache.")
    batch = BatchCache(0, slack, device)
    first = new_stats(schedules[0])
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

    join([Arrival(*x) for x in zip(schedules, layouts, prompts, [max_new_tokens] * len(prompts), streamers,
                                   strict=True)])
    if admit is not None:
        join(admit())
    while active:
        batch.drop()  # what a row cropped before its call (a sliding context) is gone before the call
        call, columns, reads = pack(calls, batch.valid, pad_token_id)
        logits, spent = timed(forward, call, batch.cache)
        total.nfe += 1
        total.rows_per_call.append(call.input_ids.numel())
        total.model_time_s += spent
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
