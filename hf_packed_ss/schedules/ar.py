"""Plain autoregressive decoding on the same engine: one verifier row, one token per call."""

from __future__ import annotations

import torch

from ..plan import CallPlan, CallResult
from .base import EMPTY, Schedule


class ARSchedule(Schedule):
    """The exactness reference: each call verifies an empty draft and emits its "bonus" token."""

    name = "ar"
    speculative = False

    def plan(self) -> CallPlan:
        return CallPlan(draft=EMPTY)

    def advance(self, plan: CallPlan, result: CallResult) -> torch.Tensor:
        accepted, _ = self._verify(plan, result)
        return accepted
