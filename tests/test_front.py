"""The Hugging Face front: generate kwargs and GenerationConfig fields, statistics, bad input,
Auto-class registration with offline save/load, and `enable` on a model of the released structure."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_config, tiny_model
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    GenerationConfig,
    GenerationMixin,
    Ministral3Model,
    PreTrainedModel,
)

import hf_packed_ss
from hf_packed_ss import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel


@pytest.fixture(scope="module")
def model():
    return tiny_model(3)


PROMPT = torch.tensor([[5, 9, 2, 7]])


def test_generate_returns_prompt_plus_continuation_and_stats(model):
    ref = reference_greedy(model, PROMPT[0], 12)
    out = model.generate(PROMPT, assistant_mode="packed_ss", speculative_width=4, max_new_tokens=12,
                         return_dict_in_generate=True)
    assert out.sequences.shape == (1, 4 + 12) and out.sequences[0, 4:].tolist() == ref
    s = out.decoding_stats
    assert s.schedule == "packed_ss" and s.width == 4 and s.new_tokens == 12
    assert s.nfe == len(s.rows_per_call) and sum(s.accepted_per_iteration) == 12
    assert 0 < s.model_time_s <= s.decoder_time_s
    stock = model.generate(PROMPT, max_new_tokens=12, do_sample=False)
    assert torch.equal(stock, out.sequences)


def test_generation_config_fields_and_precedence(model):
    config = GenerationConfig(assistant_mode="linear_ss", speculative_width=3, max_new_tokens=6,
                              return_dict_in_generate=True)
    out = model.generate(PROMPT, generation_config=config)
    assert out.decoding_stats.schedule == "linear_ss" and out.decoding_stats.width == 3
    out = model.generate(PROMPT, generation_config=config, assistant_mode="quadratic_ss", speculative_width=2)
    assert out.decoding_stats.schedule == "quadratic_ss" and out.decoding_stats.width == 2
    # the model's own generation config is the last fallback
    model.generation_config.assistant_mode = "packed_ss"
    try:
        out = model.generate(PROMPT, max_new_tokens=5, return_dict_in_generate=True)
        assert out.decoding_stats.schedule == "packed_ss"
        stock = model.generate(PROMPT, max_new_tokens=5, assistant_mode=None, return_dict_in_generate=True)
        assert not hasattr(stock, "decoding_stats") and torch.equal(stock.sequences, out.sequences)
    finally:
        del model.generation_config.assistant_mode


def test_default_length_follows_generation_config(model):
    out = model.generate(PROMPT, assistant_mode="packed_ss", max_length=9)
    assert out.shape == (1, 9)


def test_max_new_tokens_zero_returns_prompt(model):
    out = model.generate(PROMPT, assistant_mode="packed_ss", max_new_tokens=0, return_dict_in_generate=True)
    assert torch.equal(out.sequences, PROMPT) and out.decoding_stats.nfe == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(assistant_mode="cubic_ss"), "Unknown assistant_mode"),
        (dict(speculative_width=0), "out of range"),
        (dict(speculative_width=32), "out of range"),
        (dict(speculative_width=2.5), "out of range"),
        (dict(max_new_tokens=-1), "must be >= 0"),
        (dict(num_beams=2), "num_beams"),
        (dict(guidance_scale=2.0), "guidance_scale"),
        (dict(num_return_sequences=2, do_sample=True), "num_return_sequences"),
        (dict(stop_strings=["x"]), "stop_strings"),
        (dict(attention_mask=torch.tensor([[1, 1, 1, 0]])), "right-padded"),
    ],
)
def test_bad_input_raises_clear_value_error(model, kwargs, message):
    kwargs = {"assistant_mode": "packed_ss", "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.generate(PROMPT, **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens=3 .*prompt lookup"),
        (dict(assistant_early_exit=1), "assistant_early_exit"),
        (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
        (dict(dola_layers="high"), "dola_layers"),
        (dict(token_healing=True), "token_healing"),
        (dict(prefill_chunk_size=2), "prefill_chunk_size"),
        (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
        (dict(output_logits=True, return_dict_in_generate=True), "output_logits"),
        (dict(output_hidden_states=True, return_dict_in_generate=True), "output_hidden_states"),
        (dict(synced_gpus=True), "synced_gpus"),
        (dict(max_new_tokens=2.5), "must be >= 0"),
        (dict(max_new_tokens=None, max_length=3), "max_length"),  # stock refuses a max_length below the prompt
    ],
)
def test_options_stock_generate_would_use_another_loop_for_are_refused(model, kwargs, message):
    kwargs = {"assistant_mode": "packed_ss", "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.generate(PROMPT, **kwargs)


def test_bad_token_ids_are_named_with_the_vocabulary(model):
    for ids, message in [
        (PROMPT.float(), "integer token ids; got dtype torch.float32"),
        (torch.tensor([[5, 9, 48]]), r"input_ids\[0, 2\] = 48 is outside the vocabulary .*vocab_size=48"),
        (torch.tensor([[-1, 9]]), r"input_ids\[0, 0\] = -1 is outside"),
        ([[5, 9, 2]], "must be a torch tensor"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.generate(ids, assistant_mode="packed_ss", max_new_tokens=3)


def test_lengths_follow_stock_rules(model):
    """No max_new_tokens: 20 new tokens as stock (not max_length counted from 0); max_length counts the prompt."""
    prompt = torch.arange(30)[None] % 40
    for kwargs in ({}, {"max_length": 40}, {"max_new_tokens": 7, "min_new_tokens": 5}):
        stock = model.generate(prompt, do_sample=False, **kwargs)
        for mode in ("ar", "packed_ss"):
            assert torch.equal(model.generate(prompt, assistant_mode=mode, **kwargs), stock), (mode, kwargs)


def test_processors_that_read_the_length_limit_see_the_real_one(model):
    """forced_eos_token_id forces EOS at max_length - 1, which max_new_tokens sets (as in stock generate)."""
    stock = model.generate(PROMPT, max_new_tokens=6, forced_eos_token_id=3, do_sample=False)
    assert stock[0, -1] == 3
    for mode in ("ar", "linear_ss", "quadratic_ss", "packed_ss"):
        out = model.generate(PROMPT, assistant_mode=mode, speculative_width=4, max_new_tokens=6, forced_eos_token_id=3)
        assert torch.equal(out, stock), mode


def test_decoding_past_max_position_embeddings_warns():
    short = tiny_model(3, max_position_embeddings=16)
    with pytest.warns(UserWarning, match="max_position_embeddings=16"):
        short.generate(PROMPT, assistant_mode="packed_ss", max_new_tokens=20)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        short.generate(PROMPT, assistant_mode="packed_ss", max_new_tokens=8)


def test_import_gives_the_bundled_subpackage():
    import subprocess
    import sys

    script = "import hf_packed_ss; print(hf_packed_ss.bundled.names())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tiny-nemotron-gsm8k" in done.stdout


def test_batch_decoded_and_empty_prompt_rejected(model):
    """A batch is decoded (once refused: see test_batch.py), each row as the prompt alone; an empty prompt is not."""
    alone = model.generate(PROMPT, assistant_mode="packed_ss", max_new_tokens=3)
    assert model.generate(PROMPT.repeat(2, 1), assistant_mode="packed_ss", max_new_tokens=3).tolist() == (
        alone.repeat(2, 1).tolist())
    with pytest.raises(ValueError, match="empty"):
        model.generate(PROMPT[:, :0], assistant_mode="ar", max_new_tokens=3)


def test_model_without_mask_token_rejected():
    model = tiny_model(0, mask_token_id=None)
    with pytest.raises(ValueError, match="mask_token_id"):
        model.generate(PROMPT, assistant_mode="packed_ss", max_new_tokens=3)


def test_auto_classes_and_offline_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, NemotronLabsDiffusionConfig) and config.model_type == "nemotron_labs_diffusion"
    assert (config.mask_token_id, config.block_size, config.dlm_paradigm) == (47, 32, "bidirectional")
    for auto in (AutoModel, AutoModelForCausalLM):
        loaded = auto.from_pretrained(tmp_path, dtype=torch.float64)
        assert isinstance(loaded, NemotronLabsDiffusionModel)
        assert torch.equal(loaded(PROMPT).logits, model(PROMPT).logits)
    keys = set(loaded.state_dict())
    assert {"encoder.embed_tokens.weight", "diffusion_head.weight", "encoder.norm.weight"} <= keys
    assert not any(k.startswith("lm_head") for k in keys)


def test_plain_forward_is_causal_next_token(model):
    """Row i of model(input_ids).logits depends only on tokens <= i (the AR convention)."""
    a, b = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 2, 3, 9, 9]])
    la, lb = model(a).logits, model(b).logits
    assert torch.equal(la[0, :3], lb[0, :3]) and not torch.allclose(la[0, 3], lb[0, 3])


class ReleasedLikeModel(PreTrainedModel, GenerationMixin):
    """Stands in for the remote-code class of the release: same structure and state-dict names, a plain
    forward in *diffusion* (bidirectional) mode, and its own `generate(prompt_ids, ...)` signature."""

    config_class = NemotronLabsDiffusionConfig

    def __init__(self, config):
        super().__init__(config)
        self.encoder = Ministral3Model(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, **kwargs):
        n = input_ids.shape[1]
        everything = torch.ones(1, 1, n, n, dtype=torch.bool)
        return self.diffusion_head(self.encoder(input_ids, attention_mask=everything).last_hidden_state)

    def generate(self, prompt_ids, max_new_tokens=8, block_length=4):
        return prompt_ids, 0  # the release returns (output_ids, nfe)


def test_enable_on_released_structure():
    torch.manual_seed(0)
    released = ReleasedLikeModel(tiny_config()).to(torch.float64).eval()
    ours = NemotronLabsDiffusionModel(tiny_config()).to(torch.float64).eval()
    ours.load_state_dict(released.state_dict())
    ref = reference_greedy(ours, PROMPT[0], 20)
    hf_packed_ss.enable(released)
    for mode in ("ar", "linear_ss", "quadratic_ss", "packed_ss"):
        out = released.generate(PROMPT, assistant_mode=mode, speculative_width=5, max_new_tokens=20)
        assert out[0, 4:].tolist() == ref
    twin = released._hf_packed_ss_twin
    assert twin.diffusion_head.weight.data_ptr() == released.diffusion_head.weight.data_ptr()  # no copy
    assert set(released.state_dict()) == set(ours.state_dict())  # the twin is not a submodule
    assert released.generate(PROMPT, max_new_tokens=3, block_length=2) == (PROMPT, 0)  # its own generate
    hf_packed_ss.disable(released)
    with pytest.raises(TypeError):
        released.generate(PROMPT, assistant_mode="packed_ss")


def test_enable_rejects_other_structures():
    with pytest.raises(ValueError, match="diffusion_head"):
        hf_packed_ss.enable(nn.Linear(2, 2))


def test_eager_attention_decodes_exactly(model):
    """Eager attention needs an additive float mask (a boolean one is silently misread)."""
    eager = tiny_model(3, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    ref = reference_greedy(model, PROMPT[0], 15)
    for mode in ("linear_ss", "quadratic_ss", "packed_ss"):
        out = eager.generate(PROMPT, assistant_mode=mode, speculative_width=4, max_new_tokens=15)
        assert out[0, 4:].tolist() == ref
