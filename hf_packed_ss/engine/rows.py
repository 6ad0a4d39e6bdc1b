"""The one model-free row probe: the rows of a schedule's calls, read off the engine itself.

A copy of the schedule is driven through the real loop (`loop.decode`) and a fresh layout of the same engine class
and shape policy (`engine_layout`), with logits that need no model (vocabulary 3, MASK = 2): every proposal row
predicts token 0, so every draft is all 0s, and a call's first h verifier rows predict 0 (the draft's token:
accepted) and the rest 1 (the first of them rejects). h is chosen per call, so a probe can make a schedule find
every draft length it can meet. Everything that needs a row count reads it here, never from a formula of its
own: the static cache's steady call (`static.steady_rows`), `auto`'s rows by width and draft length
(`schedules.call_rows`) and the bench's rows per iteration (`tools.bench.rows.rows_per_iteration`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .acceptance import Greedy
from .contract import PackedCall
from .layouts.mask import LayoutBase
from .loop import decode

VOCAB, MASK = 3, 2
_ACCEPTED, _REJECTED = torch.tensor([20.0, 0.0, 0.0]), torch.tensor([0.0, 20.0, 0.0])


@dataclass(frozen=True)
class ProbedCall:
    """One call of a probed decode: its input rows, whether it verifies (a Linear-SS drafting call does not) and
    the draft tokens it found to verify (kappa)."""

    rows: int
    verifies: bool
    drafted: int


def engine_layout(layout) -> type:
    """The engine layout class `layout` is (or extends: a subclass that changes what a call predicts, such as a
    test's oracle drafter, keeps its rows); a layout of no engine class stands for itself."""
    package = LayoutBase.__module__.rpartition(".")[0]
    return next((c for c in type(layout).__mro__ if c.__module__.startswith(package)), type(layout))


def logits_accepting(call: PackedCall, h: int) -> torch.Tensor:
    """``(r, VOCAB)`` logits of `call`'s kept rows under which it accepts min(h, its draft) draft tokens."""
    logits = torch.zeros(call.logit_rows.numel(), VOCAB)
    logits[:, 0] = 20.0
    if call.verifier_rows is not None:
        logits[call.verifier_rows][h:] = _REJECTED  # a view: the verifier rows from rank h on reject
    return logits


def model_free_calls(schedule, layout, accept: bool | Sequence[int], new_tokens: int,
                     stop: Callable[[torch.Tensor], bool] | None = None) -> list[ProbedCall]:
    """Every call of a greedy decode of `new_tokens` tokens after a two-token prompt, with no model.

    `accept`: False, every draft token rejected (h = 0, what a random drafter gives nearly always); True, every
    one accepted; or one h per model call (the prompt's is call 0; past the sequence's end, h = 0). `stop` ends the
    decode early (the loop's stopping criterion). `schedule` and `layout` are copied, never run."""
    probe = copy.copy(schedule)
    probe.acceptance = Greedy()
    calls: list[ProbedCall] = []

    def accepted(i: int) -> int:
        if isinstance(accept, bool):
            return new_tokens if accept else 0
        return accept[i] if i < len(accept) else 0

    def record(step) -> None:
        calls.append(ProbedCall(step.call.rows, step.plan.verify, step.plan.available))

    decode(lambda call, cache: logits_accepting(call, accepted(len(calls))), probe,
           engine_layout(layout)(MASK, layout.static_shapes), torch.zeros(2, dtype=torch.long), new_tokens, stop=stop,
           trace=record)
    return calls
