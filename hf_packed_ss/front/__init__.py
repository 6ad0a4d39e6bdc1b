"""The Hugging Face front: ``model.generate(..., assistant_mode=..., speculative_width=...)``.

One job per module: `families` (which engine decodes a model), `validation` (refusals, once, at the front door),
`stopping` (the user's criteria as one check), `forward` (engine calls to model calls), `candidates` (the draft
through transformers' `CandidateGenerator` interface) and `generate` (option precedence, then `engine.decode`)."""

from .candidates import PackedSSCandidateGenerator
from .families import FAMILIES, MODES, PREFIX, SCHEDULE_OPTIONS, Family, default_width, family, takers
from .forward import model_forward
from .generate import (
    PackedSSGenerateOutput,
    SpeculativeGenerationMixin,
    check_generate,
    length_defaults,
    new_token_budget,
    speculative_generate,
)
from .stopping import StopSequenceCriteria, stopping
from .validation import check_generation_mode, check_token_ids, validate

__all__ = [
    "FAMILIES",
    "MODES",
    "PREFIX",
    "SCHEDULE_OPTIONS",
    "Family",
    "PackedSSCandidateGenerator",
    "PackedSSGenerateOutput",
    "SpeculativeGenerationMixin",
    "StopSequenceCriteria",
    "check_generation_mode",
    "check_token_ids",
    "default_width",
    "family",
    "length_defaults",
    "model_forward",
    "new_token_budget",
    "speculative_generate",
    "check_generate",
    "stopping",
    "takers",
    "validate",
]
