"""Layouts: how one model family is asked a `CallPlan` (paper appendix D)."""

from .nemotron import NemotronLayout, PackedCall

__all__ = ["NemotronLayout", "PackedCall"]
