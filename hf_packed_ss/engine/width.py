"""`auto`'s chooser: the arm of every call (AR, or Packed-SS at a width W) by predicted throughput.

Throughput is tokens per NFE over time per NFE (the paper's decomposition). Time per NFE comes from `CallCost`,
measured on this machine. Tokens per NFE come from the acceptance profile: r_k, the chance that a draft token
k positions past the prefix its drafter saw survives given that the draft before it did.

For Packed-SS at width W the draft is made from P_{t-1} and covers offsets 1..W-1 of it (offset 0 is the
position the same call verifies), on both layouts. A call that finds a draft of n tokens (offsets W-n..W-1)
accepts h of them with probability r_(W-n) ... r_(W-n+h-1) (1 - r_(W-n+h)), appends A = h + 1 tokens and
leaves the next call a draft of n' = W - 1 - h tokens. That chain over n has a stationary law pi, and

    throughput(W) = c(W) sum_n pi_n E[A | n] / sum_n pi_n cost(rows(W, n)),    throughput(AR) = 1 / cost(rows(AR)),

with rows(W, n) read off the decode's own layout (`schedules.call_rows`). Acceptance is correlated from call to
call, which the chain ignores: it over-predicts, the more the wider the draft, so c(W) calibrates it by what the
calls at each width really appended (`WidthChooser.calibration`).

`WidthChooser.choose`, before every call, reads top to bottom: it times the call just made, then plays the next
call of an exploration, sweep or check under way, or at a decision point starts a sweep or a neighbour check when
one is due, else decides. Every number it runs by is a field of `AutoPolicy` (`policy.py`, which says why).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .cost import DRAFT, VERIFY, CallCost
from .policy import AUTO_POLICY, AutoPolicy

_VERSIONS = itertools.count()  # acceptance profile versions


@dataclass
class AcceptanceProfile:
    """Discounted counts of draft tokens tried and accepted per drafter offset (index k = offset k), under
    `policy`'s prior and discounts."""

    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    # changes with every observation (unique in the process): what is computed from the rates is kept until then
    version: int = field(default_factory=lambda: next(_VERSIONS))
    policy: AutoPolicy = field(default=AUTO_POLICY, repr=False)

    def observe(self, first: int, drafted: int, h: int) -> None:
        """A verification of `drafted` tokens whose first sits `first` positions past the drafter's prefix
        accepted `h`: offsets first..first+h-1 survived, offset first+h (if drafted) did not."""
        fade, forget = self.policy.fade, self.policy.forget
        self.version = next(_VERSIONS)
        seen = min(h + 1, drafted)
        top = first + seen
        if len(self.tried) < top:
            grow = top - len(self.tried)
            self.tried += [0.0] * grow
            self.accepted += [0.0] * grow
        self.tried = [fade * t for t in self.tried]  # every offset fades slowly, also those this draft never
        self.accepted = [fade * a for a in self.accepted]  # reached: a width once judged on a few draws is tried again
        for i, k in enumerate(range(first, top)):  # and each offset tried forgets faster (follows the prompt)
            self.tried[k] = forget * self.tried[k] + 1
            self.accepted[k] = forget * self.accepted[k] + (i < h)

    def rates(self, top: int) -> list[float]:
        """r_0..r_(top-1) (r_0 unused): posterior means, each prior the estimate one offset nearer."""
        prior, strength = self.policy.prior, self.policy.prior_strength
        out = [prior]
        for k in range(1, top):
            tried = self.tried[k] if k < len(self.tried) else 0.0
            accepted = self.accepted[k] if k < len(self.accepted) else 0.0
            prior = (accepted + strength * prior) / (tried + strength)
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


@lru_cache(maxsize=64)
def chains_for(widths: tuple[int, ...]) -> Chains:
    return Chains(widths)


@dataclass
class Measured:
    """What `auto` decodes of one model on one machine have learnt, kept for the process (`front.measured_for`):
    the call cost, the acceptance profile, the calibration's tallies and where the chooser stands in its
    re-timing. `Measured()` runs by `AUTO_POLICY`; `Measured.under(policy)` by another."""

    policy: AutoPolicy = AUTO_POLICY
    cost: CallCost = field(default_factory=CallCost)
    profile: AcceptanceProfile = field(default_factory=AcceptanceProfile)
    centre: int | None = None  # the last decision's arm and the calls to the next: a decode starts there, and
    every: int = AUTO_POLICY.decide_every  # its first decision weighs the arms around it without the margin
    # --- the calibration: the calls at each width: width -> [tokens they appended, tokens the chain expected of
    # them, calls, `tallied` when last counted], each call of any width discounting them all
    appended: dict = field(default_factory=dict, repr=False)
    chain: dict = field(default_factory=dict, repr=False)  # width -> the chain's tokens per call, last computed
    tallied: int = 0  # calls counted in `appended`
    # the drafting arms' predicted rates by (arms, their rows): with the profile version, the tallies and the draft
    # cost stamp they were computed for, kept across decodes (while AR plays none of them changes)
    kept: dict = field(default_factory=dict, repr=False)
    # --- re-timing (counted across decodes)
    probe_every: int = AUTO_POLICY.probe_first  # calls without a draft before a draft check
    undrafted: int = 0  # calls without a draft to verify since one was last checked
    unchecked: int = 0  # calls at a drafting width since a neighbour was last timed
    side: int = -1  # the side of the last neighbour check: +1 wider, -1 narrower
    swept: int = 0  # `cost.timed` at the last sweep (or exploration)
    sweep_every: int = AUTO_POLICY.sweep_first  # timed calls from it to the next
    sweeps: int = 0
    played: dict = field(default_factory=dict, repr=False)  # arm -> `cost.timed` at its last timed call

    @classmethod
    def under(cls, policy: AutoPolicy) -> Measured:
        """Nothing learnt yet, under `policy`."""
        return cls(policy, CallCost(policy=policy), AcceptanceProfile(policy=policy), every=policy.decide_every,
                   probe_every=policy.probe_first, sweep_every=policy.sweep_first)


class WidthChooser:
    """Picks the arm of every call: 0 for AR, else a Packed-SS width from `widths` (AR only where `ar`)."""

    def __init__(self, widths: tuple[int, ...], ar: bool, measured: Measured):
        self.widths, self.ar, self.measured = tuple(sorted(widths)), ar, measured
        self.policy = measured.policy
        # W = 1 drafts nothing it can use (its one drafted position is the one its call verifies): with AR allowed
        # it is AR with extra rows
        self.arms = ((0,) if ar else ()) + tuple(w for w in self.widths if w > 1 or not ar or len(self.widths) == 1)
        self.drafting = tuple(a for a in self.arms if a)
        self.arm: int | None = None
        self.previous: int | None = None  # the arm of the call before the last one
        self.run = 0  # the last call's place in its arm's run
        self.queue: list[int] = []  # the calls an exploration, sweep or check has still to make
        self.tic: float | None = None
        self.since = 0  # calls since the last decision
        self.every = self.policy.decide_every  # calls between decisions now
        self.held: int | None = None  # the arm a check interrupted: the one a switch must beat after it
        self.fresh = True  # no decision made yet in this decode

    def start(self, rows: Callable[[int], tuple[int, tuple[int, ...]]]) -> None:
        """Before a decode's first call; `rows(W)`: the rows of an AR call and of a Packed-SS call at W by the
        draft it finds (`schedules.call_rows` on the decode's layout)."""
        self.call_rows = rows
        self.arm, self.tic, self.since, self.every, self.held = None, None, 0, self.policy.decide_every, None
        self.previous, self.run = None, 0
        if self.measured.centre in self.arms:  # no decision before the first call (each costs ~0.5 ms in place)
            self.arm, self.every = self.measured.centre, self.measured.every
            self.previous, self.run = self.arm, self.policy.warm - 1  # no switch: the prompt call is timed
        self.fresh = True  # the decode's first decision: the arm it starts with is no incumbent
        # rows of each drafting arm's call by the draft it finds (padded past W, where the chain holds no mass)
        self.draft_rows = np.ones((len(self.drafting), max(self.drafting, default=1)), dtype=np.int64)
        for i, w in enumerate(self.drafting):
            self.draft_rows[i, :w] = self.rows(w)[1]
        self.queue = self.exploration()
        self.arms_key = self.drafting, self.draft_rows.tobytes()  # where `Measured.kept` holds these arms' rates

    def rows(self, width: int) -> tuple[int, tuple[int, ...]]:
        return self.call_rows(max(width, 1))

    def choose(self, last_rows: int | None) -> int:
        """The arm of the next call; `last_rows`: the rows of the call made since the last `choose`."""
        policy = self.policy
        self.record(last_rows, time.perf_counter())  # 1. time and count the call just made
        if self.queue:  # 2. an exploration, sweep or check under way: its next call, and a decision right after it
            self.arm = self.queue.pop(0)
            self.since, self.every = policy.decide_most, policy.decide_every
        elif self.arm is None or self.since >= self.every:  # 3. a decision point
            arm = self.next_arm()
            self.every = min(2 * self.every, policy.decide_most) if arm == self.arm else policy.decide_every
            self.arm = arm
            self.measured.centre, self.measured.every = (arm if self.held is None else self.held), self.every
        self.tic = time.perf_counter()
        return self.arm

    def record(self, rows: int | None, now: float) -> None:
        """Time the call just made, unless it is one of the first `warm` of its arm's run (they meet another
        width's shapes and draft: the curve keeps what a width costs while it plays), and count it."""
        self.run = self.run + 1 if self.previous == self.arm else 0
        if self.tic is not None and rows is not None and self.run >= self.policy.warm:
            self.measured.cost.observe(VERIFY if self.arm == 0 else DRAFT, rows, now - self.tic)
            self.measured.played[self.arm] = self.measured.cost.timed
        self.previous = self.arm
        self.since += 1
        if self.arm is not None and self.arm < 2:  # AR, or Packed-SS at W = 1 (its one drafted position is verified
            self.measured.undrafted += 1           # by the call that drafts it): nothing to learn from
        elif self.arm is not None:
            self.measured.unchecked += 1

    def next_arm(self) -> int:
        """At a decision point: a sweep when one is due, else a neighbour check when one is due, else a decision."""
        measured = self.measured
        if self.arm is not None and measured.cost.timed - measured.swept >= measured.sweep_every:
            return self.sweep(self.held if self.held is not None else self.arm)
        if self.arm and self.arm >= 2 and measured.unchecked >= self.policy.neighbour_every:
            return self.neighbour(self.arm)
        return self.decide()

    # --- 1. exploration ---------------------------------------------------------------------------------------

    def spread(self) -> list[int]:
        """The widths the cost model is measured at beyond the played ones: widest, middle, narrowest."""
        return sorted({self.widths[-1], self.widths[len(self.widths) // 2], self.widths[0]}, reverse=True)

    def exploration(self) -> list[int]:
        """The calls that measure what the cost model lacks: `explore_calls` at each of a spread of widths (the
        first call also processes the prompt) and `explore_ar_calls` AR calls, the first `warm` of each untimed
        (and a row count's first timed call is not kept). None once a sweep has run (the sweeps keep the cost
        model then; the first dropped what this timed)."""
        cost, policy, plan = self.measured.cost, self.policy, []
        if self.measured.sweeps:
            return plan
        for w in self.spread():
            if self.rows(w)[1][-1] not in cost.points[DRAFT]:
                plan += [w] * policy.explore_calls
        if self.ar and self.rows(0)[0] not in cost.points[VERIFY]:
            plan += [0] * policy.explore_ar_calls
        if plan:
            self.measured.swept = cost.timed
        return plan

    # --- 2. decisions -----------------------------------------------------------------------------------------

    def decide(self) -> int:
        """The arm predicted fastest among those `around` the incumbent, kept unless another beats it by
        `margin` (a decode's first decision has no incumbent); while calls without drafts win, now and then a
        draft check."""
        self.since = 0
        current = self.arm if self.held is None else self.held  # after a check, the arm it interrupted holds
        self.held = None
        best, predicted = self.best(self.around(current))
        if self.fresh:
            current, self.fresh = None, False
        if current in predicted and predicted[best] < self.policy.margin * predicted[current]:
            best = current
        if best < 2 and self.measured.undrafted >= self.measured.probe_every:
            checked = self.draft_check(best, predicted)
            if checked is not None:
                return checked
        if best >= 2:  # speculation pays: when AR next wins, check a draft again soon
            self.measured.probe_every = self.policy.probe_first
        return best

    def around(self, centre: int | None) -> tuple[int, ...]:
        """The arms a decision weighs: those within `span` of `centre` in `arms`, and AR where allowed (all of
        them before any decision). Tokens per second are unimodal in W, so a few steps a decision find the best,
        and a decision costs a fraction of what weighing every width does."""
        if centre is None or centre not in self.arms:
            return self.arms
        i, span = self.arms.index(centre), self.policy.span
        near = self.arms[max(i - span, 0) : i + span + 1]
        return near if near[0] == 0 or not self.ar else (0, *near)

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
        where `calibrate_calls` calls were made; log c is fitted linear in W over those widths (constant with
        one), weighted by calls, falling at most `slope` per width."""
        policy, ws, logs, weights = self.policy, [], [], []
        for w, (tokens, expected, calls, at) in self.measured.appended.items():
            calls *= policy.calibrate_forget ** (self.measured.tallied - at)  # every call fades every width's tallies
            if calls >= policy.calibrate_calls:
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
        return np.exp(mean_y + np.clip(slope, -policy.slope, 0.0) * (widths - mean_x))

    def tally(self, arm: int, tokens: int) -> None:
        """A call at width `arm` appended `tokens`; the chain's expectation for it is the last one computed."""
        expected = self.measured.chain.get(arm)
        if expected is None:
            return
        measured = self.measured
        measured.tallied += 1
        kept = measured.appended.setdefault(arm, [0.0, 0.0, 0.0, measured.tallied])
        fade = self.policy.calibrate_forget ** (measured.tallied - kept[3])
        kept[:] = fade * kept[0] + tokens, fade * kept[1] + expected, fade * kept[2] + 1.0, measured.tallied

    def observe(self, first: int, drafted: int, h: int) -> None:
        """A verification (`AcceptanceProfile.observe`): a draft was checked."""
        self.measured.profile.observe(first, drafted, h)
        self.measured.undrafted = 0

    # --- 3. re-timing what is not played ----------------------------------------------------------------------

    def draft_check(self, best: int, predicted: dict[int, float]) -> int | None:
        """Calls without drafts (`best`) have won for `probe_every` calls: `probe_calls` calls at the best width
        that drafts, the next check `probe_backoff` times later (`probe_backoff_clear` times while `best` is
        predicted `clear` times faster); None where no width drafts."""
        policy, measured = self.policy, self.measured
        drafting = [w for w in self.widths if w >= 2]
        if not drafting:
            return None
        width = max(drafting, key=lambda w: predicted.get(w, 0.0))
        clear = predicted.get(best, 0.0) > policy.clear * predicted.get(width, 0.0)
        backoff = policy.probe_backoff_clear if clear else policy.probe_backoff
        measured.probe_every = min(backoff * measured.probe_every, policy.probe_most)
        measured.undrafted = 0
        return self.check(width, policy.probe_calls, best)

    def neighbour(self, best: int) -> int:
        """Time the arm next to `best` for `neighbour_calls` calls, on alternate sides (the narrower one below
        W = 2 is AR); the decision after them keeps `best` unless what they measured makes another arm faster by
        the margin."""
        measured, i = self.measured, self.arms.index(best)
        measured.unchecked, measured.side = 0, -measured.side
        j = i + measured.side if 0 <= i + measured.side < len(self.arms) else i - measured.side
        if not 0 <= j < len(self.arms):
            return best
        return self.check(self.arms[j], self.policy.neighbour_calls, best)

    def sweep(self, current: int) -> int:
        """`sweep_calls` calls at the middle width and the narrowest drafting arm and `sweep_ar_calls` at AR where
        they were untimed for `unplayed` calls, then the decision after them weighs what they measured with
        `current` as the incumbent. The first sweep restarts the cost model's windows and forgets the row counts
        it will not time again: the exploration timed them in a cold process."""
        measured, policy, now = self.measured, self.policy, self.measured.cost.timed
        first = not measured.sweeps
        measured.swept, measured.sweep_every = now, min(2 * measured.sweep_every, policy.sweep_every)
        measured.sweeps += 1
        # the middle width, the narrowest drafting arm and AR (the widest costs most and rarely matters; AR calls are
        # cheap: a few more of them)
        middle = self.widths[len(self.widths) // 2]
        arms = sorted({middle, *self.drafting[:1]} & set(self.arms), reverse=True) + ([0] if self.ar else [])
        if first:
            timed = [a for a in arms + [current] if a]
            measured.cost.restart({VERIFY: {self.rows(0)[0]}, DRAFT: {r for a in timed for r in self.rows(a)[1]}})
        stale = [a for a in arms if a != current
                 and (first or now - measured.played.get(a, -policy.unplayed) >= policy.unplayed)]
        plan = [a for a in stale for _ in range(policy.sweep_ar_calls if a == 0 else policy.sweep_calls)]
        if not plan:
            return self.decide()
        self.queue, self.held = plan[1:], current
        return plan[0]

    def check(self, arm: int, calls: int, incumbent: int) -> int:
        """Play `arm` for `calls` calls; the decision after them weighs what they measured with `incumbent`, not
        `arm`, as the arm a switch must beat."""
        self.queue, self.held = [arm] * (calls - 1), incumbent
        return arm
