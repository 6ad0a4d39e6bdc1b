"""Algorithm 1 for a whole batch in tensors: greedy Packed-SS and AR on either family's layout, every row's state a
row of a tensor, so a call's own cost is a fixed number of tensor ops and one host sync whatever the batch size.

`batch.decode_batch` takes this path when every row can (`batch.tensorised`). It runs the schedule, layout and
acceptance code a single decode runs; only the bookkeeping is batched:

- the prompt call: each row's is the call its own schedule plans and its own layout lays out at batch size 1
  (`loop.plan_call`), the rows' calls packed into one as the per-row loop packs them (`batch_cache.pack`), and
  each row's schedule reads its logits (`advance`): its first token and first draft (appendix E.2);
- every later call is the layout's `SteadyCall` (its static shape, one for all rows). One round, for rows b with
  draft d_b (kappa_b tokens) and P's last token l_b:

  1. verify: h_b = `acceptance.greedy_prefix` (the greedy acceptance `Greedy` decides with); A_b = h_b + 1 tokens
     accepted (d^(1..h_b) and the verifier's next), cut at the first EOS and at the length limit (`stop_cut`;
     Algorithm 1, lines 5-8);
  2. draft: D_b = the proposal ranks past the A_b accepted (`SteadyCall.next_draft`, line 10);
  3. cache: rows 0..h_b stay (l_b and the h_b accepted draft rows); the call's other columns are holes of row b
     (columns no row keeps are cropped; the cache is compacted as in `BatchCache`).

Rows that join a running batch (`admit`) get the same prompt call over a cache of their own, whose columns then
join the batch's (both left-padded to the longer). Every row gets exactly its batch-1 tokens, calls and
acceptances (tests/test_batch.py runs both families against each row's own loop and against batch 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields

import torch
from transformers import DynamicCache

from .acceptance import greedy_prefix, greedy_tokens
from .batch_cache import Arrival, BatchCache, BatchForward, pack, stack_rows
from .loop import _sync, cancelled, end_stream, new_stats, plan_call, timed
from .schedules import PackedSSSchedule
from .state import DecoderState
from .static import slots_needed
from .stats import DecodingStats


def stop_cut(verified: torch.Tensor, accepted: torch.Tensor, room: torch.Tensor, eos: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Algorithm 1, lines 7-8 for every row: of the first `accepted` ``(m,)`` tokens of `verified` ``(m, V)``, those
    up to the first EOS (included) and within `room` ``(m,)`` tokens of the length limit. Returns their count and,
    with `eos` ids, whether an EOS was among the accepted (the row ends)."""
    count = torch.minimum(accepted, room)
    if eos is None:
        return count, None
    rank = torch.arange(verified.shape[1], device=verified.device)[None]
    hit = torch.isin(verified, eos) & (rank < accepted[:, None])
    before = (~hit).long().cumprod(dim=1).sum(dim=1)  # tokens before the first accepted EOS
    return torch.minimum(count, before + 1), before < accepted


@dataclass
class Rows:
    """The rows decoding in lockstep. Host lists: each row's index among the outputs, the cache columns it sees,
    the tokens it has and its limit. Device tensors, one row each: prompt length, tokens accepted (`done`, and
    `out` holding them), limit, P's last token ``(m, 1)``, the draft ``(m, slots)`` and its length `kappa`."""

    index: list[int]
    held: list[int]
    produced: list[int]
    limits: list[int]
    lengths: torch.Tensor
    done: torch.Tensor
    limit: torch.Tensor
    last: torch.Tensor
    draft: torch.Tensor
    kappa: torch.Tensor
    out: torch.Tensor

    @classmethod
    def empty(cls, slots: int, device: torch.device) -> Rows:
        none = torch.zeros(0, dtype=torch.long, device=device)
        return cls([], [], [], [], none, none, none, none[:, None], none.new_zeros(0, slots), none, none[:, None])

    def __len__(self) -> int:
        return len(self.index)

    def keep(self, stay: list[int]) -> None:
        """Only rows `stay` (indices into the current rows) go on."""
        index = torch.tensor(stay, dtype=torch.long, device=self.done.device)
        for f in fields(self):
            value = getattr(self, f.name)
            setattr(self, f.name, [value[i] for i in stay] if isinstance(value, list) else value[index])

    def extend(self, new: Rows) -> None:
        """`new` rows follow; `out` is widened to the wider of the two."""
        wide = max(self.out.shape[1], new.out.shape[1])
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(new, f.name)
            if f.name == "out":
                mine, theirs = (torch.nn.functional.pad(t, (0, wide - t.shape[1])) for t in (mine, theirs))
            setattr(self, f.name, mine + theirs if isinstance(mine, list) else torch.cat([mine, theirs]))


class Lockstep:
    """One lockstep decode: the batch's cache, the rows in it, and every row's output and statistics."""

    def __init__(self, forward: BatchForward, first: Arrival, eos_token_ids: Iterable[int], pad_token_id: int,
                 slack: int, trace=None, cache=None):
        device = first.prompt.device
        self.forward, self.pad, self.slack, self.trace, self.device = forward, pad_token_id, slack, trace, device
        self.mode = first.schedule.current()  # (name, width): every row's, every iteration
        drafting = isinstance(first.schedule, PackedSSSchedule)
        self.steady = first.layout.steady_call(first.schedule.width, drafting, device)
        self.columns = torch.arange(self.steady.rows, device=device)[None]
        eos = sorted({int(e) for e in eos_token_ids})
        self.eos_set, self.eos = set(eos), torch.tensor(eos, device=device) if eos else None
        self.batch = BatchCache(0, slack, device, cache)  # the cache and its validity mask
        self.rows = Rows.empty(self.steady.draft_slots, device)
        self.stats: list[DecodingStats] = []
        self.total = DecodingStats(schedule=self.mode[0], width=self.mode[1], per_row=self.stats)
        self.outputs: list[torch.Tensor | None] = []
        self.inputs: list[torch.Tensor] = []  # every row's prompt, by its index
        self.feeds: list = []  # every row's streamer
        self.waiting: list[Arrival] = []  # arrivals a static cache has no free row for yet: they join as rows leave
        self.start = time.perf_counter()

    def finish(self, b: int, tokens: torch.Tensor) -> None:
        self.stats[b].new_tokens = tokens.numel()
        self.outputs[b] = torch.cat([self.inputs[b], tokens])
        self.stats[b].decoder_time_s = time.perf_counter() - self.start
        end_stream(self.feeds[b], self.stats[b])

    def join(self, arrivals: Sequence[Arrival], initial: bool = False) -> None:
        """Queue `arrivals`, then start as many as the cache has rows for (all of them over a DynamicCache)."""
        self.waiting.extend(arrivals)
        cache = self.batch.cache
        capacity, size = getattr(cache, "capacity", None), getattr(cache, "batch_rows", None)
        for a in arrivals:
            if capacity is not None and slots_needed(a.prompt.numel(), a.max_new_tokens, self.slack,
                                                     self.steady.rows) > capacity:
                raise ValueError(f"A row of {a.prompt.numel()} prompt tokens and max_new_tokens={a.max_new_tokens} "
                                 f"needs more than the static cache's {capacity} slots: raise max_cache_len "
                                 "(generate(..., max_cache_len=N)).")
        while self.waiting:
            room = len(self.waiting) if initial or size is None else size - len(self.rows)
            if room <= 0:
                return
            self.begin(self.waiting[:room], initial)
            del self.waiting[:room]
            initial = False

    def begin(self, arrivals: Sequence[Arrival], initial: bool) -> None:
        """New rows: each gets its output and statistics; those with tokens to decode make their prompt call."""
        fresh = []
        for a in arrivals:
            b = len(self.outputs)
            self.outputs.append(None)
            self.inputs.append(a.prompt)
            self.feeds.append(a.streamer)
            self.stats.append(new_stats(a.schedule))
            if a.streamer is not None:
                a.streamer.put(a.prompt.cpu())
            if a.max_new_tokens <= 0 or cancelled(a.streamer):
                self.finish(b, a.prompt[:0])
            else:
                fresh.append((b, a))
        if fresh:
            self.prompt_call(fresh, initial)

    def prompt_call(self, fresh: list[tuple[int, Arrival]], initial: bool) -> None:
        """The rows' prompt calls, packed into one; each row's own schedule accepts its first token and makes its
        first draft; the rows that go on join the batch (`enter`). `fresh`: (output index, arrival) pairs."""
        # 1. each row's prompt call as its schedule and layout make it alone, packed into one call
        plans, calls = [], []
        for b, a in fresh:
            a.schedule.begin(a.layout, a.max_new_tokens, self.device)
            plan, call = plan_call(a.schedule, a.layout, DecoderState(a.prompt, a.max_new_tokens,
                                                                      2 * (a.schedule.width + 1)), self.stats[b])
            plans.append(plan)
            calls.append(call)
        k = len(fresh)
        call, _, reads = pack(calls, torch.zeros(k, 0, dtype=torch.bool, device=self.device), self.pad)
        own = self.batch.cache if initial else DynamicCache()  # joining rows' prompts: a cache of their own first
        logits, spent = timed(self.forward, call, own)
        self.total.count_call(call.input_ids.numel(), spent)
        self.total.accepted_per_iteration.append(k)
        # 2. each row's schedule reads its logits: the first token and (Packed-SS) the first draft
        stay, firsts, drafts, kappas, kept = [], [], [], [], []
        for j, ((b, a), plan, mine) in enumerate(zip(fresh, plans, calls, strict=True)):
            verdict = a.schedule.advance(plan, mine.read(logits[j] if reads[j] is None else logits[j, reads[j]]))
            stats = self.stats[b]
            stats.count_call(mine.rows, spent)
            stats.prompt_time_s = spent
            stats.count_iteration(1, *self.mode)
            first = verdict.values[:1]
            if a.streamer is not None:
                a.streamer.put(torch.tensor(verdict.tokens[:1]))
            if verdict.tokens[0] in self.eos_set or a.max_new_tokens <= 1 or cancelled(a.streamer):
                self.finish(b, first)
                continue
            stay.append(j)
            firsts.append(first)
            draft = a.schedule.draft.tokens
            kappas.append(draft.numel())
            drafts.append(torch.nn.functional.pad(draft, (0, self.steady.draft_slots - draft.numel()),
                                                  value=self.steady.mask_token_id))
            kept.append(mine.rows_to_cache(0))  # the prompt's rows: P less its last token
        if not stay:
            own.crop(-call.rows)
            return
        # 3. the rows that go on, with their first token and draft, join the batch
        limits = [fresh[j][1].max_new_tokens for j in stay]
        first, device = torch.cat(firsts), self.device
        self.enter(own, call.rows, stay if len(stay) < k else None, initial, Rows(
            index=[fresh[j][0] for j in stay], held=kept, produced=[1] * len(stay), limits=limits,
            lengths=torch.tensor([fresh[j][1].prompt.numel() for j in stay], device=device),
            done=torch.ones(len(stay), dtype=torch.long, device=device), limit=torch.tensor(limits, device=device),
            last=first[:, None], draft=torch.stack(drafts), kappa=torch.tensor(kappas, device=device),
            out=torch.nn.functional.pad(first[:, None], (0, max(limits) + self.steady.verifier - 1))))

    def enter(self, own, columns: int, stay: list[int] | None, initial: bool, new: Rows) -> None:
        """Rows `new` join the batch: `own` (the cache of their prompt call, `columns` long; rows `stay` of it, None:
        all) keeps each row's prompt columns (`new.held`: P less its last token) and becomes the batch's cache
        (`initial`) or joins it (`stack_rows`)."""
        widest = max(new.held)
        if widest < columns:  # the columns past every staying row's prompt go
            own.crop(widest - columns)
        if stay is not None:
            own.batch_select_indices(torch.tensor(stay, device=self.device))
        valid = torch.arange(widest, device=self.device)[None] < torch.tensor(new.held, device=self.device)[:, None]
        if initial:
            self.batch.valid = valid
        else:
            stack_rows(self.batch, own, valid)
        self.rows.extend(new)

    def round(self) -> None:
        """One call for every row in the batch (see the module docstring)."""
        rows, steady, batch = self.rows, self.steady, self.batch
        m = len(rows)
        streaming = any(self.feeds[b] is not None for b in rows.index)
        # 1. one call at P's last position for every row (Algorithm 1, lines 3-4)
        call = steady.build(rows.last, rows.draft, rows.kappa, rows.lengths + rows.done - 1, batch.valid)
        logits, spent = timed(self.forward, call, batch.cache)
        self.total.count_call(call.input_ids.numel(), spent)
        tokens = greedy_tokens(logits)  # (m, r): the verifier rows, then the proposal rows
        verified = tokens[:, : steady.verifier]
        h = greedy_prefix(rows.draft, verified, rows.kappa)  # lines 5-6
        rows.draft, rows.kappa = steady.next_draft(tokens[:, steady.verifier :], h)  # line 10
        rows.last = verified.gather(1, h[:, None])
        batch.valid = torch.cat([batch.valid, self.columns < (h + 1)[:, None]], dim=1)  # l and the h accepted
        # 2. accept A = h + 1 tokens, cut at the first EOS and at the length limit (lines 7-8)
        accepted, ended = stop_cut(verified, h + 1, rows.limit - rows.done, self.eos)
        rank = torch.arange(verified.shape[1], device=self.device)[None]
        rows.out.scatter_(1, rows.done[:, None] + rank, verified)
        rows.done = rows.done + accepted
        pieces = [accepted] if ended is None else [accepted, ended.long()]
        host = torch.cat([*pieces, verified.flatten()] if streaming else pieces).tolist()  # the round's one sync
        stay = []
        for i, b in enumerate(rows.index):
            got = host[i]
            self.stats[b].count_call(steady.rows, spent)
            self.stats[b].count_iteration(got, *self.mode)
            rows.produced[i] += got
            streamer = self.feeds[b]
            if streamer is not None and got:
                at = len(pieces) * m + i * verified.shape[1]
                streamer.put(torch.tensor(host[at : at + got], dtype=torch.long))
            if (ended is not None and host[m + i]) or rows.produced[i] >= rows.limits[i] or cancelled(streamer):
                self.finish(b, rows.out[i, : rows.produced[i]])
            else:
                stay.append(i)
                rows.held[i] += got  # a continuing row keeps l and its h = A - 1 accepted drafts
        self.total.accepted_per_iteration.append(sum(host[:m]))
        # 3. columns no staying row kept go; finished rows leave; compact once the holes pass the slack
        widest = max((host[i] for i in stay), default=0)
        if widest < steady.rows:
            batch.cache.crop(widest - steady.rows)
            batch.valid = batch.valid[:, : batch.length - (steady.rows - widest)]
        if self.trace is not None:
            self.trace(batch, call)
        if len(stay) < m:
            batch.cache.batch_select_indices(torch.tensor(stay, dtype=torch.long, device=self.device))
            batch.valid = batch.valid[stay]
            rows.keep(stay)
        if len(rows) and batch.length - max(rows.held) > self.slack:
            batch.compact()

    def run(self, arrivals: Sequence[Arrival], admit: Callable[[], Sequence[Arrival]] | None
            ) -> tuple[list[torch.Tensor], DecodingStats]:
        self.join(arrivals, initial=True)
        if admit is not None:
            self.join(admit())
        while len(self.rows) or self.waiting:
            if not len(self.rows):  # every row left while arrivals wait (a static cache was full): they start now
                self.join([])
                continue
            self.round()
            if admit is not None:
                self.join(admit())
        _sync(self.device)
        self.total.decoder_time_s = time.perf_counter() - self.start
        self.total.new_tokens = sum(s.new_tokens for s in self.stats)
        return self.outputs, self.total


def decode_lockstep(forward: BatchForward, arrivals: Sequence[Arrival], eos_token_ids: Iterable[int],
                    pad_token_id: int, slack: int, trace=None, cache=None, admit=None
                    ) -> tuple[list[torch.Tensor], DecodingStats]:
    """Decode the batch's rows (`Arrival`s: schedule, layout, prompt, limit, streamer) in lockstep (see the module
    docstring). Returns what `decode_batch` returns. `cache`: the batch's KV cache (a `SlotCache` for compiled
    calls; default a DynamicCache). Streamers' tokens ride on each round's one sync. `admit()`: asked after every
    round for `Arrival`s that join the running batch."""
    _sync(arrivals[0].prompt.device)
    return Lockstep(forward, arrivals[0], eos_token_ids, pad_token_id, slack, trace, cache).run(arrivals, admit)
