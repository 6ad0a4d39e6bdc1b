"""The contract between a Schedule (what to ask) and a Layout (how to ask one model family).

A schedule speaks in positions after the verified prefix P; a layout turns that into rows, position
ids and a 4D mask. Neither sees the other's internals (DESIGN.md, "four parts with one job each").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Proposal:
    """Ask the drafter (diffusion mode) for ``length`` tokens following a context.

    The context is the verified prefix P plus the first ``branch`` draft tokens of this call
    (Quadratic-SS asks one branch per acceptance count; Packed-SS and Linear-SS only branch 0).
    ``anchored`` picks the Nemotron block form: ``[last context token, MASK x length]`` with the
    context's last token repeated inside the bidirectional block (paper appendix D.1), or
    ``[MASK x length]`` right after the causally encoded context (appendix E.2 initial call;
    Quadratic-SS branches).
    """

    branch: int
    length: int
    anchored: bool = True


@dataclass(frozen=True)
class CallPlan:
    """One model call.

    Attributes:
        draft: draft tokens to verify, as a 1D LongTensor (positions 1..k after P).
        verify: whether the call has verifier rows (False only for Linear-SS's drafting call).
        draft_slots: physical draft slots in the verifier block (>= len(draft)); the excess is
            MASK padding that keeps shapes static and can never extend acceptance.
        proposals: drafting queries answered in the same call.
    """

    draft: torch.Tensor
    verify: bool = True
    draft_slots: int = 0
    proposals: tuple[Proposal, ...] = ()

    @property
    def n_draft(self) -> int:
        return int(self.draft.numel())


@dataclass
class CallResult:
    """What a call returns, already mapped back to positions after P.

    Attributes:
        verifier: ``(n_draft + 1, V)`` AR logits; row i scores the token at draft position i + 1
            given P and the draft tokens before it (the last row is the bonus position), or None.
        proposals: one ``(length, V)`` tensor of drafter logits per requested proposal, row j
            scoring position ``branch + 1 + j`` after P.
    """

    verifier: torch.Tensor | None
    proposals: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class WindowPlan:
    """One call of any-order decoding (Algorithm 3) over the active window U_t.

    Positions are output positions (0 = first token after the prompt). Ranks follow the order pi_t.

    Attributes:
        order: pi_t, the unresolved positions of the window by verification rank.
        draft: the stored draft token at each rank (None where a position has none), or None for a
            call without old-draft rows (AR, drafting-only and native calls).
        verify: whether the call has one verifier query per rank.
        regions: proposal regions; region ``b`` drafts the ranks ``region_ranks(b)`` from P_{t-1} plus
            the draft tokens at ranks ``< b`` (Packed-SS and Linear-SS: ``(0,)``; Quadratic-SS: ``0..u-1``).
    """

    order: tuple[int, ...]
    draft: tuple[int | None, ...] | None = None
    verify: bool = True
    regions: tuple[int, ...] = ()

    def region_ranks(self, b: int) -> range:
        """The ranks whose region-``b`` proposals can become drafts. A verifying call resolves ranks
        ``0..h`` (A_t = min(h + 1, u)) and its region ``b`` is read only when ``h >= b``, so rows for
        ranks ``<= b`` could never be used; a call that only drafts needs every rank."""
        return range(b + 1 if self.verify else 0, len(self.order))

    @property
    def available(self) -> int:
        """kappa_t: ranks with a stored draft before the first missing one."""
        if self.draft is None:
            return 0
        return next((r for r, d in enumerate(self.draft) if d is None), len(self.draft))
