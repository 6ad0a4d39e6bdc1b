"""The cache of a batch and its packed calls: which physical KV-cache columns each row sees (`RowCache`,
`BatchCache`), rows joining a running batch (`Arrival`, `stack_rows`), per-row column gathers (`gather_columns`)
and one batched call from the rows' own calls (`pack`). Shared by the per-row batch loop (`batch.decode_rows`)
and the lockstep one (`lockstep.decode_lockstep`, whose prompt calls are the rows' own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .contract import PackedCall

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
    static = hasattr(batch.cache, "append_rows")
    if static:
        batch.cache.append_rows(cache, rows)  # in place; with no row left it starts over at slot 0
        size = batch.cache.length
        batch.valid = batch.valid if rows else batch.valid[:, :0]
    elif not rows:  # nobody left in the batch: the new rows' cache is the batch's
        batch.cache, batch.valid = cache, valid
        return
    else:
        size = max(batch.length, valid.shape[1])

    def left(t: torch.Tensor, dim: int) -> torch.Tensor:
        pad = [0, 0] * (t.dim() - 1 - dim) + [size - t.shape[dim], 0]
        return torch.nn.functional.pad(t, pad)

    if not static:
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
