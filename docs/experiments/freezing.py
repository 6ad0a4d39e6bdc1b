"""Does inductor's freezing reach a compiled CPU forward? A bare forward of 1 and 12 rows over a static cache,
compiled twice in one process (two code objects, so two graphs): once with `freezing` only in
`torch.compile(options=...)`, once with it set in inductor's config around each call (`front.forward.InductorOptions`,
what our compiled forwards and the bench's stock+compile do; here forced for any dtype, where the package freezes
bfloat16 and float16 only). Its own bare forward, written before `bench.timing.bare_call` made a code object per
call (it shared one, so dynamo reused the first graph for the second setting). Interleaved medians, one thread.

    python docs/experiments/freezing.py smollm2-135m-drafter bfloat16 15
"""

import sys
import types

import torch
from transformers import StaticCache

from hf_packed_ss.front.forward import InductorOptions
from hf_packed_ss.tools.bench.timing import time_interleaved
from hf_packed_ss.tools.loading import load_model

CAPACITY, CONTEXT = 384, 200


def bare(base, rows: int, options: InductorOptions):
    cache = StaticCache(config=base.config, max_cache_len=CAPACITY)
    columns = torch.arange(CAPACITY)

    def causal(start: int, n: int) -> torch.Tensor:
        return (columns[None] <= torch.arange(start, start + n)[:, None])[None, None]

    def forward(ids, positions, mask, cache):
        return base(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                    past_key_values=cache).logits

    forward = types.FunctionType(forward.__code__.replace(), forward.__globals__, "forward", None, forward.__closure__)
    graph = torch.compile(forward, dynamic=False, options={"freezing": True})
    with torch.inference_mode():
        base(input_ids=torch.randint(1000, (1, CONTEXT)), position_ids=torch.arange(CONTEXT)[None],
             attention_mask=causal(0, CONTEXT), use_cache=True, past_key_values=cache)
    inputs = (torch.randint(1000, (1, rows)), torch.arange(CONTEXT, CONTEXT + rows)[None], causal(CONTEXT, rows), cache)

    def call() -> None:
        with torch.inference_mode(), options:
            graph(*inputs)
            cache.crop(-rows)

    return call


def main() -> None:
    torch.set_num_threads(1)
    name, dtype, iters = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
    model, _ = load_model(name, dtype)
    base = model.get_base_model() if hasattr(model, "get_base_model") else getattr(model, "_hf_packed_ss_twin", model)
    calls = {}
    for label, options in (("options only", InductorOptions(None, dtype)),
                           ("config set", InductorOptions({"options": {"freezing": True}}, torch.bfloat16))):
        for rows in (1, 12):
            calls[label, rows] = call = bare(base, rows, options)
            call()
    for (label, rows), seconds in time_interleaved(calls, iters=iters, warmup=2).items():
        print(f"{label:>12}, {rows:2d} rows: {seconds * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
