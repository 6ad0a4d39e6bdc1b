"""The Hugging Face front: ``model.generate(..., assistant_mode=..., speculative_width=...)``.

A thin shell: it resolves the `GenerationConfig`, validates the request once at the front door,
and hands one sequence to the Runner. Without `assistant_mode` it is stock `generate`.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import torch
from transformers import (
    GenerationConfig,
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.configuration_utils import GenerationMode
from transformers.utils import ModelOutput

from .acceptance import Greedy, RejectionSampler
from .candidates import PackedSSCandidateGenerator
from .engine import SCHEDULES, WINDOW_SCHEDULES, DecodingStats, Forward, SamePositionLayout, ShiftedBlockLayout, decode
from .lora import proposal_only_adapters, proposal_rows
from .modeling import cache_keyword
from .order import ORDERS

_HOOKS = ("logits_processor", "stopping_criteria", "streamer", "prefix_allowed_tokens_fn", "generator", "tokenizer",
          "assistant_model")
# Our own generate options, read from kwargs or a GenerationConfig attribute (stock generate never sees them).
_OPTIONS = {"assistant_mode": None, "speculative_width": None, "verify_order": None, "confidence_threshold": None,
            "stop_sequences": None, "native_cache_order": None, "stop_at_eos": None, "native_context": None,
            "speculative_branches": None, "static_shapes": None}


@dataclass(frozen=True)
class Family:
    """How one model family decodes: its layout, schedules and the widths it allows."""

    layout: type
    schedules: dict
    any_order: bool

    def widths(self, config) -> tuple[int, int]:
        """(largest width, default width for a mode) from the config."""
        if self.any_order:  # W <= S_max; the release pairs smax 2W with window W (appendix E.1)
            return config.max_block_size, max(1, config.max_block_size // 2)
        return config.block_size - 1, config.block_size - 1


# Decoding engine per model family (config.model_type). Any other causal LM whose config carries
# `mask_token_id` and `block_size` (a base model with a proposal-only drafter) uses the prefix family.
PREFIX = Family(ShiftedBlockLayout, SCHEDULES, any_order=False)
FAMILIES = {
    "nemotron_labs_diffusion": PREFIX,
    "setdlm": Family(SamePositionLayout, WINDOW_SCHEDULES, any_order=True),
}


def family(config) -> Family | None:
    """A registered format's family, or the prefix family for any causal LM given a MASK id and block size."""
    if config.model_type in FAMILIES:
        return FAMILIES[config.model_type]
    return PREFIX if getattr(config, "block_size", None) and getattr(config, "mask_token_id", None) else None


MODES = sorted(set(SCHEDULES) | set(WINDOW_SCHEDULES))


@dataclass
class PackedSSGenerateOutput(ModelOutput):
    """`generate(..., return_dict_in_generate=True)` output: `sequences` (prompt + continuation),
    `decoding_stats` (a `DecodingStats`) and the run's `candidate_generator`."""

    sequences: torch.LongTensor | None = None
    decoding_stats: DecodingStats | None = None
    candidate_generator: PackedSSCandidateGenerator | None = None


def model_forward(model: torch.nn.Module) -> Forward:
    """Adapt a model whose forward takes a 4D boolean mask and `logits_to_keep` to the Runner.

    A proposal-only adapter (see `lora.py`) is told which rows are proposal rows for each call."""
    cache_kw = cache_keyword(model)

    def forward(call, cache):
        with proposal_rows(model, call.proposal_start):
            out = model(
                input_ids=call.input_ids,
                position_ids=call.position_ids,
                attention_mask=call.attention_mask,
                use_cache=True,
                logits_to_keep=call.logit_rows,
                **{cache_kw: cache},
            )
        return out.logits[0]

    return forward


def default_width(config, mode: str) -> int:
    """Nemotron: the largest width the block size allows (W = B - 1). SetDLM: half the training horizon
    (smax16 -> W = 8). A schedule may cap it (`default_width_cap`: Quadratic-SS keeps the paper's B = 8)."""
    fam = family(config)
    _, default = fam.widths(config)
    cap = fam.schedules[mode].default_width_cap
    return default if cap is None else min(default, cap)


def takers(option: str) -> list[str]:
    """The modes whose schedule takes `option` (in any family)."""
    return sorted({m for fam in FAMILIES.values() for m, s in fam.schedules.items() if option in s.options})


# Options some schedule takes (`Schedule.options`); each is refused for the schedules that do not.
SCHEDULE_OPTIONS = sorted({o for fam in FAMILIES.values() for s in fam.schedules.values() for o in s.options})


def _reject(condition: bool, message: str) -> None:
    if condition:
        raise ValueError(message)


def validate(model, options: dict, input_ids: torch.Tensor, config: GenerationConfig, model_kwargs: dict,
             hooks: dict) -> int:
    """Check a speculative request once, at the front door; returns the speculative width to use."""
    mode, width = options["assistant_mode"], options["speculative_width"]
    _reject(
        mode not in MODES,
        f"Unknown assistant_mode={mode!r}; choose one of {MODES}, or leave it unset for stock generate.",
    )
    model_type = getattr(model.config, "model_type", None)
    fam = family(model.config)
    _reject(
        fam is None,
        f"assistant_mode has no packed layout for model_type={model_type!r} (available: {sorted(FAMILIES)}, or "
        "any causal LM whose config sets mask_token_id and block_size for its drafter); "
        "call generate without assistant_mode.",
    )
    _reject(
        mode not in fam.schedules,
        f"assistant_mode={mode!r} is SetDLM's own decoder and needs an any-order model (model_type 'setdlm'); "
        f"{model_type!r} takes {sorted(fam.schedules)}.",
    )
    mask_token_id = getattr(model.config, "mask_token_id", None)
    _reject(
        mask_token_id is None,
        f"{type(model).__name__} has no `config.mask_token_id`, so it has no diffusion mode to draft with. "
        "Set the mask token id of its diffusion mode, or call generate without assistant_mode.",
    )
    size = "max_block_size" if fam.any_order else "block_size"
    block_size = getattr(model.config, size, None)
    _reject(not block_size or block_size < 2 - fam.any_order,
            f"The model config needs `{size}` >= {2 - fam.any_order} (the diffusion block).")
    widest, _ = fam.widths(model.config)
    width = default_width(model.config, mode) if width is None else width
    _reject(
        isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= widest,
        f"speculative_width={width!r} is out of range: use an integer in [1, {widest}] "
        + (f"(the window may not exceed the training horizon max_block_size={block_size})." if fam.any_order else
           f"(block size B = W + 1 must not exceed the model's block_size={block_size})."),
    )
    schedule = fam.schedules[mode]
    for name in SCHEDULE_OPTIONS:
        _reject(options[name] is not None and name not in schedule.options,
                f"{name} only applies to assistant_mode={' or '.join(map(repr, takers(name)))} (got {mode!r}): "
                "drop it.")
    order = options["verify_order"]
    _reject(order is not None and order not in ORDERS,
            f"Unknown verify_order={order!r}; choose one of {sorted(ORDERS)}.")
    _reject(order == "confidence" and not fam.any_order,
            f"verify_order='confidence' needs an any-order model (model_type 'setdlm'); {model_type!r} verifies "
            "left to right only.")
    _reject(not schedule.verifies and order not in (None, "ltr"),
            f"assistant_mode={mode!r} commits by confidence threshold and has no verification order: drop "
            "verify_order.")
    threshold = options["confidence_threshold"]
    _reject(threshold is not None and not (isinstance(threshold, (int, float)) and 0 < threshold <= 1),
            f"confidence_threshold={threshold!r} must be a probability in (0, 1].")
    # the values of a schedule's own options are checked by the schedule when the front builds it
    _reject(options["native_context"] == "sliding" and input_ids.shape[-1] > getattr(model.config, "block_size", 0),
            f"The prompt ({input_ids.shape[-1]} tokens) is longer than block_size="
            f"{getattr(model.config, 'block_size', None)}, the context native_context='sliding' keeps: shorten it "
            "or use native_context='full'.")
    stops = options["stop_sequences"]
    _reject(stops is not None and not (isinstance(stops, (list, tuple)) and all(
        isinstance(x, (list, tuple)) and x and all(isinstance(t, int) for t in x) for x in stops)),
        "stop_sequences must be a list of non-empty token-id lists, e.g. [[13, 13], [2]].")
    _reject(options["static_shapes"] is not None and not isinstance(options["static_shapes"], bool),
            f"static_shapes={options['static_shapes']!r} must be True (one call shape per schedule and width, for "
            "compiled graphs: appendix D.3) or False (the default: only the rows that can matter).")
    _reject(input_ids.dim() != 2, f"input_ids must have shape (batch, length); got {tuple(input_ids.shape)}.")
    _reject(
        input_ids.shape[0] != 1,
        f"assistant_mode={mode!r} decodes one sequence at a time; got batch size {input_ids.shape[0]}. "
        "Call generate once per prompt.",
    )
    _reject(input_ids.shape[1] == 0, "The prompt is empty: pass at least one token (e.g. the BOS token).")
    check_token_ids(input_ids, model.config.get_text_config().vocab_size)
    _reject(
        config.num_beams != 1 or (config.num_return_sequences or 1) != 1,
        "assistant_mode decodes one sequence per call: num_beams and num_return_sequences must be 1 "
        "(call generate again for more samples).",
    )
    check_generation_mode(config)
    _reject(
        config.guidance_scale not in (None, 1, 1.0),
        "guidance_scale needs extra model calls per token and is not supported with assistant_mode.",
    )
    mask = model_kwargs.pop("attention_mask", None)
    _reject(
        mask is not None and mask.dim() != 2,
        "generate takes a 2D attention_mask (batch, length); the packed 4D masks are built by hf_packed_ss itself.",
    )
    _reject(
        mask is not None and not bool(mask.all()),
        "attention_mask with padding is not supported with assistant_mode: pass the unpadded prompt.",
    )
    _reject(
        hooks.get("assistant_model") is not None,
        "assistant_model and assistant_mode both name a drafter: the diffusion mode of the model drafts with "
        "assistant_mode, so drop assistant_model (or drop assistant_mode for stock assisted decoding).",
    )
    _reject(
        config.cache_implementation not in (None, "dynamic"),
        f"cache_implementation={config.cache_implementation!r} is not supported with assistant_mode: the decoder "
        "crops a DynamicCache after every call; leave cache_implementation unset.",
    )
    _reject(
        config.stop_strings is not None and hooks.get("tokenizer") is None,
        "stop_strings needs the model's tokenizer: pass generate(..., tokenizer=tokenizer).",
    )
    unused = sorted(k for k, v in model_kwargs.items() if v is not None and k != "use_cache")
    _reject(bool(unused), f"generate arguments not used by assistant_mode: {unused}.")
    return width


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Integer ids inside the vocabulary, named when not (torch would fail deep in the embedding)."""
    _reject(
        input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool,
        f"input_ids must hold integer token ids; got dtype {input_ids.dtype}. Pass the tokenizer's ids "
        "(tokenizer(text, return_tensors='pt').input_ids) or cast with .long().",
    )
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"input_ids[{row}, {col}] = {int(input_ids[row, col])} is outside the vocabulary of this model "
            f"(vocab_size={vocab_size}: ids 0..{vocab_size - 1}); encode the prompt with this model's tokenizer."
        )


# Options that select another decoding loop in stock generate, each with what to do instead.
_OTHER_LOOPS = {
    "prompt_lookup_num_tokens": "prompt lookup is stock assisted generation with an n-gram drafter",
    "assistant_early_exit": "early exit is stock assisted generation with a layer-skipping drafter",
    "use_mtp": "multi-token prediction is stock assisted generation with the model's MTP heads",
    "penalty_alpha": "contrastive search is another decoding loop",
    "dola_layers": "DoLa is another decoding loop",
    "constraints": "constrained beam search is another decoding loop",
    "force_words_ids": "constrained beam search is another decoding loop",
    "token_healing": "token healing rewrites the prompt before decoding",
    "prefill_chunk_size": "the prompt is processed in one call",
    "output_scores": "assistant_mode returns sequences and decoding_stats, not per-token scores",
    "output_logits": "assistant_mode returns sequences and decoding_stats, not per-token logits",
    "output_attentions": "assistant_mode does not collect attentions",
    "output_hidden_states": "assistant_mode does not collect hidden states",
}


def check_generation_mode(config: GenerationConfig) -> None:
    """Refuse every `generate` option that would select another decoding loop, or an output we do not
    produce, instead of silently ignoring it or assistant_mode."""
    given = sorted(k for k in _OTHER_LOOPS if getattr(config, k, None) not in (None, False, 0))
    _reject(
        bool(given),
        "Not supported together with assistant_mode: "
        + "; ".join(f"{k}={getattr(config, k)!r} ({_OTHER_LOOPS[k]})" for k in given)
        + ". Drop these options, or drop assistant_mode to use stock generate with them.",
    )
    _reject(
        config.get_generation_mode() not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE),
        f"assistant_mode decodes greedily or by sampling; these options select {config.get_generation_mode()}. "
        "Drop them, or drop assistant_mode.",
    )


class StopSequenceCriteria(StoppingCriteria):
    """Stop once the sequence ends with one of the token-id `stop_sequences` (multi-token end markers)."""

    def __init__(self, stop_sequences):
        self.stop_sequences = [torch.tensor(x, dtype=torch.long) for x in stop_sequences]

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for marker in self.stop_sequences:
            if input_ids.shape[1] >= marker.numel():
                done |= (input_ids[:, -marker.numel():] == marker.to(input_ids.device)).all(dim=1)
        return done


def stopping(config: GenerationConfig, criteria, tokenizer, stop_sequences=None):
    """`stop(sequence) -> bool` from the user's stopping criteria, `stop_sequences`, `stop_strings` and
    `max_time` (EOS and the length limit are the Runner's own, exact, checks), or None when there is
    nothing to ask."""
    checks = StoppingCriteriaList(criteria or [])
    if stop_sequences:
        checks.append(StopSequenceCriteria(stop_sequences))
    if config.stop_strings is not None:
        checks.append(StopStringCriteria(stop_strings=config.stop_strings, tokenizer=tokenizer))
    if config.max_time is not None:
        checks.append(MaxTimeCriteria(max_time=config.max_time))
    if not checks:
        return None
    return lambda sequence: bool(checks(sequence[None], None).any())


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
        return stock_generate(*args, **kwargs)

    _reject(len(args) > 2, "Pass generate options other than the prompt and generation_config as keywords.")
    inputs = args[0] if args else kwargs.pop("inputs", None)
    kwargs.pop("generation_config", None)
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    _reject(input_ids is None, "Pass the prompt ids as the first argument or as input_ids=.")
    _reject(not isinstance(input_ids, torch.Tensor),
            f"input_ids must be a torch tensor of shape (batch, length); got {type(input_ids).__name__}.")
    _reject(bool(kwargs.pop("synced_gpus", None)),
            "synced_gpus is not supported with assistant_mode (one process decodes one sequence).")
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
    schedule_class = fam.schedules[mode]
    # the options this schedule takes, as given (unset ones keep the schedule's own defaults)
    extra = {k: options[k] for k in schedule_class.options if options[k] is not None}
    if fam.any_order:
        extra["verify_order"] = options["verify_order"] or "ltr"
    if "config" in inspect.signature(schedule_class).parameters:
        extra["config"] = decoder.config  # sizes a schedule reads (native: first-hitting times, trained length)
    schedule = schedule_class(width, acceptance, **extra)
    candidates = None if fam.any_order else PackedSSCandidateGenerator(schedule)
    layout = fam.layout(decoder.config.mask_token_id, static_shapes=bool(options["static_shapes"]))
    with torch.inference_mode(), proposal_only_adapters(decoder):
        sequence, stats = decode(model_forward(decoder), schedule, layout, input_ids[0], max(0, max_new), eos,
                                 processors, stop, hooks.get("streamer"),
                                 trace=None if candidates is None else candidates.observe)
    sequences = sequence[None]
    if config.return_dict_in_generate:
        return PackedSSGenerateOutput(sequences=sequences, decoding_stats=stats, candidate_generator=candidates)
    return sequences


class SpeculativeGenerationMixin:
    """Gives a model class the `assistant_mode` front; put it before `GenerationMixin`."""

    def generate(self, *args, **kwargs):
        return speculative_generate(self, super().generate, *args, **kwargs)
