"""Old import path of `hf_packed_ss.tools.train`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import train

if __name__ == "__main__":  # `python -m hf_packed_ss.train`
    sys.exit(train.main())

sys.modules[__name__] = train
