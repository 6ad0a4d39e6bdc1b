"""Layouts: how one model family is asked a plan (paper appendix D)."""

from .nemotron import NemotronLayout, PackedCall
from .setdlm import SetDLMLayout

__all__ = ["NemotronLayout", "PackedCall", "SetDLMLayout"]
