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
drafts a whole block unanchored from it (appendix E.2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .acceptance import Greedy, greedy_tokens
from .batch import BatchCache, BatchForward
from .contract import PackedCall
from .layouts.shifted_block import ShiftedBlockLayout, _template
from .loop import _sync, cancelled, new_stats, timed
from .schedules import ARSchedule, PackedSSSchedule
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
                    trace=None, cache=None, streamers: Sequence | None = None
                    ) -> tuple[list[torch.Tensor], DecodingStats]:
    """Decode the batch in lockstep (see the module docstring). Returns what `decode_batch` returns. `cache`: the
    batch's KV cache (a `SlotCache` for compiled calls; default a DynamicCache). `streamers`: per row, as
    `decode_batch`'s (their tokens ride on the round's one sync)."""
    device, n = prompts[0].device, len(prompts)
    width, drafting = schedules[0].width, isinstance(schedules[0], PackedSSSchedule)
    stats = [new_stats(s) for s in schedules]
    total = DecodingStats(schedule=stats[0].schedule, width=stats[0].width, per_row=list(stats))
    outputs: list[torch.Tensor | None] = [None] * n
    streamers = [None] * n if streamers is None else list(streamers)
    streaming = any(s is not None for s in streamers)
    for streamer, p in zip(streamers, prompts, strict=True):
        if streamer is not None:
            streamer.put(p.cpu())
    start = time.perf_counter()
    _sync(device)
    if max_new_tokens <= 0 or all(cancelled(s) for s in streamers):
        for b, p in enumerate(prompts):
            outputs[b], stats[b].decoder_time_s = p.clone(), time.perf_counter() - start
            if streamers[b] is not None:
                streamers[b].end()
        return outputs, total
    eos_ids = sorted(set(eos_token_ids))
    eos = torch.tensor(eos_ids or [-1], device=device)
    w = width if drafting else 0
    # the steady-state call of the layout: its own template (relative positions, new-rows mask, kept rows)
    proposals = ((0, True, w),) if drafting else ()
    offsets, template, kept, _ = _template(True, 1, w, w, proposals, 0, device)
    q = template.shape[0]
    rank, columns = torch.arange(w + 1, device=device), torch.arange(q, device=device)[None]
    ones = torch.ones(n, dtype=torch.long, device=device)
    batch = BatchCache(0, slack, device, cache)  # the cache and its validity mask; no per-row slot lists here
    rows = list(range(n))  # the original index of each row still in the batch
    lengths = torch.tensor([p.numel() for p in prompts], device=device)
    out = torch.zeros(n, max_new_tokens + w + 1, dtype=torch.long, device=device)
    done_count = torch.zeros(n, dtype=torch.long, device=device)  # accepted tokens per row (`left`)

    def call_model(call: PackedCall) -> torch.Tensor:
        logits, spent = timed(forward, call, batch.cache)
        total.nfe += 1
        total.model_time_s += spent
        total.rows_per_call.append(call.input_ids.numel())
        for b in rows:
            stats[b].nfe += 1
            stats[b].model_time_s += spent
            stats[b].rows_per_call.append(call.rows)
        return logits

    # 1. the prompt call: output position 0 from each row's last prompt token, D from ranks 1..W of the block
    call = first_call(prompts, width, drafting, mask_token_id, pad_token_id)
    tokens = greedy_tokens(call_model(call))  # (n, 1 + block)
    longest = call.proposal_start
    verified, draft = tokens[:, :1], tokens[:, 2 : 2 + w]
    h = torch.zeros(n, dtype=torch.long, device=device)
    kappa = torch.full((n,), w, device=device)
    batch.valid = torch.arange(longest, device=device)[None] >= (longest - lengths)[:, None]
    if call.rows > longest:
        batch.cache.crop(longest - call.rows)
    held = [p.numel() for p in prompts]  # cache columns each row sees (host copies: no sync to read them)
    produced = [0] * n  # accepted tokens per row
    added = 0  # columns the last call added to the cache
    while True:
        # 2. accept A = h + 1 tokens, cut at the first EOS and at the length limit (Algorithm 1, lines 5-8)
        ranks, m = rank[: verified.shape[1]], len(rows)
        if verified.shape[1] == 1:  # AR, or the prompt call: one token, which an active row has room for
            accepted = ones[:m]
            ended = torch.isin(verified[:, 0], eos) if eos_ids else ones[:m] == 0
        else:
            a = h + 1
            accepted = torch.minimum(a, max_new_tokens - done_count)
            if eos_ids:  # tokens before the first accepted EOS (more than A when there is none)
                cut = (torch.isin(verified, eos) & (ranks < a[:, None])).long()
                before = (1 - cut).cumprod(1).sum(1)
                accepted = torch.minimum(accepted, before + 1)
            ended = before < a if eos_ids else a == 0
        out.scatter_(1, done_count[:, None] + ranks, verified)
        done_count = done_count + accepted
        pieces = [accepted, ended.long(), verified.flatten()] if streaming else [accepted, ended.long()]
        host = torch.cat(pieces).tolist()  # the round's one sync
        now = time.perf_counter()
        stay = []
        for i, b in enumerate(rows):
            got = host[i]
            stats[b].accepted_per_iteration.append(got)
            produced[i] += got
            streamer = streamers[b]
            if streamer is not None and got:
                at = 2 * m + i * verified.shape[1]
                streamer.put(torch.tensor(host[at : at + got], dtype=torch.long))
            if host[m + i] or produced[i] >= max_new_tokens or cancelled(streamer):
                stats[b].new_tokens = produced[i]
                outputs[b] = torch.cat([prompts[b], out[i, : produced[i]]])
                stats[b].decoder_time_s = now - start
                if streamer is not None:
                    streamer.end()
            else:
                stay.append(i)
                held[i] += got if added else 0  # a continuing row keeps l and its h = A - 1 accepted drafts
        total.accepted_per_iteration.append(sum(host[:m]))
        if added:  # 4. columns no staying row kept go; compact once the holes pass the slack
            widest = max((host[i] for i in stay), default=0)
            if widest < added:
                batch.cache.crop(widest - added)
                batch.valid = batch.valid[:, : batch.length - (added - widest)]
        if trace is not None:
            trace(batch, call)
        if not stay:
            break
        if len(stay) < m:  # finished rows leave the batch
            index = torch.tensor(stay, device=device)
            batch.cache.batch_select_indices(index)
            batch.valid, lengths, out, done_count, verified, h, draft, kappa = (
                t[index] for t in (batch.valid, lengths, out, done_count, verified, h, draft, kappa))
            rows, held, produced = [rows[i] for i in stay], [held[i] for i in stay], [produced[i] for i in stay]
            m = len(rows)
        if batch.length - max(held) > slack:
            batch.compact()
        # 3. one call at P's last position: [l | D, MASK-padded to W | l | MASK x W] (lines 3-4)
        last = verified.gather(1, h[:, None])
        pieces = [last]
        if drafting:
            pieces += [torch.where(rank[None, :w] < kappa[:, None], draft, mask_token_id), last,
                       torch.full((m, w), mask_token_id, device=device)]
        mask = torch.cat([batch.valid[:, None, :].expand(m, q, batch.length), template.expand(m, q, q)], dim=2)
        call = PackedCall(input_ids=torch.cat(pieces, dim=1), position_ids=(lengths + done_count - 1)[:, None]
                          + offsets[None], attention_mask=mask[:, None], logit_rows=kept, verifier_rows=None,
                          proposal_rows=[], cache_rows_before_draft=0, proposal_start=w + 1)
        tokens = greedy_tokens(call_model(call))  # (m, 2W + 1): verifier rows 0..W, then proposal ranks 0..W-1
        verified = tokens[:, : w + 1]
        if drafting:  # h: the draft prefix the verifier reproduces; D: the proposal ranks past the A accepted
            h = ((draft == verified[:, :w]) & (rank[None, :w] < kappa[:, None])).long().cumprod(1).sum(1)
            past = (h + 1)[:, None] + rank[None, :w]
            draft = tokens[:, w + 1 :].gather(1, past.clamp(max=w - 1))
            kappa = w - 1 - h
        # the cache keeps l and the h accepted draft rows of each row (the rest are holes)
        batch.valid = torch.cat([batch.valid, columns < (h + 1)[:, None]], dim=1)
        added = q
    _sync(device)
    total.decoder_time_s = time.perf_counter() - start
    total.new_tokens = sum(s.new_tokens for s in stats)
    return outputs, total
