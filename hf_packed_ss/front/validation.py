"""Validation of a speculative request: every option, input and `generate` argument that assistant_mode cannot
honour is refused here, once, with a message that says what to do instead (the engine assumes a valid request)."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import GenerationMode

from ..engine.order import ORDERS
from ..engine.schedules import AutoSchedule, PackedSSSchedule
from .families import FAMILIES, MODES, SCHEDULE_OPTIONS, default_width, family, takers

AUTO = AutoSchedule.name  # speculative_width="auto", assistant_mode="auto"


def _reject(condition: bool, message: str) -> None:
    """One line per rule: every refusal is a ValueError whose message says what to do instead."""
    if condition:
        raise ValueError(message)


def validate(model, options: dict, input_ids: torch.Tensor, config: GenerationConfig, model_kwargs: dict,
             hooks: dict) -> int | str:
    """Check a speculative request once, at the front door; returns the speculative width to use ("auto": chosen
    per call).

    Reads its arguments only (model_kwargs included), so checking a request never changes it."""
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
    _reject(width == AUTO and mode not in (PackedSSSchedule.name, AUTO),
            f"speculative_width='auto' picks Packed-SS widths (and, with assistant_mode='auto', AR too); "
            f"assistant_mode={mode!r} takes an integer width: use assistant_mode='packed_ss' or 'auto', or pass "
            "an integer.")
    auto = width == AUTO or mode == AUTO
    _reject(auto and config.cache_implementation == "static",
            "speculative_width='auto' / assistant_mode='auto' change the call's rows from one call to the next; "
            "a static cache pads every call to one compiled shape, so there is nothing to choose: pass an integer "
            "speculative_width and a fixed assistant_mode with cache_implementation='static'.")
    _reject(auto and options["verify_order"] not in (None, "ltr"),
            "The auto width's acceptance model follows left-to-right verification: drop verify_order (or pass "
            "'ltr'), or pick a fixed width and mode for verify_order='confidence'.")
    _reject(options["cost_model"] is not None and not auto,
            "cost_model= is read by speculative_width='auto' / assistant_mode='auto' only: drop it.")
    _reject(options["cost_model"] is not None and not isinstance(options["cost_model"], (str, PathLike)),
            "cost_model= takes the path of a file `hf-packed-ss probe --cost-model FILE` wrote.")
    _reject(options["cost_model"] is not None and not Path(options["cost_model"]).is_file(),
            f"cost_model={str(options['cost_model'])!r} is not a file: write one with `hf-packed-ss probe --model "
            "MODEL --cost-model FILE`, or drop it (auto then measures the cost in its first calls).")
    if width == AUTO or (mode == AUTO and width is None):
        width = AUTO
    else:
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
    _reject(input_ids.shape[1] == 0, "The prompt is empty: pass at least one token (e.g. the BOS token).")
    check_token_ids(input_ids, model.config.get_text_config().vocab_size)
    _reject(
        config.num_beams != 1 or (config.num_return_sequences or 1) != 1,
        "assistant_mode decodes one sequence per prompt: num_beams and num_return_sequences must be 1 (for "
        "several samples of a prompt, repeat it in the batch: input_ids.repeat(n, 1), with do_sample=True).",
    )
    check_generation_mode(config)
    _reject(
        config.guidance_scale not in (None, 1, 1.0),
        "guidance_scale needs extra model calls per token and is not supported with assistant_mode.",
    )
    mask = model_kwargs.get("attention_mask")  # read only: generate drops it after validation
    _reject(
        mask is not None and mask.dim() != 2,
        "generate takes a 2D attention_mask (batch, length); the packed 4D masks are built by hf_packed_ss itself.",
    )
    if mask is not None and mask.dim() == 2:
        check_padding(mask, input_ids)
    streamer = hooks.get("streamer")
    per_row = isinstance(streamer, list | tuple)
    _reject(
        input_ids.shape[0] > 1 and streamer is not None and not per_row,
        "A streamer takes one sequence (as transformers' TextStreamer): to stream a batch with assistant_mode, "
        "pass streamer=[one streamer (or None) per row].",
    )
    _reject(
        per_row and len(streamer) != input_ids.shape[0],
        f"streamer= is a list of {len(streamer) if per_row else 0} streamers for a batch of {input_ids.shape[0]} "
        "rows: pass one streamer (or None) per row.",
    )
    admit = hooks.get("admit")
    _reject(admit is not None and not callable(admit),
            "admit= takes a callable that returns the rows joining the running batch: a list of (input_ids (1D), "
            "max_new_tokens, streamer or None).")
    size = hooks.get("max_batch_size")
    _reject(size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < input_ids.shape[0]),
            f"max_batch_size={size!r}: the most rows a batch holds at once, an int of at least the batch's "
            f"{input_ids.shape[0]} rows.")
    lengthwise = [k for k in ("min_new_tokens", "min_length", "forced_eos_token_id") if getattr(config, k, None)]
    _reject(admit is not None and bool(lengthwise),
            f"{lengthwise} count from the batch's prompt length, which a row that joins (admit=) does not share: "
            "drop them, or decode those prompts in a batch of their own.")
    can_end_early = config.eos_token_id is not None or bool(hooks.get("stopping_criteria")) or any(
        x is not None for x in (config.stop_strings, options["stop_sequences"], config.max_time))
    _reject(
        input_ids.shape[0] > 1 and config.pad_token_id is None and can_end_early,
        "A batch whose rows can end early needs pad_token_id (they are padded with it): pass generate(..., "
        "pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id).",
    )
    _reject(
        hooks.get("assistant_model") is not None,
        "assistant_model and assistant_mode both name a drafter: the diffusion mode of the model drafts with "
        "assistant_mode, so drop assistant_model (or drop assistant_mode for stock assisted decoding).",
    )
    _reject(
        config.cache_implementation not in (None, "dynamic", "static"),
        f"cache_implementation={config.cache_implementation!r} is not supported with assistant_mode: use 'dynamic' "
        "(the default) or 'static' (fixed slots, one compiled graph with compile_config).",
    )
    _reject(
        config.stop_strings is not None and hooks.get("tokenizer") is None,
        "stop_strings needs the model's tokenizer: pass generate(..., tokenizer=tokenizer).",
    )
    unused = sorted(k for k, v in model_kwargs.items() if v is not None and k not in ("use_cache", "attention_mask"))
    _reject(bool(unused), f"generate arguments not used by assistant_mode: {unused}.")
    return width


def check_padding(mask: torch.Tensor, input_ids: torch.Tensor) -> None:
    """A 2D 0/1 mask of the prompt's shape, padded on the left only (stock generate warns about right
    padding and then decodes it wrongly), with at least one token per row."""
    _reject(tuple(mask.shape) != tuple(input_ids.shape),
            f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}: pass the mask "
            "the tokenizer returned with these ids.")
    _reject(bool(((mask != 0) & (mask != 1)).any()), "attention_mask must hold 0 (padding) and 1 (token) only.")
    _reject(bool((mask.sum(dim=-1) == 0).any()),
            "A row of attention_mask is all padding: every prompt needs at least one token.")
    right = (mask[:, 1:].long() < mask[:, :-1].long()).any(dim=-1)  # a 1 followed by a 0
    if bool(right.any()):
        row = int(right.nonzero()[0])
        raise ValueError(
            f"Row {row} of the batch is right-padded (attention_mask has padding after tokens). Decoder-only "
            "models continue from the last token: pad on the left, e.g. tokenizer.padding_side = 'left' before "
            "tokenizer(prompts, padding=True).")


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
