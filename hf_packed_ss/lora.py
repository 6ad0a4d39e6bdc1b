"""Old import path: the very module `hf_packed_ss.models.lora` (one object, so patching either patches both)."""

import sys

from .models import lora

sys.modules[__name__] = lora
