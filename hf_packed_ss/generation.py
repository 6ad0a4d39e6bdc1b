"""Old import path (now `hf_packed_ss.front`: families, forward, validation, stopping, generate)."""

from .front.candidates import PackedSSCandidateGenerator
from .front.families import FAMILIES, MODES, PREFIX, SCHEDULE_OPTIONS, Family, default_width, family, takers
from .front.forward import model_forward
from .front.generate import (
    _HOOKS,
    _OPTIONS,
    PackedSSGenerateOutput,
    SpeculativeGenerationMixin,
    length_defaults,
    new_token_budget,
    speculative_generate,
)
from .front.stopping import StopSequenceCriteria, stopping
from .front.validation import _OTHER_LOOPS, _reject, check_generation_mode, check_token_ids, validate

__all__ = [
    "FAMILIES",
    "MODES",
    "PREFIX",
    "SCHEDULE_OPTIONS",
    "_HOOKS",
    "_OPTIONS",
    "_OTHER_LOOPS",
    "Family",
    "PackedSSCandidateGenerator",
    "PackedSSGenerateOutput",
    "SpeculativeGenerationMixin",
    "StopSequenceCriteria",
    "_reject",
    "check_generation_mode",
    "check_token_ids",
    "default_width",
    "family",
    "length_defaults",
    "model_forward",
    "new_token_budget",
    "speculative_generate",
    "stopping",
    "takers",
    "validate",
]
