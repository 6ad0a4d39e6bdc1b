"""Multi-token stop markers (appendix E.2) for every schedule on both model formats: `stop_sequences`
(token ids) and `stop_strings` (with a tokenizer) stop exactly where stock `generate` stops under LTR
order; under confidence order a marker counts only once all its tokens are accepted, earlier
positions are filled, and the earliest-ending marker wins. Streamers get exactly the output."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_setdlm
from drafters import Collect

from hf_packed_ss import bundled

MODES = ["ar", "linear_ss", "quadratic_ss", "packed_ss"]


@pytest.fixture(scope="module")
def formats():
    nemotron, tokenizer = bundled.load("tiny-nemotron-random", dtype=torch.float64)
    setdlm = tiny_setdlm(4, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, max_block_size=16)
    ids = tokenizer("Question: Tom has 3 apples and buys 5 more.", return_tensors="pt").input_ids
    return {"nemotron": nemotron, "setdlm": setdlm}, tokenizer, ids


def _full(model, ids, n=48):
    return model.generate(ids, max_new_tokens=n, assistant_mode=None, do_sample=False)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
@pytest.mark.parametrize("mode", MODES)
def test_stop_sequences_match_stock(formats, family, mode):
    models, _, ids = formats
    model = models[family]
    full = _full(model, ids)
    marker = full[14:16]
    stock = model.generate(ids, max_new_tokens=48, assistant_mode=None, do_sample=False, stop_sequences=[marker])
    assert stock.shape[1] < ids.shape[1] + 48 and stock[0, -2:].tolist() == marker
    ours = model.generate(ids, max_new_tokens=48, assistant_mode=mode, speculative_width=6, stop_sequences=[marker])
    assert torch.equal(ours, stock)


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
@pytest.mark.parametrize("mode", MODES)
def test_stop_strings_match_stock(formats, family, mode):
    models, tokenizer, ids = formats
    model = models[family]
    full = _full(model, ids)
    tried = 0
    for i in range(6, 40, 5):
        text = tokenizer.decode(full[i : i + 2])
        if not (text.isascii() and text.strip()):
            continue
        stock = model.generate(ids, max_new_tokens=48, assistant_mode=None, do_sample=False, stop_strings=[text],
                               tokenizer=tokenizer)
        if stock.shape[1] == ids.shape[1] + 48:
            continue
        ours = model.generate(ids, max_new_tokens=48, assistant_mode=mode, speculative_width=6, stop_strings=[text],
                              tokenizer=tokenizer)
        assert torch.equal(ours, stock), text
        tried += 1
    assert tried >= 2


@pytest.mark.parametrize("mode", ["linear_ss", "quadratic_ss", "packed_ss", "native"])
def test_any_order_markers_fill_earlier_positions_and_earliest_wins(formats, mode):
    models, _, ids = formats
    model = models["setdlm"]
    order = {} if mode == "native" else {"verify_order": "confidence"}
    free = model.generate(ids, max_new_tokens=48, assistant_mode=mode, speculative_width=8, **order)[0, ids.shape[1]:]
    free = free.tolist()
    for i in (10, 20, 30):
        markers = [free[i : i + 2], free[i + 5 : i + 8]]
        out = model.generate(ids, max_new_tokens=48, assistant_mode=mode, speculative_width=8, stop_sequences=markers,
                             return_dict_in_generate=True, **order)
        tail = out.sequences[0, ids.shape[1]:].tolist()
        assert tail[-2:] == markers[0] or tail[-3:] == markers[1]
        ends = [j + len(m) for j in range(len(tail)) for m in markers if tail[j : j + len(m)] == m]
        assert min(ends) == len(tail)  # no marker ends earlier: the earliest-ending one won
        assert model.config.mask_token_id not in tail and out.decoding_stats.new_tokens == len(tail)


@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_setdlm_streamer_receives_exactly_the_output(formats, order):
    models, _, ids = formats
    streamer = Collect()
    out = models["setdlm"].generate(ids, max_new_tokens=40, assistant_mode="packed_ss", verify_order=order,
                                    streamer=streamer)
    assert streamer.ended and streamer.puts[0] == ids[0].tolist()
    assert sum(streamer.puts[1:], []) == out[0, ids.shape[1]:].tolist()


class Provenance(Collect):
    def __init__(self):
        super().__init__()
        self.kinds: list[str] = []

    def put_iteration(self, value, kinds):
        self.put(value)
        self.kinds += kinds


@pytest.mark.parametrize("family", ["nemotron", "setdlm"])
@pytest.mark.parametrize("mode", MODES)
def test_provenance_streamers_get_how_each_token_was_produced(formats, family, mode):
    models, _, ids = formats
    streamer = Provenance()
    out = models[family].generate(ids, max_new_tokens=30, assistant_mode=mode, speculative_width=4, streamer=streamer,
                                  return_dict_in_generate=True)
    assert sum(streamer.puts[1:], []) == out.sequences[0, ids.shape[1]:].tolist()
    assert len(streamer.kinds) == out.decoding_stats.new_tokens
    if mode == "ar":
        assert set(streamer.kinds) == {"verifier"}
    else:
        assert set(streamer.kinds) <= {"draft", "correction", "bonus", "verifier"} and "correction" in streamer.kinds
        # each iteration adds draft tokens and at most one verifier token (exactly one unless truncated or,
        # any-order, a fully drafted window was accepted whole)
        iterations = len(out.decoding_stats.accepted_per_iteration)
        verifier_tokens = sum(k != "draft" for k in streamer.kinds)
        assert verifier_tokens <= iterations
        assert verifier_tokens >= iterations - 1 or family == "setdlm"
