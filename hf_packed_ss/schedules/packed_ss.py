"""Packed-SS (Algorithm 1) and Quadratic-SS as one schedule family: verify the draft and propose
the next one in the same call.

Packed-SS asks a single proposal branch conditioned on the old prefix P_{t-1}; Quadratic-SS asks one
branch per possible acceptance count h = 0..|D| (the branch conditioned on P_{t-1} + d^(1..h)).
After verification the decoder keeps the selected branch's proposals for positions beyond the
A_t = h_t + 1 newly accepted tokens. Packed-SS is the branch set {0}; any subset containing 0 is a
valid hybrid (the largest branch <= h is used).
"""

from __future__ import annotations

import torch

from ..plan import CallPlan, CallResult, Proposal
from .base import Schedule


class BranchedSSSchedule(Schedule):
    """One-call schedules. `branches(n_draft)` lists the acceptance counts that get a proposal."""

    anchored = True  # proposal block form after the first call, see `Proposal`

    def branches(self, n_draft: int) -> range:
        raise NotImplementedError

    def proposal_length(self) -> int:
        return self.width if self.anchored else self.width + 1

    def plan(self) -> CallPlan:
        if not self.started:
            # Appendix E.2: the first call drafts W + 1 masks from the prompt; one is consumed by
            # the token this call emits, W remain as the first draft.
            return CallPlan(draft=self.draft, draft_slots=0, proposals=(Proposal(0, self.width + 1, anchored=False),))
        length = self.proposal_length()
        proposals = tuple(Proposal(b, length, self.anchored) for b in self.branches(self.draft.numel()))
        return CallPlan(draft=self.draft, draft_slots=self.width, proposals=proposals)

    def advance(self, plan: CallPlan, result: CallResult) -> torch.Tensor:
        # Algorithm 1 lines 5-6 (Algorithm 2 lines 5-8): h_t accepted draft tokens, A_t = h_t + 1.
        accepted, h = self._verify(plan, result)
        # Line 10 (12): the next draft comes from the proposals for positions after the A_t accepted
        # ones. Branch b's row j scores position b + 1 + j after P_{t-1}, so kept rows start at
        # h + 1 - b; only the selected branch is sampled (appendix E.4).
        index = max(i for i, p in enumerate(plan.proposals) if p.branch <= h)
        self._draft_from(result.proposals[index][h + 1 - plan.proposals[index].branch :])
        return accepted


class PackedSSSchedule(BranchedSSSchedule):
    """Algorithm 1: one branch, drafted from P_{t-1} in the verification call."""

    name = "packed_ss"

    def branches(self, n_draft: int) -> range:
        return range(1)


class QuadraticSSSchedule(BranchedSSSchedule):
    """One proposal branch per acceptance boundary: B verifier rows + B branches of B rows."""

    name = "quadratic_ss"
    anchored = False

    def branches(self, n_draft: int) -> range:
        return range(n_draft + 1)
