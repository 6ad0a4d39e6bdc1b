"""The contract between a Schedule (what to ask), a Layout (how to ask one model family) and the loop.

Positions are output positions (0 = the first token after the prompt); ranks follow the verification order
pi_t over the active window U_t. A schedule plans in ranks, a layout turns a plan into rows, position ids
and a 4D mask, and says which ranks each proposal's rows score; neither sees the other's internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

EMPTY = torch.empty(0, dtype=torch.long)


@dataclass(frozen=True)
class Proposal:
    """Ask the drafter (diffusion mode) for the ranks after a context: the verified prefix P_{t-1} plus the
    draft tokens at ranks ``< branch`` (Packed-SS asks branch 0 only; Quadratic-SS one branch per acceptance
    count). ``anchored`` picks the shifted-block form ``[last context token, MASK x W]`` (appendix D.1) over
    ``[MASK x (W + 1)]`` read through the causal verifier rows; a same-position layout has one form."""

    branch: int
    anchored: bool = False


@dataclass(slots=True)
class Plan:
    """One model call.

    Attributes:
        order: pi_t, the window's unresolved positions by rank (a shifted-block window is a contiguous range).
        draft: the stored draft tokens at ranks 0..kappa-1 (kappa: ranks with a draft before the first
            without one), a 1D LongTensor on the model's device.
        verify: whether the call verifies: ranks 0..min(kappa + 1, u) - 1 get a verifier query; rank kappa,
            when it is in the window, is the bonus position.
        proposals: drafting queries answered in the same call.
    """

    order: tuple[int, ...]
    draft: torch.Tensor = EMPTY
    verify: bool = True
    proposals: tuple[Proposal, ...] = ()

    @property
    def available(self) -> int:
        """kappa_t: ranks with a stored draft token before the first without one."""
        return int(self.draft.numel())

    @property
    def verify_ranks(self) -> int:
        """Ranks with a verifier query: the draft and, when the window has room, the bonus position."""
        return min(self.available + 1, len(self.order)) if self.verify else 0

    @property
    def branches(self) -> tuple[int, ...]:
        return tuple(p.branch for p in self.proposals)

    def position(self, rank: int) -> int:
        """The output position of `rank`; ranks past the window continue it (a shifted-block proposal drafts
        up to one block ahead of its context)."""
        if isinstance(self.order, range):
            return self.order.start + rank
        u = len(self.order)
        return self.order[rank] if rank < u else self.order[-1] + rank - u + 1

    def positions(self, ranks: range):
        """The output positions of `ranks` (a range when the window is one)."""
        if isinstance(self.order, range):
            return range(self.order.start + ranks.start, self.order.start + ranks.stop)
        return tuple(self.position(r) for r in ranks)


@dataclass
class CallResult:
    """A call's predictions mapped back to ranks.

    Attributes:
        verifier: ``(plan.verify_ranks, V)`` AR-mode logits, row r scoring rank r given P and the draft at
            ranks < r; None when the call does not verify.
        proposals: per proposal, ``(n, V)`` drafter logits, row i scoring rank ``proposal_ranks[i][i]``.
        proposal_ranks: per proposal, the ranks its rows score.
    """

    verifier: torch.Tensor | None
    proposals: list[torch.Tensor] = field(default_factory=list)
    proposal_ranks: list[range] = field(default_factory=list)


@dataclass(slots=True)
class Verdict:
    """What one call decided: the tokens it accepts, by rank from 0, their positions, and how.

    Attributes:
        tokens: accepted tokens on the host, ranks 0..len-1 of the plan.
        positions: their output positions (a range when contiguous).
        h: how many of them are draft tokens (their rows enter the cache in this call).
        bonus: whether the token after a fully accepted draft was drawn (a "bonus" rather than a correction).
        kind: how the non-draft token was produced: "correction", "bonus", "verifier" (no draft: AR, a
            prefill) or "committed" (SetDLM's native threshold commit, several per call); "drafting" for a call
            that only drafted (Linear-SS's first call of an iteration), which accepts nothing.
    """

    tokens: list[int]
    positions: Sequence[int]
    h: int = 0
    bonus: bool = False
    kind: str = "verifier"
    values: torch.Tensor | None = None  # the tokens on the model's device, when the acceptance has them there

    @classmethod
    def drafting(cls) -> Verdict:
        """The verdict of a call that only drafted: nothing accepted, nothing verified."""
        return cls([], [], kind="drafting")

    @property
    def verified(self) -> bool:
        return self.kind != "drafting"

    @property
    def kinds(self) -> list[str]:
        """Provenance of each accepted token, in rank order."""
        return ["draft" if r < self.h else self.kind for r in range(len(self.tokens))]


@dataclass
class PackedCall:
    """A built call: model inputs plus the maps needed to read its logits back.

    Attributes:
        input_ids, position_ids (`torch.LongTensor` of shape `(1, q)`).
        attention_mask (`torch.BoolTensor` of shape `(1, 1, q, cache_len + q)`): True = attend.
        logit_rows (`torch.LongTensor` of shape `(r,)`): rows whose logits are computed.
        verifier_rows: slice of the kept logits holding the verifier predictions (or None).
        proposal_rows: one slice of the kept logits per proposal.
        proposal_ranks: the ranks each proposal's kept rows score.
        cache_rows_before_draft: pending rows (N, accepted tokens not yet cached) this call processes; they
            enter the cache whatever is accepted.
        proposal_start: rows from this one on are proposal rows (where a proposal-only adapter applies);
            every layout puts its proposal rows last. Equals `rows` when there are none.
        new_rows_mask (`torch.BoolTensor` of shape `(q, q)`): the mask's new-rows part, the layout's cached
            template for this call shape (the same object for every call of that shape: a batch whose rows
            all make such a call is built by concatenation).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_rows: torch.Tensor
    verifier_rows: slice | None
    proposal_rows: list[slice]
    cache_rows_before_draft: int
    proposal_start: int
    proposal_ranks: list[range] = field(default_factory=list)
    new_rows_mask: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[1])

    def read(self, logits: torch.Tensor) -> CallResult:
        """Split ``(r, V)`` logits of the kept rows into verifier and proposal predictions."""
        verifier = logits[self.verifier_rows] if self.verifier_rows is not None else None
        return CallResult(verifier=verifier, proposals=[logits[s] for s in self.proposal_rows],
                          proposal_ranks=list(self.proposal_ranks))

    def rows_to_cache(self, n_accepted_draft: int | None) -> int:
        """New rows that stay in the cache: the pending rows plus the accepted draft tokens' rows."""
        return self.cache_rows_before_draft + (n_accepted_draft or 0)


@dataclass(frozen=True)
class SteadyCall:
    """The call a layout makes after the prompt's under greedy AR or Packed-SS, in its static shape, as templates a
    whole batch fills in tensors (`lockstep.py`): a row's call is this one at its own positions, with its own P's
    last token and draft. Every row's call has one shape, so a round costs a fixed number of tensor ops whatever
    the batch size. Row 0 holds P's last token (the pending tail); after h accepted draft tokens the cache keeps
    rows 0..h (it and the accepted draft rows), as `PackedCall.rows_to_cache` says for a one-token tail.

    Attributes:
        position_offsets (`torch.LongTensor` of shape `(q,)`): each row's position id less P's last token's.
        new_rows_mask (`torch.BoolTensor` of shape `(q, q)`): the mask's new-rows part.
        logit_rows (`torch.LongTensor` of shape `(r,)`): the kept rows: `verifier` verifier rows scoring window ranks
            0.. (row r given P and d^(<r)), then rows scoring `proposal_ranks` given P (Packed-SS).
        anchors (`torch.LongTensor`): the columns that hold P's last token.
        draft: the columns of draft ranks 0..; a row's shorter draft leaves MASK in the rest.
        verifier: the number of verifier kept rows (more than any draft is long: a bonus rank always follows).
        proposal_ranks: the window ranks the proposal kept rows score (D_t is drawn from those past the accepted).
        proposal_start: rows from this one on are proposal rows (`PackedCall.proposal_start`).
        mask_token_id: the MASK id of the layout.
    """

    position_offsets: torch.Tensor
    new_rows_mask: torch.Tensor
    logit_rows: torch.Tensor
    anchors: torch.Tensor
    draft: slice
    verifier: int
    proposal_ranks: range
    proposal_start: int
    mask_token_id: int

    @property
    def rows(self) -> int:
        return int(self.new_rows_mask.shape[0])

    @property
    def draft_slots(self) -> int:
        return self.draft.stop - self.draft.start

    def build(self, last: torch.Tensor, draft: torch.Tensor, kappa: torch.Tensor, position: torch.Tensor,
              valid: torch.Tensor) -> PackedCall:
        """The batched call of m rows: `last` ``(m, 1)`` P's last tokens, `draft` ``(m, draft_slots)`` with `kappa`
        ``(m,)`` real tokens each, `position` ``(m,)`` P's last position, `valid` ``(m, cache_len)`` the cache
        columns each row sees."""
        m, q = last.shape[0], self.rows
        ids = last.new_full((m, q), self.mask_token_id)
        ids[:, self.anchors] = last
        if self.draft_slots:
            ranks = torch.arange(self.draft_slots, device=last.device)[None]
            ids[:, self.draft] = torch.where(ranks < kappa[:, None], draft, self.mask_token_id)
        mask = torch.cat([valid[:, None, :].expand(m, q, valid.shape[1]), self.new_rows_mask.expand(m, q, q)], dim=2)
        return PackedCall(input_ids=ids, position_ids=position[:, None] + self.position_offsets[None],
                          attention_mask=mask[:, None], logit_rows=self.logit_rows, verifier_rows=None,
                          proposal_rows=[], cache_rows_before_draft=1, proposal_start=self.proposal_start)

    def next_draft(self, proposed: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Algorithm 1, line 10 for every row: D_t, the proposal tokens past the h + 1 accepted ranks, as
        ``(m, draft_slots)`` tokens and their count per row. `proposed` ``(m, len(proposal_ranks))``: the argmax of
        the proposal rows."""
        first, stop = self.proposal_ranks.start, self.proposal_ranks.stop
        kappa = (stop - 1 - h).clamp(min=0)
        if not self.draft_slots or not proposed.shape[1]:
            return proposed.new_zeros(h.shape[0], self.draft_slots), kappa.clamp(max=0)
        ranks = torch.arange(self.draft_slots, device=h.device)[None]
        past = (h + 1 - first)[:, None] + ranks  # proposal row of D_t's rank r
        return proposed.gather(1, past.clamp(max=proposed.shape[1] - 1)), kappa


class Layout(Protocol):
    """How one model family is asked a plan (appendix D). `build` reads the decoder state's pending rows N
    (accepted tokens not yet in the cache), the prompt length and the cache length; `window` says which
    positions the next call may resolve; `drafts_from_pending` whether a call that only drafts can process N
    (the same-position layout can; the shifted-block layout drafts from P's last token, which stays pending)."""

    mask_token_id: int
    static_shapes: bool
    drafts_from_pending: bool

    def window(self, left: int, end: int, width: int, accepted) -> tuple[int, ...]: ...

    def build(self, plan: Plan, state) -> PackedCall: ...
