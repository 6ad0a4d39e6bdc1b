"""Decoding schedules, by `assistant_mode` name."""

from .ar import ARSchedule
from .base import Schedule
from .linear_ss import LinearSSSchedule
from .packed_ss import BranchedSSSchedule, PackedSSSchedule, QuadraticSSSchedule

SCHEDULES: dict[str, type[Schedule]] = {
    s.name: s for s in (ARSchedule, LinearSSSchedule, QuadraticSSSchedule, PackedSSSchedule)
}

__all__ = [
    "SCHEDULES",
    "ARSchedule",
    "BranchedSSSchedule",
    "LinearSSSchedule",
    "PackedSSSchedule",
    "QuadraticSSSchedule",
    "Schedule",
]
