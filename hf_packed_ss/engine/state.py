"""The decoder state of one sequence: Algorithm 3's state, of which the prefix family is the left-to-right case.

The accepted tokens P_t sit in one buffer ``[prompt | output positions]`` (so any contiguous run is a view),
with `left` the leftmost unresolved position and `ahead` the positions accepted past it (an any-order
verification can resolve them early; a left-to-right one never does). `end` is E, the last output position
still to decode. `pending` are the positions of N, the accepted tokens whose rows are not yet in the KV cache
(the prompt before the first call; after it, P's last token on the shifted-block layout, the correction or a
native step's commits on the same-position layout), in cache order; `cached` are the output positions whose
rows are in the cache, in cache order (a stop that drops one of them rolls the cache back). Positions lists
stay ranges while they are contiguous, so no iteration scans or copies the whole output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _join(a: Sequence[int], b: Sequence[int]) -> Sequence[int]:
    """`a` followed by `b`, kept a range when the two are contiguous."""
    if not b:
        return a
    if type(a) is range and type(b) is range and (a.stop == b.start or not a):  # left to right: the fast path
        return range(a.start if a else b.start, b.stop)
    if isinstance(a, list):  # already scattered: extend in place (no copy of the whole list per call)
        a.extend(b)
        return a
    if not a and isinstance(b, range):
        return b
    contiguous = isinstance(a, range) and a.step == 1 and list(b) == list(range(a.stop, a.stop + len(b)))
    if not a:
        contiguous = list(b) == list(range(b[0], b[0] + len(b)))
        return range(b[0], b[0] + len(b)) if contiguous else list(b)
    return range(a.start, a.stop + len(b)) if contiguous else [*a, *b]


def _slice(positions: Sequence[int]) -> slice | None:
    """The positions as a slice when they are contiguous and ascending."""
    if isinstance(positions, range) and positions.step == 1:
        return slice(positions.start, positions.stop)
    if positions and list(positions) == list(range(positions[0], positions[0] + len(positions))):
        return slice(positions[0], positions[0] + len(positions))
    return None


class DecoderState:
    """One sequence's accepted tokens, pending rows and cache bookkeeping (see the module docstring)."""

    def __init__(self, prompt: torch.Tensor, max_new_tokens: int, room: int):
        self.origin = prompt.numel()
        self.buffer = torch.cat([prompt, prompt.new_zeros(max_new_tokens + room)])
        self.positions = torch.arange(self.buffer.numel(), device=prompt.device)  # absolute positions, indexed
        self.left = 0
        self.end = max_new_tokens - 1  # E
        self.ahead: dict[int, int] = {}
        self.pending: Sequence[int] = range(-self.origin, 0)
        self.cached: Sequence[int] = range(0)  # output positions in the cache after the prompt
        self.cache_len = 0  # rows in the KV cache
        self.evicted = 0  # rows dropped from the left of [prompt, cached] (a sliding context)

    # --- reading -------------------------------------------------------------------------------------
    def accepted(self, j: int) -> bool:
        return j < self.left or j in self.ahead

    def prefix(self, length: int | None = None) -> torch.Tensor:
        """The prompt and output positions 0..length-1 (default: P's contiguous part, up to `left`); a view."""
        return self.buffer[: self.origin + (self.left if length is None else length)]

    def last_token(self) -> torch.Tensor:
        """P's last token, as a 1-element view."""
        return self.buffer[self.origin + self.left - 1 : self.origin + self.left]

    def absolute(self, positions: Sequence[int]) -> torch.Tensor:
        """Absolute position ids of output `positions` (a view when they are contiguous)."""
        run = _slice(positions)
        if run is not None:
            return self.positions[self.origin + run.start : self.origin + run.stop]
        return self.positions[torch.tensor(positions, dtype=torch.long, device=self.buffer.device) + self.origin]

    def pending_tokens(self) -> torch.Tensor:
        run = _slice(self.pending)
        if run is not None:
            return self.buffer[self.origin + run.start : self.origin + run.stop]
        return self.buffer[self.absolute(self.pending)]

    def pending_positions(self) -> torch.Tensor:
        return self.absolute(self.pending)

    # --- writing -------------------------------------------------------------------------------------
    def write(self, positions: Sequence[int], tokens: list[int], values: torch.Tensor | None = None) -> None:
        """Put `tokens` (`values`, when they are on the device already) at output `positions` of the buffer
        (accepted tokens, or draft tokens in scratch)."""
        if not tokens:
            return
        if values is None:
            values = torch.tensor(tokens, dtype=self.buffer.dtype, device=self.buffer.device)
        run = _slice(positions)
        if run is not None:
            self.buffer[self.origin + run.start : self.origin + run.stop] = values
        else:
            self.buffer[self.absolute(positions)] = values

    def commit(self, consumed: int, drafts: Sequence[int], rest: Sequence[int]) -> None:
        """After a call: its first `consumed` pending rows and the rows of the accepted `drafts` entered the
        cache; `rest` (the verifier's token, a native step's commits) are pending for the next call."""
        done = self.pending[:consumed]
        cached = range(max(done.start, 0), done.stop) if isinstance(done, range) else [j for j in done if j >= 0]
        self.cached = _join(_join(self.cached, cached), drafts)
        self.pending = _join(self.pending[consumed:], rest)
        self.cache_len += consumed + len(drafts)

    def accept(self, positions: Sequence[int], tokens: list[int], values: torch.Tensor | None = None
               ) -> Sequence[int]:
        """Accept tokens at positions (none past E; `values`: the same tokens on the device, if at hand);
        returns the positions accepted."""
        if type(positions) is range:
            n = max(0, min(len(positions), self.end + 1 - positions.start))
            positions, tokens, values = positions[:n], tokens[:n], None if values is None else values[:n]
        elif positions and max(positions) > self.end:
            keep = [i for i, j in enumerate(positions) if j <= self.end]
            positions, tokens, values = [positions[i] for i in keep], [tokens[i] for i in keep], None
        self.write(positions, tokens, values)
        if positions and positions[0] == self.left and _slice(positions) is not None:
            self.left += len(positions)  # left to right: the fast path
        else:
            self.ahead.update(zip(positions, tokens, strict=True))
        while self.left in self.ahead:
            del self.ahead[self.left]
            self.left += 1
        return positions

    def drop_after(self, end: int) -> int | None:
        """E = end: forget every position past it. Returns the index in `cached` of the first dropped cached
        row (the rows after it attended to it and must be processed again), or None."""
        self.end = end
        self.ahead = {j: t for j, t in self.ahead.items() if j <= end}
        self.left = min(self.left, end + 1)
        self.pending = [j for j in self.pending if j <= end]
        return next((i for i, j in enumerate(self.cached) if j > end), None)

    def run_start(self, j: int, floor: int) -> int:
        """The first position of the contiguous run of accepted positions that ends at `j`; every position below
        `floor` is accepted, so the walk takes at most j - floor steps."""
        start = j
        while start > 0 and self.accepted(start - 1):
            if start - 1 < floor:
                return 0
            start -= 1
        return start
