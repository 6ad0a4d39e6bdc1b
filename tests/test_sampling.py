"""Exact sampling: speculative schedules sample the AR mode's (processed) distribution exactly.

Distribution tests enumerate every continuation of a tiny model (vocabulary 6, up to 3 new tokens,
EOS = 0) and compare a few thousand samples per schedule with a chi-square goodness-of-fit test.
Seeds are fixed, so each test is deterministic; the threshold p < 1e-3 would be the false-alarm rate
per test under random seeds. The same test must reject a deliberately wrong variant (verifying
against the fresh proposal distribution instead of the stored one), which shows it has power.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import tiny_model, tiny_setdlm
from engine import decode
from scipy.stats import chisquare
from transformers import GenerationConfig

from hf_packed_ss.engine import SamePositionLayout, ShiftedBlockLayout, decode_batch
from hf_packed_ss.engine.acceptance import Greedy, ProposalDistribution, RejectionSampler, probabilities
from hf_packed_ss.engine.schedules import SCHEDULES, WINDOW_SCHEDULES, PackedSSSchedule
from hf_packed_ss.front import model_forward

V, EOS, L, WIDTH = 6, 0, 3, 2
PROMPT = torch.tensor([1, 2])
SAMPLES = 3000
THRESHOLD = 1e-3
OPTIONS = {
    "plain": dict(do_sample=True),
    "t0.7-top5": dict(do_sample=True, temperature=0.7, top_k=5),
    "top_p0.8": dict(do_sample=True, top_p=0.8),
    "min_p0.1-rep1.5": dict(do_sample=True, min_p=0.1, repetition_penalty=1.5),
}


@pytest.fixture(scope="module")
def model():
    return tiny_model(5, vocab_size=V, mask_token_id=V - 1, hidden_size=16, num_hidden_layers=1,
                      intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)


def _processors(model, options):
    config = GenerationConfig(**options)
    return model._get_logits_processor(generation_config=config, input_ids_seq_length=PROMPT.numel())


def exact_distribution(model, processors, prompt: torch.Tensor = PROMPT) -> dict[tuple, float]:
    """Probability of every continuation under the AR mode, stopped at EOS or after L tokens."""
    out: dict[tuple, float] = {}

    def expand(seq: tuple, prob: float):
        if len(seq) == L or (seq and seq[-1] == EOS):
            out[seq] = prob
            return
        ids = torch.cat([prompt, torch.tensor(seq, dtype=torch.long)])[None]
        with torch.no_grad():
            p = probabilities(processors(ids, model(ids).logits[:, -1]))[0]
        for tok in range(V):
            if p[tok] > 0:
                expand(seq + (tok,), prob * float(p[tok]))

    expand((), 1.0)
    return out


def sample_batched(model, schedule, processors, prompts: list[torch.Tensor], seed: int, rows: int = 500) -> list:
    """One sample per prompt, drawn `rows` prompts per batched decode (a fresh schedule per row, as at batch 1);
    returns each row's continuation."""
    torch.manual_seed(seed)
    layout = SamePositionLayout if model.config.model_type == "setdlm" else ShiftedBlockLayout
    out = []
    for first in range(0, len(prompts), rows):
        chunk = prompts[first : first + rows]
        schedules = [type(schedule)(schedule.width, schedule.acceptance) for _ in chunk]
        with torch.no_grad():
            seqs, _ = decode_batch(model_forward(model, batched=True), schedules,
                                   [layout(model.config.mask_token_id) for _ in chunk], chunk, L, [EOS], processors)
        out += [tuple(seq[p.numel():].tolist()) for p, seq in zip(chunk, seqs, strict=True)]
    return out


def sample(model, schedule, processors, n: int, seed: int) -> Counter:
    """`n` samples of PROMPT's continuation, drawn in batches."""
    return Counter(sample_batched(model, schedule, processors, [PROMPT] * n, seed))


def p_value(counts: Counter, exact: dict[tuple, float]) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one."""
    n = sum(counts.values())
    assert set(counts) <= set(exact), "a continuation the AR mode cannot produce was sampled"
    big = [s for s in exact if exact[s] * n >= 5]
    small = [s for s in exact if exact[s] * n < 5]
    observed = [counts[s] for s in big] + ([sum(counts[s] for s in small)] if small else [])
    expected = [exact[s] * n for s in big] + ([sum(exact[s] for s in small) * n] if small else [])
    return float(chisquare(observed, expected).pvalue)


class FreshQPackedSS(PackedSSSchedule):
    """WRONG on purpose: verifies each draft token against the proposal distribution computed in the
    current call (from the newer prefix) instead of the stored one it was drawn from."""

    def advance(self, plan, result):
        if self.started and plan.available:
            self.draft.q = ProposalDistribution.from_logits(result.proposals[0][: plan.available])
        return super().advance(plan, result)


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("mode", ["ar", "linear_ss", "quadratic_ss", "packed_ss"])
def test_schedules_sample_the_ar_distribution(model, mode, options):
    processors = _processors(model, OPTIONS[options])
    exact = exact_distribution(model, processors)
    assert abs(sum(exact.values()) - 1) < 1e-9
    schedule = SCHEDULES[mode](WIDTH, RejectionSampler())
    counts = sample(model, schedule, processors, SAMPLES, seed=1234)
    assert p_value(counts, exact) > THRESHOLD


@pytest.fixture(scope="module")
def setdlm():
    return tiny_setdlm(5, vocab_size=V + 1, mask_token_id=V, hidden_size=16, num_hidden_layers=1,
                       intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.parametrize("options", ["plain", "min_p0.1-rep1.5"])
@pytest.mark.parametrize("mode", ["linear_ss", "quadratic_ss", "packed_ss"])
def test_any_order_schedules_sample_the_ar_distribution(setdlm, mode, options):
    """SetDLM format, LTR order, window W = 2 (the window may be fully accepted without a bonus token)."""
    processors = _processors(setdlm, OPTIONS[options])
    exact = exact_distribution(setdlm, processors)
    assert abs(sum(exact.values()) - 1) < 1e-9
    counts = sample(setdlm, WINDOW_SCHEDULES[mode](WIDTH, RejectionSampler()), processors, SAMPLES, seed=99)
    assert p_value(counts, exact) > THRESHOLD


PROMPT_2 = torch.tensor([4])


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
@pytest.mark.parametrize("mode", ["packed_ss", "linear_ss"])
def test_batched_rows_with_different_prompts_each_sample_their_own_ar_distribution(request, family, mode):
    """Rows of one batch with different prompts (of different lengths, so left padding and holes differ), each
    tested against the exact enumeration of its own prompt."""
    model = request.getfixturevalue("model" if family == "nemotron" else "setdlm")
    processors = _processors(model, OPTIONS["t0.7-top5"])
    table = SCHEDULES if family == "nemotron" else WINDOW_SCHEDULES
    prompts = [PROMPT, PROMPT_2] * (SAMPLES // 2) + [PROMPT] * (SAMPLES // 2)  # alternating, then alone
    drawn = sample_batched(model, table[mode](WIDTH, RejectionSampler()), processors, prompts, seed=21)
    for prompt in (PROMPT, PROMPT_2):
        counts = Counter(d for p, d in zip(prompts, drawn, strict=True) if p is prompt)
        assert p_value(counts, exact_distribution(model, processors, prompt)) > THRESHOLD


@pytest.mark.parametrize("options", ["plain", "t0.7-top5"])
def test_chi_square_rejects_fresh_q_variant(model, options):
    processors = _processors(model, OPTIONS[options])
    exact = exact_distribution(model, processors)
    counts = sample(model, FreshQPackedSS(WIDTH, RejectionSampler()), processors, SAMPLES, seed=1234)
    assert p_value(counts, exact) < THRESHOLD


def test_enumeration_matches_stock_sampling(model):
    """Our reference enumeration is what stock `generate(do_sample=True)` samples (sanity of the test)."""
    torch.manual_seed(7)
    counts: Counter = Counter()
    for _ in range(1500):
        out = model.generate(PROMPT[None], do_sample=True, max_new_tokens=L, eos_token_id=EOS, pad_token_id=EOS,
                             temperature=0.7, top_k=5)
        seq = out[0, PROMPT.numel():].tolist()
        counts[tuple(seq[: seq.index(EOS) + 1] if EOS in seq else seq)] += 1
    exact = exact_distribution(model, _processors(model, OPTIONS["t0.7-top5"]))
    assert p_value(counts, exact) > THRESHOLD


class RecordingSampler(RejectionSampler):
    def __init__(self):
        super().__init__()
        self.log: list[tuple[int, int]] = []

    def verify(self, draft, q, logits):
        accepted, h = super().verify(draft, q, logits)
        self.log.append((h, draft.numel()))
        return accepted, h


def _positional_forward(table: torch.Tensor, mask_id: int):
    """A model whose every conditional depends only on the position scored: the AR row at position j
    scores j + 1 with table[j + 1]; a MASK row at j scores j with table[j]. Drafter == verifier."""

    def forward(call, cache):
        pos = call.position_ids[0, call.logit_rows]
        is_mask = call.input_ids[0, call.logit_rows] == mask_id
        return table[torch.where(is_mask, pos, pos + 1)]

    return forward


@pytest.mark.parametrize("mode", ["linear_ss", "quadratic_ss", "packed_ss"])
@pytest.mark.parametrize("top_k", [None, 3])
def test_identical_drafter_accepts_every_draft_token(mode, top_k):
    vocab, mask_id = 8, 7
    table = torch.randn(200, vocab, generator=torch.Generator().manual_seed(0))
    table[:, mask_id] = float("-inf")  # the mask token is never an output here
    options = dict(do_sample=True, top_k=top_k) if top_k else dict(do_sample=True)
    processors = tiny_model(0)._get_logits_processor(generation_config=GenerationConfig(**options))
    sampler = RecordingSampler()
    torch.manual_seed(0)
    seq, stats = decode(None, SCHEDULES[mode](5, sampler), torch.tensor([1, 2, 3]), 60,
                        forward=_positional_forward(table, mask_id), layout=ShiftedBlockLayout(mask_id),
                        processors=processors)
    drafted = [(h, k) for h, k in sampler.log if k]
    assert drafted and all(h == k for h, k in drafted)
    if mode != "packed_ss":  # fresh full drafts: every iteration after the first yields W + 1 tokens
        assert set(stats.accepted_per_iteration[1:-1]) == {6}


def test_sparse_storage_does_not_grow_with_vocabulary():
    model = tiny_model(0)
    processors = model._get_logits_processor(generation_config=GenerationConfig(do_sample=True, top_k=20))
    for vocab in (1_000, 50_000):
        logits = processors(torch.zeros(1, 3, dtype=torch.long).expand(7, -1), torch.randn(7, vocab))
        q = ProposalDistribution.from_logits(logits)
        assert q.index is not None and q.probs.shape == q.index.shape == (7, 20)
        tokens = q.sample(None)
        assert torch.allclose(q.prob(tokens), probabilities(logits)[torch.arange(7), tokens].float())
        assert torch.allclose(q.dense(2), probabilities(logits)[2])
    dense = ProposalDistribution.from_logits(torch.randn(4, 100))
    assert dense.index is None and dense.probs.shape == (4, 100)


def test_numerical_edge_cases():
    sampler = RejectionSampler(torch.Generator().manual_seed(0))
    logits = torch.randn(4, 10, dtype=torch.float64)
    q = ProposalDistribution.from_logits(logits[:3])
    for _ in range(200):  # p == Q exactly: always accepted, never NaN
        draft = q.sample(None)
        accepted, h = sampler.verify(draft, q, logits)
        assert h == 3 and not torch.isnan(accepted.float()).any()
    single = torch.full((2, 10), -1e9)  # top-p leaving a single token
    single[:, 4] = 0.0
    one = ProposalDistribution.from_logits(single[:1])
    assert one.index is not None and one.probs.shape == (1, 1)
    accepted, h = sampler.verify(one.sample(None), one, single)
    assert accepted.tolist() == [4, 4] and h == 1
    tiny_q = torch.tensor([[0.0, -80.0]])  # Q(d) tiny: ratio huge, accepted, no overflow issue
    q = ProposalDistribution.from_logits(tiny_q)
    accepted, h = sampler.verify(torch.tensor([1]), q, torch.tensor([[0.0, 0.0], [0.0, 0.0]]))
    assert h == 1
    bf16 = probabilities(torch.randn(2, 5).bfloat16())
    assert bf16.dtype == torch.float32


def test_seeds_reproduce(model):
    kwargs = dict(assistant_mode="packed_ss", speculative_width=2, do_sample=True, max_new_tokens=20)
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(model.generate(PROMPT[None], **kwargs))
    assert torch.equal(*outs)
    a = model.generate(PROMPT[None], generator=torch.Generator().manual_seed(9), **kwargs)
    b = model.generate(PROMPT[None], generator=torch.Generator().manual_seed(9), **kwargs)
    assert torch.equal(a, b)
    others = {tuple(model.generate(PROMPT[None], generator=torch.Generator().manual_seed(s), **kwargs)[0].tolist())
              for s in range(10)}
    assert len(others) > 1


def test_greedy_with_processors_matches_stock(model):
    for options in (dict(repetition_penalty=1.8), dict(no_repeat_ngram_size=2), dict(min_new_tokens=5)):
        stock = model.generate(PROMPT[None], max_new_tokens=12, eos_token_id=EOS, pad_token_id=EOS, **options)
        for mode in ("linear_ss", "quadratic_ss", "packed_ss"):
            ours = model.generate(PROMPT[None], assistant_mode=mode, speculative_width=3, max_new_tokens=12,
                                  eos_token_id=EOS, pad_token_id=EOS, **options)
            assert ours[0].tolist() == stock[0, : ours.shape[1]].tolist() and (
                ours.shape == stock.shape or int(ours[0, -1]) == EOS)


def test_stock_sampling_still_works(model):
    out = model.generate(PROMPT[None], do_sample=True, max_new_tokens=5, pad_token_id=EOS)
    assert out.shape[0] == 1 and 3 <= out.shape[1] <= 7


def test_greedy_policy_ignores_q():
    draft, logits = torch.tensor([2, 1]), torch.tensor([[0.0, 0, 9], [0, 0, 9], [9, 0, 0]])
    assert Greedy().verify(draft, None, logits)[1] == 1


def test_all_continuations_enumerated(model):
    exact = exact_distribution(model, _processors(model, OPTIONS["plain"]))
    assert len(exact) == 1 + (V - 1) + (V - 1) ** 2 * V
    assert set(exact) == {s for s in itertools.chain(
        [(EOS,)], [(a, EOS) for a in range(1, V)], itertools.product(range(1, V), range(1, V), range(V)))}


@pytest.mark.parametrize("shape", [(3, 7), (5, 4096), (16, 31, 4096), (2, 40, 1000), (300, 49152 // 64)])
def test_greedy_tokens_is_argmax_with_ties_and_nan(shape):
    """The fast argmax (two-level on large inputs) picks exactly torch.argmax's index: the first maximum, NaN
    counting as the maximum, on every shape (a vocabulary that no chunk size divides included)."""
    from hf_packed_ss.engine.acceptance import greedy_tokens

    gen = torch.Generator().manual_seed(sum(shape))
    for dtype in (torch.float32, torch.float64):
        x = torch.randint(0, 4, shape, generator=gen).to(dtype)  # many ties
        assert torch.equal(greedy_tokens(x), x.argmax(-1))
        x.view(-1, shape[-1])[0, shape[-1] // 2] = float("nan")
        x.view(-1, shape[-1])[-1, 1] = float("nan")
        x.view(-1, shape[-1])[-1, -1] = float("nan")
        assert torch.equal(greedy_tokens(x), x.argmax(-1))
        y = torch.randn(shape, generator=gen, dtype=dtype)
        assert torch.equal(greedy_tokens(y), y.argmax(-1))
