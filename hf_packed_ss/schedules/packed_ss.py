"""Packed-SS (Algorithm 1) and Quadratic-SS as one schedule family: verify the draft and propose
the next one in the same call.

Packed-SS asks a single proposal branch conditioned on the old prefix P_{t-1}; Quadratic-SS asks one
branch per possible acceptance count h = 0..|D| (the branch conditioned on P_{t-1} + d^(1..h)).
After verification the decoder keeps the selected branch's proposals for positions beyond the
A_t = h_t + 1 newly accepted tokens. Packed-SS is the branch set {0}; any subset containing 0 is a
valid hybrid (the largest branch <= h is used). `HybridSSSchedule` is the k-branch hybrid the paper's
section 5 names as future work: branches 0..k-1, between Packed-SS (k = 1) and Quadratic-SS (k = W + 1).
"""

from __future__ import annotations

import torch

from ..plan import CallPlan, CallResult, Proposal
from .base import Schedule

HYBRID = "hybrid_ss"
DEFAULT_BRANCHES = 2  # `speculative_branches` when unset: the smallest hybrid that is neither endpoint


def check_branches(k, width: int) -> int:
    """`speculative_branches` k for speculative width W: an integer in [1, W + 1] (1 = Packed-SS's single branch,
    W + 1 = Quadratic-SS's full set). Returns k; raises ValueError otherwise."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= width + 1:
        raise ValueError(
            f"speculative_branches={k!r} is out of range: use an integer in [1, {width + 1}] for speculative_width="
            f"{width} (1 = Packed-SS's single branch from P_(t-1), W + 1 = {width + 1} = Quadratic-SS's full set; "
            f"default {DEFAULT_BRANCHES}).")
    return k


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
    default_width_cap = 7  # the paper's Quadratic-SS block size B = 8 (section 4.1): its input grows as B(B + 1)

    def branches(self, n_draft: int) -> range:
        return range(n_draft + 1)


class HybridSSSchedule(BranchedSSSchedule):
    """The k-branch hybrid: proposal branches b = 0..min(k, |D| + 1) - 1, the branch for b accepted draft tokens
    conditioned on P_{t-1} + d^(1..b); after h acceptances the largest branch <= h, min(h, k - 1), drafts.
    Rows per call after the first: (1 + |D|) verifier rows + k blocks of B = W + 1 rows, at most B + kB.

    Block form (**decision**: anchored iff k == 1). Every form is exact (a proposal only changes what is
    verified, never what is accepted), so the form is chosen for the two endpoints and a monotone family
    between them:

    - k = 1 keeps Packed-SS's anchored ``[last, MASK x W]`` block (appendix D.1, Algorithm 1), so it makes
      exactly Packed-SS's calls, rows and acceptances (the next draft holds W - A_t tokens).
    - k >= 2 uses Quadratic-SS's unanchored ``[MASK x B]`` blocks, which read their context through the
      causal verifier rows and draft one position more: whenever h < k the selected branch b = h leaves a full
      W-token draft conditioned on P_t minus its last token, exactly as Quadratic-SS; for h >= k branch k - 1
      leaves W + k - 1 - h. So k = W + 1 makes exactly Quadratic-SS's calls, rows and acceptances, and every
      k in 2..W+1 is Quadratic-SS with its branches past k - 1 left out (an anchored form for 2 <= k <= W
      would switch form between k = W and k = W + 1 and draft one token fewer per iteration).
    """

    name = HYBRID
    options = ("speculative_branches",)

    def __init__(self, width: int, acceptance=None, speculative_branches: int = DEFAULT_BRANCHES):
        super().__init__(width, acceptance)
        self.speculative_branches = check_branches(speculative_branches, width)
        self.anchored = self.speculative_branches == 1

    def branches(self, n_draft: int) -> range:
        return range(min(self.speculative_branches, n_draft + 1))
