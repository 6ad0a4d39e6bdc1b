"""The 4D attention mask of a packed call, kept in one buffer per layout and written in place.

Every new row of a call sees the whole cache, so the mask is ``[True x cache_len | new-rows template]``.
Building it afresh costs O(rows x cache_len) per call, which grows with the context; the buffer below is
all True except the block the last call wrote, so a call costs O(rows^2) whatever the context length
(gpt-fast's "masks built once and indexed").
"""

from __future__ import annotations

import torch


class MaskBuffer:
    """An all-True ``(rows, capacity)`` bool buffer, grown geometrically, that hands out
    ``[True x cache_len | new]`` as a view. The view is valid until the next `mask` call."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None
        self.written: tuple[int, int, int] | None = None  # (rows, first column, columns) of the last `new`

    def mask(self, new: torch.Tensor, cache_len: int) -> torch.Tensor:
        """`new` (`torch.BoolTensor` of shape `(q, q)`): the new rows' mask over the new rows.
        Returns a `(q, cache_len + q)` view: True over the cache, then `new` (`new` itself with no cache, so
        the prompt's call, the only one whose size grows with the context, copies nothing)."""
        q = new.shape[0]
        if not cache_len:  # nothing cached (the prompt's call): the template is the whole mask
            return new
        width = cache_len + q
        buffer = self.buffer
        if buffer is None or buffer.device != new.device or buffer.shape[0] < q or buffer.shape[1] < width:
            rows = max(q, 0 if buffer is None else buffer.shape[0])
            columns = max(2 * width, 0 if buffer is None else buffer.shape[1], 64)
            self.buffer = buffer = torch.ones(rows, columns, dtype=torch.bool, device=new.device)
        elif self.written is not None:  # restore the block the last call wrote
            rows, first, columns = self.written
            buffer[:rows, first : first + columns] = True
            self.written = None
        if q > 1:  # one row always sees itself: its mask is all True, as the buffer already is
            buffer[:q, cache_len:width] = new
            self.written = (q, cache_len, q)
        return buffer[:q, :width]


class LayoutBase:
    """What both layouts hold for one decode: the MASK id, the shape policy, the attention-mask buffer and a
    buffer of MASK ids that calls take views of (no tensor is built per call for the MASK rows)."""

    def __init__(self, mask_token_id: int, static_shapes: bool = False):
        self.mask_token_id = mask_token_id
        self.static_shapes = static_shapes
        self.masks = MaskBuffer()  # one per decode: a call's mask is a view, valid until the next build
        self._mask_ids: torch.Tensor | None = None

    def mask_ids(self, n: int, device: torch.device) -> torch.Tensor:
        """`n` MASK ids, a view."""
        ids = self._mask_ids
        if ids is None or ids.numel() < n or ids.device != device:
            self._mask_ids = ids = torch.full((max(2 * n, 64),), self.mask_token_id, dtype=torch.long, device=device)
        return ids[:n]
