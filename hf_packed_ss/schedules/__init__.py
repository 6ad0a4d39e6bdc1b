"""Decoding schedules, by `assistant_mode` name: prefix schedules (Nemotron layout) and any-order window
schedules (SetDLM layout)."""

from .any_order import WINDOW_SCHEDULES, NativeSchedule, WindowHybridSSSchedule, WindowSchedule
from .ar import ARSchedule
from .base import Schedule
from .linear_ss import LinearSSSchedule
from .packed_ss import (
    DEFAULT_BRANCHES,
    HYBRID,
    BranchedSSSchedule,
    HybridSSSchedule,
    PackedSSSchedule,
    QuadraticSSSchedule,
    check_branches,
)

SCHEDULES: dict[str, type[Schedule]] = {
    s.name: s for s in (ARSchedule, LinearSSSchedule, QuadraticSSSchedule, PackedSSSchedule, HybridSSSchedule)
}

__all__ = [
    "DEFAULT_BRANCHES",
    "HYBRID",
    "SCHEDULES",
    "WINDOW_SCHEDULES",
    "ARSchedule",
    "BranchedSSSchedule",
    "HybridSSSchedule",
    "LinearSSSchedule",
    "NativeSchedule",
    "PackedSSSchedule",
    "QuadraticSSSchedule",
    "Schedule",
    "WindowHybridSSSchedule",
    "WindowSchedule",
    "check_branches",
]
