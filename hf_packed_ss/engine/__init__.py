"""The decoding engine: contract (plan, result, verdict), decoder state, the one loop, acceptance, verification
orders, schedules and layouts. It imports no model class and no tool."""

from .acceptance import Acceptance, Greedy, ProposalDistribution, RejectionSampler
from .batch import decode_batch
from .batch_cache import BatchCache, RowCache
from .contract import CallResult, PackedCall, Plan, Proposal, Verdict
from .layouts import SamePositionLayout, ShiftedBlockLayout
from .loop import Forward, Step, decode, decoding
from .schedules import SCHEDULES, WINDOW_SCHEDULES, Schedule
from .state import DecoderState
from .stats import DecodingStats

__all__ = [
    "SCHEDULES",
    "WINDOW_SCHEDULES",
    "Acceptance",
    "BatchCache",
    "CallResult",
    "DecoderState",
    "DecodingStats",
    "Forward",
    "Greedy",
    "PackedCall",
    "Plan",
    "Proposal",
    "ProposalDistribution",
    "RejectionSampler",
    "RowCache",
    "SamePositionLayout",
    "Schedule",
    "ShiftedBlockLayout",
    "Step",
    "Verdict",
    "decode",
    "decode_batch",
    "decoding",
]
