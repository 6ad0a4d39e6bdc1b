#!/usr/bin/env python
"""The schedules race: `python demo/app.py [--model NAME_OR_FOLDER] [--port 7860]` (same as `hf-packed-ss demo`).

A thin launcher; the app lives in `hf_packed_ss/demo.py`. Needs `pip install -e ".[demo]"`.
"""

import sys
from pathlib import Path

try:
    from hf_packed_ss.demo import main
except ModuleNotFoundError as err:  # run from a checkout without `pip install -e .`
    if err.name != "hf_packed_ss":
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hf_packed_ss.demo import main

if __name__ == "__main__":
    sys.exit(main())
