"""The SetDLM format: an any-order model on a Qwen3 backbone (Arriola & Kuleshov, "Set Diffusion").

Training duplicates every position: a token copy and a MASK copy share the position id; a MASK row
sees the clean tokens earlier in the generation order and itself, and its logit scores the token at
its *own* position (no AR shift). With the left-to-right order the MASK at position i is an AR
predictor of token i given tokens < i; with only a prefix revealed, MASK rows are a parallel
(diffusion) drafter. The MASK token's own logit is -inf, as in the release.

A plain ``model(input_ids)`` is the left-to-right AR mode in the usual causal-LM convention (row i
scores token i + 1): it appends one MASK per token (position + 1) to the input, reads their logits
and keeps only the token rows in the KV cache, so stock ``generate`` is the exactness reference. An
explicit 4D boolean ``attention_mask`` with ``position_ids`` runs any packed layout (appendix D.2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3Model
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..engine.static import slot_mask
from ..modeling import keep_rows, mask_for_backend
from .base import DualModeModel


class SetDLMConfig(Qwen3Config):
    """Qwen3 backbone fields plus the any-order fields.

    Args:
        mask_token_id: id of the MASK token (`<|fim_middle|>` for Qwen tokenizers in the release).
        max_block_size: training horizon S_max (``smaxN`` in checkpoint names; 2 x the set size d);
            the matching active window is W = S_max / 2, and W <= S_max is enforced.
        block_size: sequence length the model was trained on.
        desired_block_size: the set size d of the release's StaggeredNoise schedule (``tgtN`` / ``dN`` in run
            names); None means ``max_block_size // 2``. Read only by ``native_cache_order="first_hitting"``.
        noise_k, noise_b: explicit ``k`` / ``b`` of that schedule when the release config sets them (None:
            derived from the sizes, as StaggeredNoise does).
    """

    model_type = "setdlm"

    mask_token_id: int | None = None
    max_block_size: int = 16
    block_size: int = 1024
    desired_block_size: int | None = None
    noise_k: float | None = None
    noise_b: float | None = None


class SetDLMModel(DualModeModel):
    """`model` (Qwen3 stack) + `lm_head` (hidden -> vocab, no AR shift at MASK rows)."""

    config_class = SetDLMConfig
    base_model_prefix = "model"
    # Tensor parallelism: Qwen3Config's base_model_tp_plan for the stack, and the head split over the vocabulary
    # with its logits gathered (exact: a concat), as Qwen3ForCausalLM's lm_head.
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _no_split_modules = ["Qwen3DecoderLayer"]

    def __init__(self, config: SetDLMConfig):
        super().__init__(config)
        self._build(Qwen3Model(config), nn.Linear(config.hidden_size, config.vocab_size, bias=False))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.config.mask_token_id is not None:
            logits = logits.index_fill(-1, torch.tensor([self.config.mask_token_id], device=logits.device), -torch.inf)
        return logits

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values=None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Left-to-right AR logits by default; a 4D boolean `attention_mask` runs a packed layout
        whose MASK rows score their own positions. `cache` is 5.24's name for `past_key_values`."""
        cache = cache if cache is not None else past_key_values
        if isinstance(attention_mask, dict):  # stock generate's per-layer-type causal masks (a static cache): they
            attention_mask = None  # cover the token rows only, and the AR mode lays out its own duplicate masks
        if attention_mask is not None and attention_mask.dim() == 4:
            out = self.model(
                input_ids=input_ids, inputs_embeds=inputs_embeds, position_ids=position_ids, use_cache=use_cache,
                attention_mask=mask_for_backend(attention_mask, self.config, self.dtype), **{self._cache_kw: cache},
                **kwargs,
            )
            logits = self._logits(keep_rows(out.last_hidden_state, logits_to_keep))
            return CausalLMOutputWithPast(logits=logits, **{self._cache_kw: getattr(out, self._cache_kw, None)})
        return self._causal_forward(input_ids, attention_mask, cache, labels, use_cache, logits_to_keep, **kwargs)

    def _causal_forward(self, input_ids, attention_mask, cache, labels, use_cache, logits_to_keep, **kwargs):
        """AR mode through duplicate masks: input [x_0..x_{n-1} | MASK at positions n-k+1..n] after the cache, one
        MASK row per kept logit (an int `logits_to_keep` = k keeps the last k; otherwise every position's)."""
        if input_ids is None:
            raise ValueError("SetDLMModel's AR mode needs input_ids (it appends MASK rows to them).")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("SetDLMModel does not support padded batches: pass unpadded prompts one at a time.")
        batch, n = input_ids.shape
        k = min(logits_to_keep, n) if isinstance(logits_to_keep, int) and logits_to_keep > 0 else n
        device = input_ids.device
        past = cache.get_seq_length() if cache is not None else 0  # a device scalar for a static cache
        ids = torch.cat([input_ids, torch.full_like(input_ids[:, n - k :], self.config.mask_token_id)], dim=1)
        positions = past + torch.arange(n, device=device)
        positions = torch.cat([positions, positions[n - k :] + 1])[None].expand(batch, -1)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        new = torch.cat([
            torch.cat([causal, torch.zeros(n, k, dtype=torch.bool, device=device)], dim=1),  # tokens: causal
            torch.cat([causal[n - k :], torch.eye(k, dtype=torch.bool, device=device)], dim=1),  # MASK j: <= j, itself
        ])
        slots = cache.get_max_length() if cache is not None and getattr(cache, "layers", True) else -1  # no layer yet
        if slots > 0:  # a static cache (stock generate's, compiled): its every slot, the new rows at slot `past`
            mask = slot_mask(new, torch.as_tensor(past, device=device), torch.arange(slots, device=device))
        else:
            mask = torch.cat([torch.ones(n + k, past, dtype=torch.bool, device=device), new], dim=1)
        mask = mask[None, None].expand(batch, 1, -1, -1)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask_for_backend(mask, self.config, self.dtype),
            use_cache=use_cache, **{self._cache_kw: cache}, **kwargs,
        )
        new_cache = getattr(out, self._cache_kw, None)
        if use_cache and new_cache is not None:
            new_cache.crop(-k)  # MASK rows never stay in the cache
        hidden = out.last_hidden_state[:, n:]
        logits = self._logits(hidden if k < n or isinstance(logits_to_keep, int) else keep_rows(hidden, logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{self._cache_kw: new_cache})

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size,
                                      max_cache_length):
        """Stock `generate`'s cache, with room in a static one for the MASK rows the AR mode writes after a call's
        tokens before dropping them (one per kept logit: the last token's, or every candidate's)."""
        drafted = max(generation_config.prompt_lookup_num_tokens or 0, generation_config.num_assistant_tokens or 0)
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size,
                                                     max_cache_length + 2 * drafted + 2)


# A released `kuleshov-group/setdlm-*` folder (class SetDLM(BD3LM), config BD3LMConfig, model_type "bd3lm")
# stores a Qwen3ForCausalLM under `backbone.model`; these regexes rename its keys to ours on load.
RELEASE_KEY_MAPPING = {r"^backbone\.model\.model\.": "model.", r"^backbone\.model\.lm_head\.": "lm_head."}


def _int(value) -> int | None:
    """The release loader's `_coerce_int`: None, "", "none" and "null" (and non-numbers) mean unset."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none", "null"}):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none", "null"}):
        return None
    return float(value)


def _first(*values) -> int | None:
    return next((v for v in map(_int, values) if v is not None), None)


def _set_size_from_name(name: str) -> int | None:
    """The set size d a release run name spells (the release's `_infer_setdlm_desired_block_size`): a
    ``dN`` or else ``tgtN`` token gives d = N, else ``smaxN`` gives d = N // 2; tokens are delimited by
    non-alphanumerics and matched in the lower-cased name."""
    name = name.lower()
    for pattern in (r"(?:^|[^a-z0-9])d(\d+)(?:$|[^a-z0-9])", r"(?:^|[^a-z0-9])tgt(\d+)(?:$|[^a-z0-9])"):
        if match := re.search(pattern, name):
            return int(match.group(1))
    match = re.search(r"(?:^|[^a-z0-9])smax(\d+)(?:$|[^a-z0-9])", name)
    return int(match.group(1)) // 2 if match else None


def config_from_release(release: dict, backbone: Qwen3Config, name: str = "", *, max_block_size: int | None = None,
                        desired_block_size: int | None = None) -> SetDLMConfig:
    """Our config for a released SetDLM folder.

    The release's config.json does not hold the Qwen3 sizes (its `backbone_config` names the base model,
    e.g. Qwen/Qwen3-1.7B-Base), so pass that base model's `Qwen3Config` as `backbone`. The MASK id is
    `mask_token_id` (top level or `tokenization_config`). `name` is the checkpoint's name or path as the
    release loader sees it (its regexes run over the whole string).

    The sizes follow the release loader (`_build_setdlm_staggered_noise_schedule`), first match wins:
    - `block_size`: `noise_config.block_size`, `eval_block_size`, `block_size`, `length` (default 1024);
    - the set size d: the `desired_block_size` argument, `noise_config.desired_block_size` (1, the
      StaggeredNoise default, counts as a value), the name (`dN`, `tgtN`, `smaxN` -> N // 2), `block_size`;
    - `max_block_size`: the `max_block_size` argument; `noise_config.max_block_size` if below
      `block_size`; else `min(2 d, block_size)`.
    The arguments play the release's explicit overrides (`model_config_overrides.noise_config.*`; its
    environment variables are not read)."""
    noise = release.get("noise_config") or {}
    mask = release.get("mask_token_id", (release.get("tokenization_config") or {}).get("mask_token_id"))
    if mask is None:
        raise ValueError("The release config has no mask_token_id: pass the id of <|fim_middle|> in the config.")
    length = _first(noise.get("length"), release.get("length"), 1024)
    block = _first(noise.get("block_size"), release.get("eval_block_size"), release.get("block_size"), length)
    d = _first(desired_block_size, noise.get("desired_block_size"), _set_size_from_name(name), block)
    configured = _int(noise.get("max_block_size"))
    if max_block_size is not None:
        horizon = _int(max_block_size)
    elif configured is not None and configured < block:
        horizon = configured
    else:  # "exported HF SetDLM configs can contain max_block_size == length" (release loader)
        horizon = min(2 * d, block)
    if horizon is None or not 1 <= horizon <= block or d < 1:
        raise ValueError(f"max_block_size={horizon} (set size {d}) must be in [1, block_size={block}]: pass "
                         "max_block_size= (smaxN -> N) or desired_block_size= (dN / tgtN -> N).")
    fields = {**backbone.to_dict(), "mask_token_id": int(mask), "max_block_size": horizon, "block_size": block,
              "desired_block_size": d, "noise_k": _float(noise.get("k")), "noise_b": _float(noise.get("b"))}
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        fields.pop(key, None)
    return SetDLMConfig(**fields)


def load_release(path: str | Path, backbone: Qwen3Config, *, max_block_size: int | None = None,
                 desired_block_size: int | None = None, **kwargs) -> SetDLMModel:
    """Load a released SetDLM checkpoint folder (local; nothing is downloaded) into `SetDLMModel`.
    The sizes are derived from its config and path as in `config_from_release`."""
    release = json.loads((Path(path) / "config.json").read_text())
    config = config_from_release(release, backbone, str(path), max_block_size=max_block_size,
                                 desired_block_size=desired_block_size)
    return SetDLMModel.from_pretrained(path, config=config, key_mapping=RELEASE_KEY_MAPPING, **kwargs)
