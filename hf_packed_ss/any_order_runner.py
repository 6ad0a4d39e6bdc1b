"""Old import path of the any-order loop: the same loop serves both families (`hf_packed_ss.engine.loop`)."""

from .engine.loop import crop_left
from .runner import run_any_order

__all__ = ["crop_left", "run_any_order"]
