"""Old import path of `hf_packed_ss.tools.quality`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import quality

if __name__ == "__main__":  # `python -m hf_packed_ss.quality`
    sys.exit(quality.main())

sys.modules[__name__] = quality
