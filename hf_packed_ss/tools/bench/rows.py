"""The rows of each call of a schedule's steady-state iteration, read from the engine with no model
(`rows_per_iteration`), and the layouts' own default for static shapes (`layout_default_static_shapes`)."""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch

from ...engine.schedules import SCHEDULES

# A model-free stand-in for the model when the probe drives a schedule through its real layout: vocabulary 3,
# MASK = 2; verifier rows predict token 1 and proposal rows token 0, so every draft token is rejected.
_VOCAB, _MASK = 3, 2


def _rejecting_logits(call) -> torch.Tensor:
    """Logits for a built call's kept rows: proposals argmax 0, verifier rows argmax 1 (first draft token rejected)."""
    logits = torch.zeros(call.logit_rows.numel(), _VOCAB)
    logits[:, 0] = 1.0
    if call.verifier_rows is not None:
        logits[call.verifier_rows] = torch.tensor([0.0, 1.0, 0.0])
    return logits


def layout_default_static_shapes(any_order: bool = False) -> bool:
    """The layout's own default for `static_shapes` (what `generate` decodes with), read from its signature."""
    from ...engine.layouts import SamePositionLayout, ShiftedBlockLayout

    layout = SamePositionLayout if any_order else ShiftedBlockLayout
    return inspect.signature(layout).parameters["static_shapes"].default


@lru_cache(maxsize=1024)
def _steady_rows(schedule: str, width: int, any_order: bool, static_shapes: bool, options: tuple) -> tuple[int, ...]:
    from ...engine import WINDOW_SCHEDULES, SamePositionLayout, ShiftedBlockLayout, decode

    table = WINDOW_SCHEDULES if any_order else SCHEDULES
    steady = sorted(m for m, s in table.items() if s.exact)  # the native decoder commits by threshold: no steady state
    if schedule not in steady:
        raise ValueError(f"rows_per_iteration: no steady state for {schedule!r}; choose one of {steady}.")
    layout = (SamePositionLayout if any_order else ShiftedBlockLayout)(_MASK, static_shapes=static_shapes)
    iterations: list[list[int]] = [[]]

    def record(step) -> None:  # an iteration ends with its verification
        iterations[-1].append(step.call.rows)
        if step.plan.verify:
            iterations.append([])

    # every draft is rejected, so each iteration resolves one position: stop after four, with full windows
    decode(lambda call, cache: _rejecting_logits(call), table[schedule](width, **dict(options)), layout,
           torch.zeros(2, dtype=torch.long), 2 * width + 8, stop=lambda ids: ids.numel() >= 6, trace=record)
    return tuple(iterations[2])


def rows_per_iteration(schedule: str, width: int, any_order: bool = False, static_shapes: bool = True,
                       **options) -> list[int]:
    """Rows of each call of one steady-state iteration, read from the engine: the schedule
    (`schedules.SCHEDULES`, or `WINDOW_SCHEDULES` when `any_order`) is driven through its own plans and the real
    layout (`ShiftedBlockLayout` / `SamePositionLayout`) through the decoding loop on a two-token prompt, with no
    model: every draft is rejected at its
    first token (h = 0, what a random drafter gives nearly always), and the rows of the third iteration are
    returned, by which time every schedule repeats itself. That is the largest steady-state call of every
    schedule: each accepted draft token only shortens the next draft; SetDLM windows have one pending token (the
    correction) and LTR order. `options` go to the schedule (e.g. ``speculative_branches=k`` for hybrid_ss).

    ``static_shapes=True`` (the default) gives appendix D.3's shapes. Nemotron (B = W + 1): AR 1; Linear-SS B + B;
    Packed-SS 2B; Quadratic-SS B(B + 1). SetDLM (window u = W): AR 2; Linear-SS (1 + u) + 2u; Packed-SS 1 + 3u;
    Quadratic-SS 1 + 2u + u^2. ``static_shapes=False`` (the layouts' default, what `generate` runs) drops rows no
    acceptance can use: Packed-SS 2B - 1 and 3u - 1 (the draft left after a rejection is W - 1 long),
    Quadratic-SS 2u + u(u - 1)/2 on SetDLM, hybrid_ss in between; AR and Linear-SS are unchanged."""
    return list(_steady_rows(schedule, width, any_order, bool(static_shapes), tuple(sorted(options.items()))))
