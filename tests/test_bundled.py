"""The bundled checkpoint, the generation_config.json round trip, and the `hf-packed-ss run` command."""

from __future__ import annotations

import pytest
import torch

from hf_packed_ss import bundled
from hf_packed_ss.tools.bench.suites import question_ids
from hf_packed_ss.tools.cli import main


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


# float32: where every exact schedule is token-identical to AR, so a difference is a failure (exit code 1)
QUICK = ["--model", "tiny-nemotron-gsm8k", "--no-progress", "--warmup-tokens", "2", "--probe-iters", "1",
         "--dtype", "float32"]


def test_run_command_prints_every_schedule(capsys):
    """Real decodes (tiny checkpoint, few tokens): text, the table with tokens/s, speed-up and break-even
    columns, the verdict and the timing line."""
    assert main(["run", "--max-new-tokens", "12", "--width", "3", "--repeats", "2", *QUICK]) == 0
    printed = capsys.readouterr().out
    for mode in ("ar", "linear_ss", "quadratic_ss", "packed_ss"):
        assert f"[{mode}]" in printed and f"\n{mode}" in printed
    table = printed.split("same as ar")[1]
    assert "NO" not in table
    for column in ("tokens/s", "speed-up vs ar", "break-even", "ms/NFE"):
        assert column in printed
    assert "Fastest on this machine: " in printed and "call costs" in printed and "bare forward" in printed
    assert "Timing: median of 2 repeat(s)" in printed


def test_run_command_compiles_every_schedule_with_stock(capsys):
    """`run --compile`: each schedule, stock included, is its static-cache compiled variant under its own name,
    compiled in the warm-up, and still equal to AR."""
    assert main(["run", "--max-new-tokens", "8", "--width", "2", "--repeats", "1", "--compile", "--no-probe",
                 "--schedules", "ar", "packed_ss", "stock", *QUICK]) == 0
    table = capsys.readouterr().out.split("same as ar")[1]
    rows = {line.split()[0]: line.split()[-1] for line in table.splitlines()[2:] if line.strip()}
    assert rows.keys() >= {"ar", "packed_ss", "stock"} and rows["packed_ss"] == rows["stock"] == "yes"


def _fake_decode(calls: list, seconds: dict, wrong: str | None = None):
    """A stand-in for `bench.measure.decode_ours`: records (mode, max_new_tokens), returns fixed statistics:
    100 tokens (fewer for a warm-up), NFE 100 / (tokens per NFE), `seconds[mode]` give or take 2%."""
    per_nfe = {"ar": 1, "linear_ss": 2, "quadratic_ss": 2.5, "packed_ss": 2, "auto": 2}
    rows = {"ar": 1, "linear_ss": 4, "quadratic_ss": 20, "packed_ss": 8, "auto": 8}

    def decode(model, ids, mode, settings, compiled=False):
        calls.append((mode, settings.max_new_tokens))
        n = min(100, settings.max_new_tokens)
        nfe = max(1, round(n / per_nfe[mode]))
        tokens = list(range(n)) if mode != wrong else [7] * n
        k = sum(1 for m, _ in calls if m == mode) - 1  # this schedule's k-th decode (0: the warm-up)
        wall = seconds[mode] * (1.0, 1.02, 0.98)[k % 3]  # noise whose median is `seconds[mode]` (k = 1, 2, 3)
        return dict(width=0 if mode == "ar" else 3, new_tokens=n, nfe=nfe, decoder_time_s=wall, generate_wall_s=wall,
                    model_time_s=wall, rows_per_call=[ids.shape[1]] + [rows[mode]] * (nfe - 1),
                    accepted_per_iteration=[], tokens=tokens)

    return decode


def test_run_command_warms_up_then_times_interleaved_repeats(monkeypatch, capsys, tmp_path):
    """Every schedule is warmed up (untimed, a few tokens) before any timed decode; the timed decodes are
    `--repeats` rounds in rotating order; the table reports the median repeat, the speed-up over AR with its
    range and the break-even tokens/NFE; the verdict names the fastest schedule and why; --json has it all."""
    from hf_packed_ss.tools.bench import measure

    calls: list = []
    seconds = {"ar": 1.0, "linear_ss": 0.9, "quadratic_ss": 2.0, "packed_ss": 0.8, "auto": 0.85}
    monkeypatch.setattr(measure, "decode_ours", _fake_decode(calls, seconds))
    out = tmp_path / "run.json"
    assert main(["run", "--repeats", "3", *QUICK, "--json", str(out)]) == 0
    modes = ["ar", "linear_ss", "quadratic_ss", "packed_ss", "auto"]
    assert calls[:5] == [(m, 2) for m in modes]  # the warm-up
    timed = [m for m, n in calls[5:] if n == 128]  # the default answer length
    assert len(timed) == len(calls) - 5 == 15
    assert timed == modes + modes[1:] + modes[:1] + modes[2:] + modes[:2]  # rotated per round
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.split()[:1]
            and line.split()[0] in modes and not line.startswith("[")}
    # packed_ss: 100 tokens in 0.8 s against AR's 1.0 s: 1.25x; 50 NFE of 16 ms against AR's 10 ms: break-even 1.6
    assert rows["packed_ss"][1:5] == ["3", "100", "50", "2.00"] and rows["packed_ss"][8] == "1.25"
    assert rows["packed_ss"][-2:] == ["1.60", "yes"] and rows["ar"][-2:] == ["-", "-"]
    assert "Fastest on this machine: packed_ss, 1.25x AR's speed: it reaches 2.00 tokens/NFE where 1.60" in printed
    assert "One packed_ss call costs 1.60x an AR call here" in printed and "a bare forward of its 8 rows" in printed
    assert "Timing: median of 3 repeat(s)" in printed
    import json

    saved = json.loads(out.read_text())
    assert saved["repeats"] == 3 and len(saved["records"]) == 15 and saved["max_new_tokens"] == 128
    packed = next(r for r in saved["rows"] if r["schedule"] == "packed_ss")
    assert packed["speedup"]["low"] <= packed["speedup"]["value"] <= packed["speedup"]["high"]
    assert saved["probe_s"] and set(saved["probe_s"]) == {"1", "8"}  # 1 row and packed_ss's rows per call


def test_run_command_says_when_ar_is_fastest_and_exits_1_on_a_mismatch_2_on_an_error(monkeypatch, capsys):
    from hf_packed_ss.tools.bench import measure

    seconds = {"ar": 1.0, "linear_ss": 1.6, "quadratic_ss": 2.0, "packed_ss": 1.25}
    monkeypatch.setattr(measure, "decode_ours", _fake_decode([], seconds, wrong="linear_ss"))
    assert main(["run", "--repeats", "1", "--schedules", "ar", "packed_ss", "linear_ss", "--no-probe", *QUICK]) == 1
    printed = capsys.readouterr().out
    assert "Fastest on this machine: ar" in printed
    table = printed.split("same as ar")[1]
    assert table.count("NO") == 1 and "linear_ss" in [line.split()[0] for line in table.splitlines()
                                                       if line.strip().endswith("NO")]
    monkeypatch.undo()
    assert main(["run", "--width", "99", *QUICK]) == 2  # generate's own ValueError: a message, exit code 2
    assert "speculative_width=99 is out of range" in capsys.readouterr().err
    monkeypatch.setattr(measure, "decode_ours", _fake_decode([], seconds))
    assert main(["run", "--repeats", "1", "--schedules", "ar", "packed_ss", "--no-probe", *QUICK]) == 0
    printed = capsys.readouterr().out
    assert ("tokens/s); the best speculative schedule, packed_ss, runs at 0.80x AR's speed: it would match AR at "
            "2.50 tokens/NFE and reaches 2.00.") in printed and "Fastest on this machine: ar (" in printed


def test_repeat_statistics_and_auto_repeats():
    from hf_packed_ss.tools.bench.repeats import median_index, speedup, spread, trimmed_range
    from hf_packed_ss.tools.bench.statistics import Interval
    from hf_packed_ss.tools.cli import auto_repeats

    assert median_index([3.0, 1.0, 2.0]) == 2 and median_index([4.0, 1.0, 3.0, 2.0]) == 3  # lower median
    assert spread([1.0, 5.0, 2.0]) == Interval(2.0, 1.0, 5.0)
    assert trimmed_range([9.0, 1.0, 2.0, 3.0, 4.0]) == (2.0, 4.0)  # one left out at each end of five
    up = speedup([10.0, 10.0, 12.0], [20.0, 25.0, 18.0])  # tokens/s of AR and of a schedule, per round
    assert up.value == 2.0 and (up.low, up.high) == (1.5, 2.5)
    assert auto_repeats(60.0) == 3 and auto_repeats(0.0) == 3 and auto_repeats(5.0) == 6 and auto_repeats(0.01) == 25


def test_run_command_falls_back_to_the_tiny_checkpoint_with_a_hint(monkeypatch, capsys):
    """Without the SmolLM2 base the main command still decodes, with a trained tiny checkpoint, and says how
    to get the drafter in one line."""
    from hf_packed_ss.models import smollm2
    from hf_packed_ss.tools import cli

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

    from hf_packed_ss.models import smollm2

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
        "from hf_packed_ss.models import smollm2\n"
        "from hf_packed_ss.tools.bench.suites import question_ids\n"
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


@pytest.mark.parametrize("name", _adapters())
def test_bundle_drafter_prunes_the_adapter_to_its_targets(tmp_path, name):
    """`bundle_drafter(..., targets=)` keeps only those projections' adapters (weights and config), refuses a
    projection the adapter never had, and the pruned drafter, loaded from its folder as the commands load one
    (`--model FOLDER`: once it went to the Hub for a config), still decodes exactly as the base."""
    import json

    from safetensors.torch import load_file

    from hf_packed_ss.bundled.__main__ import main as bundled_main
    from hf_packed_ss.tools.loading import load_model

    source = bundled.path(name)
    kept = ["gate_proj", "up_proj"]
    with pytest.raises(ValueError, match="not among the adapter's projections"):
        bundled.bundle_drafter(source, "pruned", out=tmp_path / "bad", targets=["lm_head"])
    assert not (tmp_path / "bad").exists()  # refused before writing anything
    assert bundled_main(["--out", str(tmp_path), "--run", str(source), "--name", "pruned", "--drafter",
                         "--width", "2", "--targets", *kept]) == 0
    folder = tmp_path / "pruned"
    assert json.loads((folder / "adapter_config.json").read_text())["target_modules"] == kept
    projections = {key.split(".")[-3] for key in load_file(folder / "adapter_model.safetensors")}
    assert projections == set(kept)
    assert len(load_file(folder / "adapter_model.safetensors")) < len(load_file(source / "adapter_model.safetensors"))
    model, tokenizer = load_model(str(folder), torch.float32)  # as `bench --model FOLDER` loads a local adapter
    assert model.generation_config.speculative_width == 2
    ids = question_ids(tokenizer, "What is 12 + 30?")
    stock = model.generate(ids, max_new_tokens=8, assistant_mode=None, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=8), stock)


def test_truncate_rank_keeps_the_best_approximation_of_each_update():
    """A rank-2 update survives truncation to rank 2 exactly; truncating a full-rank one to k leaves the error of
    the best rank-k approximation (the tail singular values), and the pair has rank-k shapes."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 12, generator=gen, dtype=torch.float64)
    b = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    pad = {"x.q_proj.lora_A.weight": torch.cat([a, torch.zeros(2, 12, dtype=torch.float64)]),
           "x.q_proj.lora_B.weight": torch.cat([b, torch.zeros(10, 2, dtype=torch.float64)], 1)}
    exact = bundled.truncate_rank(pad, 2)
    assert exact["x.q_proj.lora_A.weight"].shape == (2, 12) and exact["x.q_proj.lora_B.weight"].shape == (10, 2)
    torch.testing.assert_close(exact["x.q_proj.lora_B.weight"] @ exact["x.q_proj.lora_A.weight"], b @ a)
    full = {"y.up_proj.lora_A.weight": torch.randn(6, 12, generator=gen, dtype=torch.float64),
            "y.up_proj.lora_B.weight": torch.randn(10, 6, generator=gen, dtype=torch.float64)}
    update = full["y.up_proj.lora_B.weight"] @ full["y.up_proj.lora_A.weight"]
    cut = bundled.truncate_rank(full, 3)
    error = torch.linalg.matrix_norm(update - cut["y.up_proj.lora_B.weight"] @ cut["y.up_proj.lora_A.weight"])
    tail = torch.linalg.svdvals(update)[3:]
    torch.testing.assert_close(error, tail.square().sum().sqrt())


def test_bundle_drafter_rank_rescales_alpha_and_refuses_a_larger_rank(tmp_path):
    import json

    source = bundled.path("smollm2-135m-drafter")
    config = json.loads((source / "adapter_config.json").read_text())
    with pytest.raises(ValueError, match="must be 1 to the adapter's rank"):
        bundled.bundle_drafter(source, "wide", out=tmp_path, rank=config["r"] + 1)
    folder = bundled.bundle_drafter(source, "narrow", out=tmp_path, rank=4)
    narrow = json.loads((folder / "adapter_config.json").read_text())
    assert narrow["r"] == 4 and narrow["lora_alpha"] / 4 == config["lora_alpha"] / config["r"]
    from safetensors.torch import load_file

    weights = load_file(folder / "adapter_model.safetensors")
    assert all(w.shape[0] == 4 for k, w in weights.items() if "lora_A" in k)
    assert all(w.shape[1] == 4 for k, w in weights.items() if "lora_B" in k)


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


def _package_files() -> list[str]:
    return sorted(str(p.relative_to(bundled.HERE)) for p in bundled.HERE.rglob("*") if "__pycache__" not in p.parts)


def test_bundle_writes_only_where_it_is_told(tmp_path):
    """`bundle` / `bundle_drafter` / `build_random` refuse to run without a destination and never write into the
    installed package; `python -m hf_packed_ss.bundled` needs --out and writes only FOLDER/NAME."""
    from conftest import tiny_model
    from transformers import AutoModelForCausalLM, GenerationConfig

    from hf_packed_ss.bundled.__main__ import main as bundled_main

    run = tmp_path / "run"
    model = tiny_model(0)
    model.generation_config = GenerationConfig(assistant_mode="packed_ss", speculative_width=3)  # as a trained run
    model.save_pretrained(run)
    bundled.load("tiny-nemotron-random")[1].save_pretrained(run)
    (run / "training_args.json").write_text("{}")
    before = _package_files()
    with pytest.raises(ValueError, match="out="):
        bundled.bundle(run, "tiny-test")
    with pytest.raises(ValueError, match="out="):
        bundled.bundle_drafter(run, "tiny-test")
    with pytest.raises(ValueError, match="out="):
        bundled.build_random(tmp_path / "train.jsonl")
    with pytest.raises(SystemExit):  # argparse: --out is required
        bundled_main(["--run", str(run), "--name", "tiny-test"])
    folder = bundled.bundle(run, "tiny-test", width=5, out=tmp_path / "dest")
    assert folder == tmp_path / "dest" / "tiny-test"
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["tiny-test"]
    for file in ("config.json", "model.safetensors", "tokenizer.json", "training_args.json"):
        assert (folder / file).is_file(), file
    assert GenerationConfig.from_pretrained(folder).speculative_width == 5
    assert AutoModelForCausalLM.from_pretrained(folder).dtype == torch.bfloat16
    assert bundled_main(["--out", str(tmp_path / "cli"), "--run", str(run), "--name", "tiny-cli"]) == 0
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == ["tiny-cli"]
    assert (tmp_path / "cli" / "tiny-cli" / "model.safetensors").is_file()
    assert _package_files() == before and "tiny-test" not in bundled.names()


def test_publish_reads_model_cards_from_the_folder_given(tmp_path):
    from hf_packed_ss.tools import publish

    assert publish.CARDS is not None and publish.card("tiny-nemotron-random") == (
        publish.CARDS / "tiny-nemotron-random" / "README.md")
    (tmp_path / "tiny-nemotron-random").mkdir()
    (tmp_path / "tiny-nemotron-random" / "README.md").write_text("---\nlicense: mit\n---\nA card.\n")
    out = tmp_path / "hub"
    assert main(["publish", "tiny-nemotron-random", "--repo-id", "someone/x", "--local-dir", str(out),
                 "--cards", str(tmp_path)]) == 0
    assert (out / "README.md").read_text().endswith("A card.\n") and (out / "model.safetensors").is_file()
    with pytest.raises(FileNotFoundError, match="--cards"):
        publish.card("tiny-nemotron-random", tmp_path / "none")
