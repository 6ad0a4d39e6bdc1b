"""Released Nemotron-Labs-Diffusion checkpoints loaded with remote code: `enable(model)`.

The release replaces `generate` with its own decoders and its attention ignores a passed mask in
diffusion mode, so `enable` runs our decoders through a shared-weight twin of our own class.
"""

from __future__ import annotations

import inspect
import types
import warnings

import torch
import transformers
from torch import nn

from ..front.generate import speculative_generate
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
    with torch.device(_rope_device(model)):  # non-persistent rope buffers are not in the state dict
        twin.encoder.rotary_emb = type(twin.encoder.rotary_emb)(config)
    copy_dispatch_hooks(model, twin)
    copy_tensor_parallel_forwards(model, twin)
    return twin.eval()


def copy_tensor_parallel_forwards(model: nn.Module, twin: nn.Module) -> None:
    """Give each module of `twin` the tensor-parallel forward of the same-named module of a sharded `model`.

    Under `from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))` transformers shards a
    module's parameters into DTensors and replaces its `forward` (`TensorParallelLayer.install_forward`) with one
    that turns plain inputs into DTensors and back; the twin shares those DTensors, so it needs the same forwards,
    installed on its own modules with the same style (from the model's public `tp_plan`) and mesh (the DTensor
    parameters' `device_mesh`). The one detail that is not API: a hooked module holds `forward` in its instance
    `__dict__` (pinned by tests/test_tensor_parallel.py, which fails with "mixed torch.Tensor and DTensor" if
    transformers stops doing so)."""
    plan = getattr(model, "tp_plan", None) or {}
    if not plan or (getattr(model, "tp_size", None) or 1) < 2:
        return  # not sharded
    import re

    from torch.distributed.tensor import DTensor
    from transformers.integrations.tensor_parallel import ALL_PARALLEL_STYLES

    rules = [(re.compile(re.escape(k).replace(r"\*", r"\d+") + r"\Z"), style) for k, style in plan.items()]
    for name, module in model.named_modules():
        style = next((style for rule, style in rules if rule.match(name)), None)
        if style is None or "forward" not in vars(module):
            continue  # not in the plan (a parameter rule, or replicated), or transformers left it as it is
        mesh = next((p.device_mesh for p in module.parameters(recurse=False) if isinstance(p, DTensor)), None)
        if mesh is not None:
            ALL_PARALLEL_STYLES[style].install_forward(twin.get_submodule(name), mesh)


def copy_dispatch_hooks(model: nn.Module, twin: nn.Module) -> None:
    """Give each module of `twin` a copy of the accelerate hook of the same-named module of `model`.

    A model dispatched with `device_map` keeps offloaded parameters on the meta device and loads them
    (from CPU memory or disk) in its hooks' `pre_forward`; the twin shares those meta tensors, so it
    needs the same hooks, reading the same offloaded weights (`weights_map`), on its own modules."""
    for name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            from accelerate.hooks import add_hook_to_module

            add_hook_to_module(twin.get_submodule(name), _fresh_hook(hook))


def _fresh_hook(hook):
    """A new hook with the same settings (hooks keep per-module state, so they are never shared)."""
    from accelerate.hooks import AlignDevicesHook, SequentialHook

    if isinstance(hook, SequentialHook):
        return SequentialHook(*(_fresh_hook(h) for h in hook.hooks))
    if type(hook) is AlignDevicesHook:
        return AlignDevicesHook(
            execution_device=hook.execution_device, offload=hook.offload, io_same_device=hook.io_same_device,
            weights_map=hook.weights_map, offload_buffers=hook.offload_buffers,
            place_submodules=hook.place_submodules, skip_keys=hook.skip_keys, tied_params_map=hook.tied_params_map,
        )
    raise ValueError(
        f"enable() cannot run a model dispatched with an accelerate {type(hook).__name__}; load it with a "
        "device_map (accelerate's AlignDevicesHook: GPU, CPU or disk offload) or without one."
    )


def _rope_device(model: nn.Module) -> torch.device:
    """Where the rotary embedding runs: its buffers' device, else its dispatch hook's execution device."""
    rope = getattr(model.encoder, "rotary_emb", None)
    devices = [b.device for b in (rope.buffers() if rope is not None else ()) if b.device.type != "meta"]
    if devices:
        return devices[0]
    for module in (rope, model.encoder, model):
        device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device)
    return model.diffusion_head.weight.device


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
    """Undo `enable`: the model's own `generate` again. Warns when the release's own decoders that this
    hands back cannot run on the installed transformers (see `release_decoders_that_cannot_run`)."""
    if getattr(model, "stock_generate", None) is not None:
        model.generate = model.stock_generate
        del model.stock_generate
        model.__dict__.pop("_hf_packed_ss_twin", None)
        broken = release_decoders_that_cannot_run(model)
        if broken:
            warnings.warn(
                f"On the installed transformers {transformers.__version__}, the release's own decoders cannot run: "
                + "; ".join(f"`{name}` {why}" for name, why in broken.items())
                + ". hf_packed_ss's decoders are unaffected: keep `enable(model)` and call "
                "generate(..., assistant_mode='ar' | 'linear_ss' | 'packed_ss' | ...), or install the transformers "
                "version the release was written for to use its own decoders.",
                UserWarning,
                stacklevel=2,
            )
    return model


def release_decoders_that_cannot_run(model: nn.Module) -> dict[str, str]:
    """The release's decoders (`generate`, `linear_spec_generate`) that fail on the installed transformers,
    each with the reason. The two incompatibilities found by running the release (see docs/design.md) are
    checked as such, not by version number:

    - its own Ministral3 stack (remote code) takes `past_key_values`, which transformers 5.24 renamed to
      `cache` in the stack it builds on, so its forward, and with it its `generate`, raises;
    - its `linear_spec_generate` crops the cache to a positive length, which `DynamicCache.crop` refuses
      since 5.23."""
    if isinstance(model, NemotronLabsDiffusionModel) or not _has_release_structure(model):
        return {}
    from transformers import Ministral3Model

    broken = {}
    stack = type(model.encoder)
    own_stack = not stack.__module__.startswith("transformers.")
    takes = inspect.signature(stack.forward).parameters
    renamed = "cache" in inspect.signature(Ministral3Model.forward).parameters
    if own_stack and renamed and "past_key_values" in takes and "cache" not in takes:
        broken["generate"] = ("raises (its Ministral3 stack takes `past_key_values`, renamed `cache` in "
                              "transformers 5.24)")
    if callable(getattr(model, "linear_spec_generate", None)) and not _crop_to_length_works():
        broken["linear_spec_generate"] = ("raises (it calls DynamicCache.crop with a positive length, refused "
                                          "since transformers 5.23)")
    return broken


def _crop_to_length_works() -> bool:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1), 0)
    try:
        cache.crop(1)
    except ValueError:
        return False
    return cache.get_seq_length() == 1
