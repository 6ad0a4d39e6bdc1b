"""Models dispatched by accelerate (`device_map`, CPU and disk offload) decode exactly as undispatched ones."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_model
from transformers import AutoModelForCausalLM

SCHEDULE_NAMES = ["ar", "linear_ss", "quadratic_ss", "packed_ss"]
PROMPT = torch.tensor([[5, 9, 2, 7, 1]])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    model = tiny_model(8)
    model.save_pretrained(folder)
    return folder, reference_greedy(model, PROMPT[0], 24)


@pytest.mark.parametrize(
    "device_map",
    [
        "auto",
        {"": "cpu"},
        {"encoder.embed_tokens": "cpu", "encoder.layers.0": "cpu", "encoder.layers.1": "disk",
         "encoder.norm": "cpu", "encoder.rotary_emb": "cpu", "diffusion_head": "disk"},
    ],
    ids=["auto", "cpu", "disk-offload"],
)
def test_dispatched_model_decodes_exactly(saved, device_map, tmp_path):
    folder, expected = saved
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, device_map=device_map,
                                                 offload_folder=str(tmp_path / "offload"))
    if isinstance(device_map, dict) and "disk" in device_map.values():
        assert "disk" in set(model.hf_device_map.values())  # really offloaded
    for mode in SCHEDULE_NAMES:
        out = model.generate(PROMPT, assistant_mode=mode, speculative_width=5, max_new_tokens=24)
        assert out[0, PROMPT.shape[1]:].tolist() == expected, mode
