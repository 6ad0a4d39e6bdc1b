"""What every schedule shares: its width, its draft, and the plan/advance protocol.

A schedule is model-agnostic. It holds the current draft (tokens following the verified prefix P),
turns it into a `CallPlan`, and advances from the `CallResult`. The Runner owns P, the cache, the
stopping rules and the statistics.
"""

from __future__ import annotations

import torch

from ..acceptance import greedy_accept
from ..plan import CallPlan, CallResult

EMPTY = torch.empty(0, dtype=torch.long)


class Schedule:
    """Base class. Subclasses implement `plan` and `advance`.

    Attributes:
        name: the `assistant_mode` string.
        width: speculative width W (number of draft positions per proposal).
        calls_per_iteration: model calls an iteration takes after the first (for the docs and tests).
    """

    name: str = ""
    calls_per_iteration: int = 1

    def __init__(self, width: int):
        self.width = width
        self.draft = EMPTY
        self.started = False

    def plan(self) -> CallPlan:
        raise NotImplementedError

    def advance(self, plan: CallPlan, result: CallResult) -> torch.Tensor | None:
        """Consume a call's result; return the accepted tokens, or None when the call verified nothing."""
        raise NotImplementedError

    def _verify(self, plan: CallPlan, result: CallResult) -> tuple[torch.Tensor, int]:
        """Verify this call's draft; every schedule uses the same acceptance rule."""
        self.started = True
        return greedy_accept(plan.draft, result.verifier)


def propose(logits: torch.Tensor) -> torch.Tensor:
    """Greedy draft tokens from drafter logits (eq. 3)."""
    return logits.argmax(dim=-1)
