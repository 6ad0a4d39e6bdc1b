"""`python -m hf_packed_ss.tools.bench` (or the old `python -m hf_packed_ss.bench`): `hf-packed-ss bench`."""

import sys

from .command import main

sys.exit(main())
