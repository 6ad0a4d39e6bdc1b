"""Old import path of the schedules (now `hf_packed_ss.engine.schedules`); one class per mode serves both families."""

from ..engine.schedules import (
    DEFAULT_BRANCHES,
    HYBRID,
    SCHEDULES,
    WINDOW_SCHEDULES,
    ARSchedule,
    LinearSSSchedule,
    NativeSchedule,
    PackedSSSchedule,
    QuadraticSSSchedule,
    Schedule,
    check_branches,
)
from ..engine.schedules import HybridSSSchedule as HybridSSSchedule

BranchedSSSchedule = WindowPackedSSSchedule = PackedSSSchedule  # earlier names
WindowSchedule = Schedule
WindowHybridSSSchedule = HybridSSSchedule

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
    "WindowPackedSSSchedule",
    "WindowSchedule",
    "check_branches",
]
