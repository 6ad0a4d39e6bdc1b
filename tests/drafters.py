"""Test helpers: a streamer that records what it gets, and a test drafter: a layout wrapper whose
proposal predictions come from a known continuation, right with a chosen probability. The engine must
stay exact whatever the drafter says; a good drafter makes it take the long-acceptance and mid-block-EOS
paths that a random model's drafter never reaches."""

from __future__ import annotations

import torch
from transformers.generation.streamers import BaseStreamer

from hf_packed_ss.engine import SamePositionLayout, ShiftedBlockLayout
from hf_packed_ss.engine.contract import CallResult


class Oracle:
    """Replaces the drafter logits of every proposal by a one-hot on `continuation[pos - start]`
    (probability `accuracy`) or on a random token; verifier logits are the model's own. Mixed into a layout."""

    def __init__(self, mask_token_id: int, vocab: int, continuation: list[int], start: int, accuracy: float, seed=0,
                 static_shapes: bool = False):
        super().__init__(mask_token_id, static_shapes)
        self.vocab, self.continuation, self.start, self.accuracy = vocab, continuation, start, accuracy
        self.gen = torch.Generator().manual_seed(seed)

    def _tokens(self, positions: torch.Tensor) -> torch.Tensor:
        k = positions - self.start
        known = (k >= 0) & (k < len(self.continuation))
        right = known & (torch.rand(k.shape, generator=self.gen) < self.accuracy)
        noise = torch.randint(self.vocab, k.shape, generator=self.gen)
        truth = torch.tensor(self.continuation + [0])[k.clamp(0, len(self.continuation))]
        return torch.where(right, truth, noise)

    steady_call = None  # its proposals are the oracle's, which no steady template holds: rows run their own loops

    def build(self, plan, state):
        call = super().build(plan, state)
        read = call.read

        def oracle_read(logits: torch.Tensor) -> CallResult:
            result = read(logits)
            for ranks, block in zip(result.proposal_ranks, result.proposals, strict=True):
                tokens = self._tokens(torch.tensor([state.origin + plan.position(r) for r in ranks], dtype=torch.long))
                block.fill_(-1.0)
                block[torch.arange(block.shape[0]), tokens] = 1.0
            return result

        call.read = oracle_read
        return call


class OracleLayout(Oracle, ShiftedBlockLayout):
    """The oracle drafter on the shifted-block layout (Nemotron format)."""


class OracleSamePositionLayout(Oracle, SamePositionLayout):
    """The oracle drafter on the same-position layout (SetDLM format)."""


class Collect(BaseStreamer):
    """A streamer that keeps every `put` (the first is the prompt) and whether `end` was called."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True
