"""The Nemotron layout (paper appendix D.1): causal verifier rows and bidirectional proposal blocks
in one input, over a KV cache that holds the verified prefix P minus its last token.

Rows of a call, in order (cacheable rows first, so committing the cache is one crop):

1. verifier block: the uncached tail of P (its last token; the whole prompt on the first call),
   then the draft tokens; causal (lower-triangular). With ``static_shapes`` the block is padded with
   MASK rows up to ``draft_slots`` so every regular call has one shape (for compiled graphs); by
   default the padding is dropped: it can never extend acceptance and no other row attends to it,
   so dropping it is exact and saves rows when a Packed-SS draft is shorter than W.
2. one block per proposal: ``[anchor, MASK x L]`` (anchored; the anchor is the context's last token
   and sees only what precedes it) or ``[MASK x L]`` (unanchored; sees the whole context through the
   causal verifier rows); bidirectional inside the block.

Every row also sees the whole cache. Worked example, P = (p0 .. p9) with p0..p8 cached, draft
(d1, d2), width W = 4, Packed-SS (one anchored proposal of length 4), static_shapes (2B = 10 rows)::

    row  token  pos   sees (besides cache 0..8)
     0   p9      9    0                     verifier: row 0 scores pos 10, row 1 pos 11, row 2 pos 12
     1   d1     10    0-1
     2   d2     11    0-2
     3   MASK   12    0-3                   padding, static_shapes only (its prediction is never read)
     4   MASK   13    0-4
     5   p9      9    5-9                   proposal block; rows 6..9 score positions 10..13 given P
     6   MASK   10    5-9
     7   MASK   11    5-9
     8   MASK   12    5-9
     9   MASK   13    5-9

(Without static_shapes rows 3-4 are absent and the proposal block is rows 3..7.)

After h accepted draft tokens the cache keeps rows 0..h (p9, d1..dh); all other rows are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..plan import CallPlan, CallResult
from .mask import MaskBuffer


@dataclass
class PackedCall:
    """A built call: model inputs plus the maps needed to read its logits back.

    Attributes:
        input_ids, position_ids (`torch.LongTensor` of shape `(1, q)`).
        attention_mask (`torch.BoolTensor` of shape `(1, 1, q, cache_len + q)`): True = attend.
        logit_rows (`torch.LongTensor` of shape `(r,)`): rows whose logits are computed.
        verifier_rows: slice of the kept logits holding the verifier predictions (or None).
        proposal_rows: one slice of the kept logits per proposal.
        cache_rows_before_draft: verifier rows that enter the cache even when no draft token is accepted.
        proposal_start: rows from this one on are proposal rows (where a proposal-only adapter
            applies); every layout puts its proposal rows last. Equals `rows` when there are none.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_rows: torch.Tensor
    verifier_rows: slice | None
    proposal_rows: list[slice]
    cache_rows_before_draft: int
    proposal_start: int

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[1])

    def read(self, logits: torch.Tensor) -> CallResult:
        """Split ``(r, V)`` logits of the kept rows into verifier and proposal predictions."""
        verifier = logits[self.verifier_rows] if self.verifier_rows is not None else None
        return CallResult(verifier=verifier, proposals=[logits[s] for s in self.proposal_rows])

    def rows_to_cache(self, n_accepted_draft: int | None) -> int:
        """New rows that stay in the cache: the rows cached whatever is accepted (the tail of P) plus
        the accepted draft tokens (None: the call verified nothing)."""
        return self.cache_rows_before_draft + (n_accepted_draft or 0)


class NemotronLayout:
    """Builds `PackedCall`s for models whose AR logit at row i scores position i + 1 and whose
    diffusion logit at a MASK row scores that row's own position."""

    def __init__(self, mask_token_id: int, static_shapes: bool = False):
        self.mask_token_id = mask_token_id
        self.static_shapes = static_shapes
        self.masks = MaskBuffer()  # one per decode: a call's mask is a view, valid until the next build

    def build(self, plan: CallPlan, prefix: torch.Tensor, cache_len: int) -> PackedCall:
        """Lay out `plan` after `prefix` (1D, the verified prefix P) whose first `cache_len` tokens are cached."""
        n, k, device = prefix.numel(), plan.n_draft, prefix.device
        tail = prefix[cache_len:] if plan.verify else prefix[:0]
        t = tail.numel()
        slots = (max(plan.draft_slots, k) if self.static_shapes else k) if plan.verify else 0
        pads = torch.full((slots - k,), self.mask_token_id, dtype=torch.long, device=device)
        pieces = [tail, plan.draft.to(device), pads]
        kept: list[torch.Tensor] = []
        offset = t + slots
        verifier_rows = None
        if plan.verify:
            kept.append(torch.arange(t - 1, t + k, device=device))
            verifier_rows = slice(0, k + 1)
        proposal_rows, n_kept = [], k + 1 if plan.verify else 0
        for p in plan.proposals:
            if p.anchored:
                anchor = plan.draft[p.branch - 1 : p.branch].to(device) if p.branch else prefix[-1:]
                pieces.append(anchor)
                kept.append(torch.arange(offset + 1, offset + 1 + p.length, device=device))
                offset += 1
            else:
                kept.append(torch.arange(offset, offset + p.length, device=device))
            pieces.append(torch.full((p.length,), self.mask_token_id, dtype=torch.long, device=device))
            offset += p.length
            proposal_rows.append(slice(n_kept, n_kept + p.length))
            n_kept += p.length
        input_ids = torch.cat(pieces)[None]
        first = cache_len if plan.verify else n - 1  # position of row 0; P's last token sits at n - 1
        positions, new_mask = _template(plan.verify, t, slots, plan.proposals, n - 1 - first, device)
        mask = self.masks.mask(new_mask, cache_len)
        return PackedCall(
            input_ids=input_ids,
            position_ids=(positions + first)[None],
            attention_mask=mask[None, None],
            logit_rows=torch.cat(kept),
            verifier_rows=verifier_rows,
            proposal_rows=proposal_rows,
            cache_rows_before_draft=t,
            proposal_start=t + slots,
        )


@lru_cache(maxsize=256)
def _template(verify: bool, t: int, slots: int, proposals: tuple, last: int, device: torch.device):
    """Relative positions and the new-rows part of the mask, built once per call shape and device
    (regular calls of a schedule all share one). `last` is the relative position of P's last token.
    Returns (positions, (q, q) bool mask)."""
    pos, group, limit = [], [], []
    if verify:
        for i in range(t + slots):
            pos.append(i), group.append(-1), limit.append(i + 1)
    for g, p in enumerate(proposals):
        start = last + p.branch  # relative position of the context's last token
        if p.anchored:
            block = range(start, start + 1 + p.length)
            sees_before = start  # the anchor's earlier context only
        else:
            block = range(start + 1, start + 1 + p.length)
            sees_before = start + 1
        for x in block:
            pos.append(x), group.append(g), limit.append(sees_before)
    pos_t, group_t, limit_t = (torch.tensor(x, device=device) for x in (pos, group, limit))
    sees_verifier = (group_t[None, :] == -1) & (pos_t[None, :] < limit_t[:, None])
    same_block = (group_t[:, None] == group_t[None, :]) & (group_t[:, None] >= 0)
    return pos_t, sees_verifier | same_block
