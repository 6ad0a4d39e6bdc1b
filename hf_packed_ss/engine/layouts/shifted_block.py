"""The shifted-block layout (paper appendix D.1; Nemotron-Labs-Diffusion, prefix drafters): causal verifier
rows and bidirectional proposal blocks in one input, over a KV cache that holds the verified prefix P minus its
last token.

Rows of a call, in order (cacheable rows first, so committing the cache is one crop):

1. verifier block: the pending rows N, the uncached tail of P (its last token; the whole prompt on the
   first call), then the draft tokens; causal (lower-triangular). With ``static_shapes`` the block is padded with
   MASK rows up to W slots so every regular call has one shape (for compiled graphs); by
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

from functools import lru_cache

import torch

from ..contract import PackedCall, Plan, SteadyCall
from .mask import LayoutBase


class ShiftedBlockLayout(LayoutBase):
    """Builds `PackedCall`s for models whose AR logit at row i scores position i + 1 and whose diffusion logit
    at a MASK row scores that row's own position.

    Its window is the block B = W + 1 after P, left to right and contiguous (rank r = position left + r): a
    draft of up to W tokens and the bonus position. A proposal drafts from its context's end: anchored, the W
    ranks b..b+W-1; unanchored, the B ranks b..b+W (one block ahead of the context, past the window and the
    length limit alike: every call of a schedule keeps one shape)."""

    drafts_from_pending = False  # P's last token anchors a drafting-only call and stays pending
    branches_past_draft = False  # branch b's context is P + d^(1..b): there is no branch past the draft

    def window(self, left: int, end: int, width: int, accepted) -> range:
        return range(left, left + width + 1)

    def build(self, plan: Plan, state) -> PackedCall:
        """Lay out `plan` after the verified prefix P of the decoder `state` (`state.pending`: P's uncached tail)."""
        u, k = len(plan.order), plan.available
        tail = state.pending_tokens() if plan.verify else state.buffer[:0]
        device, t = tail.device, tail.numel()
        slots = (u - 1 if self.static_shapes else k) if plan.verify else 0
        shape = tuple((p.branch, p.anchored, u - 1 if p.anchored else u) for p in plan.proposals)
        last = state.origin + state.left - 1  # P's last token
        first = last - t + 1 if plan.verify else last  # position of row 0
        # static shapes keep the logits of every verifier slot (the first k + 1 are read), so the template does
        # not depend on the draft's length: one object per shape, shared by every call (and batch row) of it
        read = slots if self.static_shapes and plan.verify else k
        positions, new_mask, kept, rows = _template(plan.verify, t, read, slots, shape, last - first, device)
        pieces = [tail, plan.draft, self.mask_ids(slots - k, device)]
        for branch, anchored, length in shape:
            if anchored:
                pieces.append(plan.draft[branch - 1 : branch] if branch else state.last_token())
            pieces.append(self.mask_ids(length, device))
        ids = torch.cat(pieces) if len(pieces) > 3 or k or slots else tail  # AR, a prefill: the tail alone
        return PackedCall(
            input_ids=ids[None],
            position_ids=(positions + first)[None],
            attention_mask=self.masks.mask(new_mask, state.cache_len)[None, None],
            logit_rows=kept,
            verifier_rows=slice(0, k + 1) if plan.verify else None,
            proposal_rows=list(rows),
            cache_rows_before_draft=t,
            proposal_start=t + slots,
            proposal_ranks=[range(branch, branch + length) for branch, _, length in shape],
            new_rows_mask=new_mask,
        )

    def steady_call(self, width: int, drafting: bool, device: torch.device) -> SteadyCall:
        """Every call after the prompt's of greedy Packed-SS (`drafting`) or AR at width W, in its static shape:
        ``[l | d, MASK-padded to W | l | MASK x W]`` (the module docstring's 2B rows, P's last token l at relative
        position 0; AR: ``[l]``). Verifier rows 0..W score ranks 0..W; proposal rows W + 2.. ranks 0..W-1."""
        return _steady(width if drafting else 0, self.mask_token_id, device)


@lru_cache(maxsize=64)
def _steady(w: int, mask_token_id: int, device: torch.device) -> SteadyCall:
    proposals = ((0, True, w),) if w else ()
    offsets, mask, kept, _ = _template(True, 1, w, w, proposals, 0, device)
    anchors = torch.tensor([0, w + 1] if w else [0], device=device)
    return SteadyCall(offsets, mask, kept, anchors, slice(1, 1 + w), verifier=w + 1, proposal_ranks=range(w),
                      proposal_start=w + 1, mask_token_id=mask_token_id)


def _template(verify: bool, t: int, k: int, slots: int, proposals: tuple, last: int, device: torch.device):
    """Everything about one call shape that does not depend on the tokens: relative positions, the new-rows part
    of the mask, the rows whose logits are kept and the slices of them per proposal. `proposals` are
    (branch, anchored, length) triples, `last` the relative position of P's last token. Regular calls (a tail of
    one token) share a few shapes, built once per decode shape and device; the prompt's call is built afresh
    (vectorised), so no cache holds a prompt-sized mask."""
    build = _shape if t <= 2 else _shape.__wrapped__
    return build(verify, t, k, slots, proposals, last, device)


@lru_cache(maxsize=256)
def _shape(verify: bool, t: int, k: int, slots: int, proposals: tuple, last: int, device: torch.device):
    nv = t + slots if verify else 0  # verifier rows: causal, relative position = row index
    q = nv + sum(length + anchored for _, anchored, length in proposals)
    mask = torch.ones(q, q, dtype=torch.bool, device=device).tril_()  # the verifier rows: causal
    pos, kept, rows = [torch.arange(nv)], [torch.arange(t - 1, t + k)] if verify else [], []
    n, n_kept = nv, k + 1 if verify else 0
    for branch, anchored, length in proposals:
        start = last + branch  # relative position of the context's last token
        size, sees = length + anchored, start if anchored else start + 1  # an anchor sees only its earlier context
        mask[n : n + size] = False
        mask[n : n + size, : min(sees, nv)] = True  # the verifier rows before its context's end
        mask[n : n + size, n : n + size] = True  # bidirectional inside the block
        pos.append(torch.arange(size) + (start if anchored else start + 1))
        kept.append(torch.arange(n + anchored, n + size))
        rows.append(slice(n_kept, n_kept + length))
        n, n_kept = n + size, n_kept + length
    return torch.cat(pos).to(device), mask, torch.cat(kept).to(device), tuple(rows)
