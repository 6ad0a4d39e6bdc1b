"""Schedule properties read from the statistics: rows per call (appendix D.3) and Theorem 3.2."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_model
from drafters import OracleLayout
from engine import decode
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_packed_ss.engine import ShiftedBlockLayout
from hf_packed_ss.engine.contract import CallResult
from hf_packed_ss.engine.schedules import SCHEDULES


@pytest.mark.parametrize("width", [1, 3, 7])
def test_rows_per_call(width):
    model = tiny_model(0)
    prompt = torch.arange(5)
    B = width + 1
    for mode in SCHEDULES:
        out = model.generate(prompt[None], assistant_mode=mode, speculative_width=width, max_new_tokens=30,
                             return_dict_in_generate=True)
        rows, stats = out.decoding_stats.rows_per_call, out.decoding_stats
        assert stats.nfe == len(rows) and stats.new_tokens == 30
        if mode in ("ar", "linear_ss"):
            assert rows[0] == prompt.numel()  # prefill emits the first token
        else:
            assert rows[0] == prompt.numel() + B  # prompt + W + 1 masks (appendix E.2)
        later = rows[1:]
        if mode == "ar":
            assert set(later) == {1}
        elif mode == "linear_ss":  # two calls of B rows per iteration: 2B
            assert set(later) == {B} and len(later) == 2 * (len(stats.accepted_per_iteration) - 1)
        elif mode == "packed_ss":  # one call of at most 2B rows per iteration
            assert max(later) <= 2 * B and len(later) == len(stats.accepted_per_iteration) - 1
        elif mode == "auto":  # AR or Packed-SS at a width up to W, one call per iteration
            assert max(later) <= 2 * B and len(later) == len(stats.accepted_per_iteration) - 1
            assert set(stats.width_per_iteration) <= set(range(width + 1))
        elif mode == "hybrid_ss":  # default k = 2 branches: one call of at most B + 2B rows per iteration
            assert max(later) <= 3 * B and len(later) == len(stats.accepted_per_iteration) - 1
        else:  # quadratic_ss: one call of B(B + 1) rows
            assert set(later) == {B * (B + 1)} and len(later) == len(stats.accepted_per_iteration) - 1



@pytest.mark.parametrize("width", [2, 4, 7])
def test_packed_ss_drops_verifier_padding_exactly(width):
    """Without static shapes a Packed-SS call holds only the draft it verifies: 1 + k verifier rows
    (k = max(0, W - A_{t-1}), the proposals left after the previous acceptance) + W + 1 proposal rows. With
    static shapes it pads to 2B rows. Both decode the same tokens with the same acceptances."""
    model = tiny_model(11)
    prompt = torch.arange(4)
    full = reference_greedy(model, prompt, 60)
    runs = {}
    for static in (False, True):
        layout = OracleLayout(model.config.mask_token_id, model.config.vocab_size, full, 4, 0.8, 0, static)
        with torch.no_grad():
            seq, stats = decode(model, SCHEDULES["packed_ss"](width), prompt, 60, layout=layout)
        assert seq[4:].tolist() == full
        runs[static] = stats
    lean, padded = runs[False], runs[True]
    assert lean.accepted_per_iteration == padded.accepted_per_iteration
    assert set(padded.rows_per_call[1:]) == {2 * (width + 1)}
    drafts = [width] + [max(0, width - a) for a in lean.accepted_per_iteration[1:-1]]
    assert lean.rows_per_call[1:] == [1 + k + 1 + width for k in drafts]
    assert sum(lean.rows_per_call) < sum(padded.rows_per_call)

class _Null:
    """A forward that returns zeros: the threshold layout below supplies every prediction."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, call, cache):
        return torch.zeros(call.logit_rows.numel(), self.vocab)


class ThresholdLayout(ShiftedBlockLayout):
    """A synthetic model satisfying Assumption 3.1: the verifier's greedy continuation is `target`;
    the drafter's prediction at output position k, from a context of c verified output tokens, is
    right exactly when c >= thresholds[k]."""

    def __init__(self, target, thresholds, prompt_len, vocab):
        super().__init__(mask_token_id=vocab - 1)
        self.target, self.thresholds, self.prompt_len, self.vocab = target, thresholds, prompt_len, vocab

    def _onehot(self, tokens):
        out = torch.zeros(len(tokens), self.vocab)
        out[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
        return out

    def build(self, plan, state):
        call = super().build(plan, state)
        done = state.left  # verified output tokens before this call
        L = len(self.target)

        def tok(k):  # target token at 1-indexed output position k (anything past the end)
            return self.target[k - 1] if k <= L else 0

        def read(_logits):
            verifier = self._onehot([tok(done + i) for i in range(1, plan.available + 2)]) if plan.verify else None
            proposals = []
            for p, ranks in zip(plan.proposals, call.proposal_ranks, strict=True):
                c = done + p.branch
                ks = [done + 1 + r for r in ranks]
                right = [k > L or c >= self.thresholds[k - 1] for k in ks]
                proposals.append(self._onehot([tok(k) if ok else (tok(k) + 1) % (self.vocab - 1)
                                               for k, ok in zip(ks, right, strict=True)]))
            return CallResult(verifier=verifier, proposals=proposals, proposal_ranks=call.proposal_ranks)

        call.read = read
        return call


@st.composite
def _threshold_tables(draw):
    length = draw(st.integers(1, 40))
    thresholds = [draw(st.integers(0, k)) for k in range(1, length + 1)]  # c*_k <= k
    target = draw(st.lists(st.integers(0, 9), min_size=length, max_size=length))
    return target, thresholds


@settings(max_examples=300, deadline=None)
@given(table=_threshold_tables(), width=st.integers(1, 10))
def test_theorem_3_2_packed_never_needs_more_calls_than_linear(table, width):
    target, thresholds = table
    prompt = torch.tensor([3, 1, 4])
    nfe = {}
    for mode in ("linear_ss", "packed_ss"):
        for L in range(1, len(target) + 1):
            layout = ThresholdLayout(target, thresholds, prompt.numel(), vocab=12)
            seq, stats = decode(None, SCHEDULES[mode](width), prompt, L, forward=_Null(12), layout=layout)
            assert seq[prompt.numel():].tolist() == target[:L]
            nfe[mode, L] = stats.nfe
    for L in range(1, len(target) + 1):
        assert nfe["packed_ss", L] <= nfe["linear_ss", L], (L, nfe)


def test_theorem_check_has_power():
    """The same comparison catches a schedule that wastes calls: a Packed-SS variant that keeps only
    one retained draft token needs more calls than Linear-SS on some threshold tables."""

    class ShortSightedPacked(SCHEDULES["packed_ss"]):
        def advance(self, plan, result):
            accepted = super().advance(plan, result)
            self.draft = self.draft[:1]
            return accepted

    prompt = torch.tensor([3, 1, 4])
    worse = 0
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        target = torch.randint(0, 10, (30,), generator=g).tolist()
        thresholds = [max(0, k - 8) for k in range(1, 31)]  # right from 8 tokens back
        runs = {}
        for name, schedule in (("linear", SCHEDULES["linear_ss"](6)), ("short", ShortSightedPacked(6))):
            seq, stats = decode(None, schedule, prompt, 30, forward=_Null(12),
                                layout=ThresholdLayout(target, thresholds, 3, 12))
            assert seq[3:].tolist() == target  # still exact: only the speed suffers
            runs[name] = stats.nfe
        worse += runs["short"] > runs["linear"]
    assert worse > 0


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8])
def test_packed_ss_ceiling_is_half_the_width_plus_one(width):
    """With every draft right, Packed-SS alternates calls that accept A and W - A + 1 tokens (a call's first A
    proposals sit where it accepts: Algorithm 1, line 10), so it makes (W + 1) / 2 tokens per call, a drafter's
    ceiling at that width; Quadratic-SS, drafting from every acceptance boundary, makes W + 1."""
    from hf_packed_ss.engine.rows import MASK, model_free_calls

    new = 2 * 3 * 4 * 5 * 9  # a multiple of every cycle, so the ratio is exact
    packed = model_free_calls(SCHEDULES["packed_ss"](width), ShiftedBlockLayout(MASK), True, new)
    assert new / len(packed) == pytest.approx((width + 1) / 2, rel=0.02)
    assert new / len(model_free_calls(SCHEDULES["packed_ss"](width), ShiftedBlockLayout(MASK), False, new)) == 1.0
    quadratic = model_free_calls(SCHEDULES["quadratic_ss"](width), ShiftedBlockLayout(MASK), True, new)
    assert new / len(quadratic) == pytest.approx(width + 1, rel=0.02)


@pytest.mark.parametrize("family", ["prefix", "any_order"])
def test_static_shapes_is_a_generate_option(family):
    """`generate(..., static_shapes=True)` keeps one call shape per schedule and width (appendix D.3) and decodes
    the same tokens with the same acceptances as the lean default."""
    from conftest import tiny_setdlm

    model = tiny_model(2) if family == "prefix" else tiny_setdlm(2)
    prompt = torch.tensor([[3, 1, 4, 1]])
    width = 4
    for mode in ("linear_ss", "quadratic_ss", "packed_ss", "hybrid_ss"):
        runs = {static: model.generate(prompt, assistant_mode=mode, speculative_width=width, max_new_tokens=24,
                                       static_shapes=static, return_dict_in_generate=True)
                for static in (False, True)}
        lean, padded = runs[False].decoding_stats, runs[True].decoding_stats
        assert torch.equal(runs[False].sequences, runs[True].sequences), mode
        assert lean.accepted_per_iteration == padded.accepted_per_iteration, mode
        if mode != "linear_ss":  # one call per iteration: every call after the first with a full window (SetDLM's
            # window stops at the last output position) has the same shape
            done = [sum(padded.accepted_per_iteration[:i]) for i in range(len(padded.rows_per_call))]
            full = [rows for rows, d in list(zip(padded.rows_per_call, done, strict=True))[1:] if 24 - d >= width + 1]
            assert len(full) > 5 and len(set(full)) == 1, (mode, padded.rows_per_call)
        assert sum(lean.rows_per_call) <= sum(padded.rows_per_call), mode
    with pytest.raises(ValueError, match="static_shapes=1 must be True"):
        model.generate(prompt, assistant_mode="packed_ss", static_shapes=1, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"\['static_shapes'\] only apply with assistant_mode"):
        model.generate(prompt, static_shapes=True, max_new_tokens=3)
