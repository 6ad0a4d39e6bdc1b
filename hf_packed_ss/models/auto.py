"""Registration of our model formats with the Auto classes, with remote code winning when asked for.

transformers gives a class registered with `AutoConfig.register` priority over a folder's remote code
(`explicit_local_code` in `AutoConfig.from_pretrained`): after ``import hf_packed_ss``, a released
Nemotron-Labs-Diffusion folder loaded with ``trust_remote_code=True`` would silently become our class and
lose the release's own methods (`ar_generate`, `linear_spec_generate`, its `generate`). A library
registering on import should behave like a built-in class instead: remote code when the user trusts it
and the folder's config has an `auto_map`, our class otherwise. `AutoConfig.from_pretrained` is wrapped
so that, for exactly those calls, our registrations are hidden while transformers resolves the config;
the model class then follows from the config class (`AutoModel` looks models up by config class).
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

import transformers
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .nemotron import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel
from .setdlm import SetDLMConfig, SetDLMModel

FORMATS = {NemotronLabsDiffusionConfig: NemotronLabsDiffusionModel, SetDLMConfig: SetDLMModel}
MODEL_TYPES = {config.model_type for config in FORMATS}
# Serialises config resolution while a registration is hidden, so no other thread sees it missing.
_LOCK = threading.RLock()


def wants_remote_code(name_or_path, kwargs: dict) -> bool:
    """True when `trust_remote_code=True` and the config names one of our model types with remote code."""
    if not kwargs.get("trust_remote_code"):
        return False
    hub = {k: kwargs[k] for k in ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only",
                                  "subfolder") if k in kwargs}
    try:
        config, _ = PreTrainedConfig.get_config_dict(name_or_path, **hub)
    except (OSError, ValueError):
        return False  # transformers' own call reports the problem
    return config.get("model_type") in MODEL_TYPES and "AutoConfig" in (config.get("auto_map") or {})


@contextmanager
def _registrations_hidden():
    hidden = {t: CONFIG_MAPPING._extra_content.pop(t) for t in MODEL_TYPES if t in CONFIG_MAPPING._extra_content}
    try:
        yield
    finally:
        CONFIG_MAPPING._extra_content.update(hidden)


def _remote_code_first(from_pretrained):
    @functools.wraps(from_pretrained)
    def wrapper(cls, pretrained_model_name_or_path, *args, **kwargs):
        with _LOCK:
            if wants_remote_code(pretrained_model_name_or_path, kwargs):
                with _registrations_hidden():
                    return from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs)
            return from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs)

    wrapper._hf_packed_ss_wrapped = True
    return wrapper


def register() -> None:
    """Register both formats with AutoConfig / AutoModel / AutoModelForCausalLM, and name their model classes on
    the `transformers` module (idempotent)."""
    for config, model in FORMATS.items():
        AutoConfig.register(config.model_type, config, exist_ok=True)
        AutoModel.register(config, model, exist_ok=True)
        AutoModelForCausalLM.register(config, model, exist_ok=True)
    for model in FORMATS.values():  # resolvable as `getattr(transformers, config.architectures[0])`, as
        if not hasattr(transformers, model.__name__):  # transformers serve and pipelines look classes up
            setattr(transformers, model.__name__, model)
    if not getattr(AutoConfig.from_pretrained, "_hf_packed_ss_wrapped", False):
        AutoConfig.from_pretrained = classmethod(_remote_code_first(AutoConfig.from_pretrained.__func__))
