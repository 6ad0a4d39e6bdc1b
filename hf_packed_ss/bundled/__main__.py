"""Rebuild the bundled random checkpoint: ``python -m hf_packed_ss.bundled [path/to/gsm8k/train.jsonl]``."""

import sys
from pathlib import Path

from . import build_random

default = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "train.jsonl"
build_random(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
