"""`generate` with our options: option precedence, the length budget, then one `engine.decode` call.

It holds no decoding logic: it resolves the options, validates the request (`validation`), builds the schedule
and layout the model's family names (`families`), and hands one sequence to the engine. Without `assistant_mode`
it is stock `generate`."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import torch
from transformers import CompileConfig, GenerationConfig, StoppingCriteriaList
from transformers.utils import ModelOutput

from ..engine import DecodingStats, Greedy, RejectionSampler, decode, decode_batch
from ..engine.batch import tensorised
from ..engine.batch_cache import Arrival
from ..engine.static import slots_needed, steady_rows
from ..models.lora import proposal_only_adapters
from .candidates import PackedSSCandidateGenerator
from .families import family
from .forward import model_forward, static_batch_forward, static_forward
from .measured import measured_for
from .stopping import StopSequenceCriteria, stopping
from .validation import AUTO, _reject, validate

_HOOKS = ("logits_processor", "stopping_criteria", "streamer", "prefix_allowed_tokens_fn", "generator", "tokenizer",
          "assistant_model", "admit", "max_batch_size")
# Our own generate options, read from kwargs or a GenerationConfig attribute (stock generate never sees them).
_OPTIONS = {"assistant_mode": None, "speculative_width": None, "verify_order": None, "confidence_threshold": None,
            "stop_sequences": None, "native_cache_order": None, "stop_at_eos": None, "native_context": None,
            "speculative_branches": None, "static_shapes": None, "cost_model": None}


@dataclass
class PackedSSGenerateOutput(ModelOutput):
    """`generate(..., return_dict_in_generate=True)` output: `sequences` (prompt + continuation),
    `decoding_stats` (a `DecodingStats`) and the run's `candidate_generator`."""

    sequences: torch.LongTensor | None = None
    decoding_stats: DecodingStats | None = None
    candidate_generator: PackedSSCandidateGenerator | None = None


def length_defaults(model, generation_config, kwargs: dict) -> tuple[bool, bool]:
    """Whether max_length / min_length are left at transformers' defaults, read the way stock generate
    reads them (before the generation config is filled in)."""
    configs = (generation_config, model.generation_config)
    return tuple(kwargs.get(k) is None and all(c is None or getattr(c, k, None) is None for c in configs)
                 for k in ("max_length", "min_length"))


def new_token_budget(model, model_config, config: GenerationConfig, input_ids: torch.Tensor,
                     default_max_length: bool, default_min_length: bool) -> int:
    """The number of new tokens exactly as stock `generate` sets it, with its warnings and errors
    (`max_new_tokens` over `max_length`; by default 20 new tokens, capped by `max_position_embeddings`;
    a `max_length` not above the prompt is an error). Sets `config.max_length` / `min_length` as stock does,
    so processors that read them (`forced_eos_token_id`, `min_new_tokens`) see the real limit."""
    n = input_ids.shape[1]
    model._prepare_generated_length(generation_config=config, has_default_max_length=default_max_length,
                                    has_default_min_length=default_min_length, model_input_name="input_ids",
                                    inputs_tensor=input_ids, input_ids_length=n)
    model._validate_generated_length(config, n, default_max_length)
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is not None and config.max_length > limit:
        warnings.warn(
            f"The prompt ({n} tokens) plus up to {config.max_length - n} new tokens exceeds the model's "
            f"max_position_embeddings={limit}: positions past {limit} were not trained, so text there may "
            "degrade (the output is still exactly the AR mode's). Lower max_new_tokens to stay within the limit.",
            UserWarning,
            stacklevel=3,
        )
    return config.max_length - n


def speculative_generate(model, stock_generate, *args, **kwargs):
    """`generate` with our options (`assistant_mode`, `speculative_width`, `speculative_branches`, `verify_order`,
    `confidence_threshold`, `stop_sequences`); `stock_generate` untouched without `assistant_mode`.

    Precedence: explicit kwargs > the `generation_config` passed > `model.generation_config`.
    """
    request = _request(model, args, kwargs)
    if request is None:
        return stock_generate(*args, **kwargs)
    return _decode(model, *request)


def check_generate(model, *args, **kwargs) -> None:
    """Raise the `ValueError` that `model.generate(*args, **kwargs)` would raise for these options, without
    decoding or touching the model (a server checks a request before it joins a batch); without
    `assistant_mode` nothing is checked (stock generate checks its own)."""
    _request(model, args, dict(kwargs))


def _request(model, args: tuple, kwargs: dict):
    """The options resolved and validated; None for stock generate (`kwargs` then holds what it gets)."""
    generation_config = args[1] if len(args) > 1 else kwargs.get("generation_config")
    base = generation_config if generation_config is not None else model.generation_config
    given = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
    explicit = sorted(k for k in _OPTIONS if k not in ("assistant_mode", "stop_sequences") and given.get(k) is not None)
    # A None option means "use the config", as for stock generate options; only assistant_mode=None is a
    # choice of its own (stock generate).
    options = {k: given[k] if given.get(k) is not None or (k == "assistant_mode" and k in given)
               else getattr(base, k, default) for k, default in _OPTIONS.items()}
    config_mode = getattr(base, "assistant_mode", None)
    if given.get("speculative_width") is None and config_mode not in (None, options["assistant_mode"]):
        options["speculative_width"] = None  # the config's width was chosen for its own mode; use this one's default
    if given.get("speculative_branches") is None and config_mode not in (None, options["assistant_mode"]):
        options["speculative_branches"] = None  # so were its branches (a hybrid_ss config, another mode asked)
    if options["assistant_mode"] is None:
        _reject(bool(explicit), f"{explicit} only apply with assistant_mode=...: set assistant_mode or drop them.")
        if options["stop_sequences"]:  # stock generate gets the same criterion
            criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
            kwargs["stopping_criteria"] = criteria + [StopSequenceCriteria(options["stop_sequences"])]
        return None

    _reject(len(args) > 2, "Pass generate options other than the prompt and generation_config as keywords.")
    inputs = args[0] if args else kwargs.pop("inputs", None)
    kwargs.pop("generation_config", None)
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    _reject(input_ids is None, "Pass the prompt ids as the first argument or as input_ids=.")
    _reject(not isinstance(input_ids, torch.Tensor),
            f"input_ids must be a torch tensor of shape (batch, length); got {type(input_ids).__name__}.")
    _reject(bool(kwargs.pop("synced_gpus", None)),
            "synced_gpus is not supported with assistant_mode (one process decodes the whole batch).")
    max_new = kwargs.pop("max_new_tokens", None)  # popped: GenerationConfig rejects 0, which we allow
    _reject(max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0),
            f"max_new_tokens={max_new!r} must be >= 0 (an integer number of tokens).")
    if max_new:
        kwargs["max_new_tokens"] = max_new
    hooks = {k: kwargs.pop(k) for k in _HOOKS if k in kwargs}
    defaults = length_defaults(model, generation_config, kwargs)  # read before the config is filled in, as stock
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    decoder = getattr(model, "_hf_packed_ss_twin", model)  # a released model runs through its twin
    width = validate(decoder, options, input_ids, config, model_kwargs, hooks)
    return options, input_ids, config, model_kwargs, hooks, decoder, width, max_new, defaults


def _decode(model, options: dict, input_ids: torch.Tensor, config: GenerationConfig, model_kwargs: dict,
            hooks: dict, decoder, width: int, max_new: int | None, defaults: tuple[bool, bool]):
    """Decode a validated request (`_request`'s) with the engine; what `generate` returns."""
    mask = model_kwargs.pop("attention_mask", None)  # validated: left padding only; the layouts build the masks
    prompts = [ids if mask is None else ids[mask[b].bool()] for b, ids in enumerate(input_ids)]

    prompt_len = input_ids.shape[1]
    max_new = 0 if max_new == 0 else new_token_budget(model, decoder.config, config, input_ids, *defaults)
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    processors = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=prompt_len,
        logits_processor=hooks.get("logits_processor"),
        prefix_allowed_tokens_fn=hooks.get("prefix_allowed_tokens_fn"),
        device=input_ids.device,
    )
    acceptance = RejectionSampler(hooks.get("generator")) if config.do_sample else Greedy()
    stop = stopping(config, hooks.get("stopping_criteria"), hooks.get("tokenizer"), options["stop_sequences"])
    fam = family(decoder.config)
    mode = options["assistant_mode"]
    schedule_class = fam.schedules[AUTO if width == AUTO else mode]
    # the options this schedule takes, as given (unset ones keep the schedule's own defaults)
    extra = {k: options[k] for k in schedule_class.options if options[k] is not None}
    if fam.any_order:
        extra["verify_order"] = options["verify_order"] or "ltr"
    if "config" in inspect.signature(schedule_class).parameters:
        extra["config"] = decoder.config  # sizes a schedule reads (native: first-hitting times, trained length)
    if schedule_class.name == AUTO:  # AR (assistant_mode="auto") and Packed-SS at every width, or at the one given
        widest = fam.widths(decoder.config)[0]
        extra |= dict(widths=tuple(range(1, widest + 1)) if width == AUTO else (width,), ar=mode == AUTO,
                      measured=measured_for(decoder, len(prompts) > 1 or hooks.get("admit") is not None,
                                            options["cost_model"]))
        width = widest if width == AUTO else width
    # one schedule and one layout per sequence: they hold its draft and its mask buffer
    schedules = [schedule_class(width, acceptance, **extra) for _ in prompts]
    admit = hooks.get("admit")  # continuous batching: rows that join the running batch
    # a prefix-family batch lays out static shapes unless told otherwise: the rows a lean call leaves out are
    # padding in the batched call anyway, and with one shape per row the batched call is a concatenation (a
    # same-position call's shape depends on its draft either way, and its sliding context on its rows)
    static = options["static_shapes"]
    if static is None:  # a static cache pads every call to one shape anyway: lay out the static shapes
        static = config.cache_implementation == "static" or ((len(prompts) > 1 or admit is not None)
                                                             and not fam.any_order)
    layouts = [fam.layout(decoder.config.mask_token_id, static_shapes=static) for _ in prompts]

    def arrivals() -> list[Arrival]:
        """`admit()`'s (input_ids, max_new_tokens, streamer) triples, each with a schedule and layout of its own."""
        return [Arrival(schedule_class(width, acceptance, **extra),
                        fam.layout(decoder.config.mask_token_id, static_shapes=static), ids, n, streamer)
                for ids, n, streamer in admit()]

    # only a dict output returns the candidate generator, so only then is it made and told every verification
    wanted = config.return_dict_in_generate and not fam.any_order and len(prompts) == 1 and admit is None
    candidates = PackedSSCandidateGenerator(schedules[0]) if wanted else None
    streamers = hooks.get("streamer")
    streamers = list(streamers) if isinstance(streamers, list | tuple) else [streamers] * len(prompts)  # per row
    with torch.inference_mode(), proposal_only_adapters(decoder):
        if config.cache_implementation == "static":
            pad = config.pad_token_id if config.pad_token_id is not None else (eos or [0])[0]
            outputs, stats = decode_static(decoder, config, schedules, layouts, prompts, max(0, max_new), eos,
                                           processors, stop, streamers,
                                           None if candidates is None else candidates.observe, pad,
                                           None if admit is None else arrivals, hooks.get("max_batch_size"))
        elif len(prompts) == 1 and admit is None:
            sequence, stats = decode(model_forward(decoder), schedules[0], layouts[0], prompts[0], max(0, max_new),
                                     eos, processors, stop, streamers[0],
                                     trace=None if candidates is None else candidates.observe)
            outputs = [sequence]
        else:
            pad = config.pad_token_id if config.pad_token_id is not None else (eos or [0])[0]
            outputs, stats = decode_batch(model_forward(decoder, batched=True), schedules, layouts, prompts,
                                          max(0, max_new), eos, processors, stop, pad_token_id=pad,
                                          streamers=streamers, admit=None if admit is None else arrivals)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos or [0])[0]
    sequences = padded(input_ids, prompts, outputs[: len(prompts)], pad)  # rows that joined went to their streamers
    if config.return_dict_in_generate:
        return PackedSSGenerateOutput(sequences=sequences, decoding_stats=stats, candidate_generator=candidates)
    return sequences


def decode_static(decoder, config: GenerationConfig, schedules, layouts, prompts, max_new: int, eos, processors,
                  stop, streamers, trace, pad_token_id: int, admit=None, max_batch_size: int | None = None
                  ) -> tuple[list[torch.Tensor], DecodingStats]:
    """`cache_implementation="static"`: each sequence through the model's `StaticForward` (one graph for every
    call after the prompt's, compiled by `compile_options`) over a `SlotCache` sized for the longest, kept on
    the model for later calls. A batch that can run in lockstep (`engine.batch.tensorised`: greedy AR or Packed-SS,
    EOS and length only, either family) runs so through a `StaticBatchForward` of `max_batch_size` rows (default the
    batch's), into whose free rows `admit()`'s arrivals join between two calls; any other batch's rows, and its
    arrivals after them, run one after another through the one graph."""
    rows = steady_rows(schedules[0], layouts[0])
    longest = max(p.numel() for p in prompts)
    options = compile_options(config, decoder.device)
    if (len(prompts) > 1 or admit is not None) and tensorised(schedules, layouts, processors, stop):
        slack = 8 * (schedules[0].width + 1)  # decode_batch's default: holes before a compaction
        capacity = max(config.max_cache_len or 0, slots_needed(longest, max_new, slack, rows))
        forward, cache = static_batch_forward(decoder, max(len(prompts), max_batch_size or 0), rows, capacity, options)
        compiled = forward.compile_time_s
        outputs, stats = decode_batch(forward, schedules, layouts, prompts, max_new, eos, processors, stop,
                                      pad_token_id=pad_token_id, slack=slack, lockstep=True, cache=cache,
                                      streamers=streamers, admit=admit)
        stats.compile_time_s = forward.compile_time_s - compiled
        return outputs, stats
    queue = [Arrival(*row) for row in zip(schedules, layouts, prompts, [max_new] * len(prompts), streamers,
                                          strict=True)]
    outputs, per_row = [], []
    while queue:
        row = queue.pop(0)
        capacity = max(config.max_cache_len or 0, slots_needed(row.prompt.numel(), row.max_new_tokens, 0, rows))
        forward, cache = static_forward(decoder, rows, capacity, options)  # the kept one when it fits
        compiled = forward.compile_time_s
        sequence, stats = decode(forward, row.schedule, row.layout, row.prompt, row.max_new_tokens, eos, processors,
                                 stop, row.streamer, cache=cache, trace=trace)
        stats.compile_time_s = forward.compile_time_s - compiled
        outputs.append(sequence)
        per_row.append(stats)
        if admit is not None:
            queue += admit()
    return outputs, per_row[0] if len(per_row) == 1 else DecodingStats.sequential(per_row)


# Inductor's options on the CPU when a CompileConfig names none (its default mode, CUDA graphs, means nothing
# there): weights frozen into the graph, so the linears run oneDNN kernels on weights packed once instead of
# repacking them every call (bfloat16 with AVX512-BF16: a 12-row call about as fast as a 1-row one). They take
# effect through `forward.InductorOptions`, for bfloat16 and float16 models only; the bench gives stock the same. A
# frozen graph holds the weights it was compiled with: one changed afterwards needs `torch._dynamo.reset()`.
INDUCTOR_OPTIONS = {"freezing": True}


def compile_options(config: GenerationConfig, device: torch.device) -> dict | None:
    """`torch.compile` kwargs for a static-cache decode, by stock `generate`'s rule: compiled unless
    `disable_compile`, by default on accelerators only, anywhere when a `compile_config` is passed (stock also
    needs its private `_compile_all_devices` on the CPU; passing a config is asking for it), with
    `INDUCTOR_OPTIONS` on the CPU where the config sets none. None: run eagerly."""
    compile_config = config.compile_config
    if config.disable_compile or (compile_config is None and device.type == "cpu"):
        return None
    compile_config = compile_config or CompileConfig()
    # the fields as set (`to_dict` deep-copies them: a backend callable would be a new backend every call)
    kwargs = {k: v for k, v in vars(compile_config).items() if k != "_compile_all_devices"}
    if device.type == "cpu" and kwargs.get("options") is None and kwargs.get("backend") == "inductor":
        kwargs["options"] = dict(INDUCTOR_OPTIONS)
    if kwargs.get("dynamic") is None:  # every shape is static by design; automatic dynamic shapes would key on
        kwargs["dynamic"] = False  # the step's name and mark a later decode's other row count dynamic
    if kwargs.get("options") is not None or kwargs.get("backend") != "inductor":
        kwargs.pop("mode", None)  # torch.compile takes a mode or options, and a mode only for inductor
    return kwargs


def padded(input_ids: torch.Tensor, prompts: list[torch.Tensor], outputs: list[torch.Tensor], pad: int
           ) -> torch.Tensor:
    """The batch as stock `generate` returns it: each row's input as given (left padding included), then its
    new tokens, then `pad` up to the longest row's."""
    new = [out[prompt.numel():] for prompt, out in zip(prompts, outputs, strict=True)]
    width = max(n.numel() for n in new)
    tail = torch.full((len(new), width), pad, dtype=input_ids.dtype, device=input_ids.device)
    for b, n in enumerate(new):
        tail[b, : n.numel()] = n
    return torch.cat([input_ids, tail], dim=1)


class SpeculativeGenerationMixin:
    """Gives a model class the `assistant_mode` front; put it before `GenerationMixin`."""

    def generate(self, *args, **kwargs):
        return speculative_generate(self, super().generate, *args, **kwargs)

    def init_continuous_batching(self, *args, **kwargs):
        """Refused: transformers' continuous batching (`transformers serve --continuous-batching`,
        `generate_batch`) runs the model's forward itself, so it would silently bypass our decoder."""
        raise NotImplementedError(
            "transformers' continuous batching calls the model's forward itself and would bypass assistant_mode's "
            "decoder: serve with `hf-packed-ss serve` (it batches concurrent requests, rows joining a running "
            "batch), or batch in your own loop with generate(..., streamer=[...], admit=...).")
