"""`speculative_width="auto"` / `assistant_mode="auto"`: exact whatever it picks, and picking by the cost model.

Exactness: greedy tokens equal AR's (float64, random models of both formats, oracle drafters whose accuracy
changes mid-decode so the chooser really switches between Packed-SS and AR), and sampling matches the exact
enumeration (chi-square, as `test_sampling.py`), for the real chooser and for one that picks a random arm every
call. The model: `draft_chain` predicts the tokens per call the engine really gets from a drafter of known
accuracy; `CallCost` interpolates between measured row counts; the chooser follows cost and acceptance.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from conftest import reference_greedy, tiny_model, tiny_setdlm
from drafters import OracleLayout, OracleSamePositionLayout
from engine import decode, schedule_for
from test_sampling import OPTIONS, _processors, exact_distribution, p_value, sample, sample_batched

from hf_packed_ss.engine import RejectionSampler, ShiftedBlockLayout
from hf_packed_ss.engine.cost import DRAFT, VERIFY, CallCost
from hf_packed_ss.engine.policy import AUTO_POLICY
from hf_packed_ss.engine.schedules import AutoSchedule, PackedSSSchedule, call_rows
from hf_packed_ss.engine.width import AcceptanceProfile, Measured, WidthChooser, draft_chain
from hf_packed_ss.front.measured import forget, measured_for

LENGTH = 320


class Frozen(CallCost):
    """A call cost that ignores the machine: the test sets what each call costs."""

    def observe(self, kind, rows, seconds):
        pass


def frozen(ar: float, draft: float, per_row: float = 0.0) -> CallCost:
    """AR calls cost `ar`; drafting calls `draft + per_row * rows` (points at 1..64 rows)."""
    cost = Frozen()
    cost.points[VERIFY] = {r: [ar, 1.0] for r in (1, 2)}
    cost.points[DRAFT] = {r: [draft + per_row * r, 1.0] for r in range(1, 65)}
    return cost


class RandomArms(AutoSchedule):
    """Auto with a chooser that picks a random arm (AR or any width) before every call: every switch the
    engine can meet, in a seeded order."""

    def __init__(self, width, acceptance=None, verify_order="ltr", seed=0):
        super().__init__(width, acceptance, verify_order)
        rng = random.Random(seed)
        self.chooser.choose = lambda last_rows: rng.choice(self.chooser.arms)


class Changing:
    """An oracle drafter right at every output position below `switch` and wrong (a random token) after it."""

    switch = 40

    def _tokens(self, positions):
        self.accuracy = 1.0
        right = super()._tokens(positions)
        self.accuracy = 0.0
        wrong = super()._tokens(positions)
        return torch.where(positions - self.start < self.switch, right, wrong)


class ChangingLayout(Changing, OracleLayout):
    pass


class ChangingSamePositionLayout(Changing, OracleSamePositionLayout):
    pass


@pytest.fixture(scope="module", params=["nemotron", "setdlm"])
def family(request):
    if request.param == "nemotron":
        return tiny_model(1), ChangingLayout, OracleLayout
    return tiny_setdlm(1), ChangingSamePositionLayout, OracleSamePositionLayout


def test_auto_switches_between_packed_ss_and_ar_as_acceptance_changes_and_keeps_the_ar_tokens(family):
    """Drafts right for the first 40 positions, wrong after: with AR calls costing 1 and drafting calls 1.5,
    Packed-SS pays while drafts land and AR after (checking a draft now and then); the tokens are AR's."""
    model, changing, _ = family
    prompt = torch.tensor([3, 1, 4, 1, 5])
    reference = reference_greedy(model, prompt, LENGTH)
    measured = Measured(cost=frozen(ar=1e-3, draft=1.5e-3))
    schedule = schedule_for(model, "auto", 8, measured=measured)
    layout = changing(model.config.mask_token_id, model.config.vocab_size, reference, prompt.numel(), 1.0)
    out, stats = decode(model, schedule, prompt, LENGTH, layout=layout)
    assert out[prompt.numel():].tolist() == reference
    modes = stats.schedule_per_iteration
    assert modes[:8] == ["packed_ss"] * 8
    assert Counter(modes[-len(modes) // 3 :])["ar"] > 0.7 * (len(modes) // 3)  # drafts stopped paying: AR
    assert len(stats.width_per_iteration) == len(stats.accepted_per_iteration) == len(stats.schedule_per_iteration)
    assert all((w == 0) == (s == "ar") for w, s in zip(stats.width_per_iteration, stats.schedule_per_iteration,
                                                       strict=True))


@pytest.mark.parametrize("seed", range(4))
def test_a_random_arm_every_call_keeps_the_ar_tokens(family, seed):
    """AR and every width in a random order, over a drafter right 70% of the time (long drafts get cut, a draft
    is dropped by an AR call and a new one starts without one)."""
    model, _, oracle = family
    prompt = torch.tensor([2, 7, 1, 8])
    reference = reference_greedy(model, prompt, LENGTH)
    layout = oracle(model.config.mask_token_id, model.config.vocab_size, reference, prompt.numel(), 0.7, seed=seed)
    schedule = RandomArms(8, seed=seed)
    out, stats = decode(model, schedule, prompt, LENGTH, layout=layout)
    assert out[prompt.numel():].tolist() == reference
    assert len(set(stats.width_per_iteration)) >= 5 and max(stats.accepted_per_iteration) > 2


def test_the_real_chooser_keeps_the_ar_tokens_with_eos_and_a_shared_process_measure(family):
    """The chooser timing the calls itself (a cold `Measured`, then the same one warm), EOS mid-way."""
    model, _, oracle = family
    measured = Measured()
    for seed in range(3):
        prompt = torch.tensor([seed + 1, 5, 9])
        reference = reference_greedy(model, prompt, LENGTH)
        eos = reference[LENGTH // 2]
        expected = reference[: reference.index(eos) + 1]
        layout = oracle(model.config.mask_token_id, model.config.vocab_size, reference, prompt.numel(), 0.8)
        out, _ = decode(model, schedule_for(model, "auto", 6, measured=measured), prompt, LENGTH, layout=layout,
                        eos=[eos])
        assert out[prompt.numel():].tolist() == expected
    assert measured.cost.points[DRAFT] and measured.profile.tried  # it measured and learnt


@pytest.fixture(scope="module")
def small():
    from test_sampling import V

    return tiny_model(5, vocab_size=V, mask_token_id=V - 1, hidden_size=16, num_hidden_layers=1,
                      intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def small_setdlm():
    from test_sampling import V

    return tiny_setdlm(5, vocab_size=V + 1, mask_token_id=V, hidden_size=16, num_hidden_layers=1,
                       intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.parametrize("options", ["plain", "t0.7-top5"])
@pytest.mark.parametrize("kind", [AutoSchedule, RandomArms])
@pytest.mark.parametrize("fixture", ["small", "small_setdlm"])
def test_auto_samples_the_ar_distribution(request, fixture, kind, options):
    from test_sampling import SAMPLES, THRESHOLD, WIDTH

    model = request.getfixturevalue(fixture)
    processors = _processors(model, OPTIONS[options])
    exact = exact_distribution(model, processors)
    counts = sample(model, kind(WIDTH + 1, RejectionSampler()), processors, SAMPLES, seed=4321)
    assert p_value(counts, exact) > THRESHOLD


def test_random_arms_sampling_test_has_power(small):
    """The same test rejects a variant that skips the stored Q for a fresh one when it switches width."""
    from test_sampling import SAMPLES, THRESHOLD, WIDTH

    from hf_packed_ss.engine import ProposalDistribution

    class FreshQRandomArms(RandomArms):
        def advance(self, plan, result):
            if self.started and plan.proposals and plan.available:
                self.draft.q = ProposalDistribution.from_logits(result.proposals[0][: plan.available])
            return super().advance(plan, result)

    processors = _processors(small, OPTIONS["plain"])
    counts = Counter(sample_batched(small, FreshQRandomArms(WIDTH + 1, RejectionSampler()), processors,
                                    [torch.tensor([1, 2])] * SAMPLES, seed=4321))
    assert p_value(counts, exact_distribution(small, processors)) < THRESHOLD


# --- the model -------------------------------------------------------------------------------------------------


def test_the_draft_chain_has_the_closed_forms():
    """A drafter always right: the draft lengths cycle, E[A] = (W + 1) / 2 (Packed-SS loses one position to the
    lag); always wrong: one token per call; W = 1 never drafts."""
    for w in (2, 4, 8):
        pi, tokens = draft_chain([0.5] + [1.0] * w, w)
        assert pi @ tokens == pytest.approx((w + 1) / 2)
        pi, tokens = draft_chain([0.5] + [0.0] * w, w)
        assert pi @ tokens == pytest.approx(1.0)
    pi, tokens = draft_chain([0.5, 0.9], 1)
    assert pi @ tokens == pytest.approx(1.0)


@pytest.mark.parametrize("fixture", ["nemotron", "setdlm"])
@pytest.mark.parametrize("accuracy", [1.0, 0.6])
def test_the_draft_chain_predicts_the_engines_tokens_per_call(fixture, accuracy):
    """Packed-SS at W = 5 with an oracle drafter right with probability rho per token: the engine's mean tokens per
    call (after the first) is the chain's prediction at r_k = rho + (1 - rho) / V (a random token can be right)."""
    model = tiny_model(2) if fixture == "nemotron" else tiny_setdlm(2)
    oracle = OracleLayout if fixture == "nemotron" else OracleSamePositionLayout
    width, length = 5, 900
    prompt = torch.tensor([4, 2])
    reference = decode(model, schedule_for(model, "ar", 1), prompt, length)[0][prompt.numel():].tolist()
    layout = oracle(model.config.mask_token_id, model.config.vocab_size, reference, prompt.numel(), accuracy, seed=3)
    _, stats = decode(model, schedule_for(model, "packed_ss", width), prompt, length, layout=layout)
    measured = np.mean(stats.accepted_per_iteration[1:-1])
    vocab = model.config.vocab_size
    rate = accuracy + (1 - accuracy) / vocab
    pi, tokens = draft_chain([0.5] + [rate] * width, width)
    assert measured == pytest.approx(pi @ tokens, rel=0.05 if accuracy < 1 else 0.01)


def test_call_rows_are_the_layouts_own():
    """Nemotron lean: AR 1 row, Packed-SS 1 + n + W + 1; SetDLM lean: AR 2, Packed-SS 1 + n + (n + 1) + W - 1."""
    from hf_packed_ss.engine import SamePositionLayout

    assert call_rows(ShiftedBlockLayout(0), 4) == (1, (6, 7, 8, 9))
    assert call_rows(SamePositionLayout(0), 4) == (2, (5, 7, 9, 11))
    assert call_rows(ShiftedBlockLayout(0, static_shapes=True), 4)[1] == (10,) * 4  # static shapes: one shape, 2B


def test_call_cost_interpolates_between_measured_rows_and_keeps_kinds_apart(tmp_path):
    cost = CallCost()
    cost.observe(DRAFT, 4, 50.0)  # a row count's first call builds its shape: not kept
    assert cost.predict(DRAFT, 8) is None
    for kind, rows, seconds in ((VERIFY, 1, 1.0), (DRAFT, 4, 2.0), (DRAFT, 12, 4.0)):
        if kind != DRAFT or rows != 4:
            cost.observe(kind, rows, 50.0)
        cost.observe(kind, rows, seconds)
    assert cost.predict(VERIFY, 1) == 1.0 and cost.predict(VERIFY, 30) == 1.0  # one point: that point
    assert cost.predict(DRAFT, 8) == pytest.approx(3.0)  # linear between 4 and 12 rows
    assert cost.predict(DRAFT, 16) == pytest.approx(5.0)  # the last segment's slope beyond
    assert cost.predict(DRAFT, 1) == pytest.approx(1.25)  # and before, never below half the nearest point
    rows = np.array([1, 2, 4, 5, 8, 12, 13, 40, 64])  # the scalar path is the batched one (decoding calls)
    assert cost.predict(DRAFT, 100) is None  # no prompt call timed yet
    assert cost.predict_many(DRAFT, rows).tolist() == pytest.approx([cost.predict(DRAFT, int(r)) for r in rows])
    for _ in range(4):
        cost.observe(DRAFT, 4, 2.0)
    for _ in range(3):
        cost.observe(DRAFT, 4, 100.0)  # pauses of the machine: the median of the recent calls stays
    assert cost.predict(DRAFT, 4) == 2.0
    cost.observe(DRAFT, 8, 1.0)
    cost.observe(DRAFT, 8, 1.0)  # cheaper than 4 rows: noise, pooled with its neighbour (non-decreasing)
    assert cost.predict(DRAFT, 4) == cost.predict(DRAFT, 8) < 2.0 < cost.predict(DRAFT, 12)
    assert cost.predict_many(DRAFT, rows).tolist() == pytest.approx([cost.predict(DRAFT, int(r)) for r in rows])
    cost.observe(DRAFT, 100, 7.0)  # a drafting decode's prompt call: kept (a prompt's length comes once)
    assert cost.predict(VERIFY, 100) == 7.0  # AR timed none: a prompt costs its rows, whichever the kind
    cost.observe(VERIFY, 200, 13.0)
    assert cost.predict(DRAFT, 150) == pytest.approx(7.0 + 6.0 * 48 / 96)  # linear between the prompts timed
    assert cost.predict(DRAFT, 70) is not None  # a prompt of 65..80 rows: a prompt's key, not 64's
    assert cost.predict(DRAFT, 64) == cost.predict_many(DRAFT, np.array([64]))[0]
    path = tmp_path / "cost.json"
    cost.save(path, key=("model", "cpu"))
    assert CallCost.load(path).points == cost.points
    path.write_text("{not json")
    with pytest.raises(ValueError, match="hf-packed-ss probe"):
        CallCost.load(path)


def test_the_acceptance_profile_counts_each_offset_given_the_ones_before():
    profile = AcceptanceProfile()
    for _ in range(50):
        profile.observe(1, 4, 2)  # offsets 1, 2 survive, 3 does not, 4 is never reached
    rates = profile.rates(6)
    assert rates[1] > 0.95 and rates[2] > 0.95 and rates[3] < 0.1
    assert rates[4] == pytest.approx(rates[3]) and rates[5] == pytest.approx(rates[3])  # unseen: the one before


def test_the_chooser_follows_cost_and_acceptance():
    measured = Measured(cost=frozen(ar=1.0, draft=1.2, per_row=0.01))
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    assert chooser.queue == []  # nothing to measure
    for _ in range(30):
        measured.profile.observe(1, 8, 8)  # every draft token survives
    best, predicted = chooser.best()
    assert best == 8 and predicted[8] > 3 * predicted[0]
    for _ in range(100):
        for first in range(1, 8):
            measured.profile.observe(first, 8 - first, 0)  # none does, wherever the draft starts
    assert chooser.best()[0] == 0
    first = AUTO_POLICY.probe_first
    arms = [chooser.choose(1) for _ in range(3 * first)]
    assert arms[0] == 0 and any(a >= 2 for a in arms)  # AR, with a check of the drafts now and then
    assert measured.probe_every in (2 * first, 4 * first)  # AR still won: the next check comes later


def test_a_drafting_call_is_never_predicted_cheaper_than_an_ar_call():
    """Noise can make the measured drafting calls look cheaper than AR ones; the work they do cannot be."""
    measured = Measured(cost=frozen(ar=1.0, draft=0.5))
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    for _ in range(100):
        for first in range(1, 8):
            measured.profile.observe(first, 8 - first, 0)  # no draft token survives
    predicted = chooser.best()[1]
    assert all(chooser.drafting_rates()[w][0] > 1.5 * predicted[0] for w in chooser.drafting)  # the cost alone
    assert max(predicted.values()) < 1.02 * predicted[0]  # bounded by the tokens per call (~1) over AR's cost


def test_after_a_draft_check_the_arm_it_interrupted_holds():
    """Drafting calls measured as cheap as AR ones and drafts that never land: the checks' width is within the
    switching margin of AR, yet each check ends back on AR (the check's width is no incumbent)."""
    measured = Measured(cost=frozen(ar=1.0, draft=0.98))
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    for _ in range(100):
        for first in range(1, 8):
            measured.profile.observe(first, 8 - first, 0)
    chooser.arm, chooser.fresh = 0, False  # AR holds (it won before): a drafting arm 1% ahead does not clear the margin
    arms = [chooser.choose(1) for _ in range(400)]
    checks = sum(1 for a, b in zip(arms, arms[1:], strict=False) if a == 0 and b >= 2)
    assert checks >= 2 and arms.count(0) > 0.95 * len(arms)


def test_the_chain_is_calibrated_by_what_the_calls_appended():
    """One width with enough calls scales every width alike; two fit a slope in W, never steeper than the
    policy's; a width that stops playing fades out of the fit."""
    calls, slope = AUTO_POLICY.calibrate_calls, AUTO_POLICY.slope

    measured = Measured(cost=frozen(ar=1.0, draft=1.2, per_row=0.01))
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    expected = np.linspace(1.2, 2.6, len(chooser.drafting))  # the chain's tokens per call at W = 2..8
    measured.chain.update(zip(chooser.drafting, expected.tolist(), strict=True))
    for _ in range(int(calls) - 5):
        chooser.tally(4, 1)
    assert chooser.calibration().tolist() == [1.0] * 7  # too few calls to say anything
    for _ in range(200):
        chooser.tally(4, 1)
    at4 = expected[chooser.drafting.index(4)]
    assert chooser.calibration() == pytest.approx(np.full(7, 1 / at4))  # one width: one factor
    for _ in range(200):
        chooser.tally(8, 1)  # as few tokens at 8: far below the chain there
    c = chooser.calibration()
    assert c[chooser.drafting.index(4)] > c[chooser.drafting.index(8)]
    assert np.diff(np.log(c)) == pytest.approx(np.full(6, -slope))  # the fit is steeper: clipped
    for _ in range(800):
        chooser.tally(4, 1)  # W = 8's calls fade below calibrate_calls: one width again
    assert chooser.calibration() == pytest.approx(np.full(7, 1 / at4))


def test_calls_are_calibrated_against_the_chain_of_their_time():
    """Easy prompts, then hard ones, at one width: the calls appended 90% of what the chain expected each time, so
    the factor stays 0.9 (against the latest chain alone the easy calls would make it 1.5), and the chooser
    records the chain it computes for the calls that follow."""
    measured = Measured(cost=frozen(ar=1.0, draft=1.2, per_row=0.01))
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    for chain, appended in ((2.0, 1.8), (1.2, 1.08)):
        measured.chain[4] = chain
        for _ in range(100):
            chooser.tally(4, appended)
    assert chooser.calibration() == pytest.approx(np.full(7, 0.9))
    measured.chain.clear()
    before = list(measured.appended[4])
    chooser.tally(4, 1)  # no chain computed yet: nothing to compare with
    assert measured.appended[4] == before
    for first in range(1, 8):
        measured.profile.observe(first, 8 - first, 8 - first)  # drafts that always land
    chooser.best()
    assert set(measured.chain) == set(chooser.drafting) and measured.chain[8] > measured.chain[2] > 1


@pytest.mark.parametrize("checks", [True, False])
def test_a_neighbour_check_remeasures_a_width_a_stale_cost_kept_out(monkeypatch, checks):
    """Drafts land 90% of the time, so wider is faster, but the cost of 10 and more rows was measured on a slow
    stretch of the machine (5x): only W <= 4 looks worth it. Timing a neighbour now and then finds the true cost
    and climbs past W = 4; without the checks the chooser stays there."""
    from hf_packed_ss.engine import width

    def true_cost(rows: int) -> float:
        return 1.2 + 0.01 * rows

    cost = CallCost()
    cost.points[VERIFY] = {1: [1.0, 9.0]}
    cost.points[DRAFT] = {r: [true_cost(r) * (5 if r >= 10 else 1), 9.0] for r in range(3, 12)}
    measured = Measured.under(AUTO_POLICY if checks else replace(AUTO_POLICY, neighbour_every=10**9))
    measured.cost, measured.sweep_every = cost, 10**9  # no sweeps (they re-time the spread's widths too)
    measured.profile.tried, measured.profile.accepted = [0.0] + [100.0] * 15, [0.0] + [90.0] * 15
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    chooser.queue, chooser.arm = [], 4
    clock = type("Clock", (), {"now": 0.0, "perf_counter": lambda self: self.now})()
    monkeypatch.setattr(width, "time", clock)
    arms = []
    for i in range(3000):
        rows = chooser.rows(chooser.arm)[1][i % chooser.arm] if chooser.arm else chooser.rows(0)[0]
        clock.now += true_cost(rows) if chooser.arm else 1.0
        arms.append(chooser.choose(rows))
    late = arms[-1000:]
    if checks:
        assert min(late) >= 2 and sum(a > 4 for a in late) > 0.9 * len(late)
    else:
        assert set(late) <= {3, 4}


@pytest.mark.parametrize("sweeps", [True, False])
def test_a_sweep_retimes_the_arms_the_chooser_does_not_play(monkeypatch, sweeps):
    """Drafts win by far at W = 6, so AR is never played; its cost was timed on a slow stretch (3x). Sweeps time it
    (and the middle width) again (the first restarts every row count's window): their cost follows
    the machine, and the incumbent keeps playing between sweeps."""
    from hf_packed_ss.engine import width

    def true_cost(rows: int) -> float:
        return 1.2 + 0.01 * rows

    every = 200 if sweeps else 10**9
    chooser = WidthChooser(tuple(range(1, 9)), True, Measured.under(replace(AUTO_POLICY, sweep_first=every,
                                                                            sweep_every=every)))
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    cost = chooser.measured.cost
    cost.points[VERIFY] = {1: [3.0, 9.0]}
    cost.points[DRAFT] = {r: [true_cost(r) * (3 if r in (3, 10, 11, 12, 13, 14, 15, 16, 17) else 1), 9.0]
                          for r in range(3, 18)}
    chooser.measured.profile.tried = [0.0] + [100.0] * 15
    chooser.measured.profile.accepted = [0.0] + [60.0] * 15
    chooser.queue, chooser.arm = [], 5
    clock = type("Clock", (), {"now": 0.0, "perf_counter": lambda self: self.now})()
    monkeypatch.setattr(width, "time", clock)
    arms = []
    for i in range(1000):
        rows = chooser.rows(chooser.arm)[1][i % chooser.arm] if chooser.arm else chooser.rows(0)[0]
        clock.now += true_cost(rows) if chooser.arm else 1.0
        arms.append(chooser.choose(rows))
    assert (cost.predict(VERIFY, 1) == pytest.approx(1.0)) == sweeps  # AR's cost follows the machine
    assert (arms[100:].count(0) >= 2 * AUTO_POLICY.sweep_calls) == sweeps  # each sweep timed it again
    assert sum(a in (3, 4, 5, 6) for a in arms[-500:]) > 0.85 * 500  # the incumbent plays between sweeps


def test_a_call_right_after_a_switch_is_not_timed(monkeypatch):
    """The call that meets another width's draft (and shapes) costs more than the width does while it plays: 10x
    here. The curve keeps what the calls after it cost."""
    from hf_packed_ss.engine import width

    measured = Measured()
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    clock = type("Clock", (), {"now": 0.0, "perf_counter": lambda self: self.now})()
    monkeypatch.setattr(width, "time", clock)
    chooser.queue = [4] * 4 + [6] * 4 + [4, 6] * 8  # then every call is a switch
    rows = {4: 9, 6: 13}
    last = None
    for _ in range(len(chooser.queue)):
        arm = chooser.choose(last)
        clock.now += 10.0 if arm != chooser.previous else 1.0
        last = rows[arm]
    chooser.choose(last)
    assert {r: p[0] for r, p in measured.cost.points[DRAFT].items()} == {9: 1.0, 13: 1.0}


def test_a_decision_weighs_the_arms_near_the_incumbent_and_a_decode_starts_where_the_last_left():
    measured = Measured(cost=frozen(ar=1.0, draft=0.5, per_row=0.001))  # drafting is cheap: wider wins
    for first in range(1, 8):
        measured.profile.observe(first, 8 - first, 8 - first)
    chooser = WidthChooser(tuple(range(1, 9)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    assert chooser.around(None) == chooser.arms == (0, 2, 3, 4, 5, 6, 7, 8)
    assert chooser.around(5) == (0, 3, 4, 5, 6, 7) and chooser.around(0) == (0, 2, 3)
    chooser.queue, chooser.arm, chooser.fresh = [], 2, False
    arms = [chooser.choose(1) for _ in range(90)]
    assert arms[0] == 2 and arms[-1] == 8 and sorted(set(arms)) == [2, 4, 6, 8]  # climbs two widths a decision
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))  # the next decode: no decision before its first call
    assert chooser.choose(None) == 8 and measured.centre == 8


def test_a_cold_chooser_measures_a_spread_of_widths_first():
    chooser = WidthChooser(tuple(range(1, 16)), True, Measured())
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    assert chooser.queue == [15] * 5 + [8] * 5 + [1] * 5 + [0] * 4


# --- the front ---------------------------------------------------------------------------------------------------


def test_a_process_learns_under_one_policy_at_a_time(models):
    forget()
    default = measured_for(models[0])
    assert default.policy is AUTO_POLICY and measured_for(models[0]) is default
    policy = replace(AUTO_POLICY, margin=1.2, recent=8)
    variant = measured_for(models[0], policy=policy)  # another policy: learnt afresh under it
    assert variant is not default and variant.cost.policy is policy and variant.profile.policy is policy
    assert measured_for(models[0]) is variant  # generate's own lookups keep it
    forget()


def test_generate_auto_equals_ar_learns_for_the_process_and_batches_row_by_row(models):
    model = models[0]
    forget()
    prompts = [torch.tensor([[5, 3, 8, 1]]), torch.tensor([[2, 6, 4, 9]])]
    ar = [model.generate(p, assistant_mode="ar", max_new_tokens=40) for p in prompts]
    for p, expected in zip(prompts, ar, strict=True):
        for kwargs in (dict(assistant_mode="auto"), dict(assistant_mode="packed_ss", speculative_width="auto"),
                       dict(assistant_mode="auto", speculative_width=3)):
            out = model.generate(p, max_new_tokens=40, return_dict_in_generate=True, **kwargs)
            assert out.sequences.tolist() == expected.tolist()
            stats = out.decoding_stats
            assert stats.schedule == "auto" and len(stats.width_per_iteration) == len(stats.accepted_per_iteration)
            if kwargs.get("speculative_width") == 3:
                assert set(stats.width_per_iteration) <= {0, 3}
            if kwargs["assistant_mode"] == "packed_ss":
                assert "ar" not in stats.schedule_per_iteration
    measured = measured_for(model)
    assert measured.cost.points[DRAFT] and measured.cost.points[VERIFY]  # measured once for the process
    chooser = WidthChooser(tuple(range(1, model.config.block_size)), True, measured)
    chooser.start(partial(call_rows, ShiftedBlockLayout(0)))
    assert chooser.queue == []  # the next decode measures nothing again
    batch = model.generate(torch.cat(prompts), assistant_mode="auto", max_new_tokens=40)
    assert batch.tolist() == torch.cat(ar).tolist()
    assert measured_for(model, batched=True) is not measured  # a batched call's time is not one row's


def test_generate_reads_a_cost_model_file(models, tmp_path):
    model = models[1]
    forget()
    path = tmp_path / "cost.json"
    frozen(ar=1.0, draft=5.0).save(path)
    out = model.generate(torch.tensor([[1, 2, 3]]), assistant_mode="auto", cost_model=str(path), max_new_tokens=30,
                         return_dict_in_generate=True)
    assert out.sequences[0, 3:].tolist() == reference_greedy(model, torch.tensor([1, 2, 3]), 30)
    # drafting calls cost 5x an AR call in the file: a random model's drafts cannot pay for that
    modes = out.decoding_stats.schedule_per_iteration
    assert modes[:4] == ["ar"] * 4 and modes.count("ar") >= 0.8 * len(modes)  # (and a draft is checked now and then)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(assistant_mode="linear_ss", speculative_width="auto"), "takes an integer width"),
    (dict(assistant_mode="auto", cache_implementation="static"), "static cache pads every call"),
    (dict(assistant_mode="auto", cost_model="/no/such/file.json"), "is not a file"),
    (dict(assistant_mode="packed_ss", cost_model="/no/such/file.json"), "auto' only"),
    (dict(assistant_mode="auto", speculative_width=99), "out of range"),
])
def test_bad_auto_requests_say_what_to_do(models, kwargs, message):
    with pytest.raises(ValueError, match=message):
        models[0].generate(torch.tensor([[1, 2]]), max_new_tokens=4, **kwargs)


def test_auto_refuses_confidence_order():
    model = tiny_setdlm(0)
    with pytest.raises(ValueError, match="left-to-right"):
        model.generate(torch.tensor([[1, 2]]), assistant_mode="auto", verify_order="confidence", max_new_tokens=4)


def test_packed_ss_at_a_fixed_width_is_what_auto_plays_at_that_width(models):
    """Auto restricted to one width and no AR makes Packed-SS's very calls (rows, acceptances)."""
    model = models[2]
    prompt = torch.tensor([7, 7, 2])
    _, fixed = decode(model, PackedSSSchedule(4), prompt, 40)
    _, auto = decode(model, AutoSchedule(4, widths=(4,), ar=False), prompt, 40)
    assert auto.rows_per_call == fixed.rows_per_call and auto.accepted_per_iteration == fixed.accepted_per_iteration


def test_tools_read_the_measure_of_the_model_generate_decodes_with(models):
    """A PEFT model's generate runs its base's: the bench and the probe read the base's `Measured`."""
    from hf_packed_ss.front.measured import decoder_of

    class Wrapped:
        def get_base_model(self):
            return models[0]

    assert decoder_of(Wrapped()) is models[0] and decoder_of(models[0]) is models[0]
    assert measured_for(decoder_of(Wrapped())) is measured_for(models[0])
