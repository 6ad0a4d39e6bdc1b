"""Acceptance: how many draft tokens survive verification, and which verifier token follows them.

Pure functions on tensors, shared by every schedule (paper section 3.1, eq. 2).
"""

from __future__ import annotations

import torch


def greedy_accept(draft: torch.Tensor, verifier_logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Greedy left-to-right verification (Algorithm 1, lines 5-6).

    Args:
        draft (`torch.LongTensor` of shape `(k,)`): draft tokens d^(1..k).
        verifier_logits (`torch.Tensor` of shape `(k + 1, V)`): row i scores position i + 1.

    Returns:
        accepted (`torch.LongTensor` of shape `(h + 1,)`): d^(1..h) followed by v^(h+1), the
        correction after the first mismatch or the bonus after full acceptance; and h.
    """
    verified = verifier_logits.argmax(dim=-1)
    k = draft.numel()
    h = int((draft == verified[:k]).cumprod(dim=0).sum()) if k else 0
    return verified[: h + 1], h
