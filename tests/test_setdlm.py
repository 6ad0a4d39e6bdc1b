"""The SetDLM model format: Auto registration, offline save/load, and its left-to-right AR mode built
from duplicate MASK rows (the reference that any-order decoding must reproduce)."""

from __future__ import annotations

import pytest
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


def test_release_folder_loads_with_key_mapping(tmp_path):
    """A folder in the layout of a released `setdlm-gsm8k-smax16` (BD3LM config, `backbone.model.*` keys)."""
    import json

    from safetensors.torch import save_file
    from transformers import Qwen3Config

    from hf_packed_ss.models.setdlm import load_release

    model = tiny_setdlm(3)
    folder = tmp_path / "setdlm-gsm8k-smax16"
    folder.mkdir()
    renamed = {"backbone.model." + k: v.contiguous()
               for k, v in model.state_dict().items()}
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    release = {"model_type": "bd3lm", "architectures": ["SetDLM"], "auto_map": {"AutoModel": "diffusion.BD3LM"},
               "length": 1024, "block_size": 1024, "mask_token_id": MASK,
               "backbone_config": {"_target_": "backbone_automodel.AutoModelFromPreTrained",
                                   "pretrained_model_name_or_path": "Qwen/Qwen3-1.7B-Base"},
               "noise_config": {"block_size": 1024, "length": 1024, "max_block_size": 1024}}
    (folder / "config.json").write_text(json.dumps(release))
    backbone = Qwen3Config(**{k: v for k, v in model.config.to_dict().items()
                              if k not in ("model_type", "mask_token_id", "max_block_size", "block_size")})
    loaded = load_release(folder, backbone, dtype=torch.float64)
    assert loaded.config.max_block_size == 16 and loaded.config.mask_token_id == MASK  # smax16 from the name
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    out = loaded.generate(ids, max_new_tokens=12, assistant_mode="packed_ss")
    assert out[0, 4:].tolist() == reference_greedy(model, ids[0], 12)


def _release_config(noise: dict | None = None, name: str = "", **kwargs):
    from transformers import Qwen3Config

    from hf_packed_ss.models.setdlm import config_from_release

    release = {"model_type": "bd3lm", "length": 1024, "block_size": 1024, "mask_token_id": MASK,
               "noise_config": {"block_size": 1024, "length": 1024, **(noise or {})}}
    backbone = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return config_from_release(release, backbone, name, **kwargs)


@pytest.mark.parametrize(
    "noise, name, overrides, expected",
    [
        # 1. an explicit max_block_size wins over everything (the release's override / MAX_BLOCK_SIZE)
        ({"max_block_size": 8, "desired_block_size": 2}, "setdlm-gsm8k-smax32", {"max_block_size": 20}, (20, 2)),
        # 2. a config value below block_size is kept, whatever the name says
        ({"max_block_size": 8, "desired_block_size": 4}, "setdlm-gsm8k-smax32", {}, (8, 4)),
        # 3. an exported max_block_size == length with the StaggeredNoise default desired_block_size 1: 2 * 1
        ({"max_block_size": 1024, "desired_block_size": 1}, "setdlm-gsm8k-smax16", {}, (2, 1)),
        # 4. a desired_block_size override wins over the config's d and the name
        ({"max_block_size": 1024, "desired_block_size": 1}, "setdlm-gsm8k-smax16", {"desired_block_size": 8}, (16, 8)),
        # 5. no d in the config: the name; dN, then tgtN, then smaxN -> N // 2
        ({"max_block_size": 1024}, "setdlm-gsm8k-smax16", {}, (16, 8)),
        ({}, "runs/gsm8k_aoarm_tgt4_max1024_distill_again_v2", {}, (8, 4)),
        ({}, "ckpt-d3-tgt16-smax32", {}, (6, 3)),
        ({}, "/models/SetDLM_TGT8", {}, (16, 8)),  # matched lower-cased
        ({}, "setdlm-gsm8k-smax16x", {}, (1024, 1024)),  # a token must end at a non-alphanumeric
        # 6. no size anywhere: d = block_size, so max_block_size = block_size
        ({}, "my-setdlm", {}, (1024, 1024)),
        # 7. 2 d is capped at block_size
        ({"desired_block_size": 700}, "", {}, (1024, 700)),
    ],
)
def test_release_max_block_size_follows_the_release_loader(noise, name, overrides, expected):
    config = _release_config(noise, name, **overrides)
    assert (config.max_block_size, config.desired_block_size) == expected
    assert config.block_size == 1024


def test_release_block_size_precedence_and_bad_sizes():
    from transformers import Qwen3Config

    from hf_packed_ss.models.setdlm import config_from_release

    backbone = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    base = {"mask_token_id": MASK, "length": 512}
    assert config_from_release(base, backbone, "smax8").block_size == 512  # length
    assert config_from_release({**base, "block_size": 256}, backbone, "smax8").block_size == 256
    assert config_from_release({**base, "block_size": 256, "eval_block_size": 128}, backbone).block_size == 128
    noisy = {**base, "eval_block_size": 128, "noise_config": {"block_size": 64, "k": "0.5", "b": None}}
    config = config_from_release(noisy, backbone, "smax8")
    assert (config.block_size, config.max_block_size, config.noise_k, config.noise_b) == (64, 8, 0.5, None)
    with pytest.raises(ValueError, match="must be in \\[1, block_size=512\\]: pass max_block_size="):
        config_from_release(base, backbone, max_block_size=600)


def test_a_fresh_dynamic_cache_with_no_layer_yet_is_a_dynamic_cache():
    """`hf-packed-ss probe` passes an empty `DynamicCache()`; the causal forward reads it as dynamic (it used to ask
    it for a static length and fail) and gives the uncached logits."""
    from transformers import DynamicCache

    model = tiny_setdlm(0)
    ids = torch.randint(0, 39, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cached = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True).logits
        plain = model(input_ids=ids, use_cache=False).logits
    assert torch.allclose(cached, plain)
