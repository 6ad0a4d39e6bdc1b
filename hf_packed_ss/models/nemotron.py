"""The Nemotron-Labs-Diffusion format: a Ministral3 decoder stack (`encoder`) plus one bias-free
`diffusion_head` shared by the AR mode and the diffusion mode.

Names follow the public release (``nvidia/Nemotron-Labs-Diffusion-*``) so that its state dict and
config load here. One deliberate difference: a plain ``model(input_ids)`` is the *causal* AR mode
(row i predicts token i+1), which is what stock ``generate`` and every exactness test compare against.
The diffusion mode is reached by passing an explicit 4D boolean ``attention_mask`` (True = attend) and
explicit ``position_ids``; a mask row's logit then predicts the token at that row's own position.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Ministral3Config, Ministral3Model
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..modeling import keep_rows, mask_for_backend
from .base import DualModeModel


class NemotronLabsDiffusionConfig(Ministral3Config):
    """Ministral3 backbone fields plus the diffusion fields of the release.

    Args:
        mask_token_id: id of the MASK token whose rows the diffusion mode fills.
        block_size: diffusion block size B the model was trained with; speculative width W <= B - 1.
        dlm_paradigm: attention inside a diffusion block ("bidirectional" in the release).
        dlm_loss_weight, ar_loss_weight: weights of the joint training objective.
    """

    model_type = "nemotron_labs_diffusion"
    # The release's plans (its configuration_nemotron_labs_diffusion.py, "for base model `Ministral`"), relative
    # to the `encoder`: `from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))` shards them
    # (transformers adds the vocabulary-sharded `embed_tokens`).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    mask_token_id: int | None = 100
    block_size: int = 32
    dlm_paradigm: str = "bidirectional"
    dlm_loss_weight: float | None = None
    ar_loss_weight: float = 1.0
    dp_varying_mask_ratio: bool = False


class NemotronLabsDiffusionModel(DualModeModel):
    """`encoder` (Ministral3 stack) + `diffusion_head` (hidden -> vocab, no bias, untied)."""

    config_class = NemotronLabsDiffusionConfig
    base_model_prefix = "encoder"
    head_name = "diffusion_head"
    # Under tensor parallelism the head is split over the vocabulary and its logits gathered (exact: a concat), as
    # transformers does for Ministral3ForCausalLM's lm_head; the release leaves its head whole on every rank.
    _tp_plan = {"diffusion_head": "colwise_gather_output"}
    _no_split_modules = ["Ministral3DecoderLayer"]

    def __init__(self, config: NemotronLabsDiffusionConfig):
        super().__init__(config)
        self._build(Ministral3Model(config), nn.Linear(config.hidden_size, config.vocab_size, bias=False))

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
        """Causal AR forward by default; a 4D boolean `attention_mask` selects any packed layout.

        `cache` is transformers' 5.24 name for `past_key_values` (both accepted).
        `logits_to_keep` follows transformers: an int keeps the last that many rows (0 = all), a 1D
        tensor keeps those row indices, so long prompts never pay for unused vocabulary projections.
        """
        if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.dtype == torch.bool:
            attention_mask = mask_for_backend(attention_mask, self.config, self.dtype)
        out = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{self._cache_kw: cache if cache is not None else past_key_values},
            **kwargs,
        )
        hidden = out.last_hidden_state
        logits = self.diffusion_head(keep_rows(hidden, logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        new_cache = getattr(out, self._cache_kw, None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{self._cache_kw: new_cache})

