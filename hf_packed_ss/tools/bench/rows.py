"""The rows of each call of a schedule's steady-state iteration, read from the engine with no model
(`rows_per_iteration`), and the layouts' own default for static shapes (`layout_default_static_shapes`)."""

from __future__ import annotations

import inspect
from functools import lru_cache

from ...engine.layouts import SamePositionLayout, ShiftedBlockLayout
from ...engine.rows import MASK, model_free_calls
from ...engine.schedules import SCHEDULES, WINDOW_SCHEDULES


def layout_default_static_shapes(any_order: bool = False) -> bool:
    """The layout's own default for `static_shapes` (what `generate` decodes with), read from its signature."""
    layout = SamePositionLayout if any_order else ShiftedBlockLayout
    return inspect.signature(layout).parameters["static_shapes"].default


@lru_cache(maxsize=1024)
def _steady_rows(schedule: str, width: int, any_order: bool, static_shapes: bool, options: tuple) -> tuple[int, ...]:
    table = WINDOW_SCHEDULES if any_order else SCHEDULES
    steady = sorted(m for m, s in table.items() if s.exact)  # the native decoder commits by threshold: no steady state
    if schedule not in steady:
        raise ValueError(f"rows_per_iteration: no steady state for {schedule!r}; choose one of {steady}.")
    layout = (SamePositionLayout if any_order else ShiftedBlockLayout)(MASK, static_shapes=static_shapes)
    # every draft is rejected, so each iteration resolves one position: stop after four, with full windows
    calls = model_free_calls(table[schedule](width, **dict(options)), layout, False, 2 * width + 8,
                             stop=lambda ids: ids.numel() >= 6)
    iterations: list[list[int]] = [[]]
    for call in calls:  # an iteration ends with its verification
        iterations[-1].append(call.rows)
        if call.verifies:
            iterations.append([])
    return tuple(iterations[2])


def rows_per_iteration(schedule: str, width: int, any_order: bool = False, static_shapes: bool = True,
                       **options) -> list[int]:
    """Rows of each call of one steady-state iteration, read from the engine: the schedule
    (`schedules.SCHEDULES`, or `WINDOW_SCHEDULES` when `any_order`) is driven through its own plans and the real
    layout (`ShiftedBlockLayout` / `SamePositionLayout`) through the decoding loop on a two-token prompt by the
    engine's model-free probe (`engine.rows.model_free_calls`): every draft is rejected at its first token (h = 0,
    what a random drafter gives nearly always), and the rows of the third iteration are returned, by which time
    every schedule repeats itself. That is the largest steady-state call of every
    schedule: each accepted draft token only shortens the next draft; SetDLM windows have one pending token (the
    correction) and LTR order. `options` go to the schedule (e.g. ``speculative_branches=k`` for hybrid_ss).

    ``static_shapes=True`` (the default) gives appendix D.3's shapes. Nemotron (B = W + 1): AR 1; Linear-SS B + B;
    Packed-SS 2B; Quadratic-SS B(B + 1). SetDLM (window u = W): AR 2; Linear-SS (1 + u) + 2u; Packed-SS 1 + 3u;
    Quadratic-SS 1 + 2u + u^2. ``static_shapes=False`` (the layouts' default, what `generate` runs) drops rows no
    acceptance can use: Packed-SS 2B - 1 and 3u - 1 (the draft left after a rejection is W - 1 long),
    Quadratic-SS 2u + u(u - 1)/2 on SetDLM, hybrid_ss in between; AR and Linear-SS are unchanged."""
    return list(_steady_rows(schedule, width, any_order, bool(static_shapes), tuple(sorted(options.items()))))
