"""Old import path of the benchmark, now `hf_packed_ss.tools.bench`.

Each submodule here (`hf_packed_ss.bench.measure`, ...) is bound to the moved module itself, so code and tests
that import or patch the old names reach the code that runs; `python -m hf_packed_ss.bench` still runs the bench.
"""

from ..tools.bench import main

__all__ = ["main"]
