"""`PackedSSCandidateGenerator`: the retained draft, seen through transformers' `CandidateGenerator`
interface, so that code written against that interface can inspect it.

How it differs from stock assisted generation: a stock candidate generator *runs a drafter* inside
`get_candidates` (an assistant model, prompt lookup, ...), and the target model verifies afterwards.
Here drafting already happened inside the previous verification call (Packed-SS drafts from the older
prefix P_{t-1}; Quadratic-SS from the accepted branch; Linear-SS in its own drafting call), so
`get_candidates` only *returns* the retained draft and the distributions it was sampled from; it never
calls a model. It watches a decode through the loop's trace hook (`observe`), which reports every
verification to `update_candidate_strategy`.
"""

from __future__ import annotations

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ..engine.loop import Step
from ..engine.schedules import Schedule


class PackedSSCandidateGenerator(CandidateGenerator):
    """A read-only view of a schedule's draft (tokens d and stored proposal distributions Q).

    Attributes:
        num_matches: the accepted draft tokens h of every verification so far, in order.
    """

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.num_matches: list[int] = []

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Returns `input_ids` followed by the draft, shape `(1, n + k)`, and the draft's stored Q as
        logits (log-probabilities, `-inf` outside its support), shape `(1, k, V)`, or None under greedy
        decoding (Q is then a point mass on each draft token)."""
        draft = self.schedule.draft.tokens.to(input_ids.device)
        candidates = torch.cat([input_ids, draft[None]], dim=-1)
        q = self.schedule.draft.q
        if q is None or len(q) == 0:
            return candidates, None
        dense = torch.stack([q.dense(i) for i in range(len(q))])
        return candidates, dense.log()[None]

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        """Record the outcome of a verification; the width is fixed, so no strategy changes."""
        self.num_matches.append(int(num_matches))

    def observe(self, step: Step) -> None:
        """The loop's trace hook: record the outcome of every call that verified."""
        if step.verdict.verified:
            self.update_candidate_strategy(None, step.result.verifier, step.verdict.h)
