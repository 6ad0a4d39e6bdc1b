"""The k-branch hybrid (`assistant_mode="hybrid_ss"`, `speculative_branches=k`) on both model families.

Greedy output equals plain AR greedy for k in {1, 2, 3, W + 1}; sampling follows the AR distribution (chi-square
against exact enumeration, the helpers of test_sampling); k = 1 makes exactly Packed-SS's calls, rows and
acceptances and k = W + 1 exactly Quadratic-SS's; with a drafter equal to the verifier every draft token is accepted
and the draft lengths follow the branch rule; bad values of speculative_branches raise; the tools name its k.
"""

from __future__ import annotations

import argparse
from collections import Counter

import pytest
import torch
from conftest import reference_greedy, tiny_model, tiny_setdlm
from drafters import OracleLayout
from engine import decode
from test_sampling import EOS, OPTIONS, PROMPT, SAMPLES, THRESHOLD, V, _processors, exact_distribution, p_value
from transformers import GenerationConfig

from hf_packed_ss.engine import SamePositionLayout, ShiftedBlockLayout
from hf_packed_ss.engine import decode as engine_decode
from hf_packed_ss.engine.acceptance import Greedy, RejectionSampler
from hf_packed_ss.engine.schedules import (
    DEFAULT_BRANCHES,
    SCHEDULES,
    WINDOW_SCHEDULES,
    HybridSSSchedule,
)
from hf_packed_ss.front import model_forward
from hf_packed_ss.tools.bench.measure import Settings, decoder_for, schedule_mode, schedule_name

PREFIX_WIDTHS = [1, 2, 3, 7, 15, 31]  # as tests/test_exactness.py
WINDOW_WIDTHS = [1, 4, 8, 16]  # as tests/test_any_order.py (max_block_size 16)


def ks(width: int) -> list[int]:
    """k in {1, 2, 3, W + 1} that are valid for W (k <= W + 1)."""
    return sorted({k for k in (1, 2, 3, width + 1) if k <= width + 1})


def _prompt(seed: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(vocab - 1, (length,), generator=torch.Generator().manual_seed(500 + seed))


@pytest.fixture(scope="module")
def setdlms():
    return {seed: tiny_setdlm(seed) for seed in range(2)}


def _stats(out):
    s = out.decoding_stats
    return out.sequences[0].tolist(), s.nfe, s.rows_per_call, s.accepted_per_iteration


# ---------------------------------------------------------------- greedy exactness


@pytest.mark.parametrize("width", PREFIX_WIDTHS)
def test_prefix_family_is_greedy_exact(models, width):
    """Through generate: three random models, prompts of 1, 5 and 17 tokens, every valid k of {1, 2, 3, W + 1}."""
    for (seed, model), length in zip(models.items(), (1, 5, 17), strict=True):
        prompt = _prompt(seed, length, model.config.vocab_size)
        full = reference_greedy(model, prompt, 60)
        for k in ks(width):
            for max_new in sorted({1, width + 1, 60}):
                out = model.generate(prompt[None], assistant_mode="hybrid_ss", speculative_width=width,
                                     speculative_branches=k, max_new_tokens=max_new)
                assert out[0, length:].tolist() == full[:max_new], (seed, k, max_new)


@pytest.mark.parametrize("width", [1, 2, 3, 7, 15])
def test_prefix_family_is_exact_with_a_good_drafter_and_eos_mid_block(width):
    """A drafter right 90% of the time makes long acceptances, so every branch b <= min(h, k - 1) is selected;
    EOS accepted inside a block stops exactly there."""
    model = tiny_model(11)
    vocab = model.config.vocab_size
    for seed in range(2):
        prompt = _prompt(seed, 4 + seed, vocab)
        full = reference_greedy(model, prompt, 80)
        eos = full[min(2 * width + 1, 60)]
        for k in ks(width):
            for static in (False, True):
                oracle = OracleLayout(model.config.mask_token_id, vocab, full, prompt.numel(), 0.9, seed, static)
                seq, stats = decode(model, HybridSSSchedule(width, speculative_branches=k), prompt, 80, layout=oracle)
                assert seq[prompt.numel():].tolist() == full, (k, static)
                assert stats.new_tokens == sum(stats.accepted_per_iteration) == 80
                assert max(stats.rows_per_call[1:]) <= (k + 1) * (width + 1)  # B + kB
                if width > 1:
                    assert max(stats.accepted_per_iteration) > 2
            oracle = OracleLayout(model.config.mask_token_id, vocab, full, prompt.numel(), 0.9, seed)
            seq, _ = decode(model, HybridSSSchedule(width, speculative_branches=k), prompt, 80, layout=oracle,
                            eos=[eos])
            assert seq[prompt.numel():].tolist() == full[: full.index(eos) + 1]


@pytest.mark.parametrize("width", WINDOW_WIDTHS)
def test_any_order_family_is_greedy_exact(setdlms, width):
    for seed, model in setdlms.items():
        prompt = _prompt(seed, 4 + seed, model.config.vocab_size)
        full = reference_greedy(model, prompt, 40)
        eos = full[len(full) // 2]
        for k in ks(width):
            out = model.generate(prompt[None], assistant_mode="hybrid_ss", speculative_width=width,
                                 speculative_branches=k, max_new_tokens=40)
            assert out[0, prompt.numel():].tolist() == full, (seed, k)
            stopped = model.generate(prompt[None], assistant_mode="hybrid_ss", speculative_width=width,
                                     speculative_branches=k, max_new_tokens=40, eos_token_id=eos)
            assert stopped[0, prompt.numel():].tolist() == full[: full.index(eos) + 1]


# ---------------------------------------------------------------- the endpoints


@pytest.mark.parametrize("width", [1, 2, 3, 7, 15])
def test_prefix_endpoints_make_the_same_calls_rows_and_acceptances(width):
    """k = 1 is Packed-SS and k = W + 1 is Quadratic-SS call for call (a 70%-right drafter, so h varies), with
    and without static shapes; also through generate, greedy and sampling with one seed."""
    model = tiny_model(12)
    vocab = model.config.vocab_size
    prompt = _prompt(3, 5, vocab)
    full = reference_greedy(model, prompt, 50)
    for k, mode in ((1, "packed_ss"), (width + 1, "quadratic_ss")):
        for static in (False, True):
            traces = []
            for schedule in (SCHEDULES[mode](width), HybridSSSchedule(width, speculative_branches=k)):
                oracle = OracleLayout(model.config.mask_token_id, vocab, full, prompt.numel(), 0.7, 4, static)
                seq, stats = decode(model, schedule, prompt, 50, layout=oracle)
                traces.append((seq.tolist(), stats.nfe, stats.rows_per_call, stats.accepted_per_iteration))
            assert traces[0] == traces[1], (mode, static)
            assert max(traces[0][3]) > 1
        for options in (dict(do_sample=False), dict(do_sample=True, temperature=1.5)):
            outs = [_stats(model.generate(prompt[None], assistant_mode=m, speculative_width=width, max_new_tokens=40,
                                          return_dict_in_generate=True, generator=torch.Generator().manual_seed(7),
                                          **options, **extra))
                    for m, extra in ((mode, {}), ("hybrid_ss", {"speculative_branches": k}))]
            assert outs[0] == outs[1], (mode, options)


@pytest.mark.parametrize("width", WINDOW_WIDTHS)
def test_any_order_endpoints_make_the_same_calls_rows_and_acceptances(setdlms, width):
    """k = 1 is Packed-SS's region (0,); k = W + 1 (and any k >= u) is Quadratic-SS's 0..u-1: same tokens, calls,
    rows and acceptances, in LTR and confidence order, greedy and sampling with one seed."""
    model = setdlms[1]
    prompt = _prompt(9, 5, model.config.vocab_size)
    for order in ("ltr", "confidence"):
        for options in (dict(do_sample=False), dict(do_sample=True)):
            def stats(mode, order=order, options=options, **extra):
                return _stats(model.generate(prompt[None], assistant_mode=mode, speculative_width=width,
                                             max_new_tokens=40, verify_order=order, return_dict_in_generate=True,
                                             generator=torch.Generator().manual_seed(3), **options, **extra))

            assert stats("hybrid_ss", speculative_branches=1) == stats("packed_ss"), (order, options)
            quadratic = stats("quadratic_ss")
            assert stats("hybrid_ss", speculative_branches=width + 1) == quadratic, (order, options)
            assert stats("hybrid_ss", speculative_branches=width) == quadratic  # k >= u: every region
    # an intermediate k has the regions 0..k-1: more rows than Packed-SS, fewer than Quadratic-SS
    if width >= 4:
        rows = {k: sum(stats_k[2]) for k, stats_k in (
            (k, _stats(model.generate(prompt[None], assistant_mode="hybrid_ss", speculative_width=width,
                                      speculative_branches=k, max_new_tokens=40, return_dict_in_generate=True)))
            for k in (1, 2, width + 1))}
        assert rows[1] < rows[2] < rows[width + 1]


# ---------------------------------------------------------------- the branch rule, call by call


BAD = 4  # absolute positions p with p % BAD == 1 are where the drafter is wrong


def _two_table_forward(width_vocab: int, mask_id: int, shift: int, seed: int):
    """A context-free model: proposal rows (from `call.proposal_start` on) score their own position with a
    drafter table; verifier rows score position + `shift` (1: AR rows, 0: same-position MASK rows) with a table
    equal to it except at the bad positions, where its argmax differs. So a draft token is accepted exactly when
    it sits at a good position, and a proposal row read for the wrong position shows up as a rejection."""
    drafter = torch.randn(300, width_vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    drafter[:, mask_id] = float("-inf")
    verifier = drafter.clone()
    bad = torch.arange(300) % BAD == 1
    verifier[bad] = drafter[bad].roll(1, dims=1)
    verifier[:, mask_id] = float("-inf")

    def forward(call, cache):
        rows = call.logit_rows
        pos = call.position_ids[0, rows]
        proposal = (rows >= call.proposal_start)[:, None]
        return torch.where(proposal, drafter[pos], verifier[(pos + shift).clamp(max=299)])

    return forward, verifier.argmax(-1)


def _expected_h(positions) -> int:
    return next((i for i, p in enumerate(positions) if p % BAD == 1), len(positions))


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_prefix_branch_rule_call_by_call(k):
    """Each verification accepts exactly the draft tokens before the first bad position (every kept proposal row
    sits at the position it scores), and the next draft has W - A_t tokens for k = 1 (anchored) and
    W - h + min(h, k - 1) for k >= 2 (unanchored: W whenever h < k)."""
    width, vocab, mask_id = 5, 8, 7
    forward, truth = _two_table_forward(vocab, mask_id, 1, seed=k)
    log = []

    class Logged(HybridSSSchedule):
        def advance(self, plan, result):
            verdict = super().advance(plan, result)
            log.append((plan.available, verdict.h, self.draft.numel()))
            return verdict

    prompt = torch.tensor([1, 2, 3])
    seq, stats = decode(None, Logged(width, speculative_branches=k), prompt, 80, forward=forward,
                        layout=ShiftedBlockLayout(mask_id))
    assert seq[3:].tolist() == truth[3:83].tolist()  # position p holds the verifier's argmax at p
    start = 3  # absolute position of the first draft token of the next iteration
    for i, (n, h, n_next) in enumerate(log):
        assert h == _expected_h(range(start, start + n)), (i, start, n, h)
        rule = width if i == 0 else max(0, width - h - 1) if k == 1 else width - h + min(h, k - 1)
        assert n_next == rule, (i, h, n_next)  # the first call drafts W + 1 positions, one is emitted
        start += h + 1
    assert any(h >= 1 for _, h, _ in log) and any(0 < h < n for n, h, _ in log)


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_any_order_branch_rule_call_by_call(k):
    """Region min(h, k - 1) supplies the next draft at the ranks left unresolved: each verification accepts exactly
    the drafted ranks before the first bad position."""
    width, vocab, mask_id = 5, 8, 7
    forward, truth = _two_table_forward(vocab, mask_id, 0, seed=10 + k)
    log = []

    class Logged(HybridSSSchedule):
        def advance(self, plan, result):
            verdict = super().advance(plan, result)
            log.append((plan.order, plan.available, verdict.h, plan.branches))
            return verdict

    prompt = torch.tensor([1, 2, 3])
    seq, _ = decode(None, Logged(width, speculative_branches=k), prompt, 60, forward=forward,
                    layout=SamePositionLayout(mask_id))
    assert seq[3:].tolist() == truth[3:63].tolist()
    for order, available, h, regions in log:
        assert h == _expected_h([3 + j for j in order[:available]]), (order, available, h)
        assert regions == tuple(range(min(k, len(order))))
    assert any(0 < h < available for _, available, h, _ in log)


# ---------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def small_models():
    sizes = dict(hidden_size=16, num_hidden_layers=1, intermediate_size=32, num_attention_heads=2,
                 num_key_value_heads=1)
    return {"prefix": tiny_model(5, vocab_size=V, mask_token_id=V - 1, **sizes),
            "any_order": tiny_setdlm(5, vocab_size=V + 1, mask_token_id=V, **sizes)}


@pytest.mark.parametrize(("family", "width", "k", "options"), [
    ("prefix", 3, 2, "plain"), ("prefix", 3, 3, "min_p0.1-rep1.5"),
    ("any_order", 3, 2, "plain"), ("any_order", 3, 2, "min_p0.1-rep1.5"),
])
def test_hybrid_samples_the_ar_distribution(small_models, family, width, k, options):
    """W = 3 with 1 < k < W + 1: a genuine hybrid (the endpoints are the schedules test_sampling covers)."""
    model = small_models[family]
    processors = _processors(model, OPTIONS[options])
    exact = exact_distribution(model, processors)
    any_order = family == "any_order"
    layout = (SamePositionLayout if any_order else ShiftedBlockLayout)(model.config.mask_token_id)
    forward = model_forward(model)
    torch.manual_seed(4321)
    counts: Counter = Counter()
    with torch.no_grad():
        for _ in range(SAMPLES):
            seq, _ = engine_decode(forward, HybridSSSchedule(width, RejectionSampler(), speculative_branches=k), layout,
                                   PROMPT, 3, [EOS], processors)
            counts[tuple(seq[PROMPT.numel():].tolist())] += 1
    assert p_value(counts, exact) > THRESHOLD


# ---------------------------------------------------------------- the front


def test_default_k_and_config(models):
    model = models[0]
    prompt = torch.arange(5)[None]
    kwargs = dict(assistant_mode="hybrid_ss", speculative_width=4, max_new_tokens=20, return_dict_in_generate=True)
    default = _stats(model.generate(prompt, **kwargs))
    assert default == _stats(model.generate(prompt, speculative_branches=DEFAULT_BRANCHES, **kwargs))
    assert default != _stats(model.generate(prompt, speculative_branches=1, **kwargs))
    assert default[0][5:] == reference_greedy(model, prompt[0], 20)
    config = GenerationConfig(assistant_mode="hybrid_ss", speculative_width=4, speculative_branches=3)
    three = _stats(model.generate(prompt, generation_config=config, max_new_tokens=20, return_dict_in_generate=True))
    assert three == _stats(model.generate(prompt, speculative_branches=3, **kwargs))
    # the config's k was chosen for hybrid_ss: another mode asked for explicitly does not inherit it
    packed = model.generate(prompt, generation_config=config, assistant_mode="packed_ss", max_new_tokens=20)
    assert packed[0, 5:].tolist() == default[0][5:]
    assert DEFAULT_BRANCHES == 2 and SCHEDULES["hybrid_ss"] is HybridSSSchedule
    assert WINDOW_SCHEDULES["hybrid_ss"] is HybridSSSchedule


@pytest.mark.parametrize("family", ["prefix", "any_order"])
def test_bad_speculative_branches_raise(models, setdlms, family):
    model = models[0] if family == "prefix" else setdlms[0]
    prompt = torch.arange(1, 6)[None]
    for bad in (0, -1, 7, 2.0, True, "2", [2]):
        with pytest.raises(ValueError, match=r"speculative_branches=.* is out of range: use an integer in \[1, 6\]"):
            model.generate(prompt, assistant_mode="hybrid_ss", speculative_width=5, speculative_branches=bad,
                           max_new_tokens=4)
    for mode in ("ar", "linear_ss", "quadratic_ss", "packed_ss"):
        with pytest.raises(ValueError, match="speculative_branches only applies to assistant_mode='hybrid_ss'"):
            model.generate(prompt, assistant_mode=mode, speculative_branches=2, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"\['speculative_branches'\] only apply with assistant_mode"):
        model.generate(prompt, speculative_branches=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="only applies to assistant_mode='hybrid_ss'"):
        model.generate(prompt, generation_config=GenerationConfig(assistant_mode="packed_ss", speculative_branches=2),
                       max_new_tokens=4)
    with pytest.raises(ValueError, match=r"use an integer in \[1, 4\]"):
        HybridSSSchedule(3, Greedy(), speculative_branches=5)


# ---------------------------------------------------------------- the tools


def test_tools_name_the_k(models):
    assert schedule_name("hybrid_ss") == f"hybrid_ss:{DEFAULT_BRANCHES}"
    assert schedule_name("hybrid_ss:3") == "hybrid_ss:3" and schedule_name("packed_ss") == "packed_ss"
    assert schedule_name("stock") == "stock"
    for bad in ("hybrid_ss:0", "hybrid_ss:x", "packed_ss:3", "beam"):
        with pytest.raises(argparse.ArgumentTypeError, match="invalid schedule"):
            schedule_name(bad)
    assert schedule_mode("hybrid_ss:3") == ("hybrid_ss", {"speculative_branches": 3})
    assert schedule_mode("packed_ss") == ("packed_ss", {})
    decode = decoder_for(models[1], Settings(max_new_tokens=12, width=3))
    prompt = torch.arange(4)[None]
    hybrid, quadratic = decode("hybrid_ss:4", prompt), decode("quadratic_ss", prompt)
    assert hybrid["tokens"] == reference_greedy(models[1], prompt[0], 12)
    assert hybrid["rows_per_call"] == quadratic["rows_per_call"]  # k = W + 1


def test_demo_shows_the_k(models):
    from hf_packed_ss.tools import race
    from hf_packed_ss.tools.demo import load_app

    app = load_app()  # demo/app.py: the lanes' HTML

    class Tokens:  # the demo only decodes ids to text
        def decode(self, ids):
            return "".join(chr(65 + i % 26) for i in ids)

    model, prompt = models[2], torch.arange(4)[None]
    assert "hybrid_ss" in race.ORDER and race.LABELS["hybrid_ss"] == "Hybrid-SS"
    trace = race.decode_one(model, Tokens(), prompt, "hybrid_ss", width=3, max_new_tokens=10,
                            sampling={"do_sample": False}, branches=3)
    assert trace.branches == 3 and trace.label == "Hybrid-SS (k=3)"
    assert trace.tokens == reference_greedy(model, prompt[0], 10)
    assert "W = 3, k = 3" in app.lane_html(trace, "hybrid_ss")
    default = race.decode_one(model, Tokens(), prompt, "hybrid_ss", width=3, max_new_tokens=10,
                              sampling={"do_sample": False})
    assert default.branches == DEFAULT_BRANCHES
    packed = race.decode_one(model, Tokens(), prompt, "packed_ss", width=3, max_new_tokens=10,
                             sampling={"do_sample": False}, branches=3)
    assert packed.branches == 0 and "k =" not in app.lane_html(packed, "packed_ss")


@pytest.mark.parametrize("family", ["prefix", "any_order"])
def test_statistics_record_the_k(models, setdlms, family):
    model = models[0] if family == "prefix" else setdlms[0]
    prompt = torch.arange(1, 6)[None]
    for mode, k, expected in (("hybrid_ss", 3, 3), ("hybrid_ss", None, DEFAULT_BRANCHES), ("packed_ss", None, None)):
        options = {} if k is None else {"speculative_branches": k}
        out = model.generate(prompt, assistant_mode=mode, speculative_width=4, max_new_tokens=6,
                             return_dict_in_generate=True, **options)
        assert out.decoding_stats.speculative_branches == expected, (mode, k)
        assert out.decoding_stats.to_dict()["speculative_branches"] == expected
