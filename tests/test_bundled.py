"""The bundled checkpoint, the generation_config.json round trip, and the `hf-packed-ss run` command."""

from __future__ import annotations

import pytest
import torch

from hf_packed_ss import bundled
from hf_packed_ss.bench.suites import question_ids
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


def test_run_command_falls_back_to_the_tiny_checkpoint_with_a_hint(monkeypatch, capsys):
    """Without the SmolLM2 base the main command still decodes, with a trained tiny checkpoint, and says how
    to get the drafter in one line."""
    from hf_packed_ss import cli, smollm2

    monkeypatch.setattr(smollm2, "installed", lambda: False)
    assert cli.default_model() == "tiny-nemotron-gsm8k"
    hint = capsys.readouterr().err
    assert smollm2.HINT in hint and len(hint.strip().splitlines()) == 1
    monkeypatch.setattr(smollm2, "installed", lambda: True)
    assert cli.default_model() == "smollm2-135m-drafter"


def _full_models() -> list[str]:
    return [n for n in bundled.names() if (bundled.path(n) / "config.json").is_file()]


@pytest.mark.parametrize("name", bundled.names())
def test_every_bundled_checkpoint_decodes_exactly(name):
    """Full models and the SmolLM2 drafter adapter (its base is installed by the README's command)."""
    model, tokenizer = bundled.load(name)
    ids = question_ids(tokenizer, "Tom has 3 apples and buys 4 more. How many apples does he have?")
    stock = model.generate(ids, max_new_tokens=12, assistant_mode=None, do_sample=False)
    config = model.generation_config
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    assert config.assistant_mode == "packed_ss" and tokenizer.eos_token_id in eos
    for mode in ("linear_ss", "quadratic_ss", "packed_ss"):
        assert torch.equal(model.generate(ids, max_new_tokens=12, assistant_mode=mode), stock), mode


@pytest.mark.parametrize("name", _full_models())
def test_publish_folder_loads_in_a_fresh_process(tmp_path, name):
    import subprocess
    import sys

    assert main(["publish", name, "--repo-id", f"someone/{name}", "--local-dir", str(tmp_path / name)]) == 0
    folder = tmp_path / name
    card = (folder / "README.md").read_text()
    head = card.split("---")[1]
    for field in ("license:", "library_name:", "datasets:", "tags:", "custom_generate"):
        assert field in head, field
    assert (folder / "model.safetensors").is_file() and (folder / "custom_generate" / "generate.py").is_file()
    script = (
        "import sys, torch, hf_packed_ss\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True, dtype=torch.float32)\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)\n"
        "ids = t('Question: 1 + 2?', return_tensors='pt').input_ids\n"
        "a = m.generate(ids, max_new_tokens=6, assistant_mode=None, do_sample=False)\n"
        "b = m.generate(ids, max_new_tokens=6)\n"
        "assert torch.equal(a, b), (a, b)\n"
        "print(m.generation_config.assistant_mode)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=300,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("packed_ss")


def _adapters() -> list[str]:
    return [n for n in bundled.names() if (bundled.path(n) / "adapter_config.json").is_file()]


@pytest.mark.parametrize("name", _adapters())
def test_published_drafter_adapter_loads_in_a_fresh_process(tmp_path, name):
    """The adapter folder names its Hub base, carries the MASK embedding and the base's tokenizer, and
    decodes (Packed-SS by default) exactly as the base model's greedy decoding in a fresh process."""
    import json
    import os
    import subprocess
    import sys

    from hf_packed_ss import smollm2

    folder = tmp_path / name
    assert main(["publish", name, "--repo-id", f"someone/{name}", "--local-dir", str(folder)]) == 0
    head = (folder / "README.md").read_text().split("---")[1]
    for field in ("license:", "library_name: peft", f"base_model: {smollm2.HUB_ID}", "datasets:", "tags:"):
        assert field in head, field
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == smollm2.HUB_ID
    for file in ("adapter_model.safetensors", "mask_embedding.safetensors", "tokenizer.json", "generation_config.json"):
        assert (folder / file).is_file(), file
    script = (
        "import sys, torch\n"
        "from hf_packed_ss import smollm2\n"
        "from hf_packed_ss.bench.suites import question_ids\n"
        "m, t = smollm2.load(sys.argv[1])\n"
        "ids = question_ids(t, 'What is 12 + 30?')\n"
        "a = m.generate(ids, max_new_tokens=8, assistant_mode=None, do_sample=False)\n"
        "b = m.generate(ids, max_new_tokens=8)\n"
        "assert torch.equal(a, b), (a, b)\n"
        "print(m.generation_config.assistant_mode)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "HF_PACKED_SS_CACHE": str(smollm2.cache_dir().parent), "HOME": os.environ.get("HOME", "/root")}
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("packed_ss")


def test_none_options_fall_back_to_the_generation_config():
    """`speculative_width=None` (as a benchmark passes it) means the checkpoint's width, not the largest one;
    that width belongs to the config's own assistant_mode, other modes keep their defaults."""
    model, tokenizer = bundled.load("tiny-nemotron-random")
    model.generation_config.speculative_width = 3
    ids = tokenizer("Question: 1 + 1?", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, speculative_width=None, verify_order=None,
                         return_dict_in_generate=True)
    assert out.decoding_stats.width == 3
    other = model.generate(ids, max_new_tokens=4, assistant_mode="quadratic_ss", return_dict_in_generate=True)
    assert other.decoding_stats.width == 7  # the config's width is for packed_ss; quadratic_ss keeps B = 8
    stock = model.generate(ids, max_new_tokens=4, assistant_mode=None, speculative_width=None)
    assert stock.shape == (1, 4 + ids.shape[1])
