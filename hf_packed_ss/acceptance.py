"""Old import path (now `hf_packed_ss.engine.acceptance`)."""

from .engine.acceptance import Acceptance, Greedy, ProposalDistribution, RejectionSampler, probabilities

__all__ = ["Acceptance", "Greedy", "ProposalDistribution", "RejectionSampler", "probabilities"]
