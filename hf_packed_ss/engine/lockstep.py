"""Algorithm 1 for a whole batch in tensors: greedy Packed-SS and AR on the shifted-block layout, every row's state
a row of a tensor, so a call's own cost is a fixed number of tensor ops and one host sync whatever the batch size.

`batch.decode_batch` takes this path when every row can (`eligible`: greedy, no logits processor, no stop
criterion, the plain shifted-block layout, one width); anything else runs each row's own loop. Both give every
row exactly its batch-1 tokens (the tests run the two against each other and against batch 1).

One round, for rows b with draft d_b (kappa_b tokens, MASK-padded to W) and P's last token l_b, is the
steady-state call of `ShiftedBlockLayout` with static shapes (its own template: 2B rows, verifier block then the
anchored proposal block [l_b, MASK x W]):

1. verify: h_b = the length of the prefix of d_b the verifier rows reproduce; A_b = h_b + 1 tokens accepted
   (the draft's first h_b and the verifier's next), cut at the first EOS and at the length limit;
2. draft: D_b = the proposal rows past the A_b accepted ranks (W - 1 - h_b tokens);
3. cache: l_b and the h_b accepted draft rows stay, the other columns are holes of row b (columns no row keeps
   are cropped; the cache is compacted as in `BatchCache`).
The first call processes each prompt (left-padded; padding columns see only themselves) and, for Packed-SS,
drafts a whole block unanchored from it (appendix E.2). Rows that join a running batch (`admit`) get the same prompt
call over a cache of their own, then their cache columns join the batch's (both left-padded to the longer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .acceptance import Greedy, greedy_tokens
from .batch_cache import Arrival, BatchCache, BatchForward, stack_rows
from .contract import PackedCall
from .layouts.shifted_block import ShiftedBlockLayout, _template
from .loop import _sync, cancelled, new_stats, timed
from .schedules import ARSchedule, PackedSSSchedule
from .static import slots_needed
from .stats import DecodingStats


def eligible(schedules: Sequence, layouts: Sequence, processors, stop) -> bool:
    """Whether the batch can run in lockstep: greedy AR or Packed-SS, one width, on the plain shifted-block
    layout, stopped only by EOS and the length limit."""
    first = schedules[0]
    return (not processors and stop is None and type(first) in (ARSchedule, PackedSSSchedule)
            and all(type(s) is type(first) and s.width == first.width and type(s.acceptance) is Greedy
                    and not s.scores_order and s.stop_at_eos and s.context_length is None for s in schedules)
            and all(type(layout) is ShiftedBlockLayout for layout in layouts))


def first_call(prompts: Sequence[torch.Tensor], width: int, drafting: bool, mask_id: int, pad: int) -> PackedCall:
    """Every prompt left-padded to the longest (its padding columns see only themselves), then for Packed-SS an
    unanchored [MASK x (W + 1)] block per row that sees its prompt (appendix E.2). Kept rows: the last prompt
    column (output position 0) and the block (ranks 0..W)."""
    device = prompts[0].device
    n, longest = len(prompts), max(p.numel() for p in prompts)
    q = longest + (width + 1 if drafting else 0)
    lengths = torch.tensor([p.numel() for p in prompts], device=device)
    ids = torch.full((n, q), mask_id, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):  # once per decode
        ids[b, : longest - p.numel()] = pad
        ids[b, longest - p.numel() : longest] = p
    column = torch.arange(q, device=device)
    pad_b = (longest - lengths)[:, None]
    positions = (column[None] - pad_b).clamp(min=0)  # the block continues each prompt: position t_b + rank
    real = (column[None] >= pad_b) & (column[None] < longest)  # (n, q): each row's prompt columns
    causal = column[:, None] >= column[None, :]
    new = (causal[None] & real[:, None, :] & (column < longest)[None, :, None]) | torch.eye(
        q, dtype=torch.bool, device=device)
    new[:, longest:, :] = real[:, None, :] | (column >= longest)[None, None, :]
    return PackedCall(input_ids=ids, position_ids=positions, attention_mask=new[:, None],
                      logit_rows=torch.arange(longest - 1, q, device=device), verifier_rows=None, proposal_rows=[],
                      cache_rows_before_draft=0, proposal_start=longest)


def decode_lockstep(forward: BatchForward, schedules: Sequence, prompts: Sequence[torch.Tensor],
                    max_new_tokens: int, eos_token_ids, pad_token_id: int, mask_token_id: int, slack: int,
                    trace=None, cache=None, streamers: Sequence | None = None, admit=None
                    ) -> tuple[list[torch.Tensor], DecodingStats]:
    """Decode the batch in lockstep (see the module docstring). Returns what `decode_batch` returns. `cache`: the
    batch's KV cache (a `SlotCache` for compiled calls; default a DynamicCache). `streamers`: per row, as
    `decode_batch`'s (their tokens ride on the round's one sync). `admit()`: asked after every round for `Arrival`s
    that join the running batch (their prompt call runs over a cache of their own, which then joins the batch's)."""
    device = prompts[0].device
    width, drafting = schedules[0].width, isinstance(schedules[0], PackedSSSchedule)
    stats: list = []
    total = DecodingStats(schedule=new_stats(schedules[0]).schedule, width=width if drafting else 0, per_row=stats)
    outputs: list[torch.Tensor | None] = []
    inputs: list[torch.Tensor] = []  # every row's prompt, by its index
    feeds: list = []  # every row's streamer
    start = time.perf_counter()
    _sync(device)
    eos_ids = sorted(set(eos_token_ids))
    eos = torch.tensor(eos_ids or [-1], device=device)
    w = width if drafting else 0
    # the steady-state call of the layout: its own template (relative positions, new-rows mask, kept rows)
    proposals = ((0, True, w),) if drafting else ()
    offsets, template, kept, _ = _template(True, 1, w, w, proposals, 0, device)
    q = template.shape[0]
    rank, columns = torch.arange(w + 1, device=device), torch.arange(q, device=device)[None]
    batch = BatchCache(0, slack, device, cache)  # the cache and its validity mask; no per-row slot lists here
    # the rows in the batch: their original index, cache columns they see, accepted tokens and limit (host), and
    # per row (tensors): prompt length, accepted tokens, their count, P's last token, the draft and its length
    rows, held, produced, limits = [], [], [], []
    empty = torch.zeros(0, dtype=torch.long, device=device)
    lengths, done_count, limit, kappa = empty, empty, empty, empty
    out = last = torch.zeros(0, 1, dtype=torch.long, device=device)
    draft = torch.zeros(0, w, dtype=torch.long, device=device)

    def finish(b: int, tokens: torch.Tensor) -> None:
        stats[b].new_tokens = tokens.numel()
        outputs[b] = torch.cat([inputs[b], tokens])
        stats[b].decoder_time_s = time.perf_counter() - start
        if feeds[b] is not None:
            if hasattr(feeds[b], "put_stats"):  # as `loop.decoding` does
                feeds[b].put_stats(stats[b])
            feeds[b].end()

    waiting: list[Arrival] = []  # arrivals a static cache has no free row for yet: they join as rows leave

    def join(arrivals: Sequence[Arrival], initial: bool = False) -> None:
        """Queue `arrivals`, then start as many as the cache has rows for (all of them over a DynamicCache)."""
        waiting.extend(arrivals)
        capacity, size = getattr(batch.cache, "capacity", None), getattr(batch.cache, "batch_rows", None)
        for a in arrivals:
            if capacity is not None and slots_needed(a.prompt.numel(), a.max_new_tokens, slack, q) > capacity:
                raise ValueError(f"A row of {a.prompt.numel()} prompt tokens and max_new_tokens={a.max_new_tokens} "
                                 f"needs more than the static cache's {capacity} slots: raise max_cache_len "
                                 "(generate(..., max_cache_len=N)).")
        while waiting:
            room = len(waiting) if initial or size is None else size - len(rows)
            if room <= 0:
                return
            begin(waiting[:room], initial)
            del waiting[:room]
            initial = False

    def begin(arrivals: Sequence[Arrival], initial: bool) -> None:
        """New rows: the prompt call (output position 0 from each row's last prompt token, D from ranks 1..W of
        the block), their first token accepted, then those that go on join the batch's tensors and cache."""
        nonlocal lengths, done_count, limit, kappa, out, last, draft
        fresh = []
        for a in arrivals:
            b = len(outputs)
            outputs.append(None)
            inputs.append(a.prompt)
            feeds.append(a.streamer)
            stats.append(new_stats(a.schedule))
            if a.streamer is not None:
                a.streamer.put(a.prompt.cpu())
            if a.max_new_tokens <= 0 or cancelled(a.streamer):
                finish(b, a.prompt[:0])
            else:
                fresh.append((b, a))
        if not fresh:
            return
        new = [a.prompt for _, a in fresh]
        call = first_call(new, width, drafting, mask_token_id, pad_token_id)
        own = batch.cache if initial else DynamicCache()  # joining rows' prompts: a cache of their own first
        logits, spent = timed(forward, call, own)
        total.nfe += 1
        total.model_time_s += spent
        total.rows_per_call.append(call.input_ids.numel())
        tokens = greedy_tokens(logits)  # (k, 1 + block)
        longest = call.proposal_start
        if call.rows > longest:
            own.crop(longest - call.rows)
        first = tokens[:, 0]
        host = torch.cat([first, torch.isin(first, eos).long()]).tolist()
        k, stay = len(fresh), []
        for j, (b, a) in enumerate(fresh):
            stats[b].nfe += 1
            stats[b].model_time_s += spent
            stats[b].rows_per_call.append(call.rows)
            stats[b].accepted_per_iteration.append(1)
            stats[b].schedule_per_iteration.append(stats[b].schedule)
            stats[b].width_per_iteration.append(w)
            if a.streamer is not None:
                a.streamer.put(torch.tensor(host[j : j + 1]))
            if (host[k + j] and eos_ids) or a.max_new_tokens <= 1 or cancelled(a.streamer):
                finish(b, first[j : j + 1])
            else:
                stay.append(j)
        total.accepted_per_iteration.append(k)
        if not stay:
            return
        index = torch.tensor(stay, device=device)
        sizes = torch.tensor([new[j].numel() for j in stay], device=device)
        valid = torch.arange(longest, device=device)[None] >= (longest - sizes)[:, None]
        if len(stay) < k:
            own.batch_select_indices(index)
        if initial:
            batch.valid = valid
        else:
            stack_rows(batch, own, valid)
        wide = max(out.shape[1], max(fresh[j][1].max_new_tokens for j in stay) + w + 1)

        def widen(t: torch.Tensor) -> torch.Tensor:  # room for the longest row's tokens and one block
            return torch.nn.functional.pad(t, (0, wide - t.shape[1]))

        lengths, done_count = torch.cat([lengths, sizes]), torch.cat([done_count, torch.ones_like(sizes)])
        limit = torch.cat([limit, torch.tensor([fresh[j][1].max_new_tokens for j in stay], device=device)])
        kappa = torch.cat([kappa, torch.full_like(sizes, w)])
        out = torch.cat([widen(out), widen(first[index, None])])
        last = torch.cat([last, first[index, None]])
        draft = torch.cat([draft, tokens[index, 2 : 2 + w]])
        rows.extend(fresh[j][0] for j in stay)
        held.extend(new[j].numel() for j in stay)
        produced.extend([1] * len(stay))
        limits.extend(fresh[j][1].max_new_tokens for j in stay)

    join([Arrival(s, None, p, max_new_tokens, f) for s, p, f in zip(
        schedules, prompts, [None] * len(prompts) if streamers is None else streamers, strict=True)], initial=True)
    if admit is not None:
        join(admit())
    while rows or waiting:
        if not rows:  # every row left while arrivals wait (a static cache was full): they start now
            join([])
            continue
        m, streaming = len(rows), any(feeds[b] is not None for b in rows)
        # 1. one call at P's last position: [l | D, MASK-padded to W | l | MASK x W] (lines 3-4)
        pieces = [last]
        if drafting:
            pieces += [torch.where(rank[None, :w] < kappa[:, None], draft, mask_token_id), last,
                       torch.full((m, w), mask_token_id, device=device)]
        mask = torch.cat([batch.valid[:, None, :].expand(m, q, batch.length), template.expand(m, q, q)], dim=2)
        call = PackedCall(input_ids=torch.cat(pieces, dim=1), position_ids=(lengths + done_count - 1)[:, None]
                          + offsets[None], attention_mask=mask[:, None], logit_rows=kept, verifier_rows=None,
                          proposal_rows=[], cache_rows_before_draft=0, proposal_start=w + 1)
        logits, spent = timed(forward, call, batch.cache)
        total.nfe += 1
        total.model_time_s += spent
        total.rows_per_call.append(call.input_ids.numel())
        for b in rows:
            stats[b].nfe += 1
            stats[b].model_time_s += spent
            stats[b].rows_per_call.append(call.rows)
        tokens = greedy_tokens(logits)  # (m, 2W + 1): verifier rows 0..W, then proposal ranks 0..W-1
        verified = tokens[:, : w + 1]
        h = torch.zeros(m, dtype=torch.long, device=device)
        if drafting:  # h: the draft prefix the verifier reproduces; D: the proposal ranks past the A accepted
            h = ((draft == verified[:, :w]) & (rank[None, :w] < kappa[:, None])).long().cumprod(1).sum(1)
            past = (h + 1)[:, None] + rank[None, :w]
            draft = tokens[:, w + 1 :].gather(1, past.clamp(max=w - 1))
            kappa = w - 1 - h
        last = verified.gather(1, h[:, None])
        # the cache keeps l and the h accepted draft rows of each row (the rest are holes)
        batch.valid = torch.cat([batch.valid, columns < (h + 1)[:, None]], dim=1)
        # 2. accept A = h + 1 tokens, cut at the first EOS and at the length limit (Algorithm 1, lines 5-8)
        a = h + 1
        accepted = torch.minimum(a, limit - done_count)
        if eos_ids:  # tokens before the first accepted EOS (more than A when there is none)
            cut = (torch.isin(verified, eos) & (rank[None] < a[:, None])).long()
            before = (1 - cut).cumprod(1).sum(1)
            accepted = torch.minimum(accepted, before + 1)
            ended = before < a
        out.scatter_(1, done_count[:, None] + rank[None], verified)
        done_count = done_count + accepted
        pieces = [accepted, ended.long()] if eos_ids else [accepted]
        host = torch.cat([*pieces, verified.flatten()] if streaming else pieces).tolist()  # the round's one sync
        stay = []
        for i, b in enumerate(rows):
            got = host[i]
            stats[b].accepted_per_iteration.append(got)
            stats[b].schedule_per_iteration.append(stats[b].schedule)
            stats[b].width_per_iteration.append(w)
            produced[i] += got
            streamer = feeds[b]
            if streamer is not None and got:
                at = len(pieces) * m + i * (w + 1)
                streamer.put(torch.tensor(host[at : at + got], dtype=torch.long))
            if (eos_ids and host[m + i]) or produced[i] >= limits[i] or cancelled(streamer):
                finish(b, out[i, : produced[i]])
            else:
                stay.append(i)
                held[i] += got  # a continuing row keeps l and its h = A - 1 accepted drafts
        total.accepted_per_iteration.append(sum(host[:m]))
        # 3. columns no staying row kept go; finished rows leave; compact once the holes pass the slack
        widest = max((host[i] for i in stay), default=0)
        if widest < q:
            batch.cache.crop(widest - q)
            batch.valid = batch.valid[:, : batch.length - (q - widest)]
        if trace is not None:
            trace(batch, call)
        if len(stay) < m:
            index = torch.tensor(stay, dtype=torch.long, device=device)
            batch.cache.batch_select_indices(index)
            batch.valid, lengths, out, done_count, limit, last, draft, kappa = (
                t[index] for t in (batch.valid, lengths, out, done_count, limit, last, draft, kappa))
            rows, held, produced, limits = ([x[i] for i in stay] for x in (rows, held, produced, limits))
        if rows and batch.length - max(held) > slack:
            batch.compact()
        if admit is not None:
            join(admit())
    _sync(device)
    total.decoder_time_s = time.perf_counter() - start
    total.new_tokens = sum(s.new_tokens for s in stats)
    return outputs, total
