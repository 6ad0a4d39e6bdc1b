"""Choosing the width of every call (`speculative_width="auto"`, `assistant_mode="auto"`) by expected throughput.

Throughput is tokens per NFE over time per NFE (the paper's decomposition). Time per NFE comes from `CallCost`,
measured on this machine. Tokens per NFE come from the acceptance profile: r_k, the chance that a draft token
k positions past the prefix its drafter saw survives given that the draft before it did.

For Packed-SS at width W the draft is made from P_{t-1} and covers offsets 1..W-1 of it (offset 0 is the
position the same call verifies), on both layouts. A call that finds a draft of n tokens (offsets W-n..W-1)
accepts h of them with probability r_(W-n) ... r_(W-n+h-1) (1 - r_(W-n+h)), appends A = h + 1 tokens and
leaves the next call a draft of n' = W - 1 - h tokens. That chain over n has a stationary law pi, and

    throughput(W) = sum_n pi_n E[A | n] / sum_n pi_n cost(rows(W, n)),    throughput(AR) = 1 / cost(rows(AR)),

with rows(W, n) read from the decode's own layout. Acceptance is correlated from call to call, which the chain
ignores: it over-predicts, the more the wider the draft, so E[A] is calibrated by what the calls at each width
really appended (`WidthChooser.calibration`). The chooser plays the best arm, measures what it has not
(the first calls of a process time a spread of widths), and while AR wins it checks a draft now and then.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .cost import DRAFT, VERIFY, CallCost

PRIOR = 0.5  # r_1 before anything is seen; a farther offset starts from the estimate of the one before it
STRENGTH = 1.0  # pseudo-observations of that prior
FORGET = 0.99  # each observation at an offset discounts the older ones there (~100 kept: the rates' noise, not
FADE = 0.998  # their drift, is what misleads), and each verification all of them a little (evidence nothing
# refreshes returns to the prior)
DECIDE_EVERY, DECIDE_MOST = 8, 64  # calls between two decisions: doubled while the choice holds, reset when it moves
MARGIN = 1.08  # switch only to an arm predicted this much faster (near the optimum the predictions are flat and
# noisy: every switch cuts or starves a draft)
PROBE_FIRST, PROBE_MOST = 16, 512  # AR calls before checking a draft again (doubled while AR keeps winning)
WARM = 2  # calls after a switch that are not timed
PROBE_CALLS = 3  # a check: one call drafts, the next ones verify
CLEAR = 1.2  # AR predicted this much faster than any draft: the next check comes 4x (not 2x) later
# calls at a drafting width before a neighbouring arm is timed for a few calls (one side, then the other): a row
# count measured on a slow stretch of the machine, or never played, would otherwise keep its width out for good
NEIGHBOUR_EVERY, NEIGHBOUR_CALLS = 192, 5
# timed calls between two sweeps: a few calls at the middle width, the narrowest drafting arm and AR where they
# were not timed in the last UNPLAYED calls. A row count timed only at the start of a process keeps what it cost on
# that stretch of the machine (a cold process's calls can cost 2x; the speed moves +-30% between ten-second
# stretches) and misjudges its arm for good; timed on several stretches, its median is the machine's usual. The
# first sweep comes SWEEP_FIRST calls after the exploration (and drops what the exploration timed: it ran cold),
# each next one twice as late, up to SWEEP_EVERY
SWEEP_FIRST, SWEEP_EVERY, SWEEP_CALLS, UNPLAYED = 128, 512, 5, 256
SPAN = 2  # a decision weighs the arms within SPAN of the incumbent (and AR)
_VERSIONS = itertools.count()  # acceptance profile versions
# the chain's tokens per call are calibrated by what calls appended over what it expected of them: at a width with
# CALIBRATE_CALLS (each call at any width discounts all by CALIBRATE_FORGET); between widths log c(W) is linear,
# falling at most SLOPE per width (acceptance is correlated from call to call, which the chain ignores: it
# over-predicts, more the wider the draft)
CALIBRATE_CALLS, CALIBRATE_FORGET, SLOPE = 20, 0.995, 0.02


@dataclass
class AcceptanceProfile:
    """Discounted counts of draft tokens tried and accepted per drafter offset (index k = offset k)."""

    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    # changes with every observation (unique in the process): what is computed from the rates is kept until then
    version: int = field(default_factory=lambda: next(_VERSIONS))

    def observe(self, first: int, drafted: int, h: int) -> None:
        """A verification of `drafted` tokens whose first sits `first` positions past the drafter's prefix
        accepted `h`: offsets first..first+h-1 survived, offset first+h (if drafted) did not."""
        self.version = next(_VERSIONS)
        seen = min(h + 1, drafted)
        top = first + seen
        if len(self.tried) < top:
            grow = top - len(self.tried)
            self.tried += [0.0] * grow
            self.accepted += [0.0] * grow
        self.tried = [FADE * t for t in self.tried]  # every offset fades slowly, also those this draft never
        self.accepted = [FADE * a for a in self.accepted]  # reached: a width once judged on a few draws is tried again
        for i, k in enumerate(range(first, top)):  # and each offset tried forgets faster (follows the prompt)
            self.tried[k] = FORGET * self.tried[k] + 1
            self.accepted[k] = FORGET * self.accepted[k] + (i < h)

    def rates(self, top: int) -> list[float]:
        """r_0..r_(top-1) (r_0 unused): posterior means, each prior the estimate one offset nearer."""
        out, prior = [PRIOR], PRIOR
        for k in range(1, top):
            tried = self.tried[k] if k < len(self.tried) else 0.0
            accepted = self.accepted[k] if k < len(self.accepted) else 0.0
            prior = (accepted + STRENGTH * prior) / (tried + STRENGTH)
            out.append(prior)
        return out


def draft_chain(rates: list[float], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed-SS at `width` under acceptance `rates`: the stationary law pi over the draft length n a call finds
    (0..W-1) and E[A | n], the tokens that call appends (module docstring)."""
    pi, tokens = Chains((width,)).solve(rates)
    return pi[0], tokens[0]


class Chains:
    """The draft chains of several widths at once, for one set of rates: one padded batch (states n >= W of a
    narrower chain lead to n = 0 and are never entered, so they hold no mass), one batched solve. Only the rates
    change between decisions; the index arrays are built once."""

    def __init__(self, widths: tuple[int, ...]):
        top, count = max(widths), len(widths)
        k, n, h = np.meshgrid(np.arange(count), np.arange(top), np.arange(top), indexing="ij")
        w = np.asarray(widths)[k]
        valid = (n < w) & (h <= n)
        k, n, h, w = k[valid], n[valid], h[valid], w[valid]
        first = w - n  # the offset of the draft's first token from its drafter's prefix
        to = w - 1 - h  # the draft the next call finds after h accepted
        # the term (width, n, h) has probability r_first ... r_(first+h-1) (1 - r_(first+h) if h < n: that token
        # was rejected; else the whole draft survived): exp(logs[upto] - logs[before]) (1 - stopped r[next])
        self.upto, self.before, self.next = first + h - 1, first - 1, np.minimum(first + h, top)
        self.stopped = (h < n).astype(float)
        self.tokens = (h + 1).astype(float)
        self.state = k * top + n  # the flat index of (width, n): where each term's tokens add up
        self.cell = (k * top + to) * top + n  # where its probability enters pi = pi move, as (move^T - I) pi = 0
        # that system without the terms: -I, and the padding states n >= W of a narrower chain lead to n = 0; its
        # last equation is replaced by the normalisation sum(pi) = 1
        self.system = np.tile(-np.eye(top), (count, 1, 1))
        pk, pn = np.nonzero(np.arange(top)[None, :] >= np.asarray(widths)[:, None])
        self.system[pk, 0, pn] = 1.0
        self.last = (self.cell // top) % top == top - 1  # terms in the replaced equation: left out
        self.cell, self.terms = self.cell[~self.last], ~self.last
        self.system[:, -1] = 1.0
        self.rhs = np.zeros((count, top, 1))
        self.rhs[:, -1] = 1.0
        self.shape = (count, top)

    def solve(self, rates: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """(pi, E[A | n]), each of shape (widths, max width); r_k = rates[k] for k >= 1."""
        count, top = self.shape
        r = np.clip(np.asarray(rates[:top], dtype=float), 1e-12, 1 - 1e-12)
        r = np.concatenate([r, np.full(top + 1 - len(r), r[-1])])
        logs = np.concatenate([[0.0], np.cumsum(np.log(r[1:]))])  # logs[j] = sum of log r_1..r_j
        p = np.exp(logs[self.upto] - logs[self.before]) * (1.0 - self.stopped * r[self.next])
        tokens = np.bincount(self.state, p * self.tokens, count * top).reshape(self.shape)
        system = self.system.copy()
        system.reshape(-1)[self.cell] += p[self.terms]  # one term per cell
        pi = np.linalg.solve(system, self.rhs)[..., 0].clip(0.0, None)
        return pi / pi.sum(axis=1, keepdims=True).clip(1e-12, None), tokens


@dataclass
class Measured:
    """What `auto` decodes of one model on one machine have learnt, kept for the process: the call cost, the
    acceptance profile, and how many calls without a draft pass before a draft is checked again."""

    cost: CallCost = field(default_factory=CallCost)
    profile: AcceptanceProfile = field(default_factory=AcceptanceProfile)
    probe_every: int = PROBE_FIRST
    undrafted: int = 0  # calls without a draft to verify since one was last checked (across decodes)
    unchecked: int = 0  # calls at a drafting width since a neighbour was last timed (across decodes)
    side: int = -1  # the side of the last neighbour check: +1 wider, -1 narrower
    centre: int | None = None  # the last decision's arm and the calls to the next: a decode starts there, and
    every: int = DECIDE_EVERY  # its first decision weighs the arms around it without the switching margin
    # the drafting arms' predicted rates by (arms, their rows): with the profile version, the tallies and the draft
    # cost stamp they were computed for, kept across decodes (while AR plays none of them changes)
    kept: dict = field(default_factory=dict, repr=False)
    # the calls at each width: width -> [tokens they appended, tokens the chain expected of them, calls, `tallied`
    # when last counted], each call of any width discounting them all by CALIBRATE_FORGET
    appended: dict = field(default_factory=dict, repr=False)
    chain: dict = field(default_factory=dict, repr=False)  # width -> the chain's tokens per call, last computed
    tallied: int = 0  # calls counted in `appended`
    swept: int = 0  # `cost.timed` at the last sweep (or exploration)
    sweep_every: int = field(default_factory=lambda: SWEEP_FIRST)  # calls from it to the next
    sweeps: int = 0
    played: dict = field(default_factory=dict, repr=False)  # arm -> `cost.timed` at its last timed call


@lru_cache(maxsize=64)
def chains_for(widths: tuple[int, ...]) -> Chains:
    return Chains(widths)


class WidthChooser:
    """Picks the arm of every call: 0 for AR, else a Packed-SS width from `widths`."""

    def __init__(self, widths: tuple[int, ...], ar: bool, measured: Measured):
        self.widths, self.ar, self.measured = tuple(sorted(widths)), ar, measured
        # W = 1 drafts nothing it can use (its one drafted position is the one its call verifies): with AR allowed
        # it is AR with extra rows
        self.arms = ((0,) if ar else ()) + tuple(w for w in self.widths if w > 1 or not ar or len(self.widths) == 1)
        self.drafting = tuple(a for a in self.arms if a)
        self.arm: int | None = None
        self.previous: int | None = None  # the arm of the call before the last one
        self.run = 0
        self.queue: list[int] = []
        self.tic: float | None = None
        self.since = 0  # calls since the last decision
        self.every = DECIDE_EVERY  # calls between decisions now
        self.held: int | None = None  # the arm a draft check interrupted: the one a switch must beat after it
        self.fresh = True  # no decision made yet in this decode

    def start(self, rows: Callable[[int], tuple[int, tuple[int, ...]]]) -> None:
        """Before a decode's first call; `rows(W)`: the rows of an AR call and of a Packed-SS call at W by the
        draft it finds (`schedules.call_rows` on the decode's layout)."""
        self.call_rows = rows
        self.arm, self.tic, self.since, self.every, self.held = None, None, 0, DECIDE_EVERY, None
        self.previous, self.run = None, 0
        if self.measured.centre in self.arms:  # no decision before the first call (each costs ~0.5 ms in place)
            self.arm, self.every = self.measured.centre, self.measured.every
            self.previous, self.run = self.arm, WARM - 1  # no switch: the prompt call is timed
        self.fresh = True  # the decode's first decision: the arm it starts with is no incumbent
        # rows of each drafting arm's call by the draft it finds (padded past W, where the chain holds no mass)
        self.draft_rows = np.ones((len(self.drafting), max(self.drafting, default=1)), dtype=np.int64)
        for i, w in enumerate(self.drafting):
            self.draft_rows[i, :w] = self.rows(w)[1]
        self.queue = self.exploration()
        self.arms_key = self.drafting, self.draft_rows.tobytes()  # where `Measured.kept` holds these arms' rates

    def rows(self, width: int) -> tuple[int, tuple[int, ...]]:
        return self.call_rows(max(width, 1))

    def spread(self) -> list[int]:
        """The widths the cost model is measured at beyond the played ones: widest, middle, narrowest."""
        return sorted({self.widths[-1], self.widths[len(self.widths) // 2], self.widths[0]}, reverse=True)

    def exploration(self) -> list[int]:
        """The calls that measure what the cost model lacks: five at each of a spread of widths (the first call
        also processes the prompt) and four AR calls, the first `WARM` of each untimed (and a row count's first
        timed call is not kept)."""
        cost, plan = self.measured.cost, []
        if self.measured.sweeps:  # the sweeps keep the cost model now (the first dropped what this timed)
            return plan
        for w in self.spread():
            if self.rows(w)[1][-1] not in cost.points[DRAFT]:
                plan += [w] * (WARM + 3)
        if self.ar and self.rows(0)[0] not in cost.points[VERIFY]:
            plan += [0] * (WARM + 2)
        if plan:
            self.measured.swept = cost.timed
        return plan

    def sweep(self, current: int) -> int:
        """Instead of a decision: `SWEEP_CALLS` calls at the middle width, the narrowest drafting arm and AR where
        they were untimed for `UNPLAYED` calls, then the decision after them weighs what they measured with
        `current` as the incumbent. The first sweep restarts the cost model's windows and forgets the row counts
        it will not time again: the exploration timed them in a cold process."""
        measured, now = self.measured, self.measured.cost.timed
        first = not measured.sweeps  # what the exploration timed (a cold process) is redone
        measured.swept, measured.sweep_every = now, min(2 * measured.sweep_every, SWEEP_EVERY)
        measured.sweeps += 1
        # the middle width, the narrowest drafting arm and AR (the widest costs most and rarely matters; AR calls are
        # cheap: a few more of them)
        middle = self.widths[len(self.widths) // 2]
        arms = sorted({middle, *self.drafting[:1]} & set(self.arms), reverse=True) + ([0] if self.ar else [])
        if first:
            timed = [a for a in arms + [current] if a]
            measured.cost.restart({VERIFY: {self.rows(0)[0]}, DRAFT: {r for a in timed for r in self.rows(a)[1]}})
        stale = [a for a in arms if a != current
                 and (first or now - measured.played.get(a, -UNPLAYED) >= UNPLAYED)]
        plan = [a for a in stale for _ in range(SWEEP_CALLS + (2 if a == 0 else 0))]
        if not plan:
            return self.decide()
        self.queue, self.held = plan[1:], current
        return plan[0]

    def best(self, arms: tuple[int, ...] | None = None) -> tuple[int, dict[int, float]]:
        """The arm predicted fastest and the predicted tokens per second of every arm whose cost is known, of
        `arms` (default: all)."""
        cost, predicted, arms = self.measured.cost, {}, self.arms if arms is None else arms
        ar = cost.predict(VERIFY, self.rows(0)[0])
        if 0 in arms and ar:
            predicted[0] = 1.0 / ar
        for w, (rate, tokens) in self.drafting_rates(tuple(a for a in arms if a)).items():
            # a drafting call does an AR call's work and more: never cheaper, whatever noise the two costs hold
            predicted[w] = min(rate, tokens / ar) if ar else rate
        if not predicted:  # nothing measured yet for these arms (a cost file without them): the widest first
            return self.widths[-1] if self.widths else 0, predicted
        return max(predicted, key=predicted.get), predicted

    def drafting_rates(self, widths: tuple[int, ...] | None = None) -> dict[int, tuple[float, float]]:
        """(predicted tokens per second, tokens per call) of the drafting arms `widths` (default: all),
        recomputed only when the acceptance profile, the tokens the calls appended or the drafting calls' cost
        changed (while AR plays, none does)."""
        cost, profile = self.measured.cost, self.measured.profile
        widths = self.drafting if widths is None else widths
        if not widths or not cost.points[DRAFT]:
            return {}
        key = profile.version, self.measured.tallied, cost.stamp(DRAFT)
        kept = self.measured.kept.get((self.arms_key, widths))
        if kept is None or kept[0] != key:
            rows = self.draft_rows[[self.drafting.index(w) for w in widths], : widths[-1]]
            seconds = cost.predict_many(DRAFT, rows)
            pi, tokens = chains_for(widths).solve(profile.rates(widths[-1]))
            expected = (pi * tokens).sum(axis=1)
            self.measured.chain.update(zip(widths, expected.tolist(), strict=True))
            expected = expected * self.calibration(widths)
            rate = expected / (pi * seconds).sum(axis=1).clip(1e-12, None)
            kept = key, dict(zip(widths, zip(rate.tolist(), expected.tolist(), strict=True), strict=True))
            self.measured.kept[self.arms_key, widths] = kept
        return kept[1]

    def calibration(self, widths: tuple[int, ...] | None = None) -> np.ndarray:
        """c(W) per drafting arm of `widths` (default: all): what the calls at W appended over what the chain
        expected of them when they were made (a run of easy or hard prompts while W played does not stick to W),
        where enough calls were made; log c is fitted linear in W over those widths (constant with one), weighted
        by calls."""
        ws, logs, weights = [], [], []
        for w, (tokens, expected, calls, at) in self.measured.appended.items():
            calls *= CALIBRATE_FORGET ** (self.measured.tallied - at)  # every call fades every width's tallies
            if calls >= CALIBRATE_CALLS:
                ws.append(w)
                logs.append(np.log(tokens / expected))
                weights.append(calls)
        widths = np.asarray(self.drafting if widths is None else widths)
        if not ws:
            return np.ones(len(widths))
        x, y, v = np.asarray(ws, dtype=float), np.asarray(logs), np.asarray(weights)
        mean_x, mean_y = (v * x).sum() / v.sum(), (v * y).sum() / v.sum()
        spread = (v * (x - mean_x) ** 2).sum()
        slope = (v * (x - mean_x) * (y - mean_y)).sum() / spread if len(ws) > 1 and spread > 0 else 0.0
        return np.exp(mean_y + np.clip(slope, -SLOPE, 0.0) * (widths - mean_x))

    def tally(self, arm: int, tokens: int) -> None:
        """A call at width `arm` appended `tokens`; the chain's expectation for it is the last one computed."""
        expected = self.measured.chain.get(arm)
        if expected is None:
            return
        measured = self.measured
        measured.tallied += 1
        kept = measured.appended.setdefault(arm, [0.0, 0.0, 0.0, measured.tallied])
        fade = CALIBRATE_FORGET ** (measured.tallied - kept[3])
        kept[:] = fade * kept[0] + tokens, fade * kept[1] + expected, fade * kept[2] + 1.0, measured.tallied

    def observe(self, first: int, drafted: int, h: int) -> None:
        self.measured.profile.observe(first, drafted, h)
        self.measured.undrafted = 0

    def choose(self, last_rows: int | None) -> int:
        """The arm of the next call; `last_rows`: the rows of the call made since the last `choose`."""
        now = time.perf_counter()
        # the first WARM calls after a switch are not timed: they meet shapes and a draft of another width (an AR
        # call after drafting ones costs 5-9% more for two calls on tiny-nemotron-gsm8k), and the cost curve is what
        # a width costs while it plays
        self.run = self.run + 1 if self.previous == self.arm else 0  # the last call's place in its arm's run
        if self.tic is not None and last_rows is not None and self.run >= WARM:
            self.measured.cost.observe(VERIFY if self.arm == 0 else DRAFT, last_rows, now - self.tic)
            self.measured.played[self.arm] = self.measured.cost.timed
        self.previous = self.arm
        self.since += 1
        if self.arm is not None and self.arm < 2:  # AR, or Packed-SS at W = 1 (its one drafted position is verified
            self.measured.undrafted += 1           # by the call that drafts it): nothing to learn from
        elif self.arm is not None:
            self.measured.unchecked += 1
        if self.queue:
            self.arm = self.queue.pop(0)
            self.since, self.every = DECIDE_MOST, DECIDE_EVERY  # weigh what it measured at once
        elif self.arm is None or self.since >= self.every:
            due = self.arm and self.arm >= 2 and self.measured.unchecked >= NEIGHBOUR_EVERY
            if self.arm is not None and self.measured.cost.timed - self.measured.swept >= self.measured.sweep_every:
                arm = self.sweep(self.held if self.held is not None else self.arm)
            else:
                arm = self.neighbour(self.arm) if due else self.decide()
            self.every = min(2 * self.every, DECIDE_MOST) if arm == self.arm else DECIDE_EVERY
            self.arm = arm
            self.measured.centre, self.measured.every = (arm if self.held is None else self.held), self.every
        self.tic = time.perf_counter()
        return self.arm

    def decide(self) -> int:
        self.since = 0
        current = self.arm if self.held is None else self.held  # after a check, the arm it interrupted holds
        self.held = None
        best, predicted = self.best(self.around(current))
        if self.fresh:
            current, self.fresh = None, False
        if current in predicted and predicted[best] < MARGIN * predicted[current]:
            best = current
        drafting = [w for w in self.widths if w >= 2]
        if best < 2 and drafting and self.measured.undrafted >= self.measured.probe_every:
            # calls without drafts have won for a while: check a draft at the best width that drafts, less often
            # each time they still win
            width = max(drafting, key=lambda w: predicted.get(w, 0.0))
            clear = predicted.get(best, 0.0) > CLEAR * predicted.get(width, 0.0)  # AR far ahead: check less often
            self.measured.probe_every = min((4 if clear else 2) * self.measured.probe_every, PROBE_MOST)
            self.measured.undrafted = 0
            return self.check(width, PROBE_CALLS, best)
        if best >= 2:  # speculation pays: when AR next wins, check a draft again soon
            self.measured.probe_every = PROBE_FIRST
        return best

    def around(self, centre: int | None) -> tuple[int, ...]:
        """The arms a decision weighs: those within SPAN of `centre` in `arms`, and AR where allowed (all of them
        before any decision). Tokens per second are unimodal in W, so a few steps a decision find the best, and
        a decision costs a fraction of what weighing every width does."""
        if centre is None or centre not in self.arms:
            return self.arms
        i = self.arms.index(centre)
        near = self.arms[max(i - SPAN, 0) : i + SPAN + 1]
        return near if near[0] == 0 or not self.ar else (0, *near)

    def neighbour(self, best: int) -> int:
        """Instead of a decision: time the arm next to `best` for `NEIGHBOUR_CALLS` calls, on alternate sides (the
        narrower one below W = 2 is AR); the decision after them keeps `best` unless what they measured makes
        another arm faster by the margin."""
        measured, i = self.measured, self.arms.index(best)
        measured.unchecked, measured.side = 0, -measured.side
        j = i + measured.side if 0 <= i + measured.side < len(self.arms) else i - measured.side
        if not 0 <= j < len(self.arms):
            return best
        return self.check(self.arms[j], NEIGHBOUR_CALLS, best)

    def check(self, arm: int, calls: int, incumbent: int) -> int:
        """Play `arm` for `calls` calls; the decision after them weighs what they measured with `incumbent`, not
        `arm`, as the arm a switch must beat."""
        self.queue, self.held = [arm] * (calls - 1), incumbent
        return arm
