"""Model formats shipped with hf_packed_ss (registered with the Auto classes on import of hf_packed_ss), and the
proposal-only drafter pieces (`lora`, `smollm2`).

The format classes load on first access: the formats import the front (`base.py`), and the front imports
`models.lora`, so importing this package must not import the formats."""

from __future__ import annotations

import importlib

_FORMATS = {
    "NemotronLabsDiffusionConfig": "nemotron",
    "NemotronLabsDiffusionModel": "nemotron",
    "SetDLMConfig": "setdlm",
    "SetDLMModel": "setdlm",
}

__all__ = ["NemotronLabsDiffusionConfig", "NemotronLabsDiffusionModel", "SetDLMConfig", "SetDLMModel"]


def __getattr__(name: str):
    """A format class, importing its module on first use (PEP 562)."""
    if name in _FORMATS:
        return getattr(importlib.import_module(f".{_FORMATS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
