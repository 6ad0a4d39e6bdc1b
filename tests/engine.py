"""The one decoder factory of the engine tests: a schedule, the layout of a model's format and its forward,
driven by the engine's one loop, with the loop's trace hook (no monkeypatching of the engine)."""

from __future__ import annotations

import torch

from hf_packed_ss.engine import SCHEDULES, WINDOW_SCHEDULES, SamePositionLayout, ShiftedBlockLayout, Step
from hf_packed_ss.engine import decode as engine_decode
from hf_packed_ss.front import model_forward


def any_order(model) -> bool:
    return model.config.model_type == "setdlm"


def layout_for(model, static: bool = False):
    """The layout of `model`'s format: same-position (SetDLM) or shifted-block (every other)."""
    kind = SamePositionLayout if any_order(model) else ShiftedBlockLayout
    return kind(model.config.mask_token_id, static_shapes=static)


def schedule_for(model, mode: str, width: int, acceptance=None, order: str = "ltr", **options):
    table = WINDOW_SCHEDULES if any_order(model) else SCHEDULES
    return table[mode](width, acceptance, order, **options)


def decode(model, schedule, prompt, length: int, *, forward=None, layout=None, static: bool = False, eos=(),
           processors=None, stop=None, streamer=None, trace=None) -> tuple[torch.Tensor, object]:
    """Decode `prompt` (1D) with `schedule` on `model` (or on `forward` + `layout` without a model); returns the
    engine's (sequence, stats)."""
    forward = model_forward(model) if forward is None else forward
    layout = layout_for(model, static) if layout is None else layout
    with torch.no_grad():
        return engine_decode(forward, schedule, layout, torch.as_tensor(prompt), length, eos, processors, stop,
                             streamer, trace=trace)


class Trace(list):
    """The loop's trace hook: keeps every `Step` (plan, call, logits, result, verdict)."""

    def __call__(self, step: Step) -> None:
        self.append(step)
