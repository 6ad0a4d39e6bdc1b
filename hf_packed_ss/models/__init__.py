"""Model formats shipped with hf_packed_ss (registered with the Auto classes on import)."""

from .nemotron import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel
from .setdlm import SetDLMConfig, SetDLMModel

__all__ = ["NemotronLabsDiffusionConfig", "NemotronLabsDiffusionModel", "SetDLMConfig", "SetDLMModel"]
