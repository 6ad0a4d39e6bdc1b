"""Old import path of the layouts (now `hf_packed_ss.engine.layouts`), under their model-family names."""

from ..engine.contract import PackedCall
from ..engine.layouts import SamePositionLayout, ShiftedBlockLayout

NemotronLayout = ShiftedBlockLayout  # appendix D.1
SetDLMLayout = SamePositionLayout  # appendix D.2

__all__ = ["NemotronLayout", "PackedCall", "SamePositionLayout", "SetDLMLayout", "ShiftedBlockLayout"]
