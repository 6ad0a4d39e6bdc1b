"""hf_packed_ss: exact self-speculative decoding (Packed-SS and baselines) for transformers models
with an AR mode and a masked-diffusion mode.

Importing the package registers the bundled model formats with the Auto classes.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .candidates import PackedSSCandidateGenerator
from .generation import PackedSSGenerateOutput
from .models import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, SetDLMConfig, SetDLMModel
from .models.release import disable, enable
from .schedules import SCHEDULES
from .stats import DecodingStats

AutoConfig.register(NemotronLabsDiffusionConfig.model_type, NemotronLabsDiffusionConfig, exist_ok=True)
AutoModel.register(NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, exist_ok=True)
AutoModelForCausalLM.register(NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, exist_ok=True)
AutoConfig.register(SetDLMConfig.model_type, SetDLMConfig, exist_ok=True)
AutoModel.register(SetDLMConfig, SetDLMModel, exist_ok=True)
AutoModelForCausalLM.register(SetDLMConfig, SetDLMModel, exist_ok=True)

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
    "disable",
    "enable",
]
