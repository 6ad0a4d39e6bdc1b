"""What both model formats share: a transformers decoder stack plus one output head, the
`assistant_mode` front, and the usual embedding accessors."""

from __future__ import annotations

from torch import nn
from transformers import GenerationMixin, PreTrainedModel

from ..front.generate import SpeculativeGenerationMixin
from ..modeling import cache_keyword


class DualModeModel(SpeculativeGenerationMixin, PreTrainedModel, GenerationMixin):
    """A stack (attribute named by `base_model_prefix`) and a head (named by `head_name`), built by
    `_build(stack, head)` in the subclass constructor."""

    head_name = "lm_head"
    _supports_sdpa = True
    _supports_attention_backend = True
    supports_gradient_checkpointing = True

    def _build(self, stack: nn.Module, head: nn.Module) -> None:
        setattr(self, self.base_model_prefix, stack)
        setattr(self, self.head_name, head)
        self._cache_kw = cache_keyword(stack)  # transformers 5.24 renamed past_key_values to cache
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return getattr(self, self.base_model_prefix).embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        getattr(self, self.base_model_prefix).embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return getattr(self, self.head_name)

    def set_output_embeddings(self, value: nn.Module) -> None:
        setattr(self, self.head_name, value)
