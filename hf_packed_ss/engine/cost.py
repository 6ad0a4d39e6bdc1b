"""The time per NFE on this machine: seconds per decoding iteration as a function of the call's rows.

Measured, not assumed: every iteration of an `auto` decode times itself (the wall time from one call's plan to
the next, so the model call, the verification and the loop's own work are all in it) and the mean per row
count is kept. Between measured row counts the cost is interpolated piecewise linearly, so a cheaper path for
1-row calls, or a step where a kernel changes, is followed instead of being averaged into one straight line.
Calls that ask the drafter and calls that do not are kept apart: on a LoRA drafter the first pay the adapter.

One `CallCost` per model, device, dtype and thread count lives for the process (`Measured`); `hf-packed-ss
probe --cost-model FILE` writes one to a file and `generate(..., cost_model=FILE)` starts from it.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

VERIFY, DRAFT = "verify", "draft"  # a call without drafter rows (AR), and one with them
KINDS = (VERIFY, DRAFT)
MEMORY = 20  # the mean of a row count follows its last ~MEMORY calls
BUCKET = 16  # row counts past 64 (prompt calls) share a point per 16 rows


def _key(rows: int) -> int:
    return rows if rows <= 64 else rows - rows % BUCKET


@dataclass
class CallCost:
    """Mean seconds per iteration by call kind and row count: ``points[kind][rows] = [seconds, calls]``."""

    points: dict[str, dict[int, list[float]]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def observe(self, kind: str, rows: int, seconds: float) -> None:
        """One timed iteration. A call far off the running mean (a pause of the machine) moves it at most 2x."""
        point = self.points[kind].setdefault(_key(rows), [seconds, 0.0])
        mean, n = point
        if n:
            seconds = min(max(seconds, mean / 2), 2 * mean)
        point[1] = n + 1
        point[0] = mean + (seconds - mean) / min(n + 1, MEMORY)

    def measured(self, kind: str) -> list[int]:
        return sorted(self.points[kind])

    def predict(self, kind: str, rows: int) -> float | None:
        """Seconds for one iteration whose call has `rows` rows: the measured mean, linear between the nearest
        measured row counts, the end segments' slope beyond them (never below half the nearest point); None
        before any call of this kind was measured."""
        table = self.points[kind]
        if not table:
            return None
        rows = _key(rows)
        if rows in table:
            return table[rows][0]
        xs = sorted(table)
        if len(xs) == 1:
            return table[xs[0]][0]
        i = min(max(bisect_left(xs, rows), 1), len(xs) - 1)
        (x0, x1), (y0, y1) = (xs[i - 1], xs[i]), (table[xs[i - 1]][0], table[xs[i]][0])
        value = y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
        return max(value, 0.5 * (y0 if rows < x0 else y1))

    def to_dict(self) -> dict:
        return {kind: {str(r): p for r, p in sorted(table.items())} for kind, table in self.points.items()}

    @classmethod
    def from_dict(cls, data: dict) -> CallCost:
        unknown = sorted(set(data) - set(KINDS) - {"key"})
        if unknown:
            raise ValueError(f"A cost model holds the kinds {list(KINDS)}; this one has {unknown}: write it with "
                             "`hf-packed-ss probe --cost-model FILE`.")
        return cls({k: {int(r): [float(p[0]), float(p[1])] for r, p in data.get(k, {}).items()} for k in KINDS})

    def save(self, path: str | Path, key: tuple = ()) -> None:
        Path(path).write_text(json.dumps({"key": [str(x) for x in key], **self.to_dict()}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> CallCost:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, TypeError, IndexError) as error:
            raise ValueError(f"cost_model={str(path)!r} is not a cost model file ({error}); write one with "
                             "`hf-packed-ss probe --model MODEL --cost-model FILE`.") from None
