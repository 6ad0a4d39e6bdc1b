"""Old import path of the layouts (now `hf_packed_ss.engine.layouts`), under their model-family names; the old
submodules (`layouts.nemotron`, `layouts.setdlm`, `layouts.mask`) resolve to this module."""

import sys

from ..engine.contract import PackedCall
from ..engine.layouts import SamePositionLayout, ShiftedBlockLayout
from ..engine.layouts.mask import MaskBuffer

NemotronLayout = ShiftedBlockLayout  # appendix D.1
SetDLMLayout = SamePositionLayout  # appendix D.2

for _old in ("nemotron", "setdlm", "mask"):
    sys.modules[f"{__name__}.{_old}"] = sys.modules[__name__]

__all__ = ["MaskBuffer", "NemotronLayout", "PackedCall", "SamePositionLayout", "SetDLMLayout", "ShiftedBlockLayout"]
