"""Old import path (now `hf_packed_ss.engine.order`)."""

from .engine.order import ORDERS, confidence, ltr

__all__ = ["ORDERS", "confidence", "ltr"]
