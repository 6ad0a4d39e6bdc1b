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

from ..modeling import keep_rows, mask_for_backend
from .base import DualModeModel


class SetDLMConfig(Qwen3Config):
    """Qwen3 backbone fields plus the any-order fields.

    Args:
        mask_token_id: id of the MASK token (`<|fim_middle|>` for Qwen tokenizers in the release).
        max_block_size: training horizon S_max (``smaxN`` in checkpoint names; 2 x the set size d);
            the matching active window is W = S_max / 2, and W <= S_max is enforced.
        block_size: sequence length the model was trained on.
    """

    model_type = "setdlm"

    mask_token_id: int | None = None
    max_block_size: int = 16
    block_size: int = 1024


class SetDLMModel(DualModeModel):
    """`model` (Qwen3 stack) + `lm_head` (hidden -> vocab, no AR shift at MASK rows)."""

    config_class = SetDLMConfig
    base_model_prefix = "model"
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
        """AR mode through duplicate masks: input [x_0..x_{n-1} | MASK at positions 1..n] after the cache."""
        if input_ids is None:
            raise ValueError("SetDLMModel's AR mode needs input_ids (it appends MASK rows to them).")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("SetDLMModel does not support padded batches: pass unpadded prompts one at a time.")
        batch, n = input_ids.shape
        device = input_ids.device
        past = cache.get_seq_length() if cache is not None else 0
        ids = torch.cat([input_ids, torch.full_like(input_ids, self.config.mask_token_id)], dim=1)
        positions = past + torch.arange(n, device=device)
        positions = torch.cat([positions, positions + 1])[None].expand(batch, -1)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        new = torch.cat([
            torch.cat([causal, torch.zeros(n, n, dtype=torch.bool, device=device)], dim=1),  # tokens: causal
            torch.cat([causal, torch.eye(n, dtype=torch.bool, device=device)], dim=1),  # MASK j: tokens <= j, itself
        ])
        mask = torch.cat([torch.ones(2 * n, past, dtype=torch.bool, device=device), new], dim=1)
        mask = mask[None, None].expand(batch, 1, -1, -1)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask_for_backend(mask, self.config, self.dtype),
            use_cache=use_cache, **{self._cache_kw: cache}, **kwargs,
        )
        new_cache = getattr(out, self._cache_kw, None)
        if use_cache and new_cache is not None:
            new_cache.crop(-n)  # MASK rows never stay in the cache
        logits = self._logits(keep_rows(out.last_hidden_state[:, n:], logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{self._cache_kw: new_cache})


# A released `kuleshov-group/setdlm-*` folder (class SetDLM(BD3LM), config BD3LMConfig, model_type "bd3lm")
# stores a Qwen3ForCausalLM under `backbone.model`; these regexes rename its keys to ours on load.
RELEASE_KEY_MAPPING = {r"^backbone\.model\.model\.": "model.", r"^backbone\.model\.lm_head\.": "lm_head."}


def config_from_release(release: dict, backbone: Qwen3Config, name: str = "") -> SetDLMConfig:
    """Our config for a released SetDLM folder.

    The release's config.json does not hold the Qwen3 sizes (its `backbone_config` names the base model,
    e.g. Qwen/Qwen3-1.7B-Base), so pass that base model's `Qwen3Config` as `backbone`. The MASK id is
    `mask_token_id` (top level or `tokenization_config`); the horizon follows the release loader:
    `noise_config.max_block_size` when it is below `block_size`, else twice the set size d from
    `noise_config.desired_block_size` or the folder name (`smaxN` -> d = N/2), capped at `block_size`."""
    noise = release.get("noise_config") or {}
    block = int(noise.get("block_size") or release.get("block_size") or release.get("length") or 1024)
    mask = release.get("mask_token_id", (release.get("tokenization_config") or {}).get("mask_token_id"))
    if mask is None:
        raise ValueError("The release config has no mask_token_id: pass the id of <|fim_middle|> in the config.")
    horizon = noise.get("max_block_size")
    if not horizon or horizon >= block:
        d = noise.get("desired_block_size")
        match = re.search(r"smax(\d+)", name)
        if (not d or d == 1) and match:
            d = int(match.group(1)) // 2
        if not d or d == 1:
            raise ValueError(f"Cannot tell the set size of {name!r}: pass max_block_size (smaxN -> N).")
        horizon = min(2 * int(d), block)
    fields = {**backbone.to_dict(), "mask_token_id": int(mask), "max_block_size": int(horizon), "block_size": block}
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        fields.pop(key, None)
    return SetDLMConfig(**fields)


def load_release(path: str | Path, backbone: Qwen3Config, **kwargs) -> SetDLMModel:
    """Load a released SetDLM checkpoint folder (local; nothing is downloaded) into `SetDLMModel`."""
    path = Path(path)
    release = json.loads((path / "config.json").read_text())
    config = config_from_release(release, backbone, path.name)
    return SetDLMModel.from_pretrained(path, config=config, key_mapping=RELEASE_KEY_MAPPING, **kwargs)
