"""The time per NFE on this machine: seconds per decoding iteration as a function of the call's rows.

Measured, not assumed: every iteration of an `auto` decode times itself (the wall time from one call's plan to
the next, so the model call, the verification and the loop's own work are all in it) and each row count keeps
the median of its recent calls. Between measured row counts the cost, made non-decreasing in rows, is
interpolated piecewise linearly, so a cheaper path for 1-row calls, or a step where a kernel changes, is
followed instead of being averaged into one straight line.
Calls that ask the drafter and calls that do not are kept apart: on a LoRA drafter the first pay the adapter.
Prompt calls (past `policy.exact` rows) are pooled across the two kinds and read linearly in rows: the prompt is most of
their cost, and each prompt length comes once.

One `CallCost` per model, device, dtype and thread count lives for the process (`Measured`); `hf-packed-ss
probe --cost-model FILE` writes one to a file and `generate(..., cost_model=FILE)` starts from it.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .policy import AUTO_POLICY, AutoPolicy

VERIFY, DRAFT = "verify", "draft"  # a call without drafter rows (AR), and one with them
KINDS = (VERIFY, DRAFT)
_STAMPS = itertools.count()  # every smoothed curve gets a new stamp: a key for what is computed from it


def _interpolate(xs: list[int], ys: list[float], rows: int) -> float | None:
    """ys at `rows` (a key): linear between the nearest xs, the end segment's slope beyond them (never below half
    the nearest point); None without points."""
    if not xs:
        return None
    i = bisect.bisect_left(xs, rows)
    if len(xs) == 1 or (i < len(xs) and xs[i] == rows):
        return ys[min(i, len(xs) - 1)]
    if 0 < i < len(xs):
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])
    end, near = (0, 1) if i == 0 else (-1, -2)
    slope = (ys[end] - ys[near]) / (xs[end] - xs[near])
    return max(ys[end] + slope * (rows - xs[end]), 0.5 * ys[end])


@dataclass
class CallCost:
    """Seconds per iteration by call kind and row count: ``points[kind][rows] = [seconds, calls]``, seconds the
    median of that row count's last `policy.recent` calls (a first call of a shape, which builds its templates,
    or a pause of the machine does not move it)."""

    points: dict[str, dict[int, list[float]]] = field(default_factory=lambda: {k: {} for k in KINDS})
    policy: AutoPolicy = AUTO_POLICY
    recent: dict[tuple[str, int], deque] = field(default_factory=dict, repr=False)
    timed: int = 0  # calls observed
    ordered: dict[tuple[str, int], list] = field(default_factory=dict, repr=False)
    _smooth: dict[str, tuple] = field(default_factory=dict, repr=False)  # kind -> (xs, ys, stamp)

    def key(self, rows):
        """The point a row count is kept at: itself, or past `policy.exact` (prompt calls) one per `policy.bucket`
        rows (above `exact`, so a prompt never lands on a decoding row count); an int or an array of them."""
        exact, bucket = self.policy.exact, self.policy.bucket
        if isinstance(rows, np.ndarray):
            return np.where(rows > exact, exact + 1 + (rows - exact - 1) // bucket * bucket, rows)
        return rows if rows <= exact else exact + 1 + (rows - exact - 1) // bucket * bucket

    def observe(self, kind: str, rows: int, seconds: float) -> None:
        """One timed iteration. The first call of a decoding row count in the process is not kept: it builds that
        shape's templates and buffers, which its later calls reuse."""
        key = self.key(rows)
        self.timed += 1
        times = self.recent.get((kind, key))
        if times is None:
            times = self.recent[kind, key] = deque(maxlen=self.policy.recent)
            if key not in self.points[kind] and key <= self.policy.exact:  # a prompt's length comes once: kept
                return
        ordered = self.ordered.get((kind, key))  # the window, sorted: its median at hand
        if ordered is None:
            ordered = self.ordered[kind, key] = sorted(times)
        if len(times) == times.maxlen:
            del ordered[bisect.bisect_left(ordered, times[0])]
        times.append(seconds)
        bisect.insort(ordered, seconds)
        point = self.points[kind].get(key)
        self.points[kind][key] = [ordered[(len(ordered) - 1) // 2], (point[1] if point else 0.0) + 1]
        self._smooth.pop(kind, None)

    def restart(self, keep: dict[str, set[int]]) -> None:
        """What was timed so far was timed cold: every row count's next call starts its window afresh, and the
        row counts of neither `keep` (those about to be timed again) nor prompts are forgotten."""
        for times in self.recent.values():
            times.clear()
        self.ordered.clear()
        for kind, table in self.points.items():
            for rows in [r for r in table if r <= self.policy.exact and r not in keep.get(kind, ())]:
                del table[rows]
        self._smooth.clear()

    def measured(self, kind: str) -> list[int]:
        return sorted(self.points[kind])

    def curve(self, kind: str) -> tuple[list[int], list[float]]:
        """The measured row counts and their cost made non-decreasing in rows (pool-adjacent-violators, weighted
        by calls): noise between neighbouring row counts is averaged out instead of ranking widths."""
        return self._smoothed(kind)[:2]

    def stamp(self, kind: str) -> int:
        """A number that changes whenever `kind`'s curve does: what is computed from the curve can be kept."""
        return self._smoothed(kind)[2]

    def _smoothed(self, kind: str) -> tuple:
        if kind not in self._smooth:
            xs = sorted(self.points[kind])
            blocks: list[list[float]] = []  # [weighted sum, weight, points]
            for x in xs:
                seconds, calls = self.points[kind][x]
                blocks.append([seconds * max(calls, 1.0), max(calls, 1.0), 1])
                while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                    last = blocks.pop()
                    blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
            ys = [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]
            self._smooth[kind] = xs, ys, next(_STAMPS)
        return self._smooth[kind]

    def predict(self, kind: str, rows: int) -> float | None:
        """Seconds for one iteration whose call has `rows` rows: `predict_many` of one, in plain Python (it runs
        between two model calls, where a few numpy calls on cold caches cost more than the arithmetic). A prompt
        call (past `policy.exact` rows) is read off the prompt calls of both kinds (its rows are most of its cost,
        whichever the kind), linear in rows; None before any was timed."""
        if rows > self.policy.exact:
            return self._prompt(self.key(rows))
        return _interpolate(*self._smoothed(kind)[:2], rows)

    def _prompt(self, rows: int) -> float | None:
        pooled: dict[int, list[float]] = {}
        for table in self.points.values():
            for r, point in table.items():
                if r > self.policy.exact:
                    pooled.setdefault(r, []).append(point[0])
        xs = sorted(pooled)
        return _interpolate(xs, [sum(pooled[x]) / len(pooled[x]) for x in xs], rows)

    def predict_many(self, kind: str, rows: np.ndarray) -> np.ndarray | None:
        """Seconds per iteration for each row count in `rows`: the smoothed measured cost (`curve`), linear
        between the nearest measured row counts, the end segments' slope beyond them (never below half the
        nearest point); None before any call of this kind was measured."""
        xs, ys, _ = self._smoothed(kind)
        if not xs:
            return None
        x, y = np.asarray(xs, dtype=float), np.asarray(ys)
        rows = self.key(rows)
        if len(xs) == 1:
            return np.full(rows.shape, y[0])
        value = np.interp(rows, x, y)
        for out, end, near in ((rows < x[0], 0, 1), (rows > x[-1], -1, -2)):  # beyond the measured rows
            if out.any():
                slope = (y[end] - y[near]) / (x[end] - x[near])
                value[out] = np.maximum(y[end] + slope * (rows[out] - x[end]), 0.5 * y[end])
        return value

    def snapshot(self) -> CallCost:
        """A copy that predicts what this one predicts now and does not learn further (what a forecast uses)."""
        return CallCost({k: {r: list(p) for r, p in table.items()} for k, table in self.points.items()}, self.policy)

    def to_dict(self) -> dict:
        return {kind: {str(r): p for r, p in sorted(table.items())} for kind, table in self.points.items()}

    @classmethod
    def from_dict(cls, data: dict, policy: AutoPolicy = AUTO_POLICY) -> CallCost:
        unknown = sorted(set(data) - set(KINDS) - {"key"})
        if unknown:
            raise ValueError(f"A cost model holds the kinds {list(KINDS)}; this one has {unknown}: write it with "
                             "`hf-packed-ss probe --cost-model FILE`.")
        cost = cls({k: {int(r): [float(p[0]), float(p[1])] for r, p in data.get(k, {}).items()} for k in KINDS}, policy)
        for kind, table in cost.points.items():  # a file's value is the first of its row count's window
            for rows, point in table.items():
                cost.recent[kind, rows] = deque([point[0]], maxlen=policy.recent)
        return cost

    def save(self, path: str | Path, key: tuple = ()) -> None:
        Path(path).write_text(json.dumps({"key": [str(x) for x in key], **self.to_dict()}, indent=1))

    @classmethod
    def load(cls, path: str | Path, policy: AutoPolicy = AUTO_POLICY) -> CallCost:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()), policy)
        except (OSError, json.JSONDecodeError, TypeError, IndexError) as error:
            raise ValueError(f"cost_model={str(path)!r} is not a cost model file ({error}); write one with "
                             "`hf-packed-ss probe --model MODEL --cost-model FILE`.") from None
