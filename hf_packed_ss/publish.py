"""Old import path of `hf_packed_ss.tools.publish`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import publish

sys.modules[__name__] = publish
