"""The bundled checkpoint, the generation_config.json round trip, and the `hf-packed-ss run` command."""

from __future__ import annotations

import pytest
import torch

from hf_packed_ss import bundled
from hf_packed_ss.cli import main


def test_bundled_names_and_load():
    assert "tiny-nemotron-random" in bundled.names()
    model, tokenizer = bundled.load("tiny-nemotron-random", dtype=torch.float64)
    assert model.dtype == torch.float64 and tokenizer.mask_token_id == model.config.mask_token_id
    with pytest.raises(ValueError, match="Unknown bundled checkpoint"):
        bundled.load("no-such-model")


def test_generation_config_json_round_trip(tmp_path):
    """A saved generation config with assistant_mode / speculative_width decodes with them after
    from_pretrained; explicit generate kwargs override it."""
    model, tokenizer = bundled.load("tiny-nemotron-random", dtype=torch.float64)
    model.generation_config.speculative_width = 5
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.generation_config.assistant_mode == "packed_ss"
    ids = tokenizer("Question: 1 + 1?", return_tensors="pt").input_ids
    out = loaded.generate(ids, max_new_tokens=8, return_dict_in_generate=True)
    assert (out.decoding_stats.schedule, out.decoding_stats.width) == ("packed_ss", 5)
    out = loaded.generate(ids, max_new_tokens=8, assistant_mode="linear_ss", speculative_width=2,
                          return_dict_in_generate=True)
    assert (out.decoding_stats.schedule, out.decoding_stats.width) == ("linear_ss", 2)
    stock = loaded.generate(ids, max_new_tokens=8, assistant_mode=None)
    assert torch.equal(stock, out.sequences)


def test_run_command_prints_every_schedule(capsys):
    assert main(["run", "--max-new-tokens", "12", "--width", "3"]) == 0
    printed = capsys.readouterr().out
    for mode in ("ar", "linear_ss", "quadratic_ss", "packed_ss"):
        assert f"[{mode}]" in printed and f"\n{mode}" in printed
    assert "NO" not in printed.split("same as ar")[1]
