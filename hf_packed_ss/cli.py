"""Old import path of `hf_packed_ss.tools.cli`, bound to that module itself: patching an attribute through
either name patches the code that reads it."""

import sys

from .tools import cli

if __name__ == "__main__":  # `python -m hf_packed_ss.cli`
    sys.exit(cli.main())

sys.modules[__name__] = cli
