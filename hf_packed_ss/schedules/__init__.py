"""Old import path of the schedules (now `hf_packed_ss.engine.schedules`): one class per mode serves both
families, so the any-order `Window*` classes are the same classes. The old submodules (`schedules.base`,
`.ar`, `.linear_ss`, `.packed_ss`, `.any_order`) resolve to this module."""

import sys

from ..engine.schedules import (
    DEFAULT_BRANCHES,
    HYBRID,
    NATIVE_CACHE_ORDERS,
    NATIVE_CONTEXTS,
    SCHEDULES,
    WINDOW_SCHEDULES,
    ARSchedule,
    Draft,
    FirstHittingTimes,
    HybridSSSchedule,
    LinearSSSchedule,
    NativeSchedule,
    PackedSSSchedule,
    QuadraticSSSchedule,
    Schedule,
    check_branches,
)

BranchedSSSchedule = WindowPackedSSSchedule = PackedSSSchedule
WindowSchedule = Schedule
WindowARSchedule = ARSchedule
WindowLinearSSSchedule = LinearSSSchedule
WindowQuadraticSSSchedule = QuadraticSSSchedule
WindowHybridSSSchedule = HybridSSSchedule

for _old in ("base", "ar", "linear_ss", "packed_ss", "any_order"):
    sys.modules[f"{__name__}.{_old}"] = sys.modules[__name__]

__all__ = [
    "DEFAULT_BRANCHES",
    "HYBRID",
    "NATIVE_CACHE_ORDERS",
    "NATIVE_CONTEXTS",
    "SCHEDULES",
    "WINDOW_SCHEDULES",
    "ARSchedule",
    "BranchedSSSchedule",
    "Draft",
    "FirstHittingTimes",
    "HybridSSSchedule",
    "LinearSSSchedule",
    "NativeSchedule",
    "PackedSSSchedule",
    "QuadraticSSSchedule",
    "Schedule",
    "WindowARSchedule",
    "WindowHybridSSSchedule",
    "WindowLinearSSSchedule",
    "WindowPackedSSSchedule",
    "WindowQuadraticSSSchedule",
    "WindowSchedule",
    "check_branches",
]
