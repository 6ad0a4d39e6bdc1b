"""Model formats shipped with hf_packed_ss (registered with the Auto classes on import)."""

from .nemotron import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel

__all__ = ["NemotronLabsDiffusionConfig", "NemotronLabsDiffusionModel"]
