"""The Gradio demo end to end: the app on a free localhost port (in this process), driven with gradio_client.

A race returns texts and statistics for every schedule and the greedy texts are identical (and equal stock
greedy `generate`); every schedule is timed several times in rotating rounds and its median run reported with
the range; bad input gives a message; two client sessions never see each other's state; Stop ends a long race's
decode at once.
"""

import inspect
import statistics
import time
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

from hf_packed_ss import bundled
from hf_packed_ss.tools.demo import load_app

demo = load_app()  # demo/app.py: the Gradio app, with the names it uses from hf_packed_ss.tools.race

MAX_NEW = 20
SCHEDULES = ["ar", "linear_ss", "quadratic_ss", "packed_ss"]
# the /race endpoint's outputs as gradio_client returns them (the session State is not shown to clients)
STATUS, VERDICT, RAW, TABLE, PLOT = range(5)
pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")  # gradio's own pandas deprecations


@pytest.fixture(scope="module")
def app():
    name = demo.default_model()
    model, tokenizer = bundled.load(name)
    blocks = demo.build_app(model, tokenizer, name, replay_s=(0.1, 1.0), max_new_tokens=MAX_NEW)
    url = demo.launch(blocks, block=False, quiet=True)
    yield SimpleNamespace(url=url, model=model, tokenizer=tokenizer)
    blocks.close()


def client(app) -> Client:
    return Client(app.url, verbose=False, analytics_enabled=False, download_files=False)


def race_args(prompt=demo.EXAMPLES[1], schedules=SCHEDULES, width=0, max_new=MAX_NEW, temperature=0.0, top_k=0,
              top_p=1.0, seed=0, stop_at_eos=True, repeats=demo.DEFAULT_REPEATS):
    return [prompt, schedules, width, max_new, temperature, top_k, top_p, seed, stop_at_eos, repeats]


def stock_greedy(app, prompt: str, max_new: int) -> list[int]:
    ids = app.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode(), demo.DECODE_LOCK:  # the app's decodes are timed alone: wait for them
        out = app.model.generate(ids, assistant_mode=None, max_new_tokens=max_new, do_sample=False)  # stock
    return out[0, ids.shape[1] :].tolist()


def check_result(app, result: dict, prompt: str, repeats: int = demo.DEFAULT_REPEATS) -> None:
    rows = {r["schedule"]: r for r in result["schedules"]}
    assert list(rows) == SCHEDULES
    reference = stock_greedy(app, prompt, MAX_NEW)
    for mode, r in rows.items():
        assert r["text"] and 0 < r["new_tokens"] <= MAX_NEW and len(r["tokens"]) == r["new_tokens"]
        assert r["tokens"] == reference, f"{mode} differs from stock greedy generate"
        assert r["text"] == app.tokenizer.decode(r["tokens"])
        assert r["nfe"] >= 1 and r["tokens_per_nfe"] == pytest.approx(r["new_tokens"] / r["nfe"])
        assert r["wall_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert len(r["kinds"]) == len(r["token_times"]) == r["new_tokens"]
        assert sum(r["tokens_per_call"]) == r["new_tokens"] and len(r["tokens_per_call"]) == r["nfe"]
        assert r["speedup_vs_ar"] == pytest.approx(rows["ar"]["wall_s"] / r["wall_s"])  # the median runs
        # timed `repeats` times; the trace shown is the median run, the range spans the runs
        assert r["repeats"] == len(r["runs_wall_s"]) == len(r["runs_tokens_per_s"]) == repeats
        assert r["wall_s"] == statistics.median_low(r["runs_wall_s"])
        assert r["wall_range"] == [min(r["runs_wall_s"]), max(r["runs_wall_s"])]
        low, high = r["speedup_range"]
        ratios = [x / a for a, x in zip(rows["ar"]["runs_tokens_per_s"], r["runs_tokens_per_s"], strict=True)]
        assert (low, high) == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
        assert set(r["kinds"]) <= ({"verifier"} if mode == "ar" else {"verifier", "draft", "correction", "bonus"})
    assert result["greedy"] and result["identical"] is True and not result["stopped"]
    assert rows["ar"]["nfe"] == rows["ar"]["new_tokens"]  # one call per token


def test_race_returns_every_schedule_and_identical_greedy_texts(app):
    c = client(app)
    out = c.predict(*race_args(), api_name="/race")
    result = out[RAW]
    assert result["prompt"] == demo.EXAMPLES[1] and result["max_new_tokens"] == MAX_NEW
    check_result(app, result, demo.EXAMPLES[1])
    assert out[VERDICT].startswith("\u2713") and "identical" in out[VERDICT]
    assert out[STATUS].startswith("Done. Fastest: **") and f"median of {demo.DEFAULT_REPEATS} timed runs" in out[STATUS]
    assert [row[0] for row in out[TABLE]["data"]] == ["AR", "Linear-SS", "Quadratic-SS", "Packed-SS"]
    assert "wall s range" in out[TABLE]["headers"] and "speed-up vs AR" in out[TABLE]["headers"]
    lanes = out[PLOT + 1 :]
    finished = [h for h in lanes if 'data-finished="true"' in h]
    assert len(finished) == len(SCHEDULES) and all('class="tok k-' in h for h in finished)

    api = c.predict(demo.EXAMPLES[0], SCHEDULES, 0, MAX_NEW, api_name="/decode")  # the API-only endpoint
    check_result(app, api, demo.EXAMPLES[0])
    once = c.predict(demo.EXAMPLES[0], SCHEDULES, 0, MAX_NEW, 0.0, 0, 1.0, 0, True, 1, api_name="/decode")
    check_result(app, once, demo.EXAMPLES[0], repeats=1)


def test_bad_input_gives_a_message(app):
    c = client(app)
    with pytest.raises(AppError, match="The prompt is empty"):
        c.predict(*race_args(prompt=""), api_name="/race")
    with pytest.raises(AppError, match="Choose at least one schedule"):
        c.predict(*race_args(schedules=[]), api_name="/race")
    with pytest.raises(AppError, match="greater than maximum"):  # the slider's range
        c.predict(*race_args(width=999), api_name="/race")
    with pytest.raises(AppError, match=r"speculative_width=99 is out of range"):  # generate's own check
        c.predict(demo.EXAMPLES[0], SCHEDULES, 99, MAX_NEW, api_name="/decode")
    with pytest.raises(AppError, match="Unknown schedules"):
        c.predict(demo.EXAMPLES[0], ["beam"], 0, MAX_NEW, api_name="/decode")
    with pytest.raises(AppError, match="Timed runs per schedule must be 1 to"):
        c.predict(demo.EXAMPLES[0], SCHEDULES, 0, MAX_NEW, 0.0, 0, 1.0, 0, True, 0, api_name="/decode")
    assert c.predict(*race_args(max_new=4), api_name="/race")[RAW]["identical"]  # the app still works


def test_measure_times_rotating_rounds_and_keeps_the_median_run(app):
    """As the benchmark: round r decodes the schedules in `rotation(schedules, r)` order, each alone; every
    schedule's returned trace is its median run by tokens/s, with all runs' figures; the defaults are a long
    enough answer and several runs."""
    starts = []
    traces = demo.measure(app.model, app.tokenizer, demo.EXAMPLES[1], SCHEDULES, max_new_tokens=8, repeats=3,
                          events=lambda kind, mode, n: starts.append((mode, n)) if kind == "start" else None)
    rounds = [(m, r) for r in range(3) for m in SCHEDULES[r:] + SCHEDULES[:r]]
    assert starts == rounds
    for t in traces:
        assert len(t.runs_wall_s) == 3 and t.tokens_per_s == statistics.median_low(t.runs_tokens_per_s)
    assert demo.DEFAULT_MAX_NEW_TOKENS >= 128 and demo.DEFAULT_REPEATS >= 3
    assert inspect.signature(demo.build_app).parameters["max_new_tokens"].default == demo.DEFAULT_MAX_NEW_TOKENS
    assert inspect.signature(demo.measure).parameters["repeats"].default == demo.DEFAULT_REPEATS


def test_fastest_names_ar_when_no_schedule_beats_it():
    def row(schedule, label, up, low, high):
        return dict(schedule=schedule, label=label, speedup_vs_ar=up, speedup_range=[low, high], repeats=3)

    result = {"schedules": [row("ar", "AR", 1.0, 1.0, 1.0), row("packed_ss", "Packed-SS", 0.8, 0.75, 0.85)]}
    assert demo.fastest(result).startswith(" Fastest: **AR**; the best speculative schedule, **Packed-SS**, runs at "
                                           "0.80\u00d7")
    result["schedules"][1] = row("packed_ss", "Packed-SS", 1.3, 0.95, 1.4)
    line = demo.fastest(result)
    assert line.startswith(" Fastest: **Packed-SS**, 1.30\u00d7") and "within the timing noise of AR" in line


def test_sessions_are_isolated(app):
    a, b = client(app), client(app)
    prompts = demo.EXAMPLES[0], demo.EXAMPLES[2]
    jobs = [c.submit(*race_args(prompt=p), api_name="/race") for c, p in zip((a, b), prompts, strict=True)]
    for job, prompt in zip(jobs, prompts, strict=True):
        result = job.result(timeout=60)[RAW]
        assert result["prompt"] == prompt
        check_result(app, result, prompt)
    # each session's Replay replays its own last race; a new session has nothing to replay
    assert a.predict(api_name="/replay")[RAW]["prompt"] == prompts[0]
    assert b.predict(api_name="/replay")[RAW]["prompt"] == prompts[1]
    fresh = client(app).predict(api_name="/replay")
    assert fresh[STATUS].startswith("Nothing to replay") and "prompt" not in (fresh[RAW] or {})


def test_stop_ends_a_long_race(app):
    c = client(app)
    # 4 x 1,024 tokens past end-of-text: seconds of decoding, stopped as soon as it has begun
    job = c.submit(*race_args(max_new=1024, stop_at_eos=False), api_name="/race")
    deadline = time.monotonic() + 30
    while not demo.DECODE_LOCK.locked():
        assert time.monotonic() < deadline and not job.done(), "the race never started decoding"
        time.sleep(0.01)
    time.sleep(0.2)
    assert demo.DECODE_LOCK.locked()  # still decoding
    assert c.predict(api_name="/stop") == "Stopped."
    t0 = time.monotonic()
    out = job.result(timeout=30)
    assert time.monotonic() - t0 < 5 and not demo.DECODE_LOCK.locked()
    assert out[STATUS] == "Stopped." and out[RAW]["stopped"] and out[VERDICT].startswith("Stopped")
    rows = out[RAW]["schedules"]
    assert rows[-1]["stopped"] and len(rows) <= len(SCHEDULES) and rows[-1]["new_tokens"] < 1024
    assert c.predict(api_name="/stop") == "Nothing is running."
    assert c.predict(*race_args(max_new=4), api_name="/race")[RAW]["identical"]  # and the session goes on


def test_sampling_race_is_seeded(app):
    c = client(app)
    args = [demo.EXAMPLES[2], SCHEDULES, 0, 12, 0.9, 20, 0.95]
    first, again = (c.predict(*args, 7, api_name="/decode") for _ in range(2))
    assert not first["greedy"] and first["identical"] is None and first["temperature"] == 0.9
    assert [r["tokens"] for r in first["schedules"]] == [r["tokens"] for r in again["schedules"]]  # same seed
    assert all(0 < r["new_tokens"] <= 12 for r in first["schedules"])
    out = c.predict(*race_args(prompt=demo.EXAMPLES[2], max_new=12, temperature=0.9, top_k=20, top_p=0.95),
                    api_name="/race")
    assert out[VERDICT].startswith("Sampling") and not out[RAW]["greedy"]
