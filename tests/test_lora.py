"""Proposal-only LoRA through PEFT: the adapter changes proposal rows only, so decoding stays exact."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_model
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import DynamicCache

from hf_packed_ss.engine import DecoderState, ShiftedBlockLayout
from hf_packed_ss.engine.schedules import SCHEDULES
from hf_packed_ss.front import model_forward
from hf_packed_ss.models.lora import proposal_only_adapters, proposal_rows

PROMPT = torch.tensor([[5, 9, 2, 7, 1]])
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _with_adapter(seed=6):
    base = tiny_model(seed)
    expected = reference_greedy(base, PROMPT[0], 20)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    return get_peft_model(base, config).to(torch.float64), expected


def test_greedy_output_equals_base_ar_with_adapter_loaded():
    peft_model, expected = _with_adapter()
    for mode in SCHEDULES:
        out = peft_model.generate(input_ids=PROMPT, assistant_mode=mode, speculative_width=4, max_new_tokens=20)
        assert out[0, PROMPT.shape[1]:].tolist() == expected, mode
    # the adapter is live outside our decoding: plain forward differs from the base
    with torch.no_grad(), peft_model.disable_adapter():
        base_logits = peft_model(input_ids=PROMPT).logits
    assert not torch.allclose(peft_model(input_ids=PROMPT).logits, base_logits)


def test_adapter_applies_to_proposal_rows_only():
    peft_model, _ = _with_adapter()
    inner = peft_model.base_model.model
    plan = SCHEDULES["packed_ss"](4).plan(tuple(range(5)))  # first call: prompt rows + W + 1 proposal rows
    call = ShiftedBlockLayout(inner.config.mask_token_id).build(plan, DecoderState(PROMPT[0], 20, 10))
    forward = model_forward(inner)
    with torch.no_grad():
        with proposal_only_adapters(inner):
            gated = forward(call, DynamicCache())
        with peft_model.disable_adapter():
            base = forward(call, DynamicCache())
    verifier_rows, proposal_rows = slice(0, 1), slice(1, None)
    assert torch.equal(gated[verifier_rows], base[verifier_rows])
    assert not torch.allclose(gated[proposal_rows], base[proposal_rows])


def test_load_adapter_from_a_subfolder(tmp_path):
    peft_model, expected = _with_adapter()
    peft_model.save_pretrained(tmp_path / "linear_spec_lora")
    base = tiny_model(6)
    base.load_adapter(str(tmp_path), adapter_name="linear_spec", adapter_kwargs={"subfolder": "linear_spec_lora"})
    assert any("lora_A" in n for n, _ in base.named_modules())
    for mode in ("linear_ss", "packed_ss"):
        out = base.generate(PROMPT, assistant_mode=mode, speculative_width=4, max_new_tokens=20)
        assert out[0, PROMPT.shape[1]:].tolist() == expected
    reloaded = PeftModel.from_pretrained(tiny_model(6), str(tmp_path / "linear_spec_lora"))
    out = reloaded.generate(input_ids=PROMPT, assistant_mode="quadratic_ss", speculative_width=3, max_new_tokens=20)
    assert out[0, PROMPT.shape[1]:].tolist() == expected


def test_calls_without_proposal_rows_never_compute_the_adapter():
    """A NaN adapter leaves a call without proposal rows (AR, stock generate) untouched only if the
    update is never computed there: multiplying it by a zero row mask would give NaN, and would cost
    the baselines the adapter's time."""
    peft_model, _ = _with_adapter()
    inner = peft_model.base_model.model
    for module in inner.modules():
        if hasattr(module, "lora_A"):
            for a in module.lora_A.values():
                a.weight.data.fill_(float("nan"))
    with torch.no_grad(), peft_model.disable_adapter():
        base = inner(PROMPT).logits
    with torch.no_grad(), proposal_only_adapters(inner):
        plain = inner(PROMPT).logits
        with proposal_rows(inner, PROMPT.shape[1]):  # a call whose proposal rows are all past its end
            no_proposals = inner(PROMPT).logits
        with proposal_rows(inner, 3):
            packed = inner(PROMPT).logits
    assert torch.equal(plain, base) and torch.equal(no_proposals, base)
    assert packed[:, 3:].isnan().all()


def test_a_merged_adapter_is_refused():
    peft_model, _ = _with_adapter()
    peft_model.merge_adapter()  # the update now sits in the base weights, so verifier rows would see it
    with pytest.raises(ValueError, match="unmerge_adapter"):
        peft_model.generate(input_ids=PROMPT, assistant_mode="packed_ss", speculative_width=4, max_new_tokens=4)


def test_an_adapter_that_cannot_be_row_gated_is_refused():
    base = tiny_model(6)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"]))
    with pytest.raises(ValueError, match="cannot be restricted to proposal rows"):
        peft_model.generate(input_ids=PROMPT, assistant_mode="packed_ss", speculative_width=4, max_new_tokens=4)
