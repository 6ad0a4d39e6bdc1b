#!/usr/bin/env python
"""``hf-packed-ss demo``: a Gradio app in which the schedules race side by side on one prompt.

`python demo/app.py [--model NAME_OR_FOLDER] [--port 7860]` (or `hf-packed-ss demo`); needs
`pip install -e ".[demo]"`. This file is the UI; the decoding side (measuring every schedule alone, each one's
median run of several, the summary) is `hf_packed_ss.tools.race`, and it does not import gradio.

A race first measures every chosen schedule alone (`race.measure`), then *replays* the median runs' timelines
side by side at their real relative pace (slowed down or sped up as a whole so the race is watchable; the
counters always show measured time). Tokens are coloured by how they were produced: accepted draft token,
correction after a rejection, bonus after a fully accepted draft, verifier token without a draft (AR, prefill)
or committed by SetDLM's native decoder.

`build_app(model, tokenizer)` returns the `gr.Blocks`; `launch(...)` starts it with the queue, theme and CSS;
`main(argv)` is the command.
"""

import argparse
import html
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path

try:
    import hf_packed_ss  # noqa: F401  (registers the model formats)
except ModuleNotFoundError as err:  # run from a checkout without `pip install -e .`
    if err.name != "hf_packed_ss":
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_packed_ss.engine.schedules import DEFAULT_BRANCHES, WINDOW_SCHEDULES
from hf_packed_ss.front.families import family
from hf_packed_ss.tools.bench.measure import BRANCHES, REFERENCE
from hf_packed_ss.tools.loading import load_model
from hf_packed_ss.tools.race import (
    DECODE_LOCK,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODELS,
    DEFAULT_REPEATS,
    DEFAULT_SCHEDULES,
    EXAMPLES,
    LABELS,
    MAX_REPEATS,
    ORDER,
    Trace,
    available_schedules,
    default_model,
    fastest,
    measure,
    summary,
    verdict,
    warm_up,
)

# How each accepted token was produced (the streamer's `put_iteration` kinds): legend text and colour.
KINDS = {
    "draft": ("accepted draft token", "#22c55e"),
    "correction": ("correction (verifier token after a rejection)", "#f97316"),
    "bonus": ("bonus (verifier token after a fully accepted draft)", "#3b82f6"),
    "verifier": ("verifier token, no draft (AR step or prefill)", "#9ca3af"),
    "committed": ("committed by the native decoder", "#a855f7"),
}
# The stop flags of the races and replays running for each browser session (gr.Request.session_hash).
_STOP: dict[str, set[threading.Event]] = {}


def _register(key: str) -> threading.Event:
    event = threading.Event()
    _STOP.setdefault(key, set()).add(event)
    return event


def _unregister(key: str, event: threading.Event) -> None:
    events = _STOP.get(key, set())
    events.discard(event)
    if not events:
        _STOP.pop(key, None)


def table(result: dict):
    """The summary as a pandas DataFrame for `gr.Dataframe`."""
    import pandas as pd

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def speed(r):
        if r["speedup_vs_ar"] is None:
            return "-"
        text = f"{r['speedup_vs_ar']:.2f}\u00d7"
        if r["schedule"] != REFERENCE and r.get("repeats", 0) > 1:
            text += " [{:.2f}, {:.2f}]".format(*r["speedup_range"])
        return text

    return pd.DataFrame([{
        "schedule": r["label"], "W": r["width"], "tokens": r["new_tokens"], "NFE": r["nfe"],
        "tokens/NFE": num(r["tokens_per_nfe"], ".2f"), "wall s": num(r["wall_s"], ".3f"),
        "wall s range": "{:.3f}\u2013{:.3f}".format(*r["wall_range"]) if r.get("repeats", 0) > 1 else "-",
        "tokens/s": num(r["tokens_per_s"], ".1f"), "speed-up vs AR": speed(r), "W per call": r["widths_used"],
        "same as AR": {None: "-", True: "yes", False: "NO"}[r["same_as_ar"]],
    } for r in result["schedules"]])


def chart(traces: list[Trace]):
    """Accepted tokens per model call: cumulative (slope = tokens/NFE) and as a histogram."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 2.8), dpi=100)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.17, top=0.9, wspace=0.15)  # (a layout engine is slow)
    left, right = fig.subplots(1, 2)
    width = 0.8 / max(1, len(traces))
    for i, t in enumerate(traces):
        per_call = t.tokens_per_call()
        cumulative = [sum(per_call[: k + 1]) for k in range(len(per_call))]
        left.step(range(1, len(per_call) + 1), cumulative, where="post", label=t.label)
        counts = [per_call.count(k) for k in range(max(per_call, default=0) + 1)]
        right.bar([k - 0.4 + width * (i + 0.5) for k in range(len(counts))], counts, width=width, label=t.label)
    left.set(xlabel="model call", ylabel="tokens accepted so far", title="Cumulative tokens per call")
    right.set(xlabel="tokens accepted by one call", ylabel="calls", title="Tokens per call")
    left.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------------------------- rendering


def lane_html(t: Trace | None, schedule: str, at: float | None = None, note: str = "", place: int | None = None,
              total: int | None = None) -> str:
    """One race column: name, progress bar, live counters and the coloured text accepted by measured time `at`
    (`None`: the end). Without a trace, a placeholder with `note`."""
    label = LABELS.get(schedule, schedule)
    if t is None:
        return (f'<div class="race-lane" data-schedule="{schedule}" data-finished="false">'
                f'<div class="lane-head"><span class="lane-name">{label}</span></div>'
                f'<div class="lane-note">{html.escape(note)}</div></div>')
    at = t.wall_s if at is None else at
    done = at >= t.wall_s
    n = len(t.tokens) if done else sum(1 for x in t.token_times if x <= at)
    nfe = t.nfe if done else (sum(1 for x in t.call_times if x <= at) if len(t.call_times) == t.nfe
                              else round(t.nfe * n / max(1, len(t.tokens))))
    elapsed = min(at, t.wall_s)
    spans = "".join(
        f'<span class="tok k-{k}" title="{KINDS.get(k, (k,))[0]}">{html.escape(p)}</span>'
        for p, k in zip(t.pieces[:n], t.kinds[:n], strict=False)
    )
    counters = [(n, "tokens"), (nfe, "NFE"), (f"{n / nfe:.2f}" if nfe else "-", "tokens/NFE"),
                (f"{n / elapsed:.0f}" if elapsed > 0 else "-", "tokens/s"), (f"{elapsed:.3f}", "wall s")]
    boxes = "".join(f"<div><b>{v}</b><span>{name}</span></div>" for v, name in counters)
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(place, f"{place}th") if place else "done"
    flag = "" if not done else "stopped" if t.stopped else f"finished {ordinal}"
    share = 100 * n / max(1, total or len(t.tokens))
    meta = f"W = {t.width}" + (f", k = {t.branches}" if t.branches else "")
    if schedule == "auto":  # the width it chose for the call that produced the latest token
        now = t.width_at(n)
        meta = "W chosen per call: " + ("-" if now is None else "AR" if now == 0 else str(now))
    width = f'<span class="lane-meta">{meta}</span>' if WINDOW_SCHEDULES[schedule].speculative else ""
    return (f'<div class="race-lane" data-schedule="{schedule}" data-finished="{str(done).lower()}" '
            f'data-tokens="{n}" data-nfe="{nfe}">'
            f'<div class="lane-head"><span class="lane-name">{label}</span>{width}'
            f'<span class="lane-flag">{flag}</span></div>'
            f'<div class="lane-bar"><div style="width:{share:.1f}%"></div></div>'
            f'<div class="lane-counters">{boxes}</div>'
            f'<div class="lane-text">{spans}</div></div>')


def legend_html(kinds: list[str]) -> str:
    chips = "".join(f'<span class="legend-chip"><span class="tok k-{k}">&nbsp;&nbsp;</span> {KINDS[k][0]}</span>'
                    for k in kinds)
    return f'<div class="race-legend">{chips}</div>'


CSS = """
.race-legend { display:flex; flex-wrap:wrap; gap:.4rem 1.2rem; font-size:.85rem; margin:.2rem 0; }
.race-lane { border:1px solid var(--border-color-primary); border-radius:8px; padding:.6rem; min-height:10rem; }
.lane-head { display:flex; align-items:baseline; gap:.5rem; margin-bottom:.35rem; white-space:nowrap; }
.lane-name { font-weight:700; font-size:1.05rem; }
.lane-meta { color:var(--body-text-color-subdued); font-size:.85rem; }
.lane-flag { margin-left:auto; font-weight:600; font-size:.85rem; }
.lane-note { color:var(--body-text-color-subdued); font-style:italic; }
.lane-bar { height:4px; background:var(--border-color-primary); border-radius:2px; margin-bottom:.45rem; }
.lane-bar > div { height:4px; background:var(--color-accent); border-radius:2px; }
.lane-counters { display:grid; grid-template-columns:repeat(5, 1fr); gap:.25rem; margin-bottom:.5rem; }
.lane-counters div { display:flex; flex-direction:column; align-items:center; padding:.15rem;
  background:var(--background-fill-secondary); border-radius:4px; }
.lane-counters b { font-variant-numeric:tabular-nums; font-size:.95rem; }
.lane-counters span { font-size:.7rem; color:var(--body-text-color-subdued); }
.lane-text { font-family:var(--font-mono); font-size:.82rem; white-space:pre-wrap; word-break:break-word;
  line-height:1.55; }
.tok { border-radius:3px; padding:0 1px; margin-right:1px; }
""" + "".join(f".k-{k} {{ background:{c}40; box-shadow: inset 0 -2px 0 {c}; }}\n" for k, (_, c) in KINDS.items())


# ------------------------------------------------------------------------------------------------ the app


def build_app(model, tokenizer, model_name: str = "model", *, replay_s: tuple[float, float] = (3.0, 30.0),
              fps: float = 12.0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, max_new_tokens_limit: int = 1024,
              repeats: int = DEFAULT_REPEATS, race_concurrency: int = 4, warmup: bool = True):
    """The Gradio Blocks. `replay_s` = (shortest, longest) race replay in seconds: a faster measurement is slowed
    down to the first, a slower one sped up to the second (relative pace is always the measured one). `warmup`
    decodes a few tokens with every schedule first, so the first race measures no one-time costs.
    `max_new_tokens` and `repeats` (timed runs per schedule) are the sliders' initial values."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    fam = family(model.config)
    modes = available_schedules(model)
    widest, _ = fam.widths(model.config)
    size = getattr(model.config, "max_block_size" if fam.any_order else "block_size", "?")
    params = sum(p.numel() for p in model.parameters())
    # "committed" tokens come from a schedule that commits without verifying (SetDLM's native decoder)
    kinds = [k for k in KINDS if k != "committed" or not all(fam.schedules[m].verifies for m in modes)]
    if warmup:
        warm_up(model, tokenizer, modes)

    def parse(prompt, schedules, width, max_new, temperature, top_k, top_p, seed, stop_at_eos, runs,
              branches=DEFAULT_BRANCHES) -> dict:
        chosen = [m for m in ORDER if m in (schedules or [])]
        if not chosen:
            raise gr.Error("Choose at least one schedule.")
        if not 1 <= int(runs or 0) <= MAX_REPEATS:
            raise gr.Error(f"Timed runs per schedule must be 1 to {MAX_REPEATS} (got {runs}).", title="Bad input")
        return dict(prompt=prompt or "", schedules=chosen, width=int(width or 0) or None, max_new_tokens=int(max_new),
                    temperature=float(temperature), top_k=int(top_k or 0), top_p=float(top_p), seed=int(seed or 0),
                    stop_at_eos=bool(stop_at_eos), repeats=int(runs), branches=int(branches or 0) or None)

    def result_of(settings: dict, traces: list[Trace]) -> dict:
        result = summary(traces, greedy=settings["temperature"] <= 0)
        return {"model": model_name, **{k: v for k, v in settings.items() if k != "schedules"}, **result}

    def frames(result: dict, stop: threading.Event):
        """Replay the measured timelines side by side: yields (lane htmls by schedule, finished, speed)."""
        traces = [Trace.from_dict(r) for r in result["schedules"]]
        longest = max((t.wall_s for t in traces), default=0.0)
        shortest_replay, longest_replay = replay_s  # measured seconds per replayed second:
        speed = 1.0 if longest <= 0 else longest / min(max(longest, shortest_replay), longest_replay)
        duration = longest / speed
        order = sorted(range(len(traces)), key=lambda i: traces[i].wall_s)
        place = {traces[i].schedule: k + 1 for k, i in enumerate(order)}
        start = time.perf_counter()
        while True:
            replay = time.perf_counter() - start
            at = replay * speed
            finished = replay >= duration or stop.is_set()  # Stop during a replay skips to the end
            lanes = {t.schedule: lane_html(t, t.schedule, None if finished else at, place=place[t.schedule])
                     for t in traces}
            yield lanes, finished, speed
            if finished:
                return
            time.sleep(max(0.0, min(1 / fps, duration - replay)))

    with gr.Blocks(title="hf_packed_ss: schedules race") as app:
        last = gr.State(None)  # this session's last race (for Replay); never shared between sessions
        gr.Markdown(
            "# Self-speculative decoding: the schedules race\n"
            f"Model **{html.escape(model_name)}** ({model.config.model_type}, {params / 1e6:.2f} M parameters, "
            f"{'max_block_size' if fam.any_order else 'block size'} {size}, {model.dtype}, {model.device}). "
            "Every schedule decodes the same prompt; exact schedules give AR's greedy text with fewer model calls."
        )
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], lines=4, elem_id="prompt")
                gr.Examples([[e] for e in EXAMPLES], inputs=[prompt], label="Examples (GSM8K test questions, code)")
            with gr.Column(scale=2):
                schedules = gr.CheckboxGroup([(LABELS[m], m) for m in modes], label="Schedules", elem_id="schedules",
                                             value=[m for m in DEFAULT_SCHEDULES if m in modes])
                with gr.Row():
                    width = gr.Slider(0, widest, value=0, step=1, label="Speculative width W",
                                      info=f"1..{widest}; 0 = each schedule's default", elem_id="width")
                    max_new = gr.Slider(1, max_new_tokens_limit, value=max_new_tokens, step=1,
                                        label="Max new tokens", elem_id="max-new-tokens")
                runs = gr.Slider(1, MAX_REPEATS, value=repeats, step=1, label="Timed runs per schedule",
                                 info="the median run is reported and replayed; the range shows the timing noise",
                                 elem_id="repeats")
                branches = gr.Slider(1, widest + 1, value=DEFAULT_BRANCHES, step=1, label="Hybrid-SS branches k",
                                     info=f"proposal branches 0..k-1: 1 = Packed-SS's single branch, W + 1 = "
                                     f"Quadratic-SS's full set (at most W + 1; default {DEFAULT_BRANCHES})",
                                     elem_id="branches",
                                     visible=any(BRANCHES in fam.schedules[m].options for m in modes))
                with gr.Accordion("Sampling", open=False):
                    temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                    with gr.Row():
                        top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                        top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)")
                    with gr.Row():
                        seed = gr.Number(0, precision=0, label="Seed")
                        stop_at_eos = gr.Checkbox(True, label="Stop at end-of-text")
                with gr.Row():
                    race_btn = gr.Button("Race", variant="primary", elem_id="race-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    replay_btn = gr.Button("Replay", elem_id="replay-btn")
        status = gr.Markdown("Press **Race**.", elem_id="race-status")
        gr.HTML(legend_html(kinds))
        with gr.Row(equal_height=True):
            lanes = {m: gr.HTML(lane_html(None, m, note="waiting for a race"), visible=m in DEFAULT_SCHEDULES,
                                elem_id=f"lane-{m}") for m in modes}
        verdict_md = gr.Markdown("", elem_id="verdict")
        summary_df = gr.Dataframe(label="Summary (each schedule measured alone; its median run, and the range of "
                                  "its runs)", elem_id="summary",
                                  interactive=False, wrap=True)
        plot = gr.Plot(label="Accepted tokens per model call", show_label=False, elem_id="chart", format="png")
        with gr.Accordion("Raw results (JSON)", open=False):
            raw = gr.JSON(elem_id="raw")
        gr.Markdown(
            "<small>Each schedule decodes **alone, one after another** (one decode at a time in this server), so "
            "they never compete for the CPU; as in the benchmark, every schedule was warmed up at start and is "
            "timed several times (rounds in rotating order); the race then replays each schedule's median run "
            "side by side at the real relative pace. Speed-up = tokens/s over AR's, with the range of the "
            "per-round ratios. NFE = model calls, prefill included; wall = the whole decode.</small>"
        )
        race_outputs = [status, verdict_md, raw, summary_df, plot, last, *lanes.values()]

        def show_replay(result: dict, stop: threading.Event):
            visible = {r["schedule"] for r in result["schedules"]}
            yield {lanes[m]: gr.update(visible=m in visible) for m in modes}
            htmls: dict = {}
            for htmls, finished, speed in frames(result, stop):
                note = "" if abs(speed - 1) < 1e-9 else f" (replayed at {speed:.3g}\u00d7 the measured pace)"
                yield {status: "Done." if finished else f"Racing{note}\u2026",
                       **{lanes[m]: h for m, h in htmls.items()}}
            traces = [Trace.from_dict(r) for r in result["schedules"]]
            yield {status: f"Done.{fastest(result)}", verdict_md: verdict(result), raw: result,
                   summary_df: table(result), plot: chart(traces) if traces else None,
                   **{lanes[m]: h for m, h in htmls.items()}}  # the finished columns: the event's final state

        def race(prompt, schedules, width, max_new, temperature, top_k, top_p, seed, stop_at_eos, runs,
                 branches=DEFAULT_BRANCHES, request: gr.Request = None):
            settings = parse(prompt, schedules, width, max_new, temperature, top_k, top_p, seed, stop_at_eos, runs,
                             branches)
            key = request.session_hash if request is not None else "-"
            stop = _register(key)
            events: queue.Queue = queue.Queue()
            box: dict = {}
            finished = threading.Event()

            def work():
                try:
                    box["traces"] = measure(model, tokenizer, settings["prompt"], settings["schedules"],
                                            width=settings["width"], max_new_tokens=settings["max_new_tokens"],
                                            temperature=settings["temperature"], top_k=settings["top_k"],
                                            top_p=settings["top_p"], seed=settings["seed"],
                                            stop_at_eos=settings["stop_at_eos"], repeats=settings["repeats"],
                                            stop=stop, events=lambda *e: events.put(e),
                                            branches=settings["branches"])
                except Exception as err:  # reported to the user below, never as a traceback
                    box["error"] = err
                finally:
                    events.put(("done", "", 0))
                    finished.set()

            chosen, waiting = settings["schedules"], "waiting to be measured"
            try:
                yield {verdict_md: "", raw: None, summary_df: None, plot: None,
                       status: "Waiting for the decoder (another race is being measured)\u2026"
                       if DECODE_LOCK.locked() else "Starting\u2026",
                       **{lanes[m]: gr.update(visible=m in chosen, value=lane_html(None, m, note=waiting))
                          for m in modes}}
                threading.Thread(target=work, daemon=True).start()
                current, run, count, done = None, 0, 0, False
                total = settings["repeats"] * len(chosen)
                measured: dict[str, int] = {}  # finished runs per schedule
                while not done:  # progress a few times a second, so the decode being timed keeps the CPU
                    finished.wait(0.3)
                    update = {}
                    while not events.empty():  # only the latest state matters
                        kind, mode, n = events.get_nowait()
                        if kind == "done":
                            done = True
                        elif kind == "start":
                            if current is not None:
                                measured[current] = measured.get(current, 0) + 1
                                k = measured[current]
                                update[lanes[current]] = lane_html(None, current, note=f"measured \u2713 "
                                                                   f"({k}/{settings['repeats']} runs)")
                            current, run, count = mode, n, 0
                        else:
                            count = n
                    if current is not None and not done:
                        k = sum(measured.values()) + 1
                        update[status] = (f"Measuring {k}/{total} (round {run + 1}/{settings['repeats']}): "
                                          f"**{LABELS[current]}** decodes alone \u2026 {count} tokens")
                        update[lanes[current]] = lane_html(None, current, note=f"measuring alone (run {run + 1}/"
                                                           f"{settings['repeats']})\u2026 {count} tokens")
                    if update:
                        yield update
                if "error" in box:
                    err = box["error"]
                    if isinstance(err, ValueError):
                        raise gr.Error(str(err), title="Bad input")
                    raise gr.Error(f"{type(err).__name__}: {err}", title="Decoding failed")
                result = result_of(settings, box["traces"])
                yield {last: result}
                if stop.is_set():
                    yield {status: "Stopped.", verdict_md: verdict(result), raw: result,
                           **{lanes[t.schedule]: lane_html(t, t.schedule) for t in box["traces"]}}
                    return
                yield from show_replay(result, stop)
            finally:
                stop.set()  # also when the event is cancelled or the browser goes away: the decode stops
                _unregister(key, stop)

        def replay(result, request: gr.Request):
            if not result:
                gr.Warning("Nothing to replay yet: run a race first.")
                yield {status: "Nothing to replay yet: press **Race**."}
                return
            key = request.session_hash if request is not None else "-"
            stop = _register(key)
            try:
                yield from show_replay(result, stop)
            finally:
                _unregister(key, stop)

        def halt(request: gr.Request):
            events = _STOP.get(request.session_hash if request is not None else "-")
            if not events:
                return "Nothing is running."
            for event in list(events):
                event.set()
            return "Stopped."

        inputs = [prompt, schedules, width, max_new, temperature, top_k, top_p, seed, stop_at_eos, runs, branches]
        race_event = race_btn.click(race, inputs, race_outputs, api_name="race", concurrency_limit=race_concurrency,
                                    concurrency_id="race")
        replay_event = replay_btn.click(replay, [last], race_outputs, api_name="replay",
                                        concurrency_limit=race_concurrency, concurrency_id="race")
        stop_btn.click(halt, None, [status], api_name="stop", queue=False, cancels=[race_event, replay_event])

        def decode(prompt: str, schedules: list[str], width: int = 0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                   stop_at_eos: bool = True, repeats: int = DEFAULT_REPEATS, branches: int = DEFAULT_BRANCHES) -> dict:
            """Measure a race without the replay; returns texts and statistics for every schedule (each one's
            median run of `repeats`, with every run's wall time and tokens/s; `branches` = hybrid_ss's k)."""
            unknown = [s for s in schedules if s not in modes]
            if unknown:
                raise gr.Error(f"Unknown schedules {unknown}; this model offers {modes}.", title="Bad input")
            settings = parse(prompt, schedules, width, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos,
                             repeats, branches)
            try:
                traces = measure(model, tokenizer, settings["prompt"], settings["schedules"], width=settings["width"],
                                 max_new_tokens=settings["max_new_tokens"], temperature=settings["temperature"],
                                 top_k=settings["top_k"], top_p=settings["top_p"], seed=settings["seed"],
                                 stop_at_eos=settings["stop_at_eos"], repeats=settings["repeats"],
                                 branches=settings["branches"])
            except ValueError as err:
                raise gr.Error(str(err), title="Bad input") from None
            return result_of(settings, traces)

        gr.api(decode, api_name="decode", concurrency_limit=race_concurrency, concurrency_id="race")
    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch(app, host: str = "127.0.0.1", port: int | None = None, *, block: bool = True, concurrency: int = 4,
           queue_size: int = 64, quiet: bool = False):
    """Start `app` with the queue (at most `concurrency` events at a time, `queue_size` waiting); returns the
    URL (with `block=False` the server runs in a background thread: call `app.close()` to stop it)."""
    import gradio as gr

    app.queue(default_concurrency_limit=concurrency, max_size=queue_size)
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "DejaVu Sans Mono", "monospace"])
    app.launch(server_name=host, server_port=port or free_port(host), prevent_thread_lock=not block, quiet=quiet,
               share=False, ssr_mode=False, theme=theme, css=CSS, footer_links=[])
    return app.local_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-packed-ss demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=f"bundled checkpoint or local folder (default: the first "
                        f"bundled of {', '.join(DEFAULT_MODELS)})")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float64", "bfloat16", "float16"],
                        help="auto: bfloat16 where the hardware runs it natively (CUDA, AVX512-BF16/AMX), else float32")
    parser.add_argument("--device", default="cpu", help="torch device for the model, e.g. cuda")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860, help="0 = any free port")
    parser.add_argument("--concurrency", type=int, default=4, help="events running at once (decodes: always one)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help="the slider's initial value")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, choices=range(1, MAX_REPEATS + 1),
                        metavar="N", help=f"timed runs per schedule, the slider's initial value (1 to {MAX_REPEATS})")
    parser.add_argument("--replay-seconds", type=float, nargs=2, default=(3.0, 30.0), metavar=("MIN", "MAX"),
                        help="a race replay lasts at least MIN and at most MAX seconds")
    parser.add_argument("--no-warmup", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    name = args.model or default_model()
    from hf_packed_ss.tools.loading import resolve

    device, dtype = resolve(args.device, args.dtype)
    model, tokenizer = load_model(name, dtype)
    model.to(device)
    app = build_app(model, tokenizer, name, replay_s=tuple(args.replay_seconds), max_new_tokens=args.max_new_tokens,
                    repeats=args.repeats, race_concurrency=args.concurrency, warmup=not args.no_warmup)
    launch(app, args.host, args.port or None, concurrency=args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
