"""Old import path of `hf_packed_ss.tools.bench.readme`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from ..tools.bench import readme

if __name__ == "__main__":  # `python -m hf_packed_ss.bench.readme`
    sys.exit(readme.main())

sys.modules[__name__] = readme
