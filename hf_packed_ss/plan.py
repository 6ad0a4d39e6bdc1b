"""Old import path of the schedule/layout contract (now `hf_packed_ss.engine.contract`)."""

from .engine.contract import CallResult, PackedCall, Plan, Proposal, Verdict

CallPlan = WindowPlan = Plan  # the two plan types are one

__all__ = ["CallPlan", "CallResult", "PackedCall", "Plan", "Proposal", "Verdict", "WindowPlan"]
