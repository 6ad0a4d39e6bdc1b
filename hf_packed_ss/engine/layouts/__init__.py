"""Layouts: how one model family is asked a plan (paper appendix D)."""

from .same_position import SamePositionLayout
from .shifted_block import ShiftedBlockLayout

__all__ = ["SamePositionLayout", "ShiftedBlockLayout"]
