"""Decoding schedules, by `assistant_mode` name: prefix schedules (Nemotron layout) and any-order window
schedules (SetDLM layout)."""

from .any_order import WINDOW_SCHEDULES, NativeSchedule, WindowSchedule
from .ar import ARSchedule
from .base import Schedule
from .linear_ss import LinearSSSchedule
from .packed_ss import BranchedSSSchedule, PackedSSSchedule, QuadraticSSSchedule

SCHEDULES: dict[str, type[Schedule]] = {
    s.name: s for s in (ARSchedule, LinearSSSchedule, QuadraticSSSchedule, PackedSSSchedule)
}

__all__ = [
    "SCHEDULES",
    "WINDOW_SCHEDULES",
    "ARSchedule",
    "BranchedSSSchedule",
    "LinearSSSchedule",
    "NativeSchedule",
    "PackedSSSchedule",
    "QuadraticSSSchedule",
    "Schedule",
    "WindowSchedule",
]
