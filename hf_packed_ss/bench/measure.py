"""Old import path of `hf_packed_ss.tools.bench.measure`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from ..tools.bench import measure

sys.modules[__name__] = measure
