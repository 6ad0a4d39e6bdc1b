"""hf_packed_ss: exact self-speculative decoding (Packed-SS and baselines) for transformers models
with an AR mode and a masked-diffusion mode.

Importing the package registers the bundled model formats with the Auto classes (remote code still
wins for a folder loaded with ``trust_remote_code=True``: see `models/auto.py`).
"""

from . import bundled
from .engine import SCHEDULES, DecodingStats
from .front import PackedSSCandidateGenerator, PackedSSGenerateOutput
from .models import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, SetDLMConfig, SetDLMModel
from .models.auto import register
from .models.release import disable, enable

register()

__version__ = "0.1.0"

__all__ = [
    "SCHEDULES",
    "DecodingStats",
    "NemotronLabsDiffusionConfig",
    "NemotronLabsDiffusionModel",
    "PackedSSCandidateGenerator",
    "PackedSSGenerateOutput",
    "SetDLMConfig",
    "SetDLMModel",
    "bundled",
    "disable",
    "enable",
]
