"""Repeated timings of one prompt: the median repeat and the spread (`hf-packed-ss run` and the demo).

The benchmark's intervals are paired bootstrap intervals over prompts; one prompt decoded a few times gets the
median of its repeats and their range instead (as `Interval`: value, low, high). The median is the lower median,
so the figure is always one measured repeat. The range leaves out the quarter of the repeats at each end (none of
3, one of 4 to 7 at each end, ...), so one interrupted repeat on a busy machine does not set it. A speed-up pairs
each repeat of a schedule with the baseline's repeat of the same round (`run_interleaved` rotates the order of
every round), so slow drift of the machine hits both.
"""

from __future__ import annotations

import statistics

from .statistics import Interval


def median_index(values: list[float]) -> int:
    """Index of the (lower) median of `values`."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


def trimmed_range(values: list[float]) -> tuple[float, float]:
    """(low, high) of `values` without the len // 4 lowest and the len // 4 highest."""
    kept = sorted(values)[len(values) // 4 : len(values) - len(values) // 4]
    return kept[0], kept[-1]


def spread(values: list[float]) -> Interval:
    """The lower median of `values` and their (trimmed) range."""
    return Interval(statistics.median_low(values), *trimmed_range(values))


def speedup(baseline: list[float], rates: list[float]) -> Interval:
    """Speed-up over the baseline from repeated throughputs (tokens/s; for the same tokens, the inverse wall
    times): the median rate over the baseline's median rate, and the (trimmed) range of the per-round ratios
    `rates[r] / baseline[r]` over the rounds both completed."""
    pairs = [r / b for b, r in zip(baseline, rates, strict=False) if b > 0]
    value = statistics.median_low(rates) / statistics.median_low(baseline)
    return Interval(value, *(trimmed_range(pairs) if pairs else (value, value)))


def relative_range(interval: Interval) -> float:
    """(high - low) / value: how far apart the repeats were, as a fraction of the reported figure."""
    return (interval.high - interval.low) / interval.value if interval.value else float("nan")
