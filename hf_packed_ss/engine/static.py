"""Static shapes for compiled calls: a KV cache of fixed slots and calls of one constant number of rows, so one
compiled graph serves every call of a decode after the prompt's (and every later decode that fits the cache).

Why it stays exact: a call of q rows is padded to the decode's `rows` Q with MASK rows that see only
themselves and are never read; its new rows are written at slots ``length .. length + Q - 1`` and every row sees
the slots below `length` (the cache) plus the call's own template. Committing or rolling back the cache only
moves `length` (the loop's `crop`): the slots above it stay in memory, masked, and the next call overwrites
them. The mask is derived from the slot position inside the graph (`slot_mask`), so nothing the size of the
cache is built per call; acceptance stays outside the graph.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from .contract import PackedCall
from .rows import model_free_calls


class SlotLayer(StaticLayer):
    """A static layer that writes a call's rows at its cache's `position` (a device scalar) instead of its own
    running count, so moving the cache back is one host-side number."""

    def __init__(self, capacity: int, cache: SlotCache):
        super().__init__(capacity)
        self.cache = cache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.cache.position + torch.arange(key_states.shape[-2], device=key_states.device)
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        raise NotImplementedError("A SlotCache knows its length: ask the cache.")


class SlotCache(Cache):
    """`capacity` slots per layer (for the batch its first call brings); `length` (host) is the number of slots
    holding the cache.

    The loop sees a transformers cache: `crop(-n)` drops the n newest rows, `crop_left(n)` the n oldest (a
    sliding context: the kept slots move down, a copy per layer), `get_seq_length()` is `length`."""

    is_compileable = True

    def __init__(self, layers: int, capacity: int, device: torch.device | str):
        # one device scalar per slot, made once: pointing a call at its slot is an assignment, not a device op
        self.slots = torch.arange(capacity + 1, device=device).unbind()
        self.position = self.slots[0]  # where the next call writes
        super().__init__(layers=[SlotLayer(capacity, self) for _ in range(layers)])
        self.capacity, self.length = capacity, 0
        self.columns = torch.arange(capacity, device=device)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    def fits(self, rows: int) -> None:
        """Raise before a call of `rows` new rows would write past the last slot."""
        if self.length + rows > self.capacity:
            raise ValueError(f"The static cache holds {self.capacity} rows; this call needs {self.length + rows}. "
                             "Raise max_cache_len (generate(..., max_cache_len=N)) or lower max_new_tokens.")

    def begin_call(self, rows: int) -> None:
        """Point the write position at the end of the cache before a call of `rows` rows."""
        self.fits(rows)
        self.position = self.slots[self.length]

    def end_call(self, rows: int) -> None:
        """The call's first `rows` rows are now the cache's newest (its padding rows lie past `length`)."""
        self.length += rows

    def crop(self, rows: int) -> None:
        """transformers' `crop`: a negative count drops that many of the newest rows (their slots stay, masked)."""
        if rows < 0:
            self.length = max(0, self.length + rows)

    def crop_left(self, rows: int) -> None:
        """Drop the `rows` oldest rows: the rest move down to slot 0 (in place, so compiled graphs keep their
        buffers)."""
        keep = self.length - rows
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[:, :, :keep] = layer.keys[:, :, rows : self.length].clone()
                layer.values[:, :, :keep] = layer.values[:, :, rows : self.length].clone()
        self.length = keep

    def reset(self) -> None:
        self.length = 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Rows `indices` move to the first rows, in place (a batch's finished rows leave; the rows past them keep
        their shape and are never seen again)."""
        m = indices.numel()
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[:m] = layer.keys[indices].clone()
                layer.values[:m] = layer.values[indices].clone()

    @property
    def batch_rows(self) -> int | None:
        """The rows its layers hold (set by the first call's batch), None before any call."""
        layer = self.layers[0]
        return layer.keys.shape[0] if layer.is_initialized else None

    def append_rows(self, cache: Cache, rows: int) -> None:
        """The rows of `cache` (a DynamicCache: rows that joined a running batch, their prompts' KV) become rows
        ``rows..`` of this one, their slots right-aligned with its `length` slots (left-padded to the longer; when
        theirs are longer, rows ``:rows`` move right, in place). Rows ``rows:`` were free (`batch_select_indices`),
        so nothing in use is overwritten; the caller's validity mask says which slots each row sees."""
        new, joining = cache.get_seq_length(), cache.layers[0].keys.shape[0]
        if rows + joining > (self.batch_rows or 0):
            raise ValueError(f"The static cache holds {self.batch_rows} rows; {rows} decode and {joining} more "
                             "would join.")
        length = self.length if rows else 0
        size = max(length, new)
        if size > self.capacity:
            raise ValueError(f"The static cache holds {self.capacity} slots; a joining prompt needs {size}. Raise "
                             "max_cache_len (generate(..., max_cache_len=N)).")
        shift = size - length
        for mine, theirs in zip(self.layers, cache.layers, strict=True):
            for held, joined in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                if shift and rows:
                    held[:rows, :, shift:size] = held[:rows, :, :length].clone()
                held[rows : rows + joining, :, size - new : size] = joined
        self.length = size

    def gather_columns(self, index: torch.Tensor) -> None:
        """Row b keeps the slots `index[b]` (a `(rows, size)` LongTensor), in that order, as slots 0..size-1, in
        place (a batch's compaction)."""
        m, size = index.shape
        for layer in self.layers:
            if layer.is_initialized:
                where = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys[:m, :, :size] = layer.keys[:m].gather(2, where)
                layer.values[:m, :, :size] = layer.values[:m].gather(2, where)
        self.length = size


def slots_needed(prompt: int, max_new_tokens: int, slack: int, rows: int) -> int:
    """The slots a row of a `prompt`-token prompt and `max_new_tokens` needs in a `SlotCache` whose calls have `rows`
    rows: its whole output, the holes a batch leaves before compacting (`slack`), and a call's rows written past
    them (twice, for a call larger than the steady one)."""
    return prompt + max_new_tokens + slack + 2 * rows


def slot_mask(template: torch.Tensor, position: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """The ``(Q, capacity)`` mask of a call written at slot `position`: every row sees the slots below it (the
    cache) and, at the call's own slots, the ``(Q, Q)`` new-rows `template`; slots past them are unused. Built
    from device tensors only (inside a compiled graph: no host number, no recompile)."""
    q = template.shape[-1]
    offset = columns - position
    block = template[..., offset.clamp(0, q - 1)]
    return (offset < 0) | ((offset < q) & block)


def pad_rows(input_ids: torch.Tensor, position_ids: torch.Tensor, rows: int, mask_token_id: int):
    """A call's ids and position ids padded to `rows` rows: MASK rows at its last position."""
    batch, extra = input_ids.shape[0], rows - input_ids.shape[1]
    return (torch.cat([input_ids, input_ids.new_full((batch, extra), mask_token_id)], dim=1),
            torch.cat([position_ids, position_ids[:, -1:].expand(batch, extra)], dim=1))


def pad_template(template: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``(q, q)`` new-rows mask padded to ``(rows, rows)``: each padding row sees only itself, no real row sees
    a padding row (so they are never read and change nothing). Always a new tensor: a layout's cached template may
    have been made outside inference mode, and a graph input of the other kind would be a recompile."""
    q = template.shape[-1]
    padded = torch.eye(rows, dtype=torch.bool, device=template.device)
    padded[:q, :q] = template
    return padded


def cache_mask(call: PackedCall, capacity: int) -> torch.Tensor:
    """The call's own 4D mask widened to every slot of a static cache (the slots past its rows masked): for the
    calls that run eagerly (the prompt's)."""
    mask = call.attention_mask
    return torch.nn.functional.pad(mask, (0, capacity - mask.shape[-1]))


def steady_rows(schedule, layout) -> int:
    """The largest call after the prompt's that `schedule` makes on `layout`: the rows every compiled call is
    padded to. Read from the engine itself, with no model: copies of the schedule are driven through the real
    loop by logits that reject every draft token and by logits that accept them all (`rows.model_free_calls`); the
    native decoder's largest call (every position committed) comes from the second."""
    key = (type(schedule), schedule.width, schedule.speculative_branches, schedule.scores_order,
           schedule.context_length, type(layout), layout.static_shapes)  # what the call shapes depend on
    if key not in _STEADY_ROWS:  # once per shape: the drive costs a few milliseconds, a generate call's set-up
        width = max(schedule.width, 1)
        _STEADY_ROWS[key] = max(call.rows for accept in (False, True)
                                for call in model_free_calls(schedule, layout, accept, 4 * width + 8)[1:])
    return _STEADY_ROWS[key]


_STEADY_ROWS: dict[tuple, int] = {}
