"""Old import path of `hf_packed_ss.tools.base_answers`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import base_answers

sys.modules[__name__] = base_answers
