"""Released Nemotron-Labs-Diffusion checkpoints loaded with remote code: `enable(model)`.

The release replaces `generate` with its own decoders and its attention ignores a passed mask in
diffusion mode, so `enable` runs our decoders through a shared-weight twin of our own class.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from ..generation import speculative_generate
from .nemotron import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel


def shared_weight_twin(model: nn.Module) -> NemotronLabsDiffusionModel:
    """Our class over the *same parameter tensors* as a model of the released structure
    (`encoder` Ministral3 stack + `diffusion_head`), e.g. one loaded with ``trust_remote_code=True``.

    The released attention ignores any mask in its diffusion mode and builds its own causal mask in
    its AR mode, so the packed 4D-mask call runs through transformers' Ministral3 stack instead;
    no weight is copied (construction happens on the meta device, then parameters are assigned).
    """
    if isinstance(model, NemotronLabsDiffusionModel):
        return model
    fields = {k: v for k, v in model.config.to_dict().items() if k not in ("model_type", "auto_map", "architectures")}
    config = NemotronLabsDiffusionConfig.from_dict(fields)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        twin = NemotronLabsDiffusionModel(config)
    twin.load_state_dict(model.state_dict(keep_vars=True), assign=True, strict=True)
    device = model.diffusion_head.weight.device
    with torch.device(device):  # non-persistent rope buffers are not in the state dict
        twin.encoder.rotary_emb = type(twin.encoder.rotary_emb)(config)
    return twin.eval()


def attach_twin(model: nn.Module) -> nn.Module:
    """Give a model of the released structure the shared-weight twin our decoders call (idempotent;
    nothing to do for our own classes). Does not touch `generate`."""
    if isinstance(model, NemotronLabsDiffusionModel) or getattr(model, "_hf_packed_ss_twin", None) is not None:
        return model
    if not _has_release_structure(model):
        raise ValueError(
            f"{type(model).__name__} does not have the Nemotron-Labs-Diffusion structure (`encoder` + "
            "`diffusion_head`); load the checkpoint with AutoModel.from_pretrained(..., trust_remote_code=True)."
        )
    # not a registered submodule: the twin must not appear in the model's state dict or parameters
    object.__setattr__(model, "_hf_packed_ss_twin", shared_weight_twin(model))
    return model


def _has_release_structure(model: nn.Module) -> bool:
    return hasattr(model, "encoder") and isinstance(getattr(model, "diffusion_head", None), nn.Linear)


def enable(model: nn.Module) -> nn.Module:
    """Give `model` the ``generate(..., assistant_mode=..., speculative_width=...)`` front.

    `model` has the release's structure (`encoder` + `diffusion_head`, config with `mask_token_id`
    and `block_size`; run through a shared-weight twin), or is any causal LM whose config carries
    `mask_token_id` and `block_size` and whose MASK rows draft (e.g. with a proposal-only LoRA).
    Without `assistant_mode`, `generate` is the model's own (the release's `generate(prompt_ids,
    max_new_tokens, block_length, ...)`), also reachable as `model.stock_generate`; `disable(model)`
    puts it back. Returns the same model.
    """
    if getattr(model, "stock_generate", None) is not None:
        return model
    if _has_release_structure(model) or not hasattr(getattr(model, "config", None), "block_size"):
        attach_twin(model)
    original = model.generate
    model.stock_generate = original

    def generate(self, *args, **kwargs):
        return speculative_generate(self, original, *args, **kwargs)

    model.generate = types.MethodType(generate, model)
    return model


def disable(model: nn.Module) -> nn.Module:
    """Undo `enable`: the model's own `generate` again."""
    if getattr(model, "stock_generate", None) is not None:
        model.generate = model.stock_generate
        del model.stock_generate
        model.__dict__.pop("_hf_packed_ss_twin", None)
    return model
