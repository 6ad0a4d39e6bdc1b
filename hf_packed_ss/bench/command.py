"""Old import path of `hf_packed_ss.tools.bench.command`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from ..tools.bench import command

sys.modules[__name__] = command
