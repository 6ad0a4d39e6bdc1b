"""``hf-packed-ss demo``: a Gradio app in which the schedules race side by side on one prompt.

Timing honesty: on a shared CPU, schedules decoding at the same time would slow each other down. So a race
first *measures* every chosen schedule alone, one after another (one decode at a time in the whole process,
whichever session asked), recording when each model call finished and when each token was accepted; as the
benchmark does, every schedule is warmed up (at start) and timed several times (`repeats`, rounds in rotating
order), and each schedule's median run is reported with the range of its runs. Then it *replays* the median
runs' timelines side by side at their real relative pace (slowed down or sped up as a whole so the race is
watchable; the counters always show measured time). Tokens are coloured by how they were
produced: accepted draft token, correction after a rejection, bonus after a fully accepted draft, verifier
token without a draft (AR, prefill) or committed by SetDLM's native decoder.

`build_app(model, tokenizer)` returns the `gr.Blocks`; `launch(...)` starts it with the queue, theme and CSS;
`main(argv)` is the command. The decoding side (`decode_one`, `measure`, `Trace`) does not import gradio.
"""

import argparse
import bisect
import html
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .bench.repeats import median_index, speedup, spread
from .bench.statistics import rotation
from .cli import load_model
from .generation import default_width, family
from .schedules import DEFAULT_BRANCHES, HYBRID, SCHEDULES

DEFAULT_MODELS = ("tiny-nemotron-gsm8k", "tiny-nemotron-random")
LABELS = {"ar": "AR", "linear_ss": "Linear-SS", "quadratic_ss": "Quadratic-SS", "packed_ss": "Packed-SS",
          HYBRID: "Hybrid-SS", "native": "Native (SetDLM)"}
ORDER = ["ar", "linear_ss", "quadratic_ss", "packed_ss", HYBRID, "native"]
DEFAULT_SCHEDULES = ["ar", "linear_ss", "quadratic_ss", "packed_ss"]
# An answer long enough to time a speculative schedule (at 24 tokens the prefill and the first calls dominate),
# and timed runs per schedule: the median is reported, the range shows the noise.
DEFAULT_MAX_NEW_TOKENS, DEFAULT_REPEATS, MAX_REPEATS = 128, 3, 9
EXACT = set(SCHEDULES)  # every schedule but `native` reproduces the AR mode's greedy output
# How each accepted token was produced (the streamer's `put_iteration` kinds): legend text and colour.
KINDS = {
    "draft": ("accepted draft token", "#22c55e"),
    "correction": ("correction (verifier token after a rejection)", "#f97316"),
    "bonus": ("bonus (verifier token after a fully accepted draft)", "#3b82f6"),
    "verifier": ("verifier token, no draft (AR step or prefill)", "#9ca3af"),
    "committed": ("committed by the native decoder", "#a855f7"),
}
# Example prompts: GSM8K test questions (MIT licence) in the format the tiny models were trained on, and code.
EXAMPLES = [
    "Question: Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
    "muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?\nAnswer:",
    "Question: James decides to run 3 sprints 3 times a week.  He runs 60 meters each sprint.  How many total "
    "meters does he run a week?\nAnswer:",
    "Question: A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does "
    "it take?\nAnswer:",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
]
# One decode at a time in the whole process: measured timings never share the CPU with another decode.
DECODE_LOCK = threading.Lock()
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


class Stopped(Exception):
    """Raised from the streamer to abandon a decode when its session pressed Stop."""


@dataclass
class Trace:
    """One schedule's measured decode: what was accepted, how, and when (seconds since its decode began)."""

    schedule: str
    label: str
    width: int
    branches: int = 0  # speculative_branches k of hybrid_ss (0 for the other schedules)
    tokens: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    text: str = ""
    nfe: int = 0
    wall_s: float = 0.0
    decoder_time_s: float = 0.0
    model_time_s: float = 0.0
    accepted_per_iteration: list[int] = field(default_factory=list)
    rows_per_call: list[int] = field(default_factory=list)
    stopped: bool = False
    runs_wall_s: list[float] = field(default_factory=list)  # every timed run of this schedule, in round order
    runs_tokens_per_s: list[float] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_nfe(self) -> float:
        return self.new_tokens / self.nfe if self.nfe else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def tokens_per_call(self) -> list[int]:
        """Tokens appended by each model call (0 for a Linear-SS drafting call); per iteration if the calls
        could not be timed."""
        if len(self.call_times) != self.nfe:
            return list(self.accepted_per_iteration)
        counts = [0] * self.nfe
        for t in self.token_times:  # a token belongs to the last call that finished before it was streamed
            counts[max(0, bisect.bisect_right(self.call_times, t) - 1)] += 1
        return counts

    def to_dict(self) -> dict:
        return {**asdict(self), "new_tokens": self.new_tokens, "tokens_per_nfe": self.tokens_per_nfe,
                "tokens_per_s": self.tokens_per_s, "tokens_per_call": self.tokens_per_call()}

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


class _Recorder:
    """A streamer with provenance: records each iteration's tokens, kinds and arrival time."""

    def __init__(self, trace: Trace, stop: threading.Event | None, progress: Callable[[int], None] | None):
        self.trace, self.stop, self.progress, self.t0 = trace, stop, progress, time.perf_counter()
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:  # the prompt first; later puts only from a plain path
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        tokens = value.reshape(-1)
        self.put_iteration(tokens, ["verifier"] * len(tokens))

    def put_iteration(self, tokens: torch.Tensor, kinds: list[str]) -> None:
        now = time.perf_counter() - self.t0
        self.trace.tokens += tokens.reshape(-1).tolist()
        self.trace.kinds += list(kinds)
        self.trace.token_times += [now] * len(kinds)
        if self.progress is not None:
            self.progress(len(self.trace.tokens))
        if self.stop is not None and self.stop.is_set():
            raise Stopped

    def end(self) -> None:
        pass


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds, decoding cumulatively (as `TextStreamer` does) from the last line start, so
    multi-byte characters and tokenizers that drop a leading space come out right."""
    pieces, start, shown = [], 0, ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[start : i + 1])
        if text.endswith("\ufffd"):  # an incomplete character: the next token completes it
            pieces.append("")
            continue
        pieces.append(text[len(shown) :] if text.startswith(shown) else text)
        shown = text
        if text.endswith("\n"):
            start, shown = i + 1, ""
    return pieces


def sampling_kwargs(temperature: float, top_k: int, top_p: float) -> dict:
    """`generate` options: greedy at temperature 0, else sampling with the given processors."""
    if temperature <= 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}


def decode_one(model, tokenizer, ids: torch.Tensor, mode: str, *, width: int | None, max_new_tokens: int,
               sampling: dict, seed: int = 0, stop_at_eos: bool = True, stop: threading.Event | None = None,
               progress: Callable[[int], None] | None = None, branches: int | None = None) -> Trace:
    """Decode `ids` with one schedule, timing every model call and every accepted token. `branches` is
    hybrid_ss's speculative_branches k (None: its default); the other schedules ignore it."""
    fam = family(model.config)
    trace = Trace(mode, LABELS.get(mode, mode), 0)
    kwargs = dict(assistant_mode=mode, max_new_tokens=int(max_new_tokens), return_dict_in_generate=True, **sampling)
    if fam.schedules[mode].speculative and width:
        kwargs["speculative_width"] = int(width)
    if mode == HYBRID:
        trace.branches = int(branches or DEFAULT_BRANCHES)
        trace.label = f"{LABELS[HYBRID]} (k={trace.branches})"
        kwargs["speculative_branches"] = trace.branches
    if sampling.get("do_sample"):
        kwargs["generator"] = torch.Generator(device=ids.device).manual_seed(int(seed))
    if not stop_at_eos:
        kwargs["eos_token_id"] = []
    recorder = _Recorder(trace, stop, progress)
    thread = threading.get_ident()  # count only this decode's calls

    def timed(*_):
        if threading.get_ident() == thread:
            trace.call_times.append(time.perf_counter() - recorder.t0)

    hook = model.register_forward_hook(timed)
    stats = None
    try:
        recorder.t0 = time.perf_counter()
        out = model.generate(ids, streamer=recorder, **kwargs)
        stats = out.decoding_stats
    except Stopped:
        trace.stopped = True
    finally:
        hook.remove()
    trace.wall_s = time.perf_counter() - recorder.t0
    if stats is not None:
        trace.width, trace.nfe = stats.width, stats.nfe
        trace.decoder_time_s, trace.model_time_s = stats.decoder_time_s, stats.model_time_s
        trace.accepted_per_iteration = list(stats.accepted_per_iteration)
        trace.rows_per_call = list(stats.rows_per_call)
    else:
        trace.nfe = len(trace.call_times)
        trace.width = int(width or default_width(model.config, mode)) if fam.schedules[mode].speculative else 0
    trace.pieces = token_pieces(tokenizer, trace.tokens)
    trace.text = "".join(trace.pieces)
    return trace


def measure(model, tokenizer, prompt: str, schedules: list[str], *, width: int | None = None,
            max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0, top_k: int = 0,
            top_p: float = 1.0, seed: int = 0, stop_at_eos: bool = True, repeats: int = DEFAULT_REPEATS,
            stop: threading.Event | None = None, events: Callable[[str, str, int], None] | None = None,
            branches: int | None = None) -> list[Trace]:
    """Decode `prompt` with every schedule, `repeats` rounds, each decode alone (holding `DECODE_LOCK`); round r
    runs the schedules in `bench.statistics.rotation` order, as the benchmark does. `branches`: hybrid_ss's k.

    Returns one Trace per schedule, in the order given: its median run by tokens/s (the lower median, so a real
    run whose timeline the race replays), with every run's wall time and tokens/s in `runs_wall_s` and
    `runs_tokens_per_s`. `events(kind, schedule, n)` is told "start" (n = the run's index) and "tokens" (n
    accepted so far). Raises ValueError for bad input (from `generate`'s validation) and stops early once
    `stop` is set: a schedule whose run was cut short is returned as that partial run, marked `stopped`."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
    sampling = sampling_kwargs(temperature, top_k, top_p)
    runs: dict[str, list[Trace]] = {m: [] for m in schedules}
    cut: dict[str, Trace] = {}
    with DECODE_LOCK:
        for r in range(max(1, int(repeats))):
            for mode in rotation(list(schedules), r):
                if stop is not None and stop.is_set():
                    break
                if events:
                    events("start", mode, r)
                progress = (lambda n, m=mode: events("tokens", m, n)) if events else None
                trace = decode_one(model, tokenizer, ids, mode, width=width, max_new_tokens=max_new_tokens,
                                   sampling=sampling, seed=seed, stop_at_eos=stop_at_eos, stop=stop,
                                   progress=progress, branches=branches)
                if trace.stopped:
                    cut[mode] = trace
                    break
                runs[mode].append(trace)
            if cut or (stop is not None and stop.is_set()):
                break
    traces = []
    for mode in schedules:
        done = runs[mode]
        if not done:
            if mode in cut:
                traces.append(cut[mode])
            continue
        median = done[median_index([t.tokens_per_s for t in done])]
        median.runs_wall_s = [t.wall_s for t in done]
        median.runs_tokens_per_s = [t.tokens_per_s for t in done]
        median.stopped = mode in cut
        traces.append(median)
    return traces


def summary(traces: list[Trace], greedy: bool) -> dict:
    """Per-schedule statistics of the median runs with the speed-up over AR (tokens/s of the median runs, and the
    range of the per-round ratios) and the range of the wall times, and whether the exact schedules agree token
    for token."""
    ar = next((t for t in traces if t.schedule == "ar"), None)
    rows = []
    for t in traces:
        row = t.to_dict()
        runs = t.runs_wall_s or [t.wall_s]
        row["repeats"] = len(t.runs_wall_s)
        wall = spread(runs)
        row["wall_range"] = [wall.low, wall.high]
        row["speedup_vs_ar"] = row["speedup_range"] = None
        if ar is not None and ar.tokens_per_s > 0 and t.wall_s > 0:
            row["speedup_vs_ar"] = t.tokens_per_s / ar.tokens_per_s
            rates, base = t.runs_tokens_per_s or [t.tokens_per_s], ar.runs_tokens_per_s or [ar.tokens_per_s]
            up = speedup(base, rates)
            row["speedup_range"] = [up.low, up.high]
        row["same_as_ar"] = None if ar is None or t is ar else t.tokens == ar.tokens
        rows.append(row)
    exact = [t for t in traces if t.schedule in EXACT]
    stopped = any(t.stopped for t in traces)
    identical = None if stopped or not greedy or len(exact) < 2 else all(t.tokens == exact[0].tokens for t in exact)
    return {"greedy": greedy, "stopped": stopped, "identical": identical, "schedules": rows}


def fastest(result: dict) -> str:
    """The status line's verdict on speed: the fastest schedule (AR included) with its speed-up and range."""
    rows = [r for r in result["schedules"] if r["speedup_vs_ar"] is not None]
    others = [r for r in rows if r["schedule"] != "ar"]
    if not others:
        return ""
    best = max(others, key=lambda r: r["speedup_vs_ar"])
    low, high = best["speedup_range"]
    runs = best["repeats"]
    noise = (f"; per-run range {low:.2f}\u2013{high:.2f}\u00d7" if runs > 1 else "")
    how = f" (tokens/s, median of {runs} timed run{'s' if runs != 1 else ''} each{noise})"
    if runs > 1 and low <= 1 <= high:
        how += ": within the timing noise of AR"
    if best["speedup_vs_ar"] >= 1:
        return f" Fastest: **{best['label']}**, {best['speedup_vs_ar']:.2f}\u00d7 AR's speed{how}."
    return (f" Fastest: **AR**; the best speculative schedule, **{best['label']}**, runs at "
            f"{best['speedup_vs_ar']:.2f}\u00d7 AR's speed{how}.")


def verdict(result: dict) -> str:
    """One line: are the greedy texts identical (they must be), or why the question does not apply."""
    rows = result["schedules"]
    exact = [r["label"] for r in rows if r["schedule"] in EXACT]
    if result["stopped"]:
        return "Stopped before every schedule finished: no comparison."
    if not result["greedy"]:
        return ("Sampling: texts may differ between schedules by chance; every schedule samples exactly "
                "the distribution AR samples.")
    if len(exact) < 2:
        return "Choose two or more exact schedules to compare their greedy texts."
    native = [r for r in rows if r["schedule"] == "native"]
    extra = ""
    if native:
        extra = (" Native (SetDLM's own decoder, not exact) "
                 + ("matches them." if rows[0]["tokens"] == native[0]["tokens"] else "differs, as it may."))
    if result["identical"]:
        return (f"\u2713 Greedy decoding: all {len(exact)} exact schedules ({', '.join(exact)}) produced identical "
                f"text, token for token.{extra}")
    return f"\u2717 Greedy decoding: the schedules produced DIFFERENT texts ({', '.join(exact)}). This is a bug.{extra}"


def table(result: dict):
    """The summary as a pandas DataFrame for `gr.Dataframe`."""
    import pandas as pd

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def speed(r):
        if r["speedup_vs_ar"] is None:
            return "-"
        text = f"{r['speedup_vs_ar']:.2f}\u00d7"
        if r["schedule"] != "ar" and r.get("repeats", 0) > 1:
            text += " [{:.2f}, {:.2f}]".format(*r["speedup_range"])
        return text

    return pd.DataFrame([{
        "schedule": r["label"], "W": r["width"], "tokens": r["new_tokens"], "NFE": r["nfe"],
        "tokens/NFE": num(r["tokens_per_nfe"], ".2f"), "wall s": num(r["wall_s"], ".3f"),
        "wall s range": "{:.3f}\u2013{:.3f}".format(*r["wall_range"]) if r.get("repeats", 0) > 1 else "-",
        "tokens/s": num(r["tokens_per_s"], ".1f"), "speed-up vs AR": speed(r),
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
    width = "" if schedule == "ar" else f'<span class="lane-meta">{meta}</span>'
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


def available_schedules(model) -> list[str]:
    fam = family(model.config)
    if fam is None:
        raise SystemExit(f"{type(model).__name__} has no packed layout (model_type={model.config.model_type!r}).")
    return [m for m in ORDER if m in fam.schedules or m == "ar"]


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
    kinds = [k for k in KINDS if k != "committed" or "native" in modes]
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
                                     elem_id="branches", visible=HYBRID in modes)
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


def default_model() -> str:
    from . import bundled

    return next((m for m in DEFAULT_MODELS if m in bundled.names()), DEFAULT_MODELS[-1])


def warm_up(model, tokenizer, modes: list[str]) -> None:
    """A few tokens with every schedule, so the first race does not pay one-time costs."""
    ids = tokenizer(EXAMPLES[0], return_tensors="pt").input_ids.to(model.device)
    with DECODE_LOCK:
        for mode in modes:
            model.generate(ids, assistant_mode=mode, max_new_tokens=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-packed-ss demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=f"bundled checkpoint or local folder (default: the first "
                        f"bundled of {', '.join(DEFAULT_MODELS)})")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
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
    import hf_packed_ss  # noqa: F401

    name = args.model or default_model()
    model, tokenizer = load_model(name, getattr(torch, args.dtype))
    model.to(args.device)
    app = build_app(model, tokenizer, name, replay_s=tuple(args.replay_seconds), max_new_tokens=args.max_new_tokens,
                    repeats=args.repeats, race_concurrency=args.concurrency, warmup=not args.no_warmup)
    launch(app, args.host, args.port or None, concurrency=args.concurrency)
    return 0
