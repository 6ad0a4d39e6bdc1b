"""Batch > 1: every row of a batched decode is that prompt's batch-1 decode (tokens, calls, rows and acceptances),
on both families, with an oracle drafter that makes the rows accept very differently, EOS mid-block in some rows;
the cache stays within its bound; the front pads as stock batched `generate` does and refuses what it cannot do."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_model, tiny_setdlm
from drafters import Collect, OracleLayout, OracleSamePositionLayout
from engine import schedule_for

from hf_packed_ss.engine import RejectionSampler, decode, decode_batch
from hf_packed_ss.front import model_forward


@pytest.fixture(scope="module")
def nemotron():
    return tiny_model(11)


@pytest.fixture(scope="module")
def setdlm():
    return tiny_setdlm(3)


def _prompts(n: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """`n` prompts of lengths between 1 and 40, the first of length 1 and the second of 40."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, 40, *torch.randint(1, 41, (max(0, n - 2),), generator=gen).tolist()][:n]
    return [torch.randint(vocab - 1, (k,), generator=gen) for k in lengths]  # never the MASK id


def _oracles(model, prompts, continuations, seed):
    """One oracle layout per row, each right with a different probability (so the rows accept differently)."""
    kind = OracleSamePositionLayout if model.config.model_type == "setdlm" else OracleLayout
    accuracies = [1.0, 0.2, 0.9, 0.6, 0.0, 0.95, 0.4, 0.8]
    return [kind(model.config.mask_token_id, model.config.vocab_size, full, p.numel(), accuracies[b % 8], seed + b)
            for b, (p, full) in enumerate(zip(prompts, continuations, strict=True))]


def _eos(continuations, width: int) -> int:
    """A token accepted mid-block in some rows and never produced in others."""
    vocab = sorted({t for full in continuations for t in full})
    hits = {t: sum(t in full for full in continuations) for t in vocab}
    partial = [t for t in vocab if 0 < hits[t] < len(continuations)]
    row0 = [t for t in continuations[0][width + 1 :] if t in partial]
    return (row0 or partial or vocab)[0]


CASES = [  # (family, mode, width, batch)
    ("nemotron", "ar", 1, 3),
    ("nemotron", "packed_ss", 1, 2),
    ("nemotron", "packed_ss", 3, 8),
    ("nemotron", "packed_ss", 15, 5),
    ("nemotron", "packed_ss", 31, 4),
    ("nemotron", "linear_ss", 2, 6),
    ("nemotron", "linear_ss", 7, 3),
    ("nemotron", "quadratic_ss", 3, 4),
    ("nemotron", "quadratic_ss", 7, 3),
    ("nemotron", "hybrid_ss", 7, 5),
    ("setdlm", "ar", 1, 3),
    ("setdlm", "packed_ss", 2, 8),
    ("setdlm", "packed_ss", 8, 4),
    ("setdlm", "packed_ss", 16, 3),
    ("setdlm", "linear_ss", 4, 5),
    ("setdlm", "quadratic_ss", 4, 4),
    ("setdlm", "hybrid_ss", 8, 3),
    ("setdlm", "native", 8, 4),
]


@pytest.mark.parametrize("family,mode,width,batch", CASES)
def test_every_row_is_its_batch_1_decode(request, family, mode, width, batch):
    """Tokens identical, and the same calls, rows per call and acceptances as the prompt decoded alone; rows stop
    at an EOS mid-block or run to the length limit, so they finish at different calls."""
    _check_rows(request.getfixturevalue(family), mode, width, batch)


@pytest.mark.parametrize("mode", ["packed_ss", "quadratic_ss"])
def test_every_row_is_its_batch_1_decode_in_confidence_order(setdlm, mode):
    _check_rows(setdlm, mode, 6, 5, order="confidence")


def _check_rows(model, mode: str, width: int, batch: int, order: str = "ltr") -> None:
    vocab, max_new = model.config.vocab_size, 3 * width + 8
    prompts = _prompts(batch, vocab, seed=width * 31 + batch)
    continuations = [reference_greedy(model, p, max_new) for p in prompts]
    eos = [_eos(continuations, width)] if mode != "native" else []
    schedules = [schedule_for(model, mode, width, order=order) for _ in prompts]
    with torch.no_grad():
        outputs, total = decode_batch(model_forward(model, batched=True), schedules,
                                      _oracles(model, prompts, continuations, 5), prompts, max_new, eos)
        alone = [decode(model_forward(model), schedule_for(model, mode, width, order=order), layout, p, max_new,
                        eos) for p, layout in zip(prompts, _oracles(model, prompts, continuations, 5), strict=True)]
    lengths = set()
    for b, (out, (seq, stats)) in enumerate(zip(outputs, alone, strict=True)):
        assert out.tolist() == seq.tolist(), b
        row = total.per_row[b]
        assert (row.nfe, row.rows_per_call, row.accepted_per_iteration) == (
            stats.nfe, stats.rows_per_call, stats.accepted_per_iteration), b
        if mode != "native" and order == "ltr":  # confidence order is exact against its serial reference
            n = seq.numel() - prompts[b].numel()
            assert seq[prompts[b].numel():].tolist() == continuations[b][:n]  # exact: the AR mode's tokens
        lengths.add(row.nfe)
    assert total.nfe == max(r.nfe for r in total.per_row) and total.new_tokens == sum(
        r.new_tokens for r in total.per_row)
    # (out of order, a position accepted ahead can be dropped by a later EOS before it: counted when accepted)
    assert sum(total.accepted_per_iteration) == total.new_tokens or order != "ltr"
    if mode != "ar" and mode != "native":
        assert len(lengths) > 1  # rows finished at different calls
        assert any(max(r.accepted_per_iteration, default=0) > 1 for r in total.per_row)  # long acceptances


def test_eos_mid_block_in_some_rows_only(nemotron):
    """The case the parametrised test relies on, checked once: EOS cuts some rows and not others."""
    prompts = _prompts(6, nemotron.config.vocab_size, seed=2)
    continuations = [reference_greedy(nemotron, p, 30) for p in prompts]
    eos = _eos(continuations, 7)
    ends = [full.index(eos) + 1 if eos in full else None for full in continuations]
    assert any(e is None for e in ends) and any(e is not None for e in ends)
    schedules = [schedule_for(nemotron, "packed_ss", 7) for _ in prompts]
    with torch.no_grad():
        outputs, _ = decode_batch(model_forward(nemotron, batched=True), schedules,
                                  _oracles(nemotron, prompts, continuations, 1), prompts, 30, [eos])
    for p, out, full, end in zip(prompts, outputs, continuations, ends, strict=True):
        assert out[p.numel():].tolist() == full[: end or 30]


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
def test_cache_stays_within_its_bound_and_compaction_keeps_outputs(request, family):
    """After every call the batch's cache is at most `slack` columns longer than the longest row's own cache
    (plus nothing: the proposal columns are cropped at once); a small slack compacts often, outputs unchanged."""
    model = request.getfixturevalue(family)
    prompts = _prompts(5, model.config.vocab_size, seed=8)
    continuations = [reference_greedy(model, p, 40) for p in prompts]
    results = {}
    for slack in (4, 10_000):
        seen = []

        def trace(batch, call, seen=seen):
            longest = max(len(r.slots) for r in batch.rows)
            seen.append((batch.length, longest, batch.cache.get_seq_length(), batch.compactions))
            for i, r in enumerate(batch.rows):  # a row's valid slots are exactly the columns it holds
                assert batch.valid[i].nonzero().flatten().tolist() == sorted(r.slots)

        schedules = [schedule_for(model, "packed_ss", 4) for _ in prompts]
        with torch.no_grad():
            results[slack] = decode_batch(model_forward(model, batched=True), schedules,
                                          _oracles(model, prompts, continuations, 3), prompts, 40, slack=slack,
                                          trace=trace)[0]
        assert all(length == physical for length, _, physical, _ in seen)
        if slack == 4:
            assert all(length <= longest + slack for length, longest, _, _ in seen)
            assert seen[-1][3] > 0  # it compacted
    assert [o.tolist() for o in results[4]] == [o.tolist() for o in results[10_000]]


def test_sampling_rows_are_reproducible_with_a_generator(nemotron):
    prompts = _prompts(4, nemotron.config.vocab_size, seed=4)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(7)
        schedules = [schedule_for(nemotron, "packed_ss", 3, RejectionSampler(gen)) for _ in prompts]
        layouts = [OracleLayout(nemotron.config.mask_token_id, nemotron.config.vocab_size, [], 0, 0.0, b)
                   for b in range(len(prompts))]
        with torch.no_grad():
            runs.append([o.tolist() for o in decode_batch(model_forward(nemotron, batched=True), schedules,
                                                          layouts, prompts, 12)[0]])
    assert runs[0] == runs[1]


# --- the front: generate(input_ids, attention_mask=...) ------------------------------------------------------

def _left_padded(prompts, pad: int):
    width = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - p.numel():], mask[b, width - p.numel():] = p, 1
    return ids, mask


@pytest.mark.parametrize("mode", ["packed_ss", "linear_ss", "hybrid_ss"])
def test_generate_pads_as_stock_batched_generate(nemotron, mode):
    """Same sequences as stock batched greedy `generate` (left padding in, `pad_token_id` after each row's EOS)."""
    prompts = _prompts(4, nemotron.config.vocab_size, seed=6)
    continuations = [reference_greedy(nemotron, p, 24) for p in prompts]
    eos = _eos(continuations, 3)
    ids, mask = _left_padded(prompts, pad=3)
    options = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=eos, pad_token_id=3, do_sample=False)
    stock = nemotron.generate(ids, **options)
    ours = nemotron.generate(ids, assistant_mode=mode, speculative_width=3, return_dict_in_generate=True, **options)
    assert ours.sequences.tolist() == stock.tolist()
    assert ours.decoding_stats.new_tokens == sum(r.new_tokens for r in ours.decoding_stats.per_row)
    assert len(ours.decoding_stats.per_row) == 4


def test_generate_batch_on_setdlm_equals_each_prompt_alone(setdlm):
    prompts = _prompts(3, setdlm.config.vocab_size, seed=9)
    ids, mask = _left_padded(prompts, pad=0)
    out = setdlm.generate(ids, attention_mask=mask, assistant_mode="packed_ss", max_new_tokens=12, pad_token_id=0)
    for b, p in enumerate(prompts):
        alone = setdlm.generate(p[None], assistant_mode="packed_ss", max_new_tokens=12)
        assert out[b, ids.shape[1]:].tolist() == alone[0, p.numel():].tolist()


@pytest.mark.parametrize("bad,match", [
    ("right", "right-padded"),
    ("4d", "2D attention_mask"),
    ("shape", "has shape"),
    ("empty_row", "all padding"),
    ("values", "0 \\(padding\\) and 1"),
    ("return_sequences", "num_return_sequences"),
    ("streamer", "A streamer takes one sequence"),
    ("streamers", "list of 1 streamers for a batch of 2"),
    ("no_pad", "pad_token_id"),
])
def test_bad_batches_get_clear_errors(nemotron, bad, match):
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    options = dict(attention_mask=mask, assistant_mode="packed_ss", max_new_tokens=3, pad_token_id=0)
    if bad == "right":
        options["attention_mask"] = torch.tensor([[1, 1, 0], [1, 1, 1]])
    elif bad == "4d":
        options["attention_mask"] = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    elif bad == "shape":
        options["attention_mask"] = torch.ones(2, 4, dtype=torch.long)
    elif bad == "empty_row":
        options["attention_mask"] = torch.tensor([[0, 0, 0], [1, 1, 1]])
    elif bad == "values":
        options["attention_mask"] = torch.tensor([[0, 2, 1], [1, 1, 1]])
    elif bad == "return_sequences":
        options.update(num_return_sequences=2, do_sample=True)
    elif bad == "streamer":
        options["streamer"] = Collect()
    elif bad == "streamers":
        options["streamer"] = [Collect()]
    elif bad == "no_pad":
        options.update(pad_token_id=None, stop_sequences=[[4]])
    with pytest.raises(ValueError, match=match):
        nemotron.generate(ids, **options)


# --- the lockstep path: every row in the same tensors (greedy AR / Packed-SS, left to right, on either family) ---

@pytest.fixture(scope="module")
def trained():
    """The bundled GSM8K-trained Nemotron-format model in float64: a real drafter, so rows accept long and very
    differently, and EOS falls inside accepted blocks."""
    from hf_packed_ss import bundled

    model, tokenizer = bundled.load("tiny-nemotron-gsm8k", torch.float64)
    return model, tokenizer


@pytest.fixture(scope="module")
def trained_setdlm():
    """The bundled GSM8K-trained SetDLM-format model in float64 (the same-position layout)."""
    from hf_packed_ss import bundled

    model, tokenizer = bundled.load("tiny-setdlm-gsm8k", torch.float64)
    return model, tokenizer


TRAINED = ["trained", "trained_setdlm"]


def _questions(tokenizer, n: int, skip: int = 0) -> list[torch.Tensor]:
    from hf_packed_ss.tools.bench.suites import SAMPLE, read_jsonl

    rows = read_jsonl(SAMPLE)[skip : skip + n]
    texts = [f"Question: {r['question']}\nAnswer:" for r in rows]
    texts[0] = texts[0][-12:]  # one short prompt
    return [tokenizer(t, return_tensors="pt").input_ids[0] for t in texts]


def _layout(model, static: bool = False):
    """The model family's own layout (shifted-block or same-position)."""
    from hf_packed_ss.front.families import family

    return family(model.config).layout(model.config.mask_token_id, static)


def _plain(model, mode, width, n):
    return [schedule_for(model, mode, width) for _ in range(n)], [_layout(model) for _ in range(n)]


def _lockstep(trace=None):
    """A trace that records whether every call ran in lockstep (a lockstep batch keeps no per-row slot lists)."""
    seen = []

    def record(batch, call):
        seen.append(not batch.rows)
        if trace is not None:
            trace(batch, call)

    return seen, record


def test_greedy_prefix_is_the_one_greedy_acceptance():
    """The batched prefix match the lockstep path verifies with gives, row by row, the h `Greedy` decides (the
    same function at batch 1), a draft shorter than its row's slots included."""
    from hf_packed_ss.engine import Greedy
    from hf_packed_ss.engine.acceptance import greedy_prefix

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 6, 5, generator=gen)  # 64 rows, ranks 0..5, vocabulary 5
    verified = logits.argmax(-1)
    kappa = torch.randint(0, 6, (64,), generator=gen)
    # drafts that follow the verifier for a random number of ranks, then differ
    follow = torch.randint(0, 6, (64, 1), generator=gen)
    draft = torch.where(torch.arange(5)[None] < follow, verified[:, :5], (verified[:, :5] + 1) % 5)
    h = greedy_prefix(draft, verified, kappa)
    for b in range(64):
        k = int(kappa[b])
        assert int(h[b]) == Greedy().decide(draft[b, :k], None, logits[b, : k + 1])[2] == min(k, int(follow[b]))


@pytest.mark.parametrize("family", TRAINED)
@pytest.mark.parametrize("mode,width,batch", [("packed_ss", 1, 3), ("packed_ss", 3, 8), ("packed_ss", 7, 5),
                                              ("packed_ss", 15, 4), ("ar", 0, 6)])
def test_lockstep_rows_are_their_batch_1_decodes(request, family, mode, width, batch):
    """Tokens, calls and acceptances of every row as decoded alone, and the same outputs as each row in its own
    loop, on both families; the model's EOS ends some rows inside an accepted block, others run to the length
    limit."""
    model, tokenizer = request.getfixturevalue(family)
    prompts, eos = _questions(tokenizer, batch, skip=width), [tokenizer.eos_token_id]
    width = max(width, 1)
    forward = model_forward(model, batched=True)
    with torch.no_grad():
        # a length limit below some answers and above others: the median answer length (EOS included)
        lengths = sorted(decode(model_forward(model), *(x[0] for x in _plain(model, "ar", 1, 1)), p, 128,
                                eos)[0].numel() - p.numel() for p in prompts)
        limit = min(lengths[len(lengths) // 2], lengths[-1] - 1)
        seen, trace = _lockstep()
        got, total = decode_batch(forward, *_plain(model, mode, width, batch), prompts, limit, eos, trace=trace)
        rowwise, _ = decode_batch(forward, *_plain(model, mode, width, batch), prompts, limit, eos, lockstep=False)
        alone = [decode(model_forward(model), *(x[0] for x in _plain(model, mode, width, 1)), p, limit, eos)
                 for p in prompts]
    assert seen and all(seen)  # chosen by default: every call in lockstep
    assert [g.tolist() for g in got] == [r.tolist() for r in rowwise] == [s.tolist() for s, _ in alone]
    for row, (_, stats) in zip(total.per_row, alone, strict=True):
        assert (row.nfe, row.accepted_per_iteration, row.new_tokens) == (
            stats.nfe, stats.accepted_per_iteration, stats.new_tokens)
    assert total.nfe == max(r.nfe for r in total.per_row) and sum(total.accepted_per_iteration) == total.new_tokens
    if mode == "packed_ss" and width > 1:
        assert len({r.nfe for r in total.per_row}) > 1  # rows finished at different calls
        assert max(max(r.accepted_per_iteration) for r in total.per_row) >= min(width, 3)  # long acceptances
    ended = [eos[0] in g[p.numel():].tolist() for p, g in zip(prompts, got, strict=True)]
    assert any(ended) and not all(ended)


@pytest.mark.parametrize("family", ["nemotron", "setdlm", *TRAINED])
def test_lockstep_is_chosen_and_its_cache_stays_bounded(request, family):
    """`decode_batch` takes the lockstep path when it can (both families); the cache never outgrows the longest
    row's own by more than the slack, a small slack compacts, and the outputs do not change."""
    model = request.getfixturevalue(family)
    model = model[0] if family in TRAINED else model
    vocab = model.config.vocab_size
    prompts = [(p + 2) % vocab for p in _prompts(6, vocab - 2, seed=3)]  # never a MASK id (0, 1 or the last)
    results = {}
    for slack in (3, 10_000):
        seen = []

        def trace(batch, call, seen=seen):
            seen.append((batch.length, int(batch.valid.sum(1).max()), batch.cache.get_seq_length(),
                         batch.compactions))

        steps, trace = _lockstep(trace)
        with torch.no_grad():
            results[slack] = decode_batch(model_forward(model, batched=True), *_plain(model, "packed_ss", 5, 6),
                                          prompts, 40, slack=slack, trace=trace)[0]
        assert steps and all(steps)
        assert seen and all(length == physical for length, _, physical, _ in seen)
        assert all(length <= longest + slack + 6 for length, longest, _, _ in seen)  # + the last call's holes
        if slack == 3:
            assert seen[-1][3] > 0
    assert [o.tolist() for o in results[3]] == [o.tolist() for o in results[10_000]]
    with torch.no_grad():
        alone = [decode(model_forward(model), *(x[0] for x in _plain(model, "packed_ss", 5, 1)), p, 40)[0]
                 for p in prompts]
    assert [o.tolist() for o in results[3]] == [a.tolist() for a in alone]


def test_lockstep_refuses_what_it_cannot_decode(nemotron):
    prompts = _prompts(2, nemotron.config.vocab_size, seed=1)
    schedules, layouts = _plain(nemotron, "linear_ss", 3, 2)
    with pytest.raises(ValueError, match="lockstep=True needs"):
        decode_batch(model_forward(nemotron, batched=True), schedules, layouts, prompts, 4, lockstep=True)
    with torch.no_grad():
        out, stats = decode_batch(model_forward(nemotron, batched=True), *_plain(nemotron, "packed_ss", 3, 2),
                                  prompts, 0)
    assert [o.tolist() for o in out] == [p.tolist() for p in prompts] and stats.nfe == 0


def test_per_row_stop_sequences_and_processors_as_stock_batched_generate(nemotron):
    """A stop sequence ends each row where stock batched `generate` ends it (and pads after it); a logits
    processor sees each row's own ids, so every row equals its prompt decoded alone with the processor."""
    prompts = _prompts(4, nemotron.config.vocab_size, seed=12)
    continuations = [reference_greedy(nemotron, p, 20) for p in prompts]
    marker = continuations[0][5:7]  # met in row 0 at least
    ids, mask = _left_padded(prompts, pad=1)
    # stock pads a stopped row only when an EOS is set (else it keeps filling it): one that never comes
    never = next(t for t in range(nemotron.config.vocab_size) if all(t not in c for c in continuations))
    options = dict(attention_mask=mask, max_new_tokens=20, pad_token_id=1, stop_sequences=[marker],
                   eos_token_id=never)
    stock = nemotron.generate(ids, **options)
    ours = nemotron.generate(ids, assistant_mode="packed_ss", speculative_width=4, **options)
    assert ours.tolist() == stock.tolist()
    first = ours[0, ids.shape[1]:].tolist()
    assert first[:7] == continuations[0][:7] and set(first[7:]) <= {1}  # row 0 ends at the marker, then padding
    penalised = nemotron.generate(ids, attention_mask=mask, assistant_mode="packed_ss", max_new_tokens=10,
                                  repetition_penalty=1.6)
    for b, p in enumerate(prompts):
        alone = nemotron.generate(p[None], assistant_mode="packed_ss", max_new_tokens=10, repetition_penalty=1.6)
        assert penalised[b, ids.shape[1]:].tolist() == alone[0, p.numel():].tolist()


def test_sampled_batch_through_generate_is_reproducible(setdlm):
    prompts = _prompts(3, setdlm.config.vocab_size, seed=2)
    ids, mask = _left_padded(prompts, pad=0)
    kwargs = dict(attention_mask=mask, assistant_mode="packed_ss", do_sample=True, max_new_tokens=8, pad_token_id=0)
    a = setdlm.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    b = setdlm.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    c = setdlm.generate(ids, generator=torch.Generator().manual_seed(6), **kwargs)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("family,mode", [("nemotron", "packed_ss"), ("nemotron", "quadratic_ss"),
                                         ("setdlm", "packed_ss"), ("setdlm", "linear_ss")])
def test_stop_criteria_that_roll_back_cached_rows_keep_rows_exact(request, family, mode):
    """A stop met inside an accepted block drops rows the row had cached (they leave its cache: older columns
    become holes); every row still equals its batch-1 decode with the same stop, and the validity mask stays
    exactly the row's cache."""
    model = request.getfixturevalue(family)
    prompts = _prompts(5, model.config.vocab_size, seed=21)
    continuations = [reference_greedy(model, p, 30) for p in prompts]
    markers = [c[7:9] for c in continuations[:3]]  # met by three rows mid-block (the oracle accepts long)

    def stop(sequence: torch.Tensor) -> bool:
        tail = sequence[-2:].tolist()
        return any(tail == m for m in markers)

    def trace(batch, call):
        for i, r in enumerate(batch.rows):
            assert batch.valid[i].nonzero().flatten().tolist() == sorted(r.slots)

    with torch.no_grad():
        got, _ = decode_batch(model_forward(model, batched=True), [schedule_for(model, mode, 6) for _ in prompts],
                              _oracles(model, prompts, continuations, 9), prompts, 30, stop=stop, trace=trace)
        alone = [decode(model_forward(model), schedule_for(model, mode, 6), layout, p, 30, stop=stop)[0]
                 for p, layout in zip(prompts, _oracles(model, prompts, continuations, 9), strict=True)]
    assert [g.tolist() for g in got] == [a.tolist() for a in alone]
    assert sum(g.numel() - p.numel() < 30 for g, p in zip(got, prompts, strict=True)) >= 3


@pytest.mark.parametrize("context", ["full", "sliding"])
def test_native_batches_with_a_sliding_context(monkeypatch, context):
    """SetDLM's native decoder in a batch, its sliding context (block_size 44) dropping each row's oldest cache
    rows (holes on the left of that row), equals each prompt decoded alone."""
    from hf_packed_ss.engine import RowCache

    model = tiny_setdlm(3, block_size=44)
    dropped = []
    crop_left = RowCache.crop_left
    monkeypatch.setattr(RowCache, "crop_left", lambda self, rows: dropped.append(rows) or crop_left(self, rows))
    prompts = _prompts(4, model.config.vocab_size, seed=5)
    ids, mask = _left_padded(prompts, pad=0)
    options = dict(assistant_mode="native", max_new_tokens=24, native_context=context, speculative_width=4)
    out = model.generate(ids, attention_mask=mask, **options)
    assert bool(dropped) == (context == "sliding")
    for b, p in enumerate(prompts):
        alone = model.generate(p[None], **options)
        assert out[b, ids.shape[1]:].tolist() == alone[0, p.numel():].tolist()


class CancelAfter(Collect):
    """A streamer whose consumer leaves once it has `tokens` new tokens (a server's client disconnecting)."""

    def __init__(self, tokens: int | None):
        super().__init__()
        self.tokens = tokens

    @property
    def cancelled(self) -> bool:
        return self.tokens is not None and sum(map(len, self.puts[1:])) >= self.tokens


@pytest.mark.parametrize("family,mode,static", [("trained", "packed_ss", False), ("trained", "linear_ss", False),
                                                ("trained", "packed_ss", True), ("trained", "ar", False),
                                                ("trained_setdlm", "packed_ss", False),
                                                ("trained_setdlm", "packed_ss", True)])
def test_per_row_streamers_see_their_row_and_a_cancelled_row_leaves(request, family, mode, static):
    """streamer=[one per row]: each gets its prompt then exactly its row's new tokens, and `end` once (lockstep,
    row-by-row and static-cache batches, both families); a row whose streamer turns `cancelled` stops with a prefix
    of its output and leaves the batch (later calls are narrower), the other rows unchanged."""
    model, tokenizer = request.getfixturevalue(family)
    prompts = _questions(tokenizer, 3, skip=4)
    ids, mask = _left_padded(prompts, pad=tokenizer.eos_token_id)
    options = dict(attention_mask=mask, assistant_mode=mode, max_new_tokens=40, pad_token_id=tokenizer.eos_token_id,
                   return_dict_in_generate=True)
    if static:
        options["cache_implementation"] = "static"
    full = model.generate(ids, streamer=[Collect() for _ in prompts], **options)
    streamers = [CancelAfter(None), CancelAfter(3), CancelAfter(None)]
    cut = model.generate(ids, streamer=streamers, **options)
    new = [row[ids.shape[1]:].tolist() for row in full.sequences]
    for b, (p, streamer) in enumerate(zip(prompts, streamers, strict=True)):
        assert streamer.puts[0] == p.tolist() and streamer.ended
        got = [t for put in streamer.puts[1:] for t in put]
        if b == 1:
            assert 3 <= len(got) < 40 and got == new[b][: len(got)]
            assert cut.sequences[b, ids.shape[1]:].tolist()[: len(got)] == got
        else:
            assert got == cut.sequences[b, ids.shape[1]:].tolist()[: len(got)] == new[b][: len(got)]
            assert len(got) == full.decoding_stats.per_row[b].new_tokens
    rows = cut.decoding_stats.rows_per_call
    if not static:  # the static batch pads a left row back: its graph keeps one shape
        assert cut.decoding_stats.per_row[1].nfe < cut.decoding_stats.nfe and rows[-1] < max(rows[1:])


def test_a_cancelled_streamer_ends_a_single_decode_early(nemotron):
    ids = torch.tensor([[5, 6, 7, 8]])
    full = nemotron.generate(ids, assistant_mode="packed_ss", max_new_tokens=30)
    streamer = CancelAfter(4)
    out = nemotron.generate(ids, assistant_mode="packed_ss", max_new_tokens=30, streamer=streamer)
    assert streamer.ended and 4 <= out.shape[1] - 4 < 30 and out[0].tolist() == full[0, : out.shape[1]].tolist()


def _arrivals(model, tokenizer, mode, width, plan):
    """An `admit` that hands the batch new prompts (GSM8K questions) at given rounds: plan = {round: [limits]}."""
    from hf_packed_ss.engine.batch_cache import Arrival

    questions = iter(_questions(tokenizer, sum(map(len, plan.values())), skip=9))
    joined, calls = [], [0]

    def admit():
        calls[0] += 1
        new = [Arrival(schedule_for(model, mode, width), _layout(model), next(questions), limit)
               for limit in plan.get(calls[0], [])]
        joined.extend(new)
        return new

    return admit, joined


@pytest.mark.parametrize("family,mode,width,lockstep", [
    ("trained", "packed_ss", 7, True), ("trained", "ar", 1, True), ("trained", "packed_ss", 3, False),
    ("trained", "linear_ss", 4, False), ("trained_setdlm", "packed_ss", 7, True), ("trained_setdlm", "ar", 1, True)])
def test_rows_that_join_a_running_batch_are_their_solo_decodes(request, family, mode, width, lockstep):
    """Continuous batching: prompts that join mid-decode (own limits, several rounds, one after the first rows
    finished) each get exactly their solo tokens and calls; the batch's cache stays exact (its length is the
    physical cache's)."""
    model, tokenizer = request.getfixturevalue(family)
    prompts, eos = _questions(tokenizer, 3), [tokenizer.eos_token_id]
    admit, joined = _arrivals(model, tokenizer, mode, width, {1: [20, 60], 4: [50], 9: [8, 30], 200: [25]})
    seen = []
    forward = model_forward(model, batched=True)
    with torch.no_grad():
        got, total = decode_batch(forward, *_plain(model, mode, width, 3), prompts, 40, eos, lockstep=lockstep,
                                  admit=admit, trace=lambda batch, call: seen.append(
                                      (batch.length, batch.cache.get_seq_length())))
        alone = [decode(model_forward(model), *(x[0] for x in _plain(model, mode, width, 1)), p, n, eos)
                 for p, n in [*((p, 40) for p in prompts), *((a.prompt, a.max_new_tokens) for a in joined)]]
    assert len(joined) == 5 and len(got) == len(total.per_row) == 8  # the round-200 arrival came too late
    assert [g.tolist() for g in got] == [s.tolist() for s, _ in alone]
    for row, (_, stats) in zip(total.per_row, alone, strict=True):
        assert (row.nfe, row.accepted_per_iteration, row.new_tokens) == (
            stats.nfe, stats.accepted_per_iteration, stats.new_tokens)
    assert all(length == physical for length, physical in seen)
    assert total.nfe < sum(r.nfe for r in total.per_row)  # rows shared calls


@pytest.mark.parametrize("family", TRAINED)
@pytest.mark.parametrize("lockstep", [True, False])
@pytest.mark.parametrize("limit", [1, 2])
def test_arrivals_into_a_batch_whose_rows_all_finished(request, family, lockstep, limit):
    """Rows that arrive once every row of the batch has ended (before its first steady call, or after) start it
    over and decode as alone."""
    from hf_packed_ss.engine.batch_cache import Arrival

    model, tokenizer = request.getfixturevalue(family)
    prompts = _questions(tokenizer, 4)
    first = [Collect(), Collect()]
    waiting = [Arrival(schedule_for(model, "packed_ss", 5), _layout(model), p, n)
               for p, n in zip(prompts[2:], (12, 9), strict=True)]
    joined = []

    def admit():  # the arrivals come only once both first rows have ended
        if joined or not all(s.ended for s in first):
            return []
        joined.extend(waiting)
        return waiting

    with torch.no_grad():
        got, _ = decode_batch(model_forward(model, batched=True), *_plain(model, "packed_ss", 5, 2), prompts[:2],
                              limit, lockstep=lockstep, admit=admit, streamers=first)
        alone = [decode(model_forward(model), *(x[0] for x in _plain(model, "packed_ss", 5, 1)), a.prompt,
                        a.max_new_tokens)[0] for a in waiting]
    assert joined and [g.numel() - p.numel() for g, p in zip(got[:2], prompts, strict=False)] == [limit, limit]
    assert [g.tolist() for g in got[2:]] == [a.tolist() for a in alone]


@pytest.mark.parametrize("family,mode,width", [("trained", "packed_ss", 7), ("trained", "ar", 1),
                                               ("trained_setdlm", "packed_ss", 7)])
def test_rows_join_a_static_batch_into_its_free_rows_as_their_solo_decodes(request, family, mode, width):
    """A compiled server's batch: a `SlotCache` of 3 rows. Arrivals take the rows of those that finished and wait
    while none is free; one whose prompt is longer than the cache moves the rows in use right; the cache is never
    reallocated; every row gets exactly its solo tokens and calls (both families)."""
    from hf_packed_ss.engine.batch_cache import Arrival
    from hf_packed_ss.engine.static import steady_rows
    from hf_packed_ss.front.forward import static_batch_forward

    model, tokenizer = request.getfixturevalue(family)
    prompts, eos = _questions(tokenizer, 2), [tokenizer.eos_token_id]
    extra = _questions(tokenizer, 5, skip=9)
    long = torch.cat([extra[1], extra[2], extra[3]])  # longer than the batch's cache when it joins
    plan = {1: [(extra[4], 20), (long, 30)], 3: [(extra[2], 12)], 6: [(extra[3], 25), (extra[1], 8)]}
    calls, joined, seen = [0], [], []

    def admit():
        calls[0] += 1
        new = [Arrival(schedule_for(model, mode, width), _layout(model, True), p, n) for p, n in plan.get(calls[0], [])]
        joined.extend(new)
        return new

    schedules, layouts = _plain(model, mode, width, 2)
    rows = steady_rows(schedules[0], layouts[0])
    forward, cache = static_batch_forward(model, 3, rows, 600, None)
    with torch.no_grad():
        got, total = decode_batch(forward, schedules, layouts, prompts, 40, eos, lockstep=True, cache=cache,
                                  admit=admit, trace=lambda batch, call: seen.append(
                                      (batch.valid.shape[0], batch.length, batch.cache.length,
                                       tuple(layer.keys.data_ptr() for layer in batch.cache.layers))))
        alone = [decode(model_forward(model), *(x[0] for x in _plain(model, mode, width, 1)), p, n, eos)
                 for p, n in [*((p, 40) for p in prompts), *((a.prompt, a.max_new_tokens) for a in joined)]]
    assert len(got) == len(total.per_row) == 7
    assert [g.tolist() for g in got] == [s.tolist() for s, _ in alone]
    for row, (_, stats) in zip(total.per_row, alone, strict=True):
        assert (row.nfe, row.accepted_per_iteration, row.new_tokens) == (
            stats.nfe, stats.accepted_per_iteration, stats.new_tokens)
    assert max(m for m, *_ in seen) == 3 and all(length == slots for _, length, slots, _ in seen)
    assert len({keys for *_, keys in seen}) == 1  # the same tensors throughout: the graph's inputs never changed


def test_admit_refuses_what_a_joining_row_cannot_share(nemotron):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="admit= takes a callable"):
        nemotron.generate(ids, assistant_mode="packed_ss", max_new_tokens=3, admit=[1])
    with pytest.raises(ValueError, match="max_batch_size=1: the most rows"):
        nemotron.generate(ids.expand(2, -1), assistant_mode="packed_ss", max_new_tokens=3, admit=list,
                          cache_implementation="static", max_batch_size=1)
    with pytest.raises(ValueError, match="min_new_tokens"):
        nemotron.generate(ids, assistant_mode="packed_ss", max_new_tokens=3, admit=list, min_new_tokens=2)


def test_generate_with_admit_decodes_joining_rows_as_alone(trained):
    """The front: `generate(..., streamer=[...], admit=fn)` hands each joining prompt its own schedule, layout and
    limit; its streamer gets exactly its solo tokens (and its statistics), `sequences` the batch's own rows; over a
    static cache too (a lockstep batch of `max_batch_size` rows, or row after row)."""
    model, tokenizer = trained
    prompts = _questions(tokenizer, 4, skip=2)
    eos = tokenizer.eos_token_id
    stats = {}

    class Stats(Collect):
        def put_stats(self, s):
            stats[id(self)] = s

    ids, mask = _left_padded(prompts[:2], pad=eos)
    static = {"cache_implementation": "static", "max_batch_size": 3, "max_cache_len": 512}  # lockstep; row by row
    for mode, options in (("packed_ss", {}), ("linear_ss", {}), ("packed_ss", static), ("linear_ss", static)):
        queue = [(prompts[2], 30, Stats()), (prompts[3], 12, Stats())]
        joined = list(queue)
        out = model.generate(ids, attention_mask=mask, assistant_mode=mode, max_new_tokens=20, pad_token_id=eos,
                             return_dict_in_generate=True, admit=lambda q=queue: [q.pop(0)] if q else [], **options)
        for p, n, streamer in joined:
            alone = model.generate(p[None], assistant_mode=mode, max_new_tokens=n, return_dict_in_generate=True)
            assert [t for put in streamer.puts[1:] for t in put] == alone.sequences[0, p.numel():].tolist()
            assert streamer.ended and stats[id(streamer)].nfe == alone.decoding_stats.nfe
        assert len(out.decoding_stats.per_row) == 4 and out.sequences.shape[0] == 2


def test_a_layout_subclass_that_changes_its_calls_decodes_row_by_row():
    """Lockstep runs a layout's `steady_call` template, so a subclass whose `build` differs, with no template of
    its own, must take the per-row path (where its own calls run)."""
    from hf_packed_ss.engine import Greedy
    from hf_packed_ss.engine.batch import tensorised
    from hf_packed_ss.engine.layouts.shifted_block import ShiftedBlockLayout
    from hf_packed_ss.engine.schedules import PackedSSSchedule

    class Rewritten(ShiftedBlockLayout):
        def build(self, plan, state):
            return super().build(plan, state)

    schedules = [PackedSSSchedule(3, Greedy()) for _ in range(2)]
    assert tensorised(schedules, [ShiftedBlockLayout(5) for _ in range(2)], None, None)
    assert not tensorised(schedules, [Rewritten(5) for _ in range(2)], None, None)
