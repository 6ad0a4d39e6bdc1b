"""The same-position layout (paper appendix D.2; SetDLM): duplicate token / MASK rows that share a position id.

Rows of a call, in order (cacheable rows first, so committing the cache is one crop):

1. N: accepted tokens not yet processed as inputs (the pending correction; the prompt on the first
   call; a native step's committed tokens), causal among themselves.
2. O: the old draft at each rank of pi_t (MASK where a rank has none; only with ``static_shapes``).
3. M: one verifier MASK per rank (by default only up to the first rank without a draft).
4. R: one proposal region of one MASK per rank, for each requested region.

Every row sees the cache and all N rows. O_r and M_r also see the O rows of earlier ranks that hold a
draft token; region b's rows see those of ranks < b; every O, M or R row sees itself and no other
MASK row. The three rows of rank r share the position id of pi_t(r), and a MASK row's logit scores its
own position. Worked example: prompt (p0..p5) cached, pending correction c at output position 0,
window U = {1, 2} with drafts d1, d2, LTR order, Packed-SS (region 0)::

    row  token  pos  sees (besides the cache)
     0   c       6   0                       N
     1   d1      7   0-1                     O (rank 0)
     2   d2      8   0-2                     O (rank 1)
     3   MASK    7   0, 3                    M rank 0: position 1 given P
     4   MASK    8   0-1, 4                  M rank 1: position 2 given P + d1
     5   MASK    7   0, 5                    R rank 0: position 1 given P
     6   MASK    8   0, 6                    R rank 1: position 2 given P

By default row 5 is absent: this call resolves rank 0 itself (`SamePositionLayout.ranks`).
After h accepted draft tokens the cache keeps rows 0..h; M and R rows never enter it.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..contract import PackedCall, Plan, Proposal, SteadyCall
from .mask import LayoutBase

ROW_N, ROW_O, ROW_M, ROW_R = 0, 1, 2, 3  # row kinds


class SamePositionLayout(LayoutBase):
    """Builds `PackedCall`s for same-position predictors (the logit at a MASK row scores its own position).

    Its window is up to W unresolved positions from the leftmost one, never past the last output position E.
    By default a call holds only rows that can matter: O rows of the drafted ranks, M rows up to the first
    rank without a draft (no verification reaches past it) and R rows of the ranks in `ranks` (a verifying
    call resolves the others itself). Dropping the others is exact and saves rows; ``static_shapes`` keeps all
    ``p + (2 + regions) u`` rows of appendix D.3 (one shape per window size, for compiled graphs) and reads
    logits only where they can be used."""

    drafts_from_pending = True  # a drafting call is [N | R]
    branches_past_draft = True  # D.3's static form has a region per rank

    def window(self, left: int, end: int, width: int, accepted) -> tuple[int, ...]:
        return tuple(j for j in range(left, min(end, left + width - 1) + 1) if j not in accepted)

    @staticmethod
    def ranks(plan: Plan, proposal: Proposal) -> range:
        """The ranks whose region-b proposals can become drafts. A verifying call resolves ranks 0..h
        (A_t = min(h + 1, u)) and its region b is read only when h >= b, so rows for ranks <= b could never be
        used; a call that only drafts needs every rank."""
        return range(proposal.branch + 1 if plan.verify else 0, len(plan.order))

    def build(self, plan: Plan, state) -> PackedCall:
        """Lay out `plan` after the cache of the decoder `state`, whose pending rows N come first."""
        pending, pending_positions = state.pending_tokens(), state.pending_positions()
        device = pending.device
        u, p, kappa = len(plan.order), pending.numel(), plan.available
        drafting = plan.verify and (kappa or plan.proposals)  # a call with old-draft rows (not AR's)
        o_rows = (u if self.static_shapes else kappa) if drafting else 0
        m = (u if self.static_shapes else min(kappa + 1, u)) if plan.verify else 0
        used = [self.ranks(plan, proposal) for proposal in plan.proposals]  # R ranks whose logits are read
        starts = tuple((b, 0 if self.static_shapes else r.start, r.start) for b, r in zip(plan.branches, used,
                                                                                          strict=True))
        new, rank_index, kept, slices, n_masks = _template(p, u, o_rows, kappa, m, plan.verify_ranks, starts, device)
        window = state.absolute(plan.order)
        return PackedCall(
            input_ids=torch.cat([pending, plan.draft, self.mask_ids(n_masks, device)])[None],
            position_ids=torch.cat([pending_positions, window[rank_index]])[None],
            attention_mask=self.masks.mask(new, state.cache_len)[None, None],
            logit_rows=kept,
            verifier_rows=slice(0, plan.verify_ranks) if plan.verify else None,
            proposal_rows=list(slices),
            cache_rows_before_draft=p,
            proposal_start=p + o_rows + m,  # M and R rows follow N and O
            proposal_ranks=used,
            new_rows_mask=new,
        )

    def steady_call(self, width: int, drafting: bool, device: torch.device) -> SteadyCall:
        """Every call after the prompt's of greedy Packed-SS (`drafting`) or AR at width W in left-to-right order,
        in its static shape with every row that can be read: ``[c | O x (W - 1) | M x W | R x (W - 1)]``, the
        pending correction c at relative position 0 and rank r's rows at r + 1 (AR: ``[c | M]``). A draft is at
        most W - 1 tokens (the ranks past the accepted one), so O rank W - 1 and R rank 0 never matter and are
        left out. Its O rows are all marked drafted: an O row past a row's draft holds MASK and is seen only by
        the M rows past it, which are never read (h <= kappa), so the one mask serves every draft length."""
        return _steady(width if drafting else 0, self.mask_token_id, device)


@lru_cache(maxsize=64)
def _steady(w: int, mask_token_id: int, device: torch.device) -> SteadyCall:
    u, slots = max(w, 1), max(w - 1, 0)  # AR: a window of one rank, no draft
    regions = ((0, 1, 1),) if w else ()
    new, rank, kept, _, _ = _template(1, u, slots, slots, u, u, regions, device)
    offsets = torch.cat([rank.new_zeros(1), rank + 1])
    return SteadyCall(offsets, new, kept, torch.tensor([0], device=device), slice(1, 1 + slots), verifier=u,
                      proposal_ranks=range(1, w), proposal_start=1 + slots + u, mask_token_id=mask_token_id)


def _template(p: int, u: int, o_rows: int, kappa: int, m: int, verify_ranks: int, regions: tuple, device: torch.device):
    """Everything about one call shape that does not depend on the tokens (few shapes recur: p in {0, 1}, a full
    window, drafts on a prefix of the ranks). O rows are ranks 0..o_rows-1 (drafted below `kappa`), `m` the
    number of M rows (the first `verify_ranks` read), `regions` (b, first R rank laid out, first R rank read)
    triples. Returns the (q, q) bool mask, the rank of each O, M and R row, the kept logit rows, the slice of
    them per region and the number of MASK rows. A call with a prompt's worth of N rows is built afresh, so no
    cache holds a prompt-sized mask."""
    build = _shape if p <= 2 else _shape.__wrapped__
    return build(p, u, o_rows, kappa, m, verify_ranks, regions, device)


@lru_cache(maxsize=1024)
def _shape(p: int, u: int, o_rows: int, kappa: int, m: int, verify_ranks: int, regions: tuple, device: torch.device):
    # Per O, M and R row: kind, rank, and `bound`: the row sees drafted O rows of rank < bound.
    kind, rank, bound, has_draft = [], [], [], []
    groups = [(ROW_O, list(range(o_rows)), list(range(o_rows)), [r < kappa for r in range(o_rows)]),
              (ROW_M, list(range(m)), list(range(m)), [False] * m)]
    groups += [(ROW_R, list(range(first, u)), [b] * (u - first), [False] * (u - first)) for b, first, _ in regions]
    for k, ranks, bounds, drafts in groups:
        kind += [k] * len(ranks)
        rank += ranks
        bound += bounds
        has_draft += drafts
    rank_t, bound_t = torch.tensor(rank, dtype=torch.long), torch.tensor(bound, dtype=torch.long)
    drafted_t = torch.tensor(has_draft, dtype=torch.bool)
    q = p + len(kind)
    new = torch.ones(q, q, dtype=torch.bool, device=device).tril_()  # N: causal among themselves
    new[p:, :p] = True  # every O, M and R row sees all of N
    sees_o = drafted_t[None, :] & (rank_t[None, :] < bound_t[:, None])  # the drafted O rows of earlier ranks
    new[p:, p:] = (sees_o | torch.eye(len(kind), dtype=torch.bool)).to(device)  # and itself
    first_logit = p + o_rows  # M and R rows follow N and O
    kept, row, slices = list(range(first_logit, first_logit + verify_ranks)), first_logit + m, []
    for _, laid, read in regions:
        kept += range(row + read - laid, row + u - laid)
        slices.append(slice(len(kept) - (u - read), len(kept)))
        row += u - laid
    n_masks = len(kind) - kappa
    return (new, rank_t.to(device), torch.tensor(kept, dtype=torch.long, device=device),
            tuple(slices), n_masks)
