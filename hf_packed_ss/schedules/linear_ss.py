"""Linear-SS: draft from the newest prefix, then verify; two calls per iteration (paper section 1).

The first call prefills the prompt and emits the first token (appendix E.2), so the first draft is
already conditioned on P_1.
"""

from __future__ import annotations

import torch

from ..plan import CallPlan, CallResult, Proposal
from .base import EMPTY, Schedule


class LinearSSSchedule(Schedule):
    name = "linear_ss"

    def __init__(self, width: int, acceptance=None):
        super().__init__(width, acceptance)
        self.drafted = False

    def plan(self) -> CallPlan:
        if not self.started:
            return CallPlan(draft=EMPTY)  # prefill: verify the empty draft
        if not self.drafted:
            return CallPlan(draft=EMPTY, verify=False, proposals=(Proposal(branch=0, length=self.width),))
        return CallPlan(draft=self.draft, draft_slots=self.width)

    def advance(self, plan: CallPlan, result: CallResult) -> torch.Tensor | None:
        if not plan.verify:
            self._draft_from(result.proposals[0])
            self.drafted = True
            return None
        accepted, _ = self._verify(plan, result)
        self.draft, self.q, self.drafted = EMPTY, None, False
        return accepted
