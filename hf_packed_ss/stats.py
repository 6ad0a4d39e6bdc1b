"""Old import path (now `hf_packed_ss.engine.stats`)."""

from .engine.stats import DecodingStats

__all__ = ["DecodingStats"]
