"""Stopping and streaming: stop strings, stopping criteria and EOS lists stop exactly where stock
`generate` stops, also when the stop falls inside an accepted block; streamers receive exactly the
returned tokens, in order, several per call."""

from __future__ import annotations

import pytest
import torch
from drafters import Collect, OracleLayout
from engine import decode
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

from hf_packed_ss import bundled
from hf_packed_ss.engine.schedules import SCHEDULES
from hf_packed_ss.front import stopping

SPECULATIVE = ["linear_ss", "quadratic_ss", "packed_ss"]


@pytest.fixture(scope="module")
def loaded():
    model, tokenizer = bundled.load("tiny-nemotron-random", dtype=torch.float64)
    ids = tokenizer("Question: Tom has 3 apples.", return_tensors="pt").input_ids
    return model, tokenizer, ids


class StopAtToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def _oracle_run(model, ids, mode, width, stock_new, stop=None, streamer=None, eos=()):
    oracle = OracleLayout(model.config.mask_token_id, model.config.vocab_size, stock_new, ids.shape[1], 1.0)
    with torch.no_grad():
        return decode(model, SCHEDULES[mode](width), ids[0], 60, layout=oracle, eos=eos, stop=stop, streamer=streamer)


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_stop_strings_mid_block_match_stock(loaded, mode):
    model, tokenizer, ids = loaded
    full = model.generate(ids, max_new_tokens=60, assistant_mode=None)[0, ids.shape[1]:].tolist()
    candidates = [tokenizer.decode(full[i : i + 2]) for i in range(4, 50, 3)]
    tried = 0
    for stop_string in candidates:
        if not (stop_string.isascii() and stop_string.strip()):
            continue
        stock = model.generate(ids, max_new_tokens=60, assistant_mode=None, stop_strings=[stop_string],
                               tokenizer=tokenizer)
        if stock.shape[1] == ids.shape[1] + 60:
            continue  # this string did not stop stock generate: not a useful case
        tried += 1
        config = model.generation_config.__class__(stop_strings=[stop_string])
        seq, stats = _oracle_run(model, ids, mode, 7, full, stopping(config, None, tokenizer))
        assert seq.tolist() == stock[0].tolist()
        assert max(stats.accepted_per_iteration) > 1  # blocks of several tokens were accepted
        ours = model.generate(ids, max_new_tokens=60, assistant_mode=mode, speculative_width=7,
                              stop_strings=[stop_string], tokenizer=tokenizer)
        assert torch.equal(ours, stock)
    assert tried >= 3


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_stopping_criteria_and_eos_lists_match_stock(loaded, mode):
    model, tokenizer, ids = loaded
    full = model.generate(ids, max_new_tokens=60, assistant_mode=None)[0, ids.shape[1]:].tolist()
    token = full[13]
    criteria = StoppingCriteriaList([StopAtToken(token)])
    stock = model.generate(ids, max_new_tokens=60, assistant_mode=None, stopping_criteria=criteria)
    config = model.generation_config.__class__()
    seq, _ = _oracle_run(model, ids, mode, 7, full, stopping(config, criteria, None))
    assert seq.tolist() == stock[0].tolist()
    ours = model.generate(ids, max_new_tokens=60, assistant_mode=mode, speculative_width=7,
                          stopping_criteria=StoppingCriteriaList([StopAtToken(token)]))
    assert torch.equal(ours, stock)
    eos_list = [full[17], full[11]]
    stock = model.generate(ids, max_new_tokens=60, assistant_mode=None, eos_token_id=eos_list)
    seq, _ = _oracle_run(model, ids, mode, 7, full, eos=eos_list)
    assert seq.tolist() == stock[0].tolist()[: seq.numel()] and int(seq[-1]) in eos_list
    ours = model.generate(ids, max_new_tokens=60, assistant_mode=mode, eos_token_id=eos_list)
    assert torch.equal(ours, seq[None])


@pytest.mark.parametrize("mode", ["ar", *SPECULATIVE])
def test_streamer_receives_exactly_the_output(loaded, mode):
    model, tokenizer, ids = loaded
    full = model.generate(ids, max_new_tokens=60, assistant_mode=None)[0, ids.shape[1]:].tolist()
    streamer = Collect()
    config = model.generation_config.__class__(stop_strings=[tokenizer.decode(full[25:27])])
    seq, stats = _oracle_run(model, ids, mode, 5, full, stopping(config, None, tokenizer), streamer)
    assert streamer.ended and streamer.puts[0] == ids[0].tolist()
    assert sum(streamer.puts[1:], []) == seq[ids.shape[1]:].tolist()
    assert [len(p) for p in streamer.puts[1:]] == stats.accepted_per_iteration
    if mode != "ar":
        assert max(len(p) for p in streamer.puts[1:]) > 1


def test_text_iterator_streamer_through_generate(loaded):
    model, tokenizer, ids = loaded
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    out = model.generate(ids, max_new_tokens=30, assistant_mode="packed_ss", streamer=streamer)
    assert "".join(streamer) == tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(assistant_model="x"), "assistant_model"),
        (dict(cache_implementation="offloaded"), "cache_implementation"),
        (dict(attention_mask=torch.ones(1, 1, 8, 8, dtype=torch.bool)), "2D attention_mask"),
        (dict(stop_strings=["x"]), "tokenizer"),
    ],
)
def test_conflicting_options_raise(loaded, kwargs, message):
    model, _, ids = loaded
    with pytest.raises(ValueError, match=message):
        model.generate(ids, assistant_mode="packed_ss", max_new_tokens=4, **kwargs)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("mode", SPECULATIVE)
def test_candidate_generator_exposes_the_retained_draft(loaded, mode, do_sample):
    """Code written against transformers' CandidateGenerator interface sees the draft each iteration."""
    from hf_packed_ss import PackedSSCandidateGenerator
    from hf_packed_ss.engine.acceptance import Greedy, RejectionSampler

    model, _, ids = loaded
    full = model.generate(ids, max_new_tokens=40, assistant_mode=None)[0, ids.shape[1]:].tolist()
    schedule = SCHEDULES[mode](5, RejectionSampler() if do_sample else Greedy())
    candidates = PackedSSCandidateGenerator(schedule)
    seen = []

    class Inspect(Collect):
        def put(self, value):
            super().put(value)
            prefix = torch.tensor([sum(self.puts, [])])
            cand_ids, cand_logits = candidates.get_candidates(prefix)
            k = schedule.draft.numel()
            assert cand_ids.shape == (1, prefix.shape[1] + k) and torch.equal(cand_ids[:, : prefix.shape[1]], prefix)
            if do_sample and k:
                q = cand_logits.softmax(-1)[0]
                assert cand_logits.shape == (1, k, model.config.vocab_size)
                assert torch.allclose(q.sum(-1), torch.ones(k, dtype=q.dtype))
                assert (q[torch.arange(k), schedule.draft.tokens] > 0).all()  # each draft token came from its Q
            else:
                assert cand_logits is None
            seen.append(k)

    oracle = OracleLayout(model.config.mask_token_id, model.config.vocab_size, full, ids.shape[1], 0.8)
    torch.manual_seed(0)
    with torch.no_grad():
        _, stats = decode(model, schedule, ids[0], 40, layout=oracle, streamer=Inspect(), trace=candidates.observe)
    assert len(candidates.num_matches) == len(stats.accepted_per_iteration)
    if mode != "linear_ss":  # Linear-SS drafts in a separate call, after the tokens are streamed
        assert max(seen) > 0
    out = model.generate(ids, assistant_mode=mode, max_new_tokens=10, return_dict_in_generate=True)
    assert isinstance(out.candidate_generator, PackedSSCandidateGenerator)


def test_text_streamer_prints_the_output(loaded, capsys):
    from transformers import TextStreamer

    model, tokenizer, ids = loaded
    text = tokenizer("Question: 12 + 30?", return_tensors="pt").input_ids
    out = model.generate(text, max_new_tokens=20, assistant_mode="quadratic_ss",
                         streamer=TextStreamer(tokenizer, skip_prompt=True))
    assert capsys.readouterr().out.rstrip("\n") == tokenizer.decode(out[0, text.shape[1]:]).rstrip("\n")
