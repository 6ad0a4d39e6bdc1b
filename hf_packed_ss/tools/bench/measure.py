"""Timing responses fairly (paper appendix E.5): one loaded model, warm-up, schedules interleaved per prompt.

Our schedules report their own statistics (`output.decoding_stats`: decoder time from the prefill call to the
last token, synchronised; model time inside forward calls). Stock `generate` reports none, so for the peer
baselines (`stock`, `prompt_lookup`) forward hooks count calls, rows and model time, and decoder time runs from
the first forward call (the prefill) to the returned output, synchronised: stock set-up before the prefill is
left out as our argument checks are. `generate_wall_s` keeps the whole call for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch._dynamo.utils import counters
from transformers.generation.streamers import BaseStreamer

from ...engine.schedules import DEFAULT_BRANCHES, HYBRID, WINDOW_SCHEDULES, ARSchedule
from ...front.families import MODES
from .record import Record, stats_fields
from .statistics import rotation
from .suites import Prompt

STOCK, PROMPT_LOOKUP = "stock", "prompt_lookup"
PEERS = (STOCK, PROMPT_LOOKUP)
# The schedule every tool compares with: the exactness reference (tokens must equal its) and the speed-up's base.
REFERENCE = ARSchedule.name
BRANCHES = "speculative_branches"  # the option ``NAME:K`` sets, for a schedule that takes it (hybrid_ss)
# the marks of a tool's schedule name, ``MODE[:K][@W][+compile]`` or ``stock/DTYPE`` (`ScheduleName`)
BRANCH_MARK = ":"  # ``hybrid_ss:3``: speculative_branches=3
WIDTH_MARK = "@"  # ``packed_ss@4``: the schedule at speculative_width=4, whatever --width says
COMPILED = "+compile"  # a schedule name's suffix: the same decode with a static cache and compiled calls
DTYPE_MARK = "/"  # ``stock/float32``: stock generate on the checkpoint loaded in float32 (bench --stock-dtypes)


def _count(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} {text!r} is not a whole number")
    return int(text)


@dataclass(frozen=True)
class ScheduleName:
    """A tool's schedule name, parsed in one place: ``MODE[:K][@W][+compile]`` (an assistant mode or a peer
    baseline) or ``stock/DTYPE``. `str` writes it back.

    Attributes:
        mode: the `assistant_mode`, or the peer (`stock`, `prompt_lookup`).
        branches: K of ``hybrid_ss:K`` (`speculative_branches`), else None.
        width: W of ``MODE@W`` (`speculative_width`), else None.
        compiled: the ``+compile`` variant (a static cache and compiled calls).
        dtype: DTYPE of ``stock/DTYPE`` (stock on the checkpoint loaded in that dtype), else None.
    """

    mode: str
    branches: int | None = None
    width: int | None = None
    compiled: bool = False
    dtype: str | None = None

    @classmethod
    def parse(cls, text: str) -> ScheduleName:
        """Raises ValueError where K or W is not a whole number (what it is otherwise is `schedule_name`'s check)."""
        base, compiled = (text.removesuffix(COMPILED), True) if text.endswith(COMPILED) else (text, False)
        base, mark, width = base.partition(WIDTH_MARK)
        base, branched, k = base.partition(BRANCH_MARK)
        mode, _, dtype = base.partition(DTYPE_MARK)
        return cls(mode, _count(k, "K") if branched else None, _count(width, "W") if mark else None, compiled,
                   dtype or None)

    def __str__(self) -> str:
        return (self.mode + (DTYPE_MARK + self.dtype if self.dtype else "")
                + (f"{BRANCH_MARK}{self.branches}" if self.branches is not None else "")
                + (f"{WIDTH_MARK}{self.width}" if self.width is not None else "") + (COMPILED if self.compiled else ""))

    @property
    def eager(self) -> ScheduleName:
        """The same schedule without ``+compile``."""
        return replace(self, compiled=False)

    def options(self) -> dict:
        """The `generate` options the name sets besides `assistant_mode`."""
        return (({BRANCHES: self.branches} if self.branches is not None else {})
                | ({"speculative_width": self.width} if self.width is not None else {}))


def compiled_variant(name: str) -> tuple[str, bool]:
    """``packed_ss+compile`` -> (``packed_ss``, True); any other name -> (name, False)."""
    parsed = ScheduleName.parse(name)
    return str(parsed.eager), parsed.compiled


def schedule_mode(name: str) -> tuple[str, dict]:
    """A tool's schedule name -> (assistant_mode, its extra `generate` options): ``hybrid_ss:K`` is
    ``assistant_mode="hybrid_ss", speculative_branches=K``; ``MODE@W`` is MODE at ``speculative_width=W``; any
    other name is the mode itself."""
    parsed = ScheduleName.parse(name)
    return parsed.mode, parsed.options()


def _branched(mode: str) -> bool:
    """Whether the mode takes K (hybrid_ss)."""
    return BRANCHES in getattr(WINDOW_SCHEDULES.get(mode), "options", ())


def _valid(name: ScheduleName) -> bool:
    """What `--schedules` takes: a mode, optionally at a width (a drafting one) and with K (hybrid_ss), or a peer."""
    schedule = WINDOW_SCHEDULES.get(name.mode)
    if name.compiled or name.dtype is not None or name.mode not in MODES + list(PEERS):
        return False
    if name.width is not None and (name.width < 1 or schedule is None or not schedule.speculative):
        return False
    return name.branches is None or (_branched(name.mode) and name.branches >= 1)


def schedule_name(text: str) -> str:
    """`--schedules` entries (an argparse `type`): a mode, a peer baseline, or ``hybrid_ss:K`` (K >= 1); a bare
    ``hybrid_ss`` becomes ``hybrid_ss:<default k>``, so every table names the k it measured."""
    import argparse

    try:
        name = ScheduleName.parse(text)
    except ValueError:
        name = None
    if name is None or not _valid(name):
        raise argparse.ArgumentTypeError(f"invalid schedule {text!r}: choose from {MODES + list(PEERS)}, "
                                         f"{HYBRID}:K for K proposal branches (speculative_branches=K), or a "
                                         f"speculative mode at width W as MODE{WIDTH_MARK}W (e.g. packed_ss@4)")
    if name.branches is None and _branched(name.mode):
        name = replace(name, branches=DEFAULT_BRANCHES)
    return str(name)


# decode(schedule, input_ids) -> the Record fields it measured (its DecodingStats' fields, generate_wall_s, tokens, ...)
Decode = Callable[[str, torch.Tensor], dict]


@dataclass(frozen=True)
class Settings:
    """What every schedule is asked for; temperature 0 means greedy. top_k 0 and top_p 1 disable those filters
    (the paper samples from the full vocabulary)."""

    max_new_tokens: int
    width: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    prompt_lookup_tokens: int = 10
    compile_mode: str | None = None  # `torch.compile` mode of the `+compile` variants (None: CompileConfig's)
    # static cache slots of each schedule's `+compile` variant: one size per schedule for the whole suite
    cache_lengths: tuple[tuple[str, int], ...] = ()

    def compiled(self, schedule: str) -> dict:
        """`generate` options of `schedule`'s `+compile` variant, alike for our schedules and stock: a static cache
        of the schedule's one size for the whole suite (no recompile while timed) and a `CompileConfig`, with our
        decoder's default inductor options unless a mode is asked (stock on the CPU also needs
        `_compile_all_devices`)."""
        from transformers import CompileConfig

        from ...front.generate import INDUCTOR_OPTIONS

        config = (CompileConfig(mode=None, options=dict(INDUCTOR_OPTIONS)) if self.compile_mode is None
                  else CompileConfig(mode=self.compile_mode))
        config._compile_all_devices = True
        return {"cache_implementation": "static", "compile_config": config,
                "max_cache_len": dict(self.cache_lengths).get(schedule)}

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def sampling(self) -> dict:
        if self.greedy:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CallMeter:
    """Forward hooks on a model for the duration of a `with`: calls, their input rows, time inside them and
    when the first call started (device-synchronised, as the Runner times our own calls)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.device = model, model.device
        self.rows: list[int] = []
        self.model_time_s = 0.0
        self.first_start: float | None = None
        self._tic = 0.0

    def _pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows.append(int((ids if ids is not None else kwargs["inputs_embeds"]).shape[1]))
        if self.first_start is None:
            sync(self.device)
            self.first_start = time.perf_counter()
        self._tic = time.perf_counter()

    def _post(self, module, args, kwargs, output) -> None:
        sync(self.device)
        self.model_time_s += time.perf_counter() - self._tic

    def __enter__(self) -> CallMeter:
        self._hooks = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()


class StepSizes(BaseStreamer):
    """Tokens stock `generate` appends per step (the first put is the prompt)."""

    def __init__(self):
        self.sizes: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


def decode_ours(model, ids: torch.Tensor, mode: str, settings: Settings, compiled: bool = False) -> dict:
    """One of our schedules (a `schedule_mode` name); its statistics come from the Runner."""
    name = mode
    mode, extra = schedule_mode(mode)
    if compiled:
        extra |= settings.compiled(name)
    drafts = mode not in WINDOW_SCHEDULES or WINDOW_SCHEDULES[mode].speculative  # AR takes no width
    sync(ids.device)
    start = time.perf_counter()
    extra.setdefault("speculative_width", settings.width if drafts else None)
    out = model.generate(ids, assistant_mode=mode, max_new_tokens=settings.max_new_tokens,
                         return_dict_in_generate=True, **settings.sampling(), **extra)
    sync(ids.device)
    wall = time.perf_counter() - start
    new = out.sequences[0, ids.shape[1]:]
    return stats_fields(out.decoding_stats) | dict(generate_wall_s=wall, tokens=new.tolist())


def decode_stock(model, ids: torch.Tensor, settings: Settings, lookup: int = 0, compiled: bool = False) -> dict:
    """Stock `generate` (`lookup` = 0) or stock prompt-lookup decoding with `lookup` draft tokens; `compiled`:
    with a static cache and its own compile. A compiled forward runs without the forward hooks (they would be
    traced into its graph): its calls are the streamer's steps plus the prefill, its time the whole decode."""
    steps = StepSizes()
    kwargs = dict(assistant_mode=None, max_new_tokens=settings.max_new_tokens, streamer=steps,
                  attention_mask=torch.ones_like(ids), **settings.sampling())
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    if compiled:
        kwargs |= settings.compiled(PROMPT_LOOKUP if lookup else STOCK)
        # Unfrozen, as a user's compile of stock runs (torch.compile's options do not reach inductor): frozen, the
        # second `generate` fails ("index out of bounds" in the cache's index_copy), stock's static cache being
        # a new one per call while the frozen graph keeps the first one's tensors as constants.
        sync(ids.device)
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        sync(ids.device)
        wall = time.perf_counter() - start
        new = out[0, ids.shape[1]:]
        return dict(width=lookup, new_tokens=int(new.numel()), nfe=len(steps.sizes) - 1, decoder_time_s=wall,
                    generate_wall_s=wall, model_time_s=0.0, rows_per_call=[], accepted_per_iteration=steps.sizes[1:],
                    tokens=new.tolist())
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT calls the base's forward
    with CallMeter(inner) as meter:
        sync(ids.device)
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        sync(ids.device)
        end = time.perf_counter()
    new = out[0, ids.shape[1]:]
    first = meter.first_start if meter.first_start is not None else end
    return dict(width=lookup, new_tokens=int(new.numel()), nfe=len(meter.rows), decoder_time_s=end - first,
                generate_wall_s=end - start, model_time_s=meter.model_time_s, rows_per_call=meter.rows,
                accepted_per_iteration=steps.sizes[1:], tokens=new.tolist())


_GRAPHS = counters["stats"]
NEAR_TIE = 1e-4  # relative logit gap under which two tokens are a near-tie of the AR mode
NEAR_TIE_ULPS = 4  # ... or this many roundings of the model's dtype (bfloat16: a few percent of the logit)


def near_tie(model, ids: torch.Tensor, reference: list[int], tokens: list[int]) -> bool:
    """Whether the first token where `tokens` leaves `reference` (the AR mode's greedy output) was a near-tie:
    the AR mode's own logits there (one plain forward of the prompt and the common prefix) put the two tokens
    within `NEAR_TIE` (or `NEAR_TIE_ULPS` roundings of the model's dtype, if wider) of each other, relative to
    the larger."""
    i = next((i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b), None)
    if i is None:  # one is a prefix of the other: the first difference is where one stopped
        return False
    prefix = torch.cat([ids[0], torch.tensor(reference[:i], dtype=ids.dtype, device=ids.device)])[None]
    with torch.inference_mode():
        logits = model(input_ids=prefix).logits[0, -1].double()
    a, b = logits[reference[i]], logits[tokens[i]]
    tolerance = max(NEAR_TIE, NEAR_TIE_ULPS * torch.finfo(logits_dtype(model)).eps)
    return bool(abs(a - b) <= tolerance * max(1.0, float(abs(a))))


def logits_dtype(model) -> torch.dtype:
    """The dtype the model computes in (its first floating parameter's)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)



def decoder_for(model, settings: Settings, stock_models: dict | None = None) -> Decode:
    """Dispatch a bench schedule name to the call that measures it; ``stock/DTYPE`` is stock `generate` on
    `stock_models[DTYPE]`, the same checkpoint loaded in that dtype."""

    def measured(schedule: str, ids: torch.Tensor) -> dict:
        name = ScheduleName.parse(schedule)
        if name.mode == STOCK and name.dtype is not None:
            return decode_stock(stock_models[name.dtype], ids, settings)
        if name.mode == STOCK:
            return decode_stock(model, ids, settings, compiled=name.compiled)
        if name.mode == PROMPT_LOOKUP:
            return decode_stock(model, ids, settings, lookup=settings.prompt_lookup_tokens, compiled=name.compiled)
        return decode_ours(model, ids, str(name.eager), settings, name.compiled)

    def decode(schedule: str, ids: torch.Tensor) -> dict:
        before = _GRAPHS["unique_graphs"]  # dynamo's count: a graph compiled during a timed decode shows here
        fields = measured(schedule, ids)
        return fields | {"compiled_graphs": _GRAPHS["unique_graphs"] - before}

    return decode


def seed_for(seed: int, prompt: int, repeat: int) -> int:
    """One seed per (prompt, repeat), the same for every schedule."""
    return (seed * 1_000_003 + prompt * 1_009 + repeat) % (2**63)


@dataclass
class Measurement:
    """What the interleaved loop measured; `errors` maps a schedule to why it stopped being run."""

    schedules: list[str]
    repeats: int
    records: list[Record] = field(default_factory=list)
    orders: list[dict] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    warmup: dict[str, dict] = field(default_factory=dict)  # each schedule's warm-up decode (where graphs compile)

    @property
    def active(self) -> list[str]:
        return [s for s in self.schedules if s not in self.errors]

    def complete_prompts(self) -> list[int]:
        """Prompts every still-active schedule decoded `repeats` times: the paired comparison uses these."""
        counts: dict[tuple[int, str], int] = {}
        for r in self.records:
            if r.error is None:
                counts[r.prompt, r.schedule] = counts.get((r.prompt, r.schedule), 0) + 1
        prompts = sorted({r.prompt for r in self.records})
        return [p for p in prompts if all(counts.get((p, s), 0) == self.repeats for s in self.active)]


def _error(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def run_interleaved(decode: Decode, schedules: list[str], prompts: list[Prompt], inputs: list[torch.Tensor],
                    repeats: int = 1, seed: int = 0, warmup: bool = True, progress: bool = True,
                    warmup_inputs: list[torch.Tensor] | None = None) -> Measurement:
    """Warm up every schedule on the first prompt (or on each of `warmup_inputs`; not recorded), then for run step =
    prompt * repeats + repeat decode with every schedule in `rotation(schedules, step)`. A schedule that raises is
    recorded with its error and not run again; Ctrl-C stops the loop and keeps everything measured so far."""
    from tqdm.auto import tqdm

    m = Measurement(list(schedules), repeats)
    bar = None
    try:
        if warmup:
            for s in schedules:
                try:
                    for ids in warmup_inputs or inputs[:1]:
                        torch.manual_seed(seed)
                        fields = decode(s, ids)
                        warm = m.warmup.setdefault(s, dict.fromkeys(("generate_wall_s", "compile_time_s",
                                                                     "compiled_graphs"), 0))
                        for k in warm:
                            warm[k] += fields.get(k) or 0
                except Exception as error:  # reported as the schedule's row error
                    m.errors[s] = "warm-up: " + _error(error)
        bar = tqdm(total=len(prompts) * repeats * len(m.active), desc="bench", unit="response", disable=not progress)
        for i, prompt in enumerate(prompts):
            for r in range(repeats):
                order = [s for s in rotation(m.schedules, i * repeats + r) if s not in m.errors]
                m.orders.append({"prompt": i, "repeat": r, "order": order})
                for position, s in enumerate(order):
                    if s in m.errors:
                        continue
                    bar.set_postfix_str(f"{prompt.id} {s}", refresh=False)
                    torch.manual_seed(seed_for(seed, i, r))
                    where = dict(prompt=i, prompt_id=prompt.id, repeat=r, position=position)
                    try:
                        fields = decode(s, inputs[i])
                    except Exception as error:
                        m.errors[s] = f"{prompt.id}: " + _error(error)
                        m.records.append(Record(schedule=s, error=m.errors[s], **where))
                        continue
                    m.records.append(Record(schedule=s, **where, **fields))
                    bar.update()
    except KeyboardInterrupt:
        m.interrupted = True
    finally:
        if bar is not None:
            bar.close()
    return m
