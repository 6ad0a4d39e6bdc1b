"""Stopping criteria: the user's transformers criteria, folded into the one `stop(sequence)` check the engine asks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import GenerationConfig, MaxTimeCriteria, StoppingCriteria, StoppingCriteriaList, StopStringCriteria


class StopSequenceCriteria(StoppingCriteria):
    """Stop once the sequence ends with one of the token-id `stop_sequences` (multi-token end markers)."""

    def __init__(self, stop_sequences: Sequence[Sequence[int]]):
        self.stop_sequences = [torch.tensor(x, dtype=torch.long) for x in stop_sequences]

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for marker in self.stop_sequences:
            if input_ids.shape[1] >= marker.numel():
                done |= (input_ids[:, -marker.numel():] == marker.to(input_ids.device)).all(dim=1)
        return done


def stopping(config: GenerationConfig, criteria: Sequence[StoppingCriteria] | None, tokenizer,
             stop_sequences: Sequence[Sequence[int]] | None = None) -> Callable[[torch.Tensor], bool] | None:
    """`stop(sequence) -> bool` from the user's stopping criteria, `stop_sequences`, `stop_strings` and
    `max_time` (EOS and the length limit are the Runner's own, exact, checks), or None when there is
    nothing to ask."""
    checks = StoppingCriteriaList(criteria or [])
    if stop_sequences:
        checks.append(StopSequenceCriteria(stop_sequences))
    if config.stop_strings is not None:
        checks.append(StopStringCriteria(stop_strings=config.stop_strings, tokenizer=tokenizer))
    if config.max_time is not None:
        checks.append(MaxTimeCriteria(max_time=config.max_time))
    if not checks:
        return None
    return lambda sequence: bool(checks(sequence[None], None).any())
