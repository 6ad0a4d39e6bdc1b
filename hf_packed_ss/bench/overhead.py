"""Old import path of `hf_packed_ss.tools.bench.overhead`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from ..tools.bench import overhead

if __name__ == "__main__":  # `python -m hf_packed_ss.bench.overhead`
    sys.exit(overhead.main())

sys.modules[__name__] = overhead
