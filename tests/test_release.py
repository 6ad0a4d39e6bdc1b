"""Released Nemotron-Labs-Diffusion checkpoints: remote code wins when asked for, in either import order;
`enable` decodes exactly on a disk-offloaded release model; `disable` warns about release decoders that
cannot run on the installed transformers."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from release import release_folder
from transformers import AutoModel, AutoModelForCausalLM

import hf_packed_ss
from hf_packed_ss import NemotronLabsDiffusionModel
from hf_packed_ss.models.release import release_decoders_that_cannot_run

MODES = ["ar", "linear_ss", "quadratic_ss", "packed_ss"]
PROMPT = [5, 9, 2, 7]

# Each script prints one JSON line: what each load gave, in the order the script did things.
DESCRIBE = """
import json, torch
from transformers import AutoModel, AutoModelForCausalLM
def describe(m):
    return {"class": type(m).__module__.split(".")[0] + "." + type(m).__qualname__,
            "config": type(m.config).__module__.split(".")[0], "release_methods":
            all(callable(getattr(m, n, None)) for n in ("ar_generate", "linear_spec_generate"))}
def remote():
    return AutoModel.from_pretrained(FOLDER, trust_remote_code=True, dtype=torch.float64)
"""
LOAD_THEN_IMPORT = DESCRIBE + """
seen = {"before_import": describe(remote())}
import hf_packed_ss
seen["remote_after_import"] = describe(remote())
seen["plain_after_import"] = describe(AutoModel.from_pretrained(FOLDER, dtype=torch.float64))
print(json.dumps(seen))
"""
IMPORT_THEN_LOAD = DESCRIBE + """
import hf_packed_ss
model = remote()
seen = {"remote": describe(model), "plain": describe(AutoModel.from_pretrained(FOLDER, dtype=torch.float64)),
        "causal_lm": describe(AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float64))}
prompt = torch.tensor([PROMPT])
reference = model.ar_generate(prompt, 16)[0]
hf_packed_ss.enable(model)
seen["exact"] = {mode: torch.equal(model.generate(prompt, assistant_mode=mode, speculative_width=4,
                                                  max_new_tokens=16), reference) for mode in MODES}
seen["release_methods_after_enable"] = describe(model)["release_methods"]
print(json.dumps(seen))
"""


def _run(script: str, folder, tmp_path) -> dict:
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    header = f"FOLDER = {str(folder)!r}\nPROMPT = {PROMPT!r}\nMODES = {MODES!r}\n"
    done = subprocess.run([sys.executable, "-c", header + script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_remote_code_wins_in_either_import_order(tmp_path):
    folder = release_folder(tmp_path)
    later = _run(LOAD_THEN_IMPORT, folder, tmp_path)
    first = _run(IMPORT_THEN_LOAD, folder, tmp_path)
    release = later["before_import"]  # what the folder gives without hf_packed_ss imported
    assert release == {"class": "transformers_modules.NemotronLabsDiffusionModel", "config": "transformers_modules",
                       "release_methods": True}
    assert later["remote_after_import"] == release and first["remote"] == release
    ours = {"class": "hf_packed_ss.NemotronLabsDiffusionModel", "config": "hf_packed_ss", "release_methods": False}
    assert later["plain_after_import"] == ours and first["plain"] == ours and first["causal_lm"] == ours
    assert first["exact"] == dict.fromkeys(MODES, True)  # enable adds our front to the release's class
    assert first["release_methods_after_enable"]


def test_trusting_remote_code_without_an_auto_map_still_loads_our_class(tmp_path):
    from conftest import tiny_model

    tiny_model(0).save_pretrained(tmp_path / "ours")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True)
    assert type(model) is NemotronLabsDiffusionModel


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    os.environ.setdefault("HF_MODULES_CACHE", str(root / "modules"))
    return release_folder(root), root


def test_enable_decodes_exactly_on_a_disk_offloaded_release_model(release):
    folder, root = release
    device_map = {"encoder.embed_tokens": "cpu", "encoder.layers.0": "cpu", "encoder.layers.1": "disk",
                  "encoder.norm": "cpu", "encoder.rotary_emb": "cpu", "diffusion_head": "disk"}
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64, device_map=device_map,
                                      offload_folder=str(root / "offload"))
    assert not isinstance(model, NemotronLabsDiffusionModel) and "disk" in set(model.hf_device_map.values())
    prompt = torch.tensor([PROMPT])
    reference = model.ar_generate(prompt, 20)[0]
    hf_packed_ss.enable(model)
    for mode in MODES:
        out = model.generate(prompt, assistant_mode=mode, speculative_width=5, max_new_tokens=20)
        assert torch.equal(out, reference), mode
    assert torch.equal(model.ar_generate(prompt, 20)[0], reference)  # the release's own hooks still work


def _raises(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001 - whatever the release's decoder hits on this transformers
        return True
    return False


def test_disable_warns_exactly_about_the_release_decoders_that_cannot_run(release):
    folder, _ = release
    model = hf_packed_ss.enable(AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_packed_ss.disable(model)
    prompt = torch.tensor([PROMPT])
    fails = {name for name, call in {"generate": lambda: model.generate(prompt, max_new_tokens=2),
                                     "linear_spec_generate": lambda: model.linear_spec_generate(prompt, 2)}.items()
             if _raises(call)}
    assert set(release_decoders_that_cannot_run(model)) == fails
    messages = [str(w.message) for w in caught if "cannot run" in str(w.message)]
    assert len(messages) == (1 if fails else 0)
    assert all(f"`{name}`" in messages[0] for name in fails)
    from conftest import tiny_model

    assert release_decoders_that_cannot_run(tiny_model(0)) == {}  # our own class has no such decoders


def test_a_release_stack_written_for_past_key_values_is_flagged_where_transformers_renamed_it():
    """The release's own Ministral3 stack takes `past_key_values`; transformers 5.24's takes `cache`."""
    from conftest import tiny_config
    from torch import nn
    from transformers import Ministral3Model

    class OldStack(nn.Module):  # the release's remote-code stack, written for transformers < 5.24
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None):
            raise AssertionError("not called")

    class Release(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = tiny_config()
            self.encoder, self.diffusion_head = OldStack(), nn.Linear(4, 4, bias=False)

    renamed = "cache" in inspect.signature(Ministral3Model.forward).parameters
    assert ("generate" in release_decoders_that_cannot_run(Release())) == renamed
