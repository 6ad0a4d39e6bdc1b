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
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .contract import PackedCall
from .loop import _sync, decoding, new_stats, timed
from .stats import DecodingStats

# forward(call, cache) -> (batch, r, V) logits of the call's kept rows, for a call with a batch dimension
BatchForward = Callable[[PackedCall, DynamicCache], torch.Tensor]


@dataclass
class Arrival:
    """A sequence that joins a running batch (`decode_batch(..., admit=...)`): its schedule and layout (one of
    each per row, as for the batch's own rows), its prompt, its own token limit and its streamer."""

    schedule: object
    layout: object
    prompt: torch.Tensor
    max_new_tokens: int
    streamer: object = None


class RowCache:
    """One row's view of the batch's cache: the physical columns that hold its cache, in order. The loop crops
    it as it would crop a DynamicCache; the batch applies the crops to the validity mask after the round and,
    for a crop made before a call (a sliding context), before the batched call."""

    def __init__(self):
        self.slots: list[int] = []
        self.dropped: list[int] = []  # columns cropped and not yet masked

    def get_seq_length(self) -> int:
        return len(self.slots)

    def crop(self, rows: int) -> None:
        """transformers' `crop`: a negative count drops that many of the newest rows."""
        if rows < 0:
            self.dropped += self.slots[rows:]
            del self.slots[rows:]

    def crop_left(self, rows: int) -> None:
        """Drop the `rows` oldest rows (a sliding context)."""
        self.dropped += self.slots[:rows]
        del self.slots[:rows]


class BatchCache:
    """The physical cache of a batch (a DynamicCache with a batch dimension) and which of its columns each
    row may see."""

    def __init__(self, rows: int, slack: int, device: torch.device, cache=None):
        self.cache = DynamicCache() if cache is None else cache
        self.rows = [RowCache() for _ in range(rows)]
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=device)
        self.slack = slack
        self.compactions = 0

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def commit(self, kept: list[int], added: int) -> None:
        """After a call of `added` columns: row i keeps at most the first `kept[i]` of them (its cacheable rows);
        the columns a row cropped (its rejected rows, a roll-back, a sliding context) stop being valid; columns no
        row keeps go."""
        device = self.valid.device
        new = torch.arange(added, device=device)[None] < torch.tensor(kept, device=device)[:, None]
        self.valid = torch.cat([self.valid, new], dim=1)
        self.drop()
        unused = added - max(kept, default=0)
        if unused:
            self.cache.crop(-unused)
            self.valid = self.valid[:, : self.length - unused]
        if self.length - max((len(r.slots) for r in self.rows), default=0) > self.slack:
            self.compact()

    def drop(self) -> None:
        """The columns rows cropped stop being valid."""
        for i, row in enumerate(self.rows):
            if row.dropped:
                self.valid[i, row.dropped] = False
                row.dropped = []

    def add(self, row: RowCache) -> None:
        """A new last row, which sees no column yet (its cache slots are zeros until its first call)."""
        if not self.rows:  # every row left: no column is anyone's, so the batch starts over on a fresh cache
            self.cache, self.valid = DynamicCache(), self.valid[:0, :0]
        self.rows.append(row)
        self.valid = torch.cat([self.valid, self.valid.new_zeros(1, self.length)])
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(1, *layer.keys.shape[1:])])
                layer.values = torch.cat([layer.values, layer.values.new_zeros(1, *layer.values.shape[1:])])

    def leave(self, keep: list[int]) -> None:
        """Only rows `keep` (indices into the current batch) stay."""
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        self.cache.batch_select_indices(index)
        self.valid = self.valid[index]
        self.rows = [self.rows[i] for i in keep]
        if self.rows and self.length - max(len(r.slots) for r in self.rows) > self.slack:
            self.compact()

    def compact(self) -> None:
        """Gather each row's valid columns, in order, to the right of a cache as long as the longest row's
        (left-padded); a row's slots are ascending, so its cache order is kept."""
        counts = self.valid.sum(1)
        size = int(counts.max())
        # a stable sort puts each row's invalid columns first and keeps the order of the valid ones
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, self.length - size :]
        gather_columns(self.cache, order)
        self.valid = torch.arange(size, device=order.device)[None] >= (size - counts)[:, None]
        for r in self.rows:
            r.slots = list(range(size - len(r.slots), size))
        self.compactions += 1


def stack_rows(batch: BatchCache, cache: DynamicCache, valid: torch.Tensor) -> None:
    """Rows that joined (their own DynamicCache, `valid` its columns they see) become the last rows of `batch`:
    both caches are left-padded to the longer one with columns no row sees, so each row's order is kept. A static
    batch cache (a `SlotCache`, whose shapes a compiled graph holds) takes them into its free rows in place."""
    rows = batch.valid.shape[0]
    if hasattr(batch.cache, "append_rows"):
        batch.cache.append_rows(cache, rows)
        size = batch.cache.length
    elif not rows:  # nobody left in the batch: the new rows' cache is the batch's
        batch.cache, batch.valid = cache, valid
        return
    else:
        size = max(batch.length, valid.shape[1])

    def left(t: torch.Tensor, dim: int) -> torch.Tensor:
        pad = [0, 0] * (t.dim() - 1 - dim) + [size - t.shape[dim], 0]
        return torch.nn.functional.pad(t, pad)

    if hasattr(batch.cache, "append_rows"):
        batch.valid = torch.cat([left(batch.valid[:, : size if rows else 0], 1), left(valid, 1)])
        return
    for mine, theirs in zip(batch.cache.layers, cache.layers, strict=True):
        mine.keys = torch.cat([left(mine.keys, 2), left(theirs.keys, 2)])
        mine.values = torch.cat([left(mine.values, 2), left(theirs.values, 2)])
    batch.valid = torch.cat([left(batch.valid, 1), left(valid, 1)])


def gather_columns(cache: DynamicCache, index: torch.Tensor) -> None:
    """Row b of every layer keeps the columns `index[b]` (a `(batch, size)` LongTensor), in that order (a static
    cache gathers in place itself)."""
    if hasattr(cache, "gather_columns"):
        cache.gather_columns(index)
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue
        heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
        where = index[:, None, :, None].expand(-1, heads, -1, dim)
        layer.keys, layer.values = layer.keys.gather(2, where), layer.values.gather(2, where)


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
    from . import lockstep as tensors

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
