"""`cache_implementation="static"` and compiled calls: the same tokens as the eager dynamic-cache decode for every
schedule on both families (greedy and seeded sampling), one compiled graph across prompts of different lengths,
and the pieces (slot cache, in-graph mask, the row count read from the engine)."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK, tiny_model, tiny_setdlm
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers import CompileConfig, DynamicCache

from hf_packed_ss.engine import SCHEDULES, WINDOW_SCHEDULES, Greedy, SamePositionLayout, ShiftedBlockLayout
from hf_packed_ss.engine.static import SlotCache, pad_rows, pad_template, slot_mask, steady_rows
from hf_packed_ss.front.forward import model_forward

FAMILIES = {"nemotron": (lambda: tiny_model(0), SCHEDULES), "setdlm": (lambda: tiny_setdlm(0), WINDOW_SCHEDULES)}
# every fixed schedule (auto picks rows per call, which a static cache refuses: test_auto.py)
CASES = [(family, mode) for family, (_, modes) in FAMILIES.items() for mode in modes if mode != "auto"]
PROMPT = torch.tensor([[5, 9, 2, 7, 1, 3, 8]])


@pytest.fixture(scope="module")
def family_models():
    return {name: make() for name, (make, _) in FAMILIES.items()}


def _generate(model, prompt, mode, compile_config=None, static=True, **kwargs):
    options = dict(assistant_mode=mode, speculative_width=3, max_new_tokens=kwargs.pop("max_new_tokens", 24),
                   return_dict_in_generate=True)
    if static:
        options.update(cache_implementation="static", compile_config=compile_config)
    return model.generate(prompt, **options, **kwargs)


@pytest.mark.parametrize(("family", "mode"), CASES)
def test_compiled_decode_equals_eager_for_every_schedule(family_models, family, mode):
    """Inductor-compiled calls over the slot cache give the eager dynamic-cache tokens (float64; the only float32
    in these models is RoPE's, identical in both); the graph really ran and its compile time is reported."""
    model = family_models[family]
    eager = _generate(model, PROMPT, mode, static=False)
    counter = CompileCounterWithBackend("inductor")
    compiled = _generate(model, PROMPT, mode, CompileConfig(backend=counter, fullgraph=True))
    assert compiled.sequences.tolist() == eager.sequences.tolist()
    assert counter.frame_count == 1 and compiled.decoding_stats.compile_time_s > 0
    assert compiled.decoding_stats.nfe == eager.decoding_stats.nfe  # the same calls, each with its own verdict


@pytest.mark.parametrize(("family", "mode"), CASES)
def test_static_cache_without_compile_equals_dynamic(family_models, family, mode):
    model = family_models[family]
    eager = _generate(model, PROMPT, mode, static=False, stop_strings=None)
    static = _generate(model, PROMPT, mode, CompileConfig(backend="eager"), disable_compile=True)
    assert static.sequences.tolist() == eager.sequences.tolist()
    assert static.decoding_stats.compile_time_s == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_seeded_sampling_equals_eager(family_models, family):
    """Acceptance stays outside the graph: a seeded sampled decode draws the same tokens compiled and eager
    (eager sampling is exact in distribution: test_sampling)."""
    model = family_models[family]
    config = CompileConfig(backend="inductor", fullgraph=True)
    for seed in range(3):
        runs = []
        for static in (False, True):
            torch.manual_seed(seed)
            runs.append(_generate(model, PROMPT, "packed_ss", config, static=static, do_sample=True,
                                  temperature=1.3).sequences.tolist())
        assert runs[0] == runs[1], seed


def test_no_recompiles_across_prompts_of_different_lengths():
    """One graph for a whole decode and for the next prompts of other lengths (torch's own counters: frames
    compiled by the backend, dynamo's graph breaks), each output the eager one."""
    model = tiny_model(1)
    counter = CompileCounterWithBackend("inductor")
    config = CompileConfig(backend=counter, fullgraph=True)
    breaks = sum(counters["graph_break"].values())
    for length in (5, 11, 8):
        prompt = torch.arange(1, length + 1)[None] % 40
        compiled = _generate(model, prompt, "packed_ss", config)
        assert compiled.sequences.tolist() == _generate(model, prompt, "packed_ss", static=False).sequences.tolist()
        assert counter.frame_count == 1, f"recompiled at a prompt of {length} tokens"
    assert sum(counters["graph_break"].values()) == breaks


def test_a_batch_with_a_static_cache_decodes_each_row_as_alone():
    """A batch that cannot run in lockstep (here Linear-SS) decodes its rows one after another through the graph."""
    model = tiny_model(2)
    prompts = torch.tensor([[0, 0, 4, 9, 3], [7, 1, 2, 8, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = model.generate(prompts, attention_mask=mask, assistant_mode="linear_ss", speculative_width=3,
                         max_new_tokens=12, cache_implementation="static", disable_compile=True,
                         return_dict_in_generate=True)
    for b in range(2):
        alone = _generate(model, prompts[b : b + 1, 2 * (1 - b) :], "linear_ss", static=False, max_new_tokens=12)
        assert out.sequences[b, 5:].tolist() == alone.sequences[0, 5 - 2 * (1 - b) :].tolist()
    stats = out.decoding_stats
    assert len(stats.per_row) == 2 and stats.nfe == sum(row.nfe for row in stats.per_row)  # one after the other
    assert stats.new_tokens == 24 and stats.decoder_time_s == sum(row.decoder_time_s for row in stats.per_row)


@pytest.mark.parametrize("family,mode", [("nemotron", "packed_ss"), ("nemotron", "ar"), ("setdlm", "packed_ss"),
                                         ("setdlm", "ar")])
def test_a_lockstep_batch_runs_one_compiled_graph(family, mode):
    """Greedy AR / Packed-SS batches run in lockstep over a slot cache of the batch's rows on both families: each
    call padded back to every row (finished rows' stand-ins see only themselves), one compiled graph for the whole
    decode, the tokens of the eager dynamic-cache batch (itself each row alone: test_batch), a row ending at EOS
    mid-decode."""
    model = tiny_model(2) if family == "nemotron" else tiny_setdlm(2)
    prompts = torch.tensor([[0, 0, 4, 9, 3, 5], [7, 1, 2, 8, 6, 4], [0, 0, 0, 0, 5, 9]])
    mask = (torch.arange(6)[None] >= torch.tensor([[2], [0], [4]])).long()
    options = dict(attention_mask=mask, assistant_mode=mode, speculative_width=3, max_new_tokens=30,
                   return_dict_in_generate=True, pad_token_id=0)
    if family == "setdlm":  # an EOS one row meets and another does not
        rows = [row[6:].tolist() for row in model.generate(prompts, **options).sequences]
        options["eos_token_id"] = next(t for t in rows[0] if any(t not in r for r in rows[1:]))
    else:
        options["eos_token_id"] = 3
    eager = model.generate(prompts, **options)
    counter = CompileCounterWithBackend("inductor")
    compiled = model.generate(prompts, cache_implementation="static", **options,
                              compile_config=CompileConfig(backend=counter, fullgraph=True))
    assert compiled.sequences.tolist() == eager.sequences.tolist()
    assert counter.frame_count == 1 and compiled.decoding_stats.nfe == eager.decoding_stats.nfe
    lengths = [row.new_tokens for row in compiled.decoding_stats.per_row]
    assert min(lengths) < 30 == max(lengths)  # a row ended early: the later calls ran with a stand-in


def test_other_cache_implementations_are_refused(family_models):
    with pytest.raises(ValueError, match="'dynamic'.*'static'"):
        _generate(family_models["nemotron"], PROMPT, "packed_ss", static=False, cache_implementation="offloaded")


def test_slot_cache_moves_its_length_and_refuses_to_overflow():
    cache = SlotCache(layers=1, capacity=8, device="cpu")
    cache.begin_call(5)
    keys = torch.arange(5.0).view(1, 1, 5, 1)
    cache.update(keys, keys, 0)
    cache.end_call(5)
    cache.crop(-2)  # the two newest rows leave: their slots stay, masked, until overwritten
    assert cache.get_seq_length() == 3 and cache.position.item() == 0
    cache.begin_call(2)
    assert cache.position.item() == 3
    cache.crop_left(1)
    assert cache.length == 2 and cache.layers[0].keys[0, 0, :2, 0].tolist() == [1.0, 2.0]
    cache.length = 7
    with pytest.raises(ValueError, match="max_cache_len"):
        cache.begin_call(2)


def test_slot_cache_selects_rows_and_gathers_columns_as_a_dynamic_cache_does():
    """A lockstep batch's leaving rows and compaction, in place over the slots: the same keys as the DynamicCache's
    `batch_select_indices` and `batch.gather_columns` give."""
    from hf_packed_ss.engine.batch_cache import gather_columns

    keys = torch.randn(3, 2, 6, 4)
    slot, dynamic = SlotCache(layers=1, capacity=10, device="cpu"), DynamicCache()
    slot.begin_call(6)
    slot.update(keys, keys + 1, 0)
    slot.end_call(6)
    dynamic.update(keys, keys + 1, 0)
    for cache in (slot, dynamic):
        cache.batch_select_indices(torch.tensor([2, 0]))
    index = torch.tensor([[1, 3, 4], [0, 2, 5]])
    gather_columns(slot, index)
    gather_columns(dynamic, index)
    assert slot.length == 3
    assert torch.equal(slot.layers[0].keys[:2, :, :3], dynamic.layers[0].keys)
    assert torch.equal(slot.layers[0].values[:2, :, :3], dynamic.layers[0].values)


def test_slot_mask_is_the_dynamic_mask_widened():
    """At slot position p the in-graph mask is [True x p | template | False ...], the layout's own mask over the
    slots that hold the cache and the call."""
    layout = ShiftedBlockLayout(MASK, static_shapes=True)
    template = torch.rand(6, 6) > 0.5
    for position in (0, 3, 10):
        mask = slot_mask(template, torch.tensor(position), torch.arange(16))
        expected = torch.zeros(6, 16, dtype=torch.bool)
        expected[:, :position] = True
        expected[:, position : position + 6] = template
        assert torch.equal(mask, expected)
    assert layout.static_shapes


def test_padding_rows_see_only_themselves():
    model = tiny_model(0)
    from hf_packed_ss.engine import DecoderState, Plan

    state = DecoderState(torch.tensor([3, 4, 5]), 10, 8)
    call = ShiftedBlockLayout(MASK).build(Plan(order=range(0, 4)), state)
    ids, positions = pad_rows(call.input_ids, call.position_ids, 9, MASK)
    template = pad_template(call.new_rows_mask, 9)
    q = call.rows
    assert ids.shape == (1, 9) and ids[0, q:].eq(MASK).all() and positions.shape == (1, 9)
    assert torch.equal(template[:q, :q], call.new_rows_mask)
    assert torch.equal(template[q:], torch.eye(9, dtype=torch.bool)[q:]) and not template[:q, q:].any()
    # the padded call's real rows give the unpadded call's logits
    slot = SlotCache(model.config.num_hidden_layers, 16, "cpu")
    slot.begin_call(9)
    with torch.no_grad():
        mask = slot_mask(template, slot.position, slot.columns)[None, None]
        padded = model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=slot, use_cache=True)
        alone = model_forward(model)(call, DynamicCache())
    assert torch.allclose(padded.logits[0, call.logit_rows], alone, atol=1e-12)


@pytest.mark.parametrize(("layout", "expected"), [
    (ShiftedBlockLayout, {"ar": 1, "linear_ss": 4, "packed_ss": 8, "quadratic_ss": 20, "hybrid_ss": 12}),
    (SamePositionLayout, {"ar": 2, "linear_ss": 6, "packed_ss": 10, "quadratic_ss": 16, "hybrid_ss": 13}),
])
def test_steady_rows_are_the_static_shapes(layout, expected):
    """W = 3, B = 4: AR 1 / 2; Linear-SS B / 2u; Packed-SS 2B / 1 + 3u; Quadratic-SS B(B + 1) / 1 + 2u + u^2."""
    found = {name: steady_rows(SCHEDULES[name](3, Greedy()), layout(MASK, static_shapes=True)) for name in expected}
    assert found == expected


def test_a_proposal_only_adapter_gates_the_same_rows_compiled():
    """A compiled call marks proposal rows with a tensor (a changing start would be a new graph): the adapter
    drafts exactly as eagerly, so each call accepts the same tokens."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    model = get_peft_model(tiny_model(6), config).to(torch.float64)
    for mode in ("packed_ss", "linear_ss"):
        eager = _generate(model, PROMPT, mode, static=False)
        compiled = _generate(model, PROMPT, mode, CompileConfig(backend="inductor", fullgraph=True))
        assert compiled.sequences.tolist() == eager.sequences.tolist()
        assert compiled.decoding_stats.accepted_per_iteration == eager.decoding_stats.accepted_per_iteration


def test_compile_follows_stocks_rule():
    """Compiled unless disable_compile; by default only on accelerators; on the CPU when a compile_config is
    passed; dynamic shapes off unless asked; a mode only for inductor without options."""
    from transformers import GenerationConfig

    from hf_packed_ss.front.generate import compile_options

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_options(GenerationConfig(), cpu) is None
    assert compile_options(GenerationConfig(), cuda) == dict(fullgraph=False, dynamic=False, backend="inductor",
                                                             mode="reduce-overhead", options=None)
    assert compile_options(GenerationConfig(disable_compile=True, compile_config=CompileConfig()), cuda) is None
    given = compile_options(GenerationConfig(compile_config=CompileConfig(dynamic=True, backend="eager")), cpu)
    assert given == dict(fullgraph=False, dynamic=True, backend="eager", options=None)
    tuned = compile_options(GenerationConfig(compile_config=CompileConfig(options={"max_autotune": True})), cpu)
    assert "mode" not in tuned and tuned["options"] == {"max_autotune": True}


def test_sliding_context_over_a_static_cache():
    """SetDLM's native decoder with native_context='sliding' drops the oldest rows before each call that would
    not fit: over the slot cache the kept rows move down to slot 0, and the tokens are the dynamic cache's."""
    model = tiny_setdlm(3, block_size=20)
    options = dict(native_context="sliding", max_new_tokens=30)
    eager = _generate(model, PROMPT, "native", static=False, **options)
    static = _generate(model, PROMPT, "native", disable_compile=True, **options)
    assert static.sequences.tolist() == eager.sequences.tolist()
    assert eager.sequences.shape[1] - PROMPT.shape[1] == 30  # the context was cropped: 7 + 30 > 20
