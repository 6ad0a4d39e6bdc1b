"""The SetDLM model format: Auto registration, offline save/load, and its left-to-right AR mode built
from duplicate MASK rows (the reference that any-order decoding must reproduce)."""

from __future__ import annotations

import torch
from conftest import SETDLM_MASK as MASK
from conftest import reference_greedy, tiny_setdlm
from transformers import AutoConfig, AutoModelForCausalLM

from hf_packed_ss import SetDLMConfig, SetDLMModel


def duplicate_mask_logits(model, tokens: list[int]) -> torch.Tensor:
    """The training construction, written out: [tokens | MASK at every position], a MASK at position
    i sees tokens < i and itself, and scores its own position."""
    n = len(tokens)
    ids = torch.tensor([tokens + [MASK] * n])
    pos = torch.arange(n)
    positions = torch.cat([pos, pos])[None]
    mask = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    mask[n:, :n] = torch.ones(n, n, dtype=torch.bool).tril(-1)
    mask[n:, n:] = torch.eye(n, dtype=torch.bool)
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask[None, None])
    return out.logits[0, n:]  # row i scores position i


def test_plain_forward_is_the_ltr_mode_of_the_duplicate_mask_construction():
    model = tiny_setdlm(0)
    tokens = [3, 8, 1, 22, 5, 17]
    with torch.no_grad():
        plain = model(torch.tensor([tokens])).logits[0]  # row i scores token i + 1
        dup = duplicate_mask_logits(model, tokens + [0])  # row i + 1 scores position i + 1 given tokens <= i
    assert torch.allclose(plain, dup[1:], atol=1e-12)
    assert torch.isinf(plain[:, MASK]).all() and (plain[:, MASK] < 0).all()


def test_stock_greedy_with_cache_equals_full_forward_reference():
    for seed in range(3):
        model = tiny_setdlm(seed)
        prompt = torch.randint(0, MASK, (5 + seed,), generator=torch.Generator().manual_seed(seed))
        ref = reference_greedy(model, prompt, 20)
        out = model.generate(prompt[None], max_new_tokens=20, do_sample=False)
        assert out[0, prompt.numel():].tolist() == ref
        assert MASK not in ref


def test_cache_holds_only_token_rows():
    model = tiny_setdlm(1)
    with torch.no_grad():
        out = model(torch.tensor([[4, 5, 6, 7]]), use_cache=True)
        cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
        assert cache.get_seq_length() == 4
        step = model(torch.tensor([[9]]), use_cache=True, **{model._cache_kw: cache}).logits[0, -1]
        full = model(torch.tensor([[4, 5, 6, 7, 9]])).logits[0, -1]
    assert torch.allclose(step, full, atol=1e-12)


def test_auto_classes_and_offline_round_trip(tmp_path):
    model = tiny_setdlm(2)
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, SetDLMConfig) and (config.mask_token_id, config.max_block_size) == (MASK, 16)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert isinstance(loaded, SetDLMModel)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
