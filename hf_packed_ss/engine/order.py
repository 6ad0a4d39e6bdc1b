"""Verification orders for any-order models (paper appendix C and E.6).

An order policy maps the unresolved positions of the active window, and a score per position known
before the call, to pi_t: the positions by verification rank. It never moves a draft token to another
position; it only decides which position is checked first.
"""

from __future__ import annotations

import math


def ltr(window, scores: dict[int, float]):
    """Left to right: the AR order (the window itself, which may be a range)."""
    return window


def confidence(window: list[int], scores: dict[int, float]) -> tuple[int, ...]:
    """Decreasing score, ties by textual position; positions without a finite score come last, in
    textual order (so the first iteration, which has no scores, is left to right)."""
    scored = [j for j in window if math.isfinite(scores.get(j, math.nan))]
    unscored = [j for j in window if j not in set(scored)]
    return tuple(sorted(scored, key=lambda j: (-scores[j], j)) + unscored)


ORDERS = {"ltr": ltr, "confidence": confidence}
