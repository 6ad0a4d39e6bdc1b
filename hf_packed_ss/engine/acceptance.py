"""Acceptance: how draft tokens are proposed, how many survive verification, and which verifier token
follows them. Pure tensor code shared by every schedule.

Two policies with one interface (`propose`, `verify`):

* `Greedy` — argmax drafts, prefix match (paper section 3.1, eq. 2-3).
* `RejectionSampler` — drafts sampled from the drafter's processed distribution Q, which is *stored*
  with each draft token; verification accepts d with probability min(1, p(d) / Q(d)), the first
  rejection draws a correction from the normalised positive part of p - Q, full acceptance draws a
  bonus from p (section 3.2, Algorithm 2, proof in appendix B.2). Variable names follow the paper:
  p = verifier (AR mode), Q = stored proposal distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """Softmax in float32 or better (half-precision logits are upcast; float64 stays float64)."""
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    return logits.softmax(dim=-1)


@dataclass
class ProposalDistribution:
    """Q for each draft position: dense ``probs`` of shape ``(n, V)``, or sparse after top-k / top-p
    truncation, ``probs`` and ``index`` of shape ``(n, m)`` with m the largest support (zeros pad the
    shorter rows), so memory per draft token does not grow with the vocabulary."""

    probs: torch.Tensor
    index: torch.Tensor | None
    vocab: int

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> ProposalDistribution:
        probs = probabilities(logits)
        support = int((probs > 0).sum(dim=-1).max()) if len(probs) else 0
        if support > probs.shape[-1] // 2 or not len(probs):
            return cls(probs, None, probs.shape[-1])
        top, index = probs.topk(support, dim=-1)
        return cls(top, index, probs.shape[-1])

    def __getitem__(self, rows: slice) -> ProposalDistribution:
        return ProposalDistribution(self.probs[rows], None if self.index is None else self.index[rows], self.vocab)

    def __len__(self) -> int:
        return self.probs.shape[0]

    def sample(self, generator: torch.Generator | None) -> torch.Tensor:
        """Draw one token per row (Algorithm 2, line 12)."""
        picks = torch.multinomial(self.probs, 1, generator=generator)
        return (picks if self.index is None else self.index.gather(-1, picks)).squeeze(-1)

    def prob(self, tokens: torch.Tensor) -> torch.Tensor:
        """Q_i(tokens_i) for each row i."""
        if self.index is None:
            return self.probs.gather(-1, tokens[:, None]).squeeze(-1)
        return (self.probs * (self.index == tokens[:, None])).sum(dim=-1)

    def dense(self, row: int) -> torch.Tensor:
        """Row `row` as a ``(V,)`` vector (only the correction needs it)."""
        if self.index is None:
            return self.probs[row]
        return torch.zeros(self.vocab, dtype=self.probs.dtype, device=self.probs.device).scatter(
            0, self.index[row], self.probs[row]
        )


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row (argmax's rule: the first maximum; NaN counts as the maximum), as fast as the CPU
    allows: most of a greedy call's own time on a large vocabulary or batch. `max(dim).indices` runs about 3x
    faster than `argmax`; on a large input a two-level search is faster again (about 2x): the first chunk of
    `chunk` logits holding the maximum (`amax` per chunk, which vectorises), then the first maximum inside it."""
    if logits.numel() < 2**16:
        return logits.max(dim=-1).indices
    vocab = logits.shape[-1]
    chunk = next((c for c in (128, 256, 64, 32) if vocab % c == 0), None)
    if chunk is None:
        return logits.max(dim=-1).indices
    chunks = logits.unflatten(-1, (vocab // chunk, chunk))
    which = chunks.amax(dim=-1).max(dim=-1).indices  # the first chunk holding the maximum
    inner = chunks.gather(-2, which[..., None, None].expand(*which.shape, 1, chunk)).squeeze(-2)
    return which * chunk + inner.max(dim=-1).indices


def greedy_prefix(draft: torch.Tensor, verified: torch.Tensor, kappa: torch.Tensor | None = None) -> torch.Tensor:
    """Algorithm 1, line 5 under greedy decoding, for a batch of rows: h_b, how many leading tokens of row b's draft
    the verifier's own tokens reproduce (the draft's first `kappa_b` count; all of them without `kappa`). The one
    greedy acceptance: `Greedy` asks it for one row, the lockstep batch for all of them, on the device.

    Args:
        draft (`torch.LongTensor` of shape `(B, K)`): the draft tokens d^(1..K) of each row.
        verified (`torch.LongTensor` of shape `(B, >= K)`): the verifier's argmax at ranks 0.., row r given P and
            d^(<r).
        kappa (`torch.LongTensor` of shape `(B,)`, optional): each row's draft length (the rest is padding).
    Returns:
        `torch.LongTensor` of shape `(B,)`: h_b. E.g. draft [[5, 6, 7]], verified [[5, 6, 2, 9]]: [2].
    """
    k = draft.shape[1]
    match = draft == verified[:, :k]
    if kappa is not None:
        match &= torch.arange(k, device=draft.device)[None] < kappa[:, None]
    return match.long().cumprod(dim=1).sum(dim=1)


class Greedy:
    """Temperature-0 acceptance: the stored proposal collapses to its draft token (section 3.2)."""

    def propose(self, logits: torch.Tensor) -> tuple[torch.Tensor, None]:
        return greedy_tokens(logits), None

    def verify(self, draft: torch.Tensor, q: None, logits: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Algorithm 1, lines 5-6. `logits` ``(k + 1, V)``: row i scores draft position i + 1.

        Returns d^(1..h) followed by v^(h+1) (correction or bonus), on the host, and h. Without a bonus row
        (``k`` rows: an any-order window whose every position has a draft) a full match returns d alone."""
        values, _, h = self.decide(draft, q, logits)
        return values, h

    def decide(self, draft: torch.Tensor, q: None, logits: torch.Tensor) -> tuple[torch.Tensor, list[int], int]:
        """`verify` with the tokens both on the device and as a host list: one host sync for h and the tokens."""
        verified = greedy_tokens(logits)
        if not draft.numel():
            return verified[:1], verified[:1].tolist(), 0
        both = torch.cat([greedy_prefix(draft[None], verified[None]), verified]).tolist()  # the one sync
        h, tokens = both[0], both[1:]
        return verified[: h + 1], tokens[: h + 1], h


class RejectionSampler:
    """Speculative rejection sampling against the stored Q (Algorithm 2, lines 5-8)."""

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def propose(self, logits: torch.Tensor) -> tuple[torch.Tensor, ProposalDistribution]:
        q = ProposalDistribution.from_logits(logits)
        return q.sample(self.generator), q

    def verify(self, draft: torch.Tensor, q: ProposalDistribution | None, logits: torch.Tensor):
        p = probabilities(logits)  # (k + 1, V)
        k = draft.numel()
        h = 0
        if k:
            ratio = p[torch.arange(k), draft] / q.prob(draft).to(p.dtype)  # Q(d) > 0: d was drawn from Q
            u = torch.rand(k, generator=self.generator, dtype=p.dtype, device=p.device)
            h = int((u < ratio).cumprod(dim=0).sum())  # u < min(1, ratio) == u < ratio as u < 1
        if h == k == logits.shape[0]:
            return draft, h  # any-order window fully accepted: no bonus row (appendix C, A_t = u_t)
        if h < k:
            residual = (p[h] - q.dense(h).to(p.dtype)).clamp_min(0)
            # Rejection implies p(d) < Q(d), so the residual has mass; rounding could still zero it.
            target = residual if residual.sum() > 0 else p[h]
        else:
            target = p[k]  # bonus
        token = torch.multinomial(target, 1, generator=self.generator)
        return torch.cat([draft[:h], token]), h

    def decide(self, draft: torch.Tensor, q: ProposalDistribution | None, logits: torch.Tensor):
        """`verify` with the tokens both on the device and as a host list."""
        values, h = self.verify(draft, q, logits)
        return values, values.tolist(), h


Acceptance = Greedy | RejectionSampler
