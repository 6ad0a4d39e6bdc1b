"""What `auto` decodes learn about a model on this machine, kept for the process (`engine.width.Measured`): one per
checkpoint, class, device, dtype and CPU thread count, and apart for batches (a batched call costs what every
row in it asks, so its times do not describe one sequence's calls)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..engine.cost import CallCost
from ..engine.policy import AUTO_POLICY, AutoPolicy
from ..engine.width import Measured

_MEASURED: dict[tuple, Measured] = {}
_SOURCES: dict[tuple, str] = {}  # the cost_model file each entry last started from


def decoder_of(model):
    """The model `generate` decodes with: a PEFT model's base (its generate runs the base's), a released model's
    twin."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, "_hf_packed_ss_twin", inner)


def measured_key(model, batched: bool = False) -> tuple:
    name = getattr(model.config, "_name_or_path", "") or id(model)  # a model never saved: this object
    return (name, type(model).__name__, str(model.device), str(model.dtype), torch.get_num_threads(),
            "batch" if batched else "one")


def measured_for(model, batched: bool = False, cost_model: str | Path | None = None,
                 policy: AutoPolicy | None = None) -> Measured:
    """The process's `Measured` for `model`; a `cost_model` file (from `hf-packed-ss probe --cost-model`) replaces
    its call cost when it names another file than the one it last started from; a `policy` other than the one it
    runs by starts it afresh under that one (`docs/experiments/auto_sim.py`)."""
    key = measured_key(model, batched)
    measured = _MEASURED.get(key)
    if measured is None or (policy is not None and measured.policy != policy):
        measured = _MEASURED[key] = Measured.under(policy or AUTO_POLICY)
        _SOURCES.pop(key, None)
    if cost_model is not None and _SOURCES.get(key) != str(cost_model):
        measured.cost = CallCost.load(cost_model, measured.policy)
        _SOURCES[key] = str(cost_model)
    return measured


def forget() -> None:
    """Drop everything measured (tests; a process that moved to another machine state)."""
    _MEASURED.clear()
    _SOURCES.clear()
