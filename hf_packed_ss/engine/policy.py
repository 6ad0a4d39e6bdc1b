"""`auto`'s policy: every number its cost model and its chooser run by, in one place (`AutoPolicy`).

`auto` (`assistant_mode="auto"`, `speculative_width="auto"`) plays, before every call, the arm predicted fastest:
AR, or Packed-SS at a width W. Throughput = tokens per NFE / time per NFE (the paper's decomposition), each part
measured on this machine: the time by the call cost (`cost.CallCost`), the tokens by the acceptance profile and
its calibration (`width`). The chooser (`width.WidthChooser`) does three things, in this order of the fields:

1. explores: the first calls of a process time a spread of widths and AR, so that the cost model has a curve;
2. decides: every few calls it plays the arm predicted fastest, near the incumbent, switching only for a clear
   gain;
3. re-times: what is not played is timed again now and then (a draft check while AR wins, a neighbour of the
   drafting width that plays, and a sweep of the middle width, the narrowest and AR), so that a cost measured on
   a slow stretch of the machine, or a width never played, does not keep its arm out for good.

The comments give each number's reason; `docs/auto.md` the measurements behind them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AutoPolicy:
    """The knobs of `auto`, one default instance (`AUTO_POLICY`); `dataclasses.replace` makes a variant (what
    `docs/experiments/auto_sim.py --configs` tries)."""

    # --- the acceptance profile: r_k, the chance a draft token k positions past its drafter's prefix survives
    prior: float = 0.5  # r_1 before anything is seen; a farther offset starts from the estimate of the one before
    prior_strength: float = 1.0  # pseudo-observations of that prior
    # each observation at an offset discounts the older ones there (about the last 100 kept: the rates' noise, not
    # their drift, is what misleads) ...
    forget: float = 0.99
    # ... and each verification discounts every offset a little (evidence nothing refreshes returns to the prior:
    # a width once judged on a few draws is tried again)
    fade: float = 0.998

    # --- the calibration of the chain's tokens per call by what the calls at each width really appended
    # (acceptance is correlated from call to call, which the chain ignores: it over-predicts, the more the wider)
    calibrate_calls: float = 20.0  # (discounted) calls a width needs before it enters the fit
    calibrate_forget: float = 0.995  # each call of any width discounts every width's tallies
    slope: float = 0.02  # log c(W) is linear between widths, falling at most this much per width

    # --- the call cost: seconds per iteration by call kind and row count
    recent: int = 48  # a row count's cost is the median of its last `recent` calls (one call of this CPU ranges 2x:
    # a short window keeps the speed of the stretch it was last timed in for the rest of a run)
    exact: int = 64  # row counts past this (prompt calls) share a point per `bucket` rows, pooled over both kinds
    bucket: int = 16
    warm: int = 2  # calls after a switch that are not timed (they meet another width's shapes and draft: an AR
    # call after drafting ones costs 5-9% more for two calls on tiny-nemotron-gsm8k)

    # --- 1. exploration: the first calls of a process, where the cost model lacks a width
    explore_calls: int = 5  # calls at each of the widest, middle and narrowest width (the first `warm` untimed)
    explore_ar_calls: int = 4  # and AR calls

    # --- 2. decisions
    decide_every: int = 8  # calls between two decisions ...
    decide_most: int = 64  # ... doubled while the choice holds, up to this; reset when it moves
    margin: float = 1.08  # switch only to an arm predicted this much faster (near the optimum the predictions are
    # flat and noisy: every switch cuts or starves a draft)
    span: int = 2  # a decision weighs the arms within `span` widths of the incumbent, and AR (tokens per second are
    # unimodal in W: a few decisions climb to the best, at a fraction of the cost of weighing every width)

    # --- 3. re-timing what is not played
    # a draft check while calls without drafts (AR) win: `probe_calls` Packed-SS calls at the best drafting width
    # (one drafts, the next verify), after `probe_first` such calls, then after `probe_backoff` times as many each
    # time AR still wins (`probe_backoff_clear` times while AR is predicted `clear` times faster), up to `probe_most`
    probe_first: int = 16
    probe_most: int = 512
    probe_calls: int = 3
    probe_backoff: int = 2
    probe_backoff_clear: int = 4
    clear: float = 1.2
    # a neighbour check: after `neighbour_every` calls at a drafting width, the arm next to it (wider and narrower
    # in turn; AR below W = 2) plays `neighbour_calls` calls; a row count timed on a slow stretch of the machine,
    # or never played, would otherwise keep its width out for good
    neighbour_every: int = 192
    neighbour_calls: int = 5
    # a sweep: `sweep_calls` calls at the middle width and at the narrowest drafting arm, `sweep_ar_calls` at AR,
    # where they were not timed in the last `unplayed` calls; the first comes `sweep_first` timed calls after the
    # exploration (and drops what the exploration timed: a cold process's calls can cost 2x), each next one twice
    # as late, up to `sweep_every` (the speed of this CPU moves +-30% between ten-second stretches: timed on
    # several, a row count's median is the machine's usual)
    sweep_first: int = 128
    sweep_every: int = 512
    sweep_calls: int = 5
    sweep_ar_calls: int = 7
    unplayed: int = 256


AUTO_POLICY = AutoPolicy()
