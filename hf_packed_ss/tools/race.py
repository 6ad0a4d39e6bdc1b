"""The schedules race, decoding side: what the Gradio demo (`demo/app.py`) runs, measures and reports.

Timing honesty: on a shared CPU, schedules decoding at the same time would slow each other down. So a race
first *measures* every chosen schedule alone, one after another (one decode at a time in the whole process,
whichever session asked: `DECODE_LOCK`), recording when each model call finished and when each token was
accepted; as the benchmark does, every schedule is warmed up (`warm_up`) and timed several times (`repeats`,
rounds in rotating order), and each schedule's median run is reported with the range of its runs. The app then
replays the median runs' timelines side by side. Tokens carry how they were produced (the streamer's
`put_iteration` kinds): accepted draft token, correction after a rejection, bonus after a fully accepted draft,
verifier token without a draft (AR, prefill) or committed by SetDLM's native decoder.

`decode_one` decodes with one schedule into a `Trace`, `measure` races several, `summary`, `fastest` and
`verdict` report on the result. Nothing here imports gradio.
"""

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from ..engine.schedules import DEFAULT_BRANCHES, HYBRID, WINDOW_SCHEDULES
from ..front.families import default_width, family
from .bench.measure import BRANCHES, REFERENCE
from .bench.repeats import median_index, speedup, spread
from .bench.statistics import rotation

DEFAULT_MODELS = ("tiny-nemotron-gsm8k", "tiny-nemotron-random")
LABELS = {"ar": "AR", "linear_ss": "Linear-SS", "quadratic_ss": "Quadratic-SS", "packed_ss": "Packed-SS",
          HYBRID: "Hybrid-SS", "native": "Native (SetDLM)", "auto": "Auto (W per call)"}
ORDER = ["ar", "linear_ss", "quadratic_ss", "packed_ss", HYBRID, "auto", "native"]
DEFAULT_SCHEDULES = ["ar", "linear_ss", "quadratic_ss", "packed_ss", "auto"]
# An answer long enough to time a speculative schedule (at 24 tokens the prefill and the first calls dominate),
# and timed runs per schedule: the median is reported, the range shows the noise.
DEFAULT_MAX_NEW_TOKENS, DEFAULT_REPEATS, MAX_REPEATS = 128, 3, 9
# The schedules that reproduce the AR mode's greedy output (all but SetDLM's native decoder), from the engine
EXACT = {m for m, schedule in WINDOW_SCHEDULES.items() if schedule.exact}
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
    width_per_iteration: list[int] = field(default_factory=list)  # 0: an AR iteration (what auto chose)
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

    def width_at(self, tokens: int) -> int | None:
        """The width of the iteration that accepted the `tokens`-th token (0: AR; None: nothing accepted yet)."""
        seen = 0
        for accepted, width in zip(self.accepted_per_iteration, self.width_per_iteration, strict=False):
            seen += accepted
            if seen >= tokens:
                return width if tokens else None
        return self.width_per_iteration[-1] if self.width_per_iteration and tokens else None

    def widths_used(self) -> str:
        """Share of iterations at each width, e.g. "AR 10% · W6 90%" ("-" for a schedule of one width)."""
        counts = {w: self.width_per_iteration.count(w) for w in sorted(set(self.width_per_iteration))}
        if len(counts) < 2 and self.schedule != "auto":
            return "-"
        total = max(1, len(self.width_per_iteration))
        return " \u00b7 ".join(f"{'AR' if w == 0 else f'W{w}'} {100 * n / total:.0f}%" for w, n in counts.items())

    def to_dict(self) -> dict:
        return {**asdict(self), "new_tokens": self.new_tokens, "tokens_per_nfe": self.tokens_per_nfe,
                "tokens_per_s": self.tokens_per_s, "tokens_per_call": self.tokens_per_call(),
                "widths_used": self.widths_used()}

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
    if BRANCHES in fam.schedules[mode].options:  # hybrid_ss's k
        trace.branches = int(branches or DEFAULT_BRANCHES)
        trace.label = f"{trace.label} (k={trace.branches})"
        kwargs[BRANCHES] = trace.branches
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
        trace.width_per_iteration = list(stats.width_per_iteration)
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
    ar = next((t for t in traces if t.schedule == REFERENCE), None)
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
    others = [r for r in rows if r["schedule"] != REFERENCE]
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
    inexact = [r for r in rows if r["schedule"] not in EXACT]  # SetDLM's native decoder
    extra = ""
    if inexact:
        extra = (" Native (SetDLM's own decoder, not exact) "
                 + ("matches them." if rows[0]["tokens"] == inexact[0]["tokens"] else "differs, as it may."))
    if result["identical"]:
        return (f"\u2713 Greedy decoding: all {len(exact)} exact schedules ({', '.join(exact)}) produced identical "
                f"text, token for token.{extra}")
    return f"\u2717 Greedy decoding: the schedules produced DIFFERENT texts ({', '.join(exact)}). This is a bug.{extra}"


def default_model() -> str:
    """The first bundled checkpoint of `DEFAULT_MODELS` (the last one if none is bundled)."""
    from .. import bundled

    return next((m for m in DEFAULT_MODELS if m in bundled.names()), DEFAULT_MODELS[-1])


def available_schedules(model) -> list[str]:
    """The schedules `model` can race, in display order."""
    fam = family(model.config)
    if fam is None:
        raise SystemExit(f"{type(model).__name__} has no packed layout (model_type={model.config.model_type!r}).")
    return [m for m in ORDER if m in fam.schedules]


def warm_up(model, tokenizer, modes: list[str]) -> None:
    """A few tokens with every schedule, so the first race does not pay one-time costs."""
    ids = tokenizer(EXAMPLES[0], return_tensors="pt").input_ids.to(model.device)
    with DECODE_LOCK:
        for mode in modes:
            model.generate(ids, assistant_mode=mode, max_new_tokens=4)
