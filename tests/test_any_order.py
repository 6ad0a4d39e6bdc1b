"""Any-order decoding on the SetDLM format (paper appendix C, D.2, E.2, E.6).

References are written here, independently of the engine: every prediction is one fresh forward of
the duplicate-mask construction (clean tokens causal in their acceptance order, one MASK row at the
queried position seeing all of them), in float64 on random tiny models.
"""

from __future__ import annotations

import pytest
import torch
from conftest import SETDLM_MASK as MASK
from conftest import tiny_setdlm

from hf_packed_ss.acceptance import Greedy, probabilities
from hf_packed_ss.any_order_runner import run_any_order
from hf_packed_ss.generation import model_forward
from hf_packed_ss.layouts import SetDLMLayout
from hf_packed_ss.schedules import WINDOW_SCHEDULES

SPECULATIVE = ["linear_ss", "quadratic_ss", "packed_ss"]


@pytest.fixture(scope="module")
def setdlms():
    return {seed: tiny_setdlm(seed) for seed in range(3)}


def conditional(model, clean: list[tuple[int, int]], position: int) -> torch.Tensor:
    """Logits for the token at absolute `position` given `clean` (absolute position, token) pairs in
    acceptance order: the any-order conditional of the training construction."""
    n = len(clean)
    ids = torch.tensor([[t for _, t in clean] + [MASK]])
    pos = torch.tensor([[j for j, _ in clean] + [position]])
    mask = torch.ones(n + 1, n + 1, dtype=torch.bool).tril()
    with torch.no_grad():
        return model(input_ids=ids, position_ids=pos, attention_mask=mask[None, None]).logits[0, -1]


def ltr_reference(model, prompt: list[int], length: int, eos: frozenset[int] = frozenset()) -> list[int]:
    """Greedy decoding over the model's left-to-right conditionals."""
    clean = list(enumerate(prompt))
    out: list[int] = []
    while len(out) < length:
        tok = int(conditional(model, clean, len(clean)).argmax())
        clean.append((len(clean), tok))
        out.append(tok)
        if tok in eos:
            break
    return out


def decode(model, mode, prompt, length, width, order="ltr", eos=(), stop=None, trace=None, static=False, **kw):
    """Run the any-order runner directly; `trace` collects (plan, call, accepted) per call."""
    schedule = WINDOW_SCHEDULES[mode](width, Greedy(), order, **kw)
    layout, forward = SetDLMLayout(MASK, static_shapes=static), model_forward(model)
    if trace is not None:
        build, advance, call_model = layout.build, schedule.advance, forward
        layout.build = lambda plan, *a: trace.append({"plan": plan, "call": build(plan, *a)}) or trace[-1]["call"]
        schedule.advance = lambda plan, result: trace[-1].update(out=advance(plan, result)) or trace[-1]["out"]
        forward = lambda call, cache: trace[-1].update(logits=call_model(call, cache)) or trace[-1]["logits"]  # noqa: E731
    with torch.no_grad():
        seq, stats = run_any_order(forward, schedule, layout, torch.tensor(prompt), length, eos, None, stop)
    return seq[len(prompt):].tolist(), stats


@pytest.mark.parametrize("mode", SPECULATIVE)
@pytest.mark.parametrize("width", [1, 4, 8, 16])
def test_ltr_schedules_are_token_exact(setdlms, mode, width):
    for seed, model in setdlms.items():
        prompt = torch.randint(0, MASK, (4 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = ltr_reference(model, prompt, 40)
        out, stats = decode(model, mode, prompt, 40, width)
        assert out == ref, (seed, mode, width)
        via_generate = model.generate(torch.tensor([prompt]), max_new_tokens=40, assistant_mode=mode,
                                      speculative_width=width)
        assert via_generate[0, len(prompt):].tolist() == ref
        eos = frozenset({ref[len(ref) // 2]})  # stop inside a block
        assert decode(model, mode, prompt, 40, width, eos=eos)[0] == ltr_reference(model, prompt, 40, eos)


def test_ar_on_the_engine_is_stock_greedy(setdlms):
    model = setdlms[1]
    prompt = [3, 9, 4]
    stock = model.generate(torch.tensor([prompt]), max_new_tokens=25, do_sample=False)[0, 3:].tolist()
    out, stats = decode(model, "ar", prompt, 25, 1)
    assert out == stock == ltr_reference(model, prompt, 25)
    assert stats.nfe == 25 and stats.rows_per_call[1:] == [2] * 24  # [correction | verifier MASK]


def serial_reference(model, prompt: list[int], length: int, trace, eos: frozenset[int]) -> list[int]:
    """Proposition C.1: replay the run's order decisions (pi_t, A_t) serially, one fresh forward per
    generated token, each conditioned on P_{t-1} and the tokens generated earlier in its group."""
    accepted = list(enumerate(prompt))  # P, absolute positions, acceptance order
    end = length - 1
    origin = len(prompt)
    for step in trace:
        if step.get("out") is None:
            continue  # a drafting-only call
        pairs, _ = step["out"]
        group = []
        for j, _ in pairs:
            tok = int(conditional(model, accepted + group, origin + j).argmax())
            group.append((origin + j, tok))
        end = min([end] + [j - origin for j, t in group if t in eos])
        accepted = [(j, t) for j, t in accepted + group if j - origin <= end]
    out = dict(accepted)
    return [out[origin + j] for j in range(end + 1)]


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_confidence_order_equals_the_serial_reference(setdlms, mode):
    reordered = 0
    for seed, model in setdlms.items():
        prompt = torch.randint(0, MASK, (5,), generator=torch.Generator().manual_seed(10 + seed)).tolist()
        ltr = ltr_reference(model, prompt, 40)
        for eos in (frozenset(), frozenset({ltr[20]})):
            trace: list[dict] = []
            out, _ = decode(model, mode, prompt, 40, 8, order="confidence", eos=eos, trace=trace)
            assert out == serial_reference(model, prompt, 40, trace, eos)
            orders = [s["plan"].order for s in trace if s["plan"].order]
            reordered += sum(list(o) != sorted(o) for o in orders)
            assert all(len(set(o)) == len(o) and max(o) - min(o) < 8 for o in orders)  # a window of W = 8
    assert reordered > 0  # the test must exercise non-LTR orders


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_confidence_scores_follow_appendix_e6(setdlms, mode):
    """Packed/Quadratic rank by the probability each draft token had when proposed (Quadratic: in the
    selected branch); Linear by the verifier's top probability in the previous iteration; unscored
    positions come last, in textual order. Scores are recomputed here from each call's logits."""
    checked = 0
    for model in setdlms.values():
        trace: list[dict] = []
        decode(model, mode, [5, 6, 7], 40, 8, order="confidence", trace=trace)
        scores: dict[int, float] = {}
        for step in trace:
            plan, result = step["plan"], step["call"].read(step["logits"])
            if mode != "linear_ss" or not plan.verify:  # Linear fixes its order at the drafting call
                window = sorted(plan.order)
                ranked = sorted((j for j in window if j in scores), key=lambda j: (-scores[j], j))
                assert list(plan.order) == ranked + [j for j in window if j not in scores]
                checked += bool(scores)
            if step["out"] is None:
                continue
            pairs, h = step["out"]
            if mode == "linear_ss":
                top = probabilities(result.verifier).max(dim=-1).values
                scores = {j: float(top[r]) for r, j in enumerate(plan.order)}
            else:
                g = min(h, len(plan.regions) - 1)
                top = probabilities(result.proposals[g]).max(dim=-1).values
                first = plan.regions[g] + 1  # a verifying call's region b holds ranks b + 1 .. u - 1
                scores = {j: float(top[r - first]) for r, j in enumerate(plan.order) if r >= len(pairs)}
    assert checked > 3


def test_rows_per_call_match_appendix_d3(setdlms):
    model = setdlms[2]
    prompt = [1, 2, 3, 4]
    for mode, rows in (("linear_ss", lambda p, u: p + 3 * u), ("packed_ss", lambda p, u: p + 3 * u),
                       ("quadratic_ss", lambda p, u: p + 2 * u + u * u)):
        for order in ("ltr", "confidence"):
            trace: list[dict] = []
            decode(model, mode, prompt, 40, 8, order=order, trace=trace, static=True)
            calls = [(len(s["plan"].order), s["call"].cache_rows_before_draft, s["call"].rows) for s in trace]
            if mode == "linear_ss":  # drafting call (p + u) and verification call (2u) make one iteration
                calls = [(u, p, r1 + r2) for (u, p, r1), (_, _, r2) in zip(calls[::2], calls[1::2], strict=True)]
            assert calls[0][1] == len(prompt)  # the prompt is processed once, in the first call
            for u, p, total in calls[1:]:
                assert p in (0, 1) and total == rows(p, u), (mode, order, u, p, total)
            assert max(u for u, _, _ in calls) == 8


@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("mode", ["packed_ss", "quadratic_ss"])
def test_rows_that_cannot_matter_are_dropped_exactly(setdlms, mode, order):
    """By default a call has O rows only for drafted ranks, M rows only up to the first undrafted rank
    (kappa + 1) and, in region b, R rows only for ranks b + 1 .. u - 1 (the call resolves ranks 0..b
    whenever region b is read); with static shapes it has all of appendix D.3's. Both decode the same
    tokens with the same acceptances, and the lean form is smaller."""
    model = setdlms[1]
    runs = {}
    for static in (False, True):
        trace: list[dict] = []
        out, stats = decode(model, mode, [5, 9, 2, 7], 40, 8, order=order, trace=trace, static=static)
        runs[static] = out, stats.accepted_per_iteration, trace
    assert runs[False][:2] == runs[True][:2]
    lean = runs[False][2]
    for step in lean[1:]:
        plan, call = step["plan"], step["call"]
        u, p, kappa = len(plan.order), call.cache_rows_before_draft, plan.available
        drafted = sum(d is not None for d in plan.draft)
        assert call.rows == p + drafted + min(kappa + 1, u) + sum(u - 1 - b for b in plan.regions)
    assert sum(s["call"].rows for s in lean) < sum(s["call"].rows for s in runs[True][2])


@pytest.mark.parametrize("mode", ["ar", *SPECULATIVE])
def test_cache_holds_prompt_plus_processed_accepted_tokens(setdlms, mode):
    """Before every call the cache is the prompt plus the accepted tokens processed so far, and a query
    through it gives the same next-token logits as a fresh forward over the accepted sequence."""
    model = setdlms[0]
    prompt = [7, 3, 11, 2]
    out, _ = decode(model, mode, prompt, 30, 8)
    full = prompt + out
    forward = model_forward(model)
    checked = 0

    def probing(call, cache):
        nonlocal checked
        n, p = cache.get_seq_length(), call.cache_rows_before_draft
        if n:
            assert call.position_ids[0, :p].tolist() == list(range(n, n + p))  # N continues the cache
            pending = call.input_ids[0, :p].tolist()
            assert pending == full[n : n + p]
            probe = torch.tensor([pending + [MASK]])
            mask = torch.ones(p + 1, n + p + 1, dtype=torch.bool)
            mask[:, n:] = torch.ones(p + 1, p + 1, dtype=torch.bool).tril()
            copy = type(cache)()
            for layer in cache.layers:
                copy.update(layer.keys.clone(), layer.values.clone(), len(copy.layers) if copy.layers else 0)
            with torch.no_grad():
                cached = model(input_ids=probe, position_ids=torch.arange(n, n + p + 1)[None],
                               attention_mask=mask[None, None], use_cache=True,
                               **{model._cache_kw: copy}).logits[0, -1]
                fresh = model(torch.tensor([full[: n + p]])).logits[0, -1]
            assert torch.allclose(cached, fresh, atol=1e-10)
            checked += 1
        return forward(call, cache)

    schedule = WINDOW_SCHEDULES[mode](8, Greedy(), "ltr")
    with torch.no_grad():
        seq, _ = run_any_order(probing, schedule, SetDLMLayout(MASK), torch.tensor(prompt), 30)
    assert seq[len(prompt):].tolist() == out and checked > 5


def test_native_honours_threshold_and_window(setdlms):
    model = setdlms[1]
    for threshold in (0.9, 0.3):
        trace: list[dict] = []
        out, stats = decode(model, "native", [4, 5, 6], 30, 6, trace=trace, confidence_threshold=threshold)
        resolved: set[int] = set()
        for step in trace:
            plan = step["plan"]
            left = min(set(range(30)) - resolved)
            assert plan.order == tuple(j for j in range(left, min(left + 6, 30)) if j not in resolved)
            assert plan.draft is None and not plan.verify  # drafting rows only
            conf, tokens = probabilities(step["call"].read(step["logits"]).proposals[0]).max(dim=-1)
            expect = {plan.order[r] for r in range(len(plan.order)) if conf[r] >= threshold}
            expect.add(plan.order[int(conf.argmax())])
            pairs, _ = step["out"]
            assert {j for j, _ in pairs} == expect
            assert all(t == int(tokens[plan.order.index(j)]) for j, t in pairs)
            resolved |= expect
        assert len(out) == 30 and MASK not in out
        if threshold == 0.3:
            assert stats.nfe < 30  # a low threshold commits several tokens per call


def test_native_stops_on_a_multi_token_marker(setdlms):
    model = setdlms[2]
    prompt = [8, 1, 9]
    free, _ = decode(model, "native", prompt, 40, 8)
    marker = free[15:17]
    stop = _marker_stop([marker])
    out, _ = decode(model, "native", prompt, 40, 8, stop=stop)
    assert out[-2:] == marker and len(out) <= 17
    assert all(out[i : i + 2] != marker for i in range(len(out) - 2))  # the earliest-ending marker wins


def _marker_stop(markers):
    from hf_packed_ss.generation import StopSequenceCriteria

    criteria = StopSequenceCriteria(markers)
    return lambda sequence: bool(criteria(sequence[None], None).any())


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_eos_before_accepted_later_positions_drops_them_exactly(setdlms, mode):
    """Confidence order can accept position j > i before EOS is accepted at i: E = i then discards j,
    and tokens cached after j (which attended to it) are processed again, so the output still equals
    the serial reference."""
    model = setdlms[0]
    prompt = torch.randint(0, MASK, (5,), generator=torch.Generator().manual_seed(12)).tolist()
    eos = frozenset({18})
    trace: list[dict] = []
    out, stats = decode(model, mode, prompt, 40, 8, order="confidence", eos=eos, trace=trace)
    accepted = [j for s in trace if s["out"] for j, _ in s["out"][0]]
    assert max(accepted) > len(out) - 1 and out[-1] in eos  # the case under test happened
    assert out == serial_reference(model, prompt, 40, trace, eos)
    assert stats.new_tokens == len(out)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(assistant_mode="packed_ss", speculative_width=17), r"\[1, 16\].*max_block_size=16"),
        (dict(assistant_mode="packed_ss", speculative_width=0), "out of range"),
        (dict(assistant_mode="packed_ss", verify_order="random"), "Unknown verify_order"),
        (dict(assistant_mode="native", verify_order="confidence"), "no verification order"),
        (dict(assistant_mode="packed_ss", confidence_threshold=0.5), "only applies to assistant_mode='native'"),
        (dict(assistant_mode="native", confidence_threshold=1.5), r"probability in \(0, 1\]"),
        (dict(assistant_mode="packed_ss", stop_sequences=[[]]), "non-empty token-id lists"),
        (dict(verify_order="confidence"), "only apply with assistant_mode"),
    ],
)
def test_bad_any_order_options_raise(setdlms, kwargs, message):
    with pytest.raises(ValueError, match=message):
        setdlms[0].generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, **kwargs)


def test_nemotron_refuses_any_order_only_options():
    from conftest import tiny_model

    model = tiny_model(0)
    with pytest.raises(ValueError, match="native.*any-order model"):
        model.generate(torch.tensor([[1, 2]]), assistant_mode="native", max_new_tokens=3)
    with pytest.raises(ValueError, match="confidence.*any-order model"):
        model.generate(torch.tensor([[1, 2]]), assistant_mode="packed_ss", verify_order="confidence", max_new_tokens=3)


def test_generate_defaults_and_stats(setdlms):
    model = setdlms[0]
    out = model.generate(torch.tensor([[4, 5]]), max_new_tokens=20, assistant_mode="packed_ss",
                         return_dict_in_generate=True)
    stats = out.decoding_stats
    assert stats.width == 8  # half the training horizon max_block_size = 16
    assert stats.new_tokens == 20 == sum(stats.accepted_per_iteration) and stats.nfe == len(stats.rows_per_call)
    empty = model.generate(torch.tensor([[4, 5]]), max_new_tokens=0, assistant_mode="packed_ss")
    assert empty.tolist() == [[4, 5]]
    native = model.generate(torch.tensor([[4, 5]]), max_new_tokens=12, assistant_mode="native",
                            confidence_threshold=0.5, return_dict_in_generate=True)
    assert native.sequences.shape == (1, 14) and native.decoding_stats.schedule == "native"
