"""Old import path (now `hf_packed_ss.front.candidates`)."""

from .front.candidates import PackedSSCandidateGenerator

__all__ = ["PackedSSCandidateGenerator"]
