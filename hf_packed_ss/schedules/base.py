"""What every schedule shares: its width, its draft, and the plan/advance protocol.

A schedule is model-agnostic. It holds the current draft (tokens following the verified prefix P),
turns it into a `CallPlan`, and advances from the `CallResult`. The Runner owns P, the cache, the
stopping rules and the statistics.
"""

from __future__ import annotations

import torch

from ..acceptance import Acceptance, Greedy, ProposalDistribution
from ..plan import CallPlan, CallResult

EMPTY = torch.empty(0, dtype=torch.long)


class Schedule:
    """Base class. Subclasses implement `plan` and `advance`.

    Attributes:
        name: the `assistant_mode` string.
        width: speculative width W (number of draft positions per proposal).
        speculative: whether it drafts at all (AR does not: its reported width is 0).
        exact: whether its output is the AR mode's (every schedule here; SetDLM's native decoder is not).
        options: the `generate` options it takes besides `speculative_width` (the front refuses the others).
        verifies: whether it verifies drafts (SetDLM's native decoder commits by threshold instead).
        default_width_cap: the largest default width, if smaller than the model's (Quadratic-SS: B = 8).
    """

    name: str = ""
    speculative: bool = True
    exact: bool = True
    options: tuple[str, ...] = ()
    verifies: bool = True
    default_width_cap: int | None = None

    def __init__(self, width: int, acceptance: Acceptance | None = None):
        self.width = width
        self.acceptance = acceptance or Greedy()
        self.draft = EMPTY  # d^(1..k) after the verified prefix
        self.q: ProposalDistribution | None = None  # the distribution each draft token was drawn from
        self.started = False

    def plan(self) -> CallPlan:
        raise NotImplementedError

    def advance(self, plan: CallPlan, result: CallResult) -> torch.Tensor | None:
        """Consume a call's result; return the accepted tokens, or None when the call verified nothing."""
        raise NotImplementedError

    def _verify(self, plan: CallPlan, result: CallResult) -> tuple[torch.Tensor, int]:
        """Verify this call's draft against its stored Q; every schedule uses the same rule."""
        self.started = True
        return self.acceptance.verify(plan.draft, self.q, result.verifier)

    def _draft_from(self, proposal_logits: torch.Tensor) -> None:
        """Make the next draft from the retained proposal rows (eq. 3 / Algorithm 2, line 12)."""
        self.draft, self.q = self.acceptance.propose(proposal_logits)
