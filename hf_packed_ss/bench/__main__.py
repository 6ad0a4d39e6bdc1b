"""`python -m hf_packed_ss.bench`: the same as `hf-packed-ss bench`."""

import sys

from .command import main

sys.exit(main())
