"""Old import path: the very module `hf_packed_ss.models.smollm2` (one object, so patching either patches both)."""

import sys

from .models import smollm2

sys.modules[__name__] = smollm2
