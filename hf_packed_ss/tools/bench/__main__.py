"""`python -m hf_packed_ss.tools.bench`: `hf-packed-ss bench`."""

import sys

from .command import main

sys.exit(main())
