"""Aggregates, paired bootstrap intervals and the interleaving order (paper section 4, appendix E.5).

Rates use aggregate totals, never means of per-response rates: throughput = total generated tokens / total
decoder wall time = (tokens/NFE) / (time/NFE). A paired ratio of schedule S to the baseline is S's statistic over
the baseline's, both recomputed on the *same* resampled prompt indices; 95% percentile intervals come from 20,000
resamples of prompts with replacement, each sampled prompt bringing all its repeated responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.stats import DecodingStats
from .record import Record

RESAMPLES = 20_000
RATIO_METRICS = ("throughput", "tokens_per_nfe", "time_per_nfe", "mean_wall")


def rotation(schedules: list[str], step: int) -> list[str]:
    """The order of run `step` (prompt index with one repeat): schedules rotated left by `step`, so every
    schedule runs first, second, ... equally often and slow drift of the machine hits all alike."""
    k = step % len(schedules)
    return schedules[k:] + schedules[:k]


@dataclass
class Totals:
    """Per-prompt sums over one schedule's repeated responses; every field has shape `(n_prompts,)`.
    `correct` is NaN where no grader exists."""

    tokens: np.ndarray
    time_s: np.ndarray
    nfe: np.ndarray
    responses: np.ndarray
    correct: np.ndarray

    def resampled(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rates of every resample: `indices` (m, n) -> each rate of shape (m,)."""
        return rates(*(getattr(self, f)[indices].sum(axis=-1) for f in ("tokens", "time_s", "nfe", "responses",
                                                                          "correct")))

    def point(self) -> dict[str, float]:
        return {k: float(v) for k, v in rates(self.tokens.sum(), self.time_s.sum(), self.nfe.sum(),
                                               self.responses.sum(), self.correct.sum()).items()}


def rates(tokens, time_s, nfe, responses, correct) -> dict:
    """The reported statistics from totals (arrays broadcast): throughput (tokens/s), tokens/NFE, time/NFE (s),
    mean wall per response (s) and accuracy (fraction; NaN if ungraded)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "throughput": np.divide(tokens, time_s),
            "tokens_per_nfe": np.divide(tokens, nfe),
            "time_per_nfe": np.divide(time_s, nfe),
            "mean_wall": np.divide(time_s, responses),
            "accuracy": np.divide(correct, responses),
        }


def per_prompt_totals(records: list[Record], schedules: list[str], prompts: list[int]) -> dict[str, Totals]:
    """Sum each schedule's successful records per prompt, in the order of `prompts`."""
    where = {p: i for i, p in enumerate(prompts)}
    out = {}
    for s in schedules:
        sums = np.zeros((5, len(prompts)))
        graded = np.zeros(len(prompts), dtype=bool)
        for r in records:
            if r.schedule == s and r.error is None and r.prompt in where:
                i = where[r.prompt]
                sums[:, i] += (r.new_tokens, r.decoder_time_s, r.nfe, 1, bool(r.correct))
                graded[i] |= r.correct is not None
        correct = np.where(graded, sums[4], np.nan)
        out[s] = Totals(sums[0], sums[1], sums[2], sums[3], correct)
    return out


@dataclass(frozen=True)
class Interval:
    """A point estimate on all prompts and its percentile bootstrap interval."""

    value: float
    low: float
    high: float


def paired_intervals(totals: dict[str, Totals], baseline: str, resamples: int = RESAMPLES, seed: int = 0,
                     level: float = 0.95, indices: np.ndarray | None = None,
                     chunk: int = 2_000) -> dict[str, dict[str, Interval]]:
    """Ratios to `baseline` (RATIO_METRICS) and accuracy differences in percentage points, per schedule.

    One `(resamples, n)` matrix of prompt indices (drawn with a seeded generator, or given as `indices`) is
    shared by all schedules, so the comparison is paired; it is processed `chunk` rows at a time."""
    n = len(totals[baseline].tokens)
    rng = np.random.default_rng(seed)
    total = resamples if indices is None else len(indices)
    draws: dict[str, dict[str, list]] = {s: {m: [] for m in (*RATIO_METRICS, "accuracy")} for s in totals}
    for start in range(0, total, chunk):
        rows = min(chunk, total - start)
        idx = rng.integers(0, n, size=(rows, n)) if indices is None else np.asarray(indices[start:start + rows])
        base = totals[baseline].resampled(idx)
        for s, t in totals.items():
            mine = t.resampled(idx)
            with np.errstate(divide="ignore", invalid="ignore"):
                for m in RATIO_METRICS:
                    draws[s][m].append(mine[m] / base[m])
            draws[s]["accuracy"].append(100.0 * (mine["accuracy"] - base["accuracy"]))
    tail = 100.0 * (1.0 - level) / 2.0
    base_point = totals[baseline].point()
    out: dict[str, dict[str, Interval]] = {}
    for s, t in totals.items():
        point = t.point()
        out[s] = {}
        for m, parts in draws[s].items():
            value = 100.0 * (point[m] - base_point[m]) if m == "accuracy" else _ratio(point[m], base_point[m])
            if m == "accuracy" and np.isnan(value):
                continue
            low, high = np.percentile(np.concatenate(parts), [tail, 100.0 - tail])
            out[s][m] = Interval(float(value), float(low), float(high))
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def aggregate(records: list[Record]) -> dict:
    """Absolute figures of one schedule's successful records (paper Table 6): totals, means and rates."""
    ok = [r for r in records if r.error is None]
    if not ok:
        return {"responses": 0}
    total = DecodingStats.sequential(ok)  # the counts and times summed
    tokens, time_s, nfe, model = total.new_tokens, total.decoder_time_s, total.nfe, total.model_time_s
    rows, accepted = total.rows_per_call, total.accepted_per_iteration
    later = [x for r in ok for x in r.rows_per_call[1:]]  # after the prompt call (paper Table 3)
    graded = [r.correct for r in ok if r.correct is not None]
    compared = [r.differs_from_ar for r in ok if r.differs_from_ar is not None]
    ties = [r for r in ok if r.differs_from_ar and r.near_tie]
    n = len(ok)
    return {
        "responses": n,
        "width": ok[0].width,
        "tokens": tokens,
        "nfe": nfe,
        "decoder_time_s": time_s,
        "model_time_s": model,
        "non_model_time_s": total.non_model_time_s,
        "throughput": tokens / time_s if time_s else float("nan"),
        "tokens_per_nfe": tokens / nfe if nfe else float("nan"),
        "time_per_nfe_s": time_s / nfe if nfe else float("nan"),
        "mean_wall_s": time_s / n,
        "mean_tokens": tokens / n,
        "mean_nfe": nfe / n,
        "mean_model_time_s": model / n,
        "mean_non_model_time_s": (time_s - model) / n,
        "mean_rows_per_call": float(np.mean(rows)) if rows else float("nan"),
        "mean_rows_per_call_after_first": float(np.mean(later)) if later else float("nan"),
        "max_rows_per_call_after_first": max(later, default=0),
        "mean_accepted_per_iteration": float(np.mean(accepted)) if accepted else float("nan"),
        "accuracy": sum(graded) / len(graded) if graded else None,
        "differs_from_ar": sum(compared) if compared else None,
        "differs_at_near_ties": len(ties) if compared else None,
        "compiled_graphs": sum(r.compiled_graphs for r in ok),
    }
