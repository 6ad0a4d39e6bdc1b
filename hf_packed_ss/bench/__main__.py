"""`python -m hf_packed_ss.bench` (the old path): the same as `hf-packed-ss bench`."""

import sys

from ..tools.bench.command import main

sys.exit(main())
