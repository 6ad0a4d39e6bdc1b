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
from engine import Trace, schedule_for
from engine import decode as engine_decode

from hf_packed_ss.engine.acceptance import Greedy, probabilities
from hf_packed_ss.engine.schedules import WINDOW_SCHEDULES
from hf_packed_ss.front import model_forward

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
    steps = Trace()
    seq, stats = engine_decode(model, schedule_for(model, mode, width, Greedy(), order, **kw), prompt, length,
                               static=static, eos=eos, stop=stop, trace=steps)
    for step in steps if trace is not None else ():  # as (plan, call, logits, (pairs, h)) per call
        verdict = step.verdict
        out = None if not verdict.verified else (list(zip(verdict.positions, verdict.tokens, strict=True)), verdict.h)
        trace.append({"plan": step.plan, "call": step.call, "logits": step.logits, "out": out})
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
                g = min(h, len(plan.branches) - 1)
                top = probabilities(result.proposals[g]).max(dim=-1).values
                first = plan.branches[g] + 1  # a verifying call's region b holds ranks b + 1 .. u - 1
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
        assert call.rows == p + drafted + min(kappa + 1, u) + sum(u - 1 - b for b in plan.branches)
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

    seq, _ = engine_decode(model, schedule_for(model, mode, 8), prompt, 30, forward=probing)
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
            assert plan.available == 0 and not plan.verify  # drafting rows only
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
    from hf_packed_ss.front import StopSequenceCriteria

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
        (dict(stop_at_eos=False), r"\['stop_at_eos'\] only apply with assistant_mode"),
        (dict(native_cache_order="first_hitting"), "only apply with assistant_mode"),
        (dict(native_context="sliding"), "only apply with assistant_mode"),
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


# --- The release's native-decoder variants (kuleshov-group/setdlms `SetDLM.generate`) -------------------


def release_first_hitting_times(n: int, config, seed: int) -> list[float]:
    """StaggeredNoise.compute_first_hitting_times as the release writes it (d = max_block_size / 2, noise
    block = length = block_size): T_j = loc_j + b (1 - exp(-E_j / k)), E ~ Exp(1), one draw of shape (1, n)."""
    length = block = config.block_size
    smax = config.max_block_size
    d = smax // 2
    area = 1 / (2 * (length / d))
    if d not in (1, smax):
        b = smax / (block + smax - 1)
        k = area / (b - area)
    else:
        k, b = 1.0, area * 2
    torch.manual_seed(seed)
    e = torch.empty(1, n, dtype=torch.float64).exponential_()
    loc = torch.linspace(0.0, 1.0 - b, block, dtype=torch.float64).flip(0)[None, -n:]
    return (loc + b * -torch.expm1(-e / k))[0].tolist()


def native_reference(model, prompt: list[int], length: int, width: int, threshold: float, times=None,
                     context: int | None = None) -> list[int]:
    """The release's native decoder (greedy, no EOS) without a KV cache: every step is one fresh forward
    over every row ever processed, each seeing the rows it saw when it was processed. Rows: the prompt
    (its own call), then each step's [tokens committed the step before, causal in feed order | one MASK
    per window position, seeing those and itself]. `times`: feed a step's committed tokens by descending
    first-hitting time (else by position). `context`: before each step the oldest rows are dropped so
    that kept rows + the step's rows <= context (`_crop_kv_cache_left`)."""
    origin = len(prompt)
    rows = list(enumerate(prompt))  # processed rows in cache order: (absolute position, token)
    starts = [0] * origin  # the first row each processed row could see
    dropped, new, out = 0, [], {}
    while len(out) < length:
        left = min(j for j in range(length) if j not in out)
        window = [j for j in range(left, min(left + width, length)) if j not in out]
        if context is not None:
            dropped = max(dropped, len(rows) - (context - len(new) - len(window)))
        n = len(rows) + len(new)
        q = n + len(window)
        mask = torch.zeros(q, q, dtype=torch.bool)
        for i in range(n):
            mask[i, (starts[i] if i < len(rows) else dropped) : i + 1] = True
        for i in range(n, q):
            mask[i, dropped:n] = True
            mask[i, i] = True
        ids = torch.tensor([[t for _, t in rows + new] + [MASK] * len(window)])
        pos = torch.tensor([[j for j, _ in rows + new] + [origin + j for j in window]])
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=pos, attention_mask=mask[None, None]).logits[0, n:]
        conf, tokens = torch.softmax(logits, dim=-1).max(dim=-1)
        commit = conf >= threshold
        commit[conf.argmax()] = True
        pairs = [(window[r], int(tokens[r])) for r in commit.nonzero()[:, 0].tolist()]
        if times is not None:
            pairs.sort(key=lambda pair: -times[pair[0]])
        starts += [dropped] * len(new)
        rows += new
        new = [(origin + j, t) for j, t in pairs]
        out.update(pairs)
    return [out[j] for j in range(length)]


def _native(model, prompt, length, seed=None, **kwargs):
    if seed is not None:
        torch.manual_seed(seed)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=length, assistant_mode="native",
                         return_dict_in_generate=True, **kwargs)
    return out.sequences[0, len(prompt):].tolist(), out.decoding_stats


def test_native_default_equals_the_release_rule_in_position_order(setdlms):
    for seed, model in setdlms.items():
        prompt = torch.randint(0, MASK, (4,), generator=torch.Generator().manual_seed(20 + seed)).tolist()
        for width, threshold in ((2, 0.9), (6, 0.4)):
            ref = native_reference(model, prompt, 30, width, threshold)
            assert _native(model, prompt, 30, speculative_width=width, confidence_threshold=threshold)[0] == ref
            explicit = _native(model, prompt, 30, speculative_width=width, confidence_threshold=threshold,
                               native_cache_order="position", stop_at_eos=True, native_context="full")[0]
            assert explicit == ref


def test_first_hitting_cache_order_feeds_committed_rows_latest_first(setdlms):
    """Each call's N rows (last step's committed tokens) come by descending first-hitting time, drawn
    once per run from the release's schedule with the run's seed; by default they come by position."""
    model = setdlms[0]
    prompt = [4, 5, 6]
    shuffled = 0
    for cache_order in ("position", "first_hitting"):
        trace: list[dict] = []
        torch.manual_seed(3)
        out, _ = decode(model, "native", prompt, 30, 6, trace=trace, confidence_threshold=0.2,
                        native_cache_order=cache_order, config=model.config)
        times = release_first_hitting_times(30, model.config, 3)
        for before, step in zip(trace, trace[1:], strict=False):
            call, committed = step["call"], [j for j, _ in before["out"][0]]
            p = call.cache_rows_before_draft
            fed = (call.position_ids[0, :p] - len(prompt)).tolist()
            assert call.input_ids[0, :p].tolist() == [out[j] for j in fed]
            if cache_order == "position":
                assert fed == sorted(committed)
            else:
                assert fed == sorted(committed, key=lambda j: -times[j])
                shuffled += fed != sorted(fed)
    assert shuffled > 0  # the case under test happened


def test_first_hitting_cache_order_equals_the_release_rule(setdlms):
    changed = 0
    for seed, model in setdlms.items():
        prompt = torch.randint(0, MASK, (3,), generator=torch.Generator().manual_seed(30 + seed)).tolist()
        for width, threshold, run_seed in ((2, 0.9, 1), (4, 0.2, 2), (8, 0.15, 5)):
            times = release_first_hitting_times(24, model.config, run_seed)
            ref = native_reference(model, prompt, 24, width, threshold, times=times)
            out, _ = _native(model, prompt, 24, seed=run_seed, speculative_width=width, confidence_threshold=threshold,
                             native_cache_order="first_hitting")
            assert out == ref, (seed, width, threshold)
            changed += out != native_reference(model, prompt, 24, width, threshold)
    assert changed > 0  # the order changes the output somewhere
    generator = torch.Generator().manual_seed(2)  # a generate(generator=...) draws the times from it when sampling
    sampled = setdlms[0].generate(torch.tensor([[1, 2]]), max_new_tokens=8, assistant_mode="native", do_sample=True,
                                  native_cache_order="first_hitting", generator=generator)
    assert sampled.shape == (1, 10)


def test_native_without_eos_stop_decodes_every_position(setdlms):
    """The release never stops at EOS: with stop_at_eos=False EOS is an ordinary token and the output is
    the no-EOS run; by default an accepted EOS at j ends the output at j."""
    model = setdlms[1]
    prompt = [7, 1, 3]
    free, _ = _native(model, prompt, 30, speculative_width=4, confidence_threshold=0.5)
    eos = free[10]
    assert eos not in free[:10]
    stopped, _ = _native(model, prompt, 30, speculative_width=4, confidence_threshold=0.5, eos_token_id=eos)
    assert len(stopped) < 30 and stopped[-1] == eos and eos not in stopped[:-1]
    through, stats = _native(model, prompt, 30, speculative_width=4, confidence_threshold=0.5, eos_token_id=eos,
                             stop_at_eos=False)
    assert through == free == native_reference(model, prompt, 30, 4, 0.5) and stats.new_tokens == 30


@pytest.fixture(scope="module")
def short_setdlm():
    return tiny_setdlm(5, block_size=16, max_block_size=4)  # trained length 16, W = 2 by default


def test_sliding_context_crops_the_cache_to_the_trained_length(short_setdlm):
    model = short_setdlm
    forward = model_forward(model)
    for prompt in ([3, 1, 4], list(range(1, 16))):  # the second fills the context: its own prompt call
        for width, threshold in ((2, 0.9), (3, 0.4)):
            sizes = []
            schedule = WINDOW_SCHEDULES["native"](width, Greedy(), confidence_threshold=threshold,
                                                  native_context="sliding", config=model.config)

            def probing(call, cache, sizes=sizes):
                sizes.append((cache.get_seq_length(), call.rows))
                return forward(call, cache)

            seq, stats = engine_decode(model, schedule, prompt, 40, forward=probing)
            out = seq[len(prompt):].tolist()
            assert out == native_reference(model, prompt, 40, width, threshold, context=16)
            assert all(cached + rows <= 16 for cached, rows in sizes) and max(c for c, _ in sizes) > 8
            if len(prompt) == 15:
                assert sizes[0] == (0, 15)  # the prompt alone, as the release's prompt call
            via_generate, _ = _native(model, prompt, 40, speculative_width=width, confidence_threshold=threshold,
                                      native_context="sliding")
            assert via_generate == out
            full, _ = _native(model, prompt, 40, speculative_width=width, confidence_threshold=threshold)
            assert full == native_reference(model, prompt, 40, width, threshold) != out  # default: no crop


def test_exact_schedules_past_the_trained_length_stay_stock(short_setdlm):
    from conftest import reference_greedy

    prompt = torch.tensor([3, 1, 4])
    ref = reference_greedy(short_setdlm, prompt, 30)
    for mode in ("ar", *SPECULATIVE):
        out = short_setdlm.generate(prompt[None], max_new_tokens=30, assistant_mode=mode)
        assert out[0, 3:].tolist() == ref


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(native_cache_order="fht"), "choose 'position'"),
        (dict(assistant_mode="packed_ss", native_cache_order="first_hitting"), "only applies to assistant_mode"),
        (dict(stop_at_eos=1), "must be True"),
        (dict(assistant_mode="linear_ss", stop_at_eos=False), "only applies to assistant_mode='native'"),
        (dict(native_context="window"), "choose 'full'"),
        (dict(assistant_mode="ar", native_context="sliding"), "only applies to assistant_mode='native'"),
        (dict(native_cache_order="first_hitting", native_context="sliding"), "choose one of them"),
        (dict(native_context="sliding", speculative_width=8), r"speculative_width < 8"),  # 2W rows must fit 16
        (dict(native_context="sliding", prompt=list(range(17))), "longer than block_size=16"),
        (dict(native_cache_order="first_hitting", max_new_tokens=17), "max_new_tokens <= 16"),
    ],
)
def test_bad_native_options_raise(short_setdlm, kwargs, message):
    kwargs = {"assistant_mode": "native", "max_new_tokens": 4, **kwargs}
    prompt = kwargs.pop("prompt", [1, 2, 3])
    model = tiny_setdlm(0, block_size=16, max_block_size=8) if "speculative_width" in kwargs else short_setdlm
    with pytest.raises(ValueError, match=message):
        model.generate(torch.tensor([prompt]), **kwargs)
