"""The Runner: the one decoding loop that drives every schedule on every layout.

It owns the verified prefix P and the KV cache, calls the model, applies the user's logits processors
to verifier and proposal rows, commits the cache (P minus its last token after every call, appendix
D.1), stops exactly at the first accepted EOS or at
``max_new_tokens`` even inside a block (Algorithm 1, lines 7-8), and counts NFE, rows and time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from transformers import DynamicCache

from .candidates import PackedSSCandidateGenerator
from .layouts.nemotron import NemotronLayout, PackedCall
from .plan import CallPlan, CallResult
from .schedules.base import Schedule
from .stats import DecodingStats

# forward(call, cache) -> (r, V) logits of the call's kept rows (`call.logit_rows`)
Forward = Callable[[PackedCall, DynamicCache], torch.Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_model(forward: Forward, call: PackedCall, cache: DynamicCache, stats: DecodingStats) -> torch.Tensor:
    """One counted, device-synchronised model call (NFE, rows, model time)."""
    tic = time.perf_counter()
    logits = forward(call, cache)
    _sync(logits.device)
    stats.model_time_s += time.perf_counter() - tic
    stats.nfe += 1
    stats.rows_per_call.append(call.rows)
    return logits


def provenance(h: int, n_draft: int, n: int) -> list[str]:
    """How each of an iteration's first `n` accepted tokens was produced: "draft" (an accepted draft
    token), then "correction" (the verifier's token after a rejection), "bonus" (after the whole draft
    was accepted) or "verifier" (no draft: AR, or Linear-SS's prefill)."""
    last = "verifier" if n_draft == 0 else "bonus" if h == n_draft else "correction"
    return (["draft"] * h + [last])[:n]


def stream(streamer, tokens: torch.Tensor, kinds: list[str]) -> None:
    """Streamers get `put(tokens)`; one that defines `put_iteration(tokens, kinds)` also gets provenance."""
    if hasattr(streamer, "put_iteration"):
        streamer.put_iteration(tokens.cpu(), kinds)
    else:
        streamer.put(tokens.cpu())


class Sequence:
    """The verified prefix P in a buffer with room after it, so that P + (tokens after it) is a view: the ids a
    logits processor or a stopping criterion sees cost no copy of P, however long it is."""

    def __init__(self, prompt: torch.Tensor, room: int):
        self.buffer = torch.cat([prompt, prompt.new_zeros(room)])
        self.n = prompt.numel()

    @property
    def prefix(self) -> torch.Tensor:
        return self.buffer[: self.n]

    def with_tail(self, tokens: torch.Tensor) -> torch.Tensor:
        """Write `tokens` after P (not appended: P is unchanged) and return the buffer; P + tokens[:i] is
        ``buffer[: n + i]``."""
        end = self.n + tokens.numel()
        if end > self.buffer.numel():
            self.buffer = torch.cat([self.buffer, self.buffer.new_zeros(end)])
        self.buffer[self.n : end] = tokens
        return self.buffer

    def append(self, tokens: torch.Tensor) -> None:
        self.with_tail(tokens)
        self.n += tokens.numel()


def process(processors, result: CallResult, plan: CallPlan, sequence: Sequence) -> CallResult:
    """Apply a `LogitsProcessorList` exactly as stock `generate` would at each position.

    Verifier row i is processed with the ids it conditions on (P + d^(1..i-1)), so input-dependent
    processors (repetition penalty, min length, ...) give the AR mode's target distribution. Proposal
    rows are processed with their context; any processing of Q keeps exactness, since each draft token
    is verified against the Q it was drawn from.
    """
    if not processors:
        return result
    n, ids = sequence.n, sequence.with_tail(plan.draft.to(sequence.buffer.device))  # ids[: n + i] = P + d^(<=i)
    verifier = None
    if result.verifier is not None:
        verifier = torch.cat([processors(ids[None, : n + i], row[None]) for i, row in enumerate(result.verifier)])
    proposals = []
    for p, logits in zip(plan.proposals, result.proposals, strict=True):
        proposals.append(processors(ids[: n + p.branch].expand(logits.shape[0], -1), logits))
    return CallResult(verifier=verifier, proposals=proposals)


def _truncate(accepted: torch.Tensor, sequence: Sequence, eos: frozenset[int], remaining: int, stop):
    """Algorithm 1, lines 7-8: keep C_t up to a = min(A_t, L - emitted, first EOS, first stop).

    Returns the kept tokens and whether decoding ends here."""
    tokens = accepted.tolist()
    a = min(len(tokens), remaining)
    a = next((i + 1 for i, tok in enumerate(tokens[:a]) if tok in eos), a)
    stopped = a < len(tokens) or tokens[a - 1] in eos
    if stop is not None:  # asked after every token, as stock generate asks its criteria
        n, ids = sequence.n, sequence.with_tail(accepted)
        hit = next((i for i in range(1, a + 1) if stop(ids[: n + i])), None)
        if hit is not None:
            a, stopped = hit, True
    return accepted[:a], stopped


def run(
    forward: Forward,
    schedule: Schedule,
    layout: NemotronLayout,
    prompt: torch.Tensor,
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    processors=None,
    stop: Callable[[torch.Tensor], bool] | None = None,
    streamer=None,
    cache: DynamicCache | None = None,
    candidates: PackedSSCandidateGenerator | None = None,
) -> tuple[torch.Tensor, DecodingStats]:
    """Decode one sequence. `prompt` is a 1D LongTensor; returns (P_final as 1D tensor, stats).

    `processors` is a transformers `LogitsProcessorList` (or None); sampling vs greedy is the
    schedule's acceptance policy. `stop(sequence)` is asked after every accepted token, as stock
    `generate` asks its stopping criteria after every token, so a stop inside an accepted block cuts
    the block exactly there. `streamer` gets the prompt, then each iteration's surviving tokens.
    `candidates` (made here when not given) is told the outcome of every verification."""
    candidates = PackedSSCandidateGenerator(schedule) if candidates is None else candidates
    eos = frozenset(int(e) for e in eos_token_ids)
    stats = DecodingStats(schedule=schedule.name, width=schedule.width if schedule.speculative else 0,
                          speculative_branches=getattr(schedule, "speculative_branches", None))
    device = prompt.device
    sequence = Sequence(prompt, max_new_tokens + 2 * (schedule.width + 1))
    cache = DynamicCache() if cache is None else cache
    cache_len = 0
    start = time.perf_counter()
    _sync(device)
    if streamer is not None:
        streamer.put(prompt.cpu())
    while stats.new_tokens < max_new_tokens:
        # 1. ask: the schedule plans the call, the layout lays it out
        plan = schedule.plan()
        call = layout.build(plan, sequence.prefix, cache_len)
        # 2. one model call
        logits = call_model(forward, call, cache, stats)

        # 3. verify and draft: the schedule advances from the (processed) predictions
        result = process(processors, call.read(logits), plan, sequence)
        accepted = schedule.advance(plan, result)
        n_draft_accepted = None if accepted is None else accepted.numel() - 1
        if accepted is not None:
            candidates.update_candidate_strategy(sequence.prefix[None], result.verifier[None], n_draft_accepted)
        # 4. commit the cache: P minus its last token (cacheable rows come first: one crop)
        keep = call.rows_to_cache(n_draft_accepted)
        cache.crop(keep - call.rows)
        cache_len += keep
        if accepted is None:
            continue
        # 5. stop exactly at EOS / length / stopping criteria, then append and stream
        accepted, stopped = _truncate(accepted.to(device), sequence, eos, max_new_tokens - stats.new_tokens, stop)
        sequence.append(accepted)
        stats.new_tokens += accepted.numel()
        stats.accepted_per_iteration.append(accepted.numel())
        if streamer is not None:
            stream(streamer, accepted, provenance(n_draft_accepted, plan.n_draft, accepted.numel()))
        if stopped:
            break
    _sync(device)
    stats.decoder_time_s = time.perf_counter() - start
    if streamer is not None:
        streamer.end()
    return sequence.prefix.clone(), stats
