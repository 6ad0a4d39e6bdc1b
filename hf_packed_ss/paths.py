"""Old import path of `hf_packed_ss.tools.paths`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import paths

sys.modules[__name__] = paths
