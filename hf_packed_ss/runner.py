"""Old import path of the decoding loop (now `hf_packed_ss.engine.loop.decode`, one loop for both families)."""

from __future__ import annotations

from .engine.loop import Forward, call_model, decode, stream

__all__ = ["Forward", "call_model", "run", "run_any_order", "stream"]


def run(forward, schedule, layout, prompt, max_new_tokens, eos_token_ids=(), processors=None, stop=None,
        streamer=None, cache=None, candidates=None):
    """`decode`, telling `candidates` (a `PackedSSCandidateGenerator`, optional) every verification."""
    trace = None if candidates is None else candidates.observe
    return decode(forward, schedule, layout, prompt, max_new_tokens, eos_token_ids, processors, stop, streamer,
                  cache, trace)


run_any_order = run
