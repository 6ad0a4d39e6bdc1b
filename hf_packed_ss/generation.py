"""Old import path (now `hf_packed_ss.front`: families, forward, validation, stopping, generate)."""

from .front import *  # noqa: F403
from .front import __all__ as _front
from .front.generate import _HOOKS, _OPTIONS
from .front.validation import _OTHER_LOOPS, _reject

__all__ = [*_front, "_HOOKS", "_OPTIONS", "_OTHER_LOOPS", "_reject"]
