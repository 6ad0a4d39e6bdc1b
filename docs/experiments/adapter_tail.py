"""Where the compiled bfloat16 Packed-SS call's cost over AR goes (issue 35): the call of each width timed against
AR and bare forwards (`tools.bench.curve.measure`, one thread, interleaved), with the adapter gated as the package
does (`rows`: a bool row tensor, every row computed), computed on the proposal tail only (`start`: the steady call's
proposal start is constant, rows // 2), or not at all (`noadapter`).

    OMP_NUM_THREADS=1 python docs/experiments/adapter_tail.py rows 40 [MODEL: bundled name or folder] [WIDTHS: 3,4,5]

Measured 2026-12-03 (run one at a time; two side by side share the memory bus): `rows` W = 3 (8 rows) 1.207x AR,
W = 5 (12 rows) 1.436x; `start` 1.210x and 1.483x, so the tail slice saves nothing. The bare forward costs the same
at 1 and 8 rows and steps up ~13% at 10-12 rows: W = 3 sits below that step.
"""
import sys

import torch

from hf_packed_ss.front import forward as fw
from hf_packed_ss.tools.bench.curve import measure
from hf_packed_ss.tools.loading import load_model

torch.set_num_threads(1)
mode = sys.argv[1]
model, tok = load_model(sys.argv[3] if len(sys.argv) > 3 else "smollm2-135m-drafter", torch.bfloat16)
if mode == "noadapter":
    orig = fw._Compiled.compiled
    def compiled(self, *inputs, rows, start):
        return orig(self, *inputs, rows=rows, start=rows)
    fw._Compiled.compiled = compiled
if mode == "start":
    orig = fw._Compiled.compiled
    def compiled(self, *inputs, rows, start):
        gate = getattr(self.model, "_hf_packed_ss_gate", None)
        if gate is None or start >= rows:
            return orig(self, *inputs, rows=rows, start=start)
        gate.start = start
        try:
            with self.options:
                return self.graph(*inputs)
        finally:
            gate.start = None
    fw._Compiled.compiled = compiled
kw = {"backend": "inductor", "dynamic": False, "options": {"freezing": True}, "fullgraph": False}
text = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests.\n" * 8
prompt = tok(text, return_tensors="pt").input_ids[0]
widths = [int(w) for w in sys.argv[4].split(",")] if len(sys.argv) > 4 else [3, 4, 5]
rows = sorted({1, 8, *(2 * w + 2 for w in widths)})  # bare forwards of AR's and each Packed-SS call's rows
r = measure(model, prompt, rows, widths, kw, iters=int(sys.argv[2]) if len(sys.argv) > 2 else 40)
print(mode, r)
ar = r["ar_ms"]
for n, ms in r["packed_ms"].items():
    print(mode, "W", r["packed_widths"][n], "rows", n, f"{ms:.1f} ms  ratio {ms / ar:.3f}",
          f"ar {ar:.1f} bare {r['bare_ms']}")
