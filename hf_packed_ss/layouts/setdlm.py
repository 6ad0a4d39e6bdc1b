"""The SetDLM layout (paper appendix D.2): duplicate token / MASK rows that share a position id.

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

By default row 5 is absent: this call resolves rank 0 itself (`WindowPlan.region_ranks`).
After h accepted draft tokens the cache keeps rows 0..h; M and R rows never enter it.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..plan import WindowPlan
from .mask import MaskBuffer
from .nemotron import PackedCall

ROW_N, ROW_O, ROW_M, ROW_R = 0, 1, 2, 3  # row kinds


class SetDLMLayout:
    """Builds `PackedCall`s for same-position predictors (the logit at a MASK row scores its own position).

    By default a call holds only rows that can matter: O rows of ranks that hold a draft token (an O row
    without one is a MASK no other row attends to), M rows up to the first rank without a draft (no
    verification reaches past it) and R rows of the ranks in `WindowPlan.region_ranks` (a verifying call
    resolves the others itself). Dropping the others is exact and saves rows; ``static_shapes`` keeps all
    ``p + (2 + regions) u`` rows of appendix D.3 (one shape per window size, for compiled graphs) and
    reads logits only where they can be used."""

    def __init__(self, mask_token_id: int, static_shapes: bool = False):
        self.mask_token_id = mask_token_id
        self.static_shapes = static_shapes
        self.masks = MaskBuffer()  # one per decode: a call's mask is a view, valid until the next build

    def build(self, plan: WindowPlan, pending: torch.Tensor, pending_positions: torch.Tensor, origin: int,
              cache_len: int) -> PackedCall:
        """Lay out `plan` after a cache of `cache_len` rows. `pending` are the N tokens at absolute
        positions `pending_positions`; output position j sits at absolute position `origin + j`."""
        device = pending.device
        u, p = len(plan.order), pending.numel()
        draft = plan.draft or ()
        o_ranks = tuple(r for r, d in enumerate(draft) if self.static_shapes or d is not None)
        m = (u if self.static_shapes else min(plan.available + 1, u)) if plan.verify else 0
        drafted = tuple(draft[r] is not None for r in o_ranks)
        used = [plan.region_ranks(b) for b in plan.regions]  # R ranks whose logits are read, per region
        rows = [range(u) if self.static_shapes else r for r in used]  # R ranks laid out, per region
        regions = tuple((b, r.start) for b, r in zip(plan.regions, rows, strict=True))
        new = _template(p, u, o_ranks, drafted, m, regions, device)
        ids = [self.mask_token_id if draft[r] is None else draft[r] for r in o_ranks]
        ids += [self.mask_token_id] * (m + sum(map(len, rows)))
        ranks = list(o_ranks) + list(range(m)) + [r for region in rows for r in region]
        positions = torch.tensor([plan.order[r] for r in ranks], dtype=torch.long, device=device) + origin
        mask = self.masks.mask(new, cache_len)
        first_logit = p + len(o_ranks)  # M and R rows follow N and O
        kept, row, slices = list(range(first_logit, first_logit + m)), first_logit + m, []
        for laid, read in zip(rows, used, strict=True):
            kept += range(row + read.start - laid.start, row + len(laid))
            slices.append(slice(len(kept) - len(read), len(kept)))
            row += len(laid)
        return PackedCall(
            input_ids=torch.cat([pending, torch.tensor(ids, dtype=torch.long, device=device)])[None],
            position_ids=torch.cat([pending_positions, positions])[None],
            attention_mask=mask[None, None],
            logit_rows=torch.tensor(kept, dtype=torch.long, device=device),
            verifier_rows=slice(0, m) if plan.verify else None,
            proposal_rows=slices,
            cache_rows_before_draft=p,
            proposal_start=first_logit + m,
        )


@lru_cache(maxsize=1024)
def _template(p: int, u: int, o_ranks: tuple[int, ...], drafted: tuple[bool, ...], m: int,
              regions: tuple[tuple[int, int], ...], device: torch.device):
    """The new-rows mask for one call shape (few shapes recur: p in {0, 1}, a full window, drafts on a
    prefix of the ranks). `o_ranks` are the ranks with an O row (`drafted`: whether it holds a draft
    token), `m` the number of M rows, `regions` (b, first R rank laid out) pairs. Returns (q, q) bool."""
    # Per row: kind, rank, and `bound`: the row sees drafted O rows of rank < bound.
    kind, rank, bound, has_draft = [ROW_N] * p, list(range(p)), [-1] * p, [False] * p
    groups = [(ROW_O, list(o_ranks), list(o_ranks), list(drafted)),
              (ROW_M, list(range(m)), list(range(m)), [False] * m)]
    groups += [(ROW_R, list(range(first, u)), [b] * (u - first), [False] * (u - first)) for b, first in regions]
    for k, ranks, bounds, drafts in groups:
        kind += [k] * len(ranks)
        rank += ranks
        bound += bounds
        has_draft += drafts
    kind_t, rank_t, bound_t, drafted_t = (torch.tensor(x) for x in (kind, rank, bound, has_draft))
    is_n = kind_t == ROW_N
    sees_n = is_n[None, :] & (~is_n[:, None] | (rank_t[None, :] <= rank_t[:, None]))
    sees_o = drafted_t[None, :] & (rank_t[None, :] < bound_t[:, None])
    new = sees_n | sees_o | torch.eye(len(kind), dtype=torch.bool)
    return new.to(device)
