"""Tensor parallelism: `torchrun --nproc-per-node 2` (gloo, CPU) decodes exactly as one process does.

Each check runs `hf_packed_ss.tools.shard` twice in subprocesses, once under `torch.distributed.run` with two ranks
and once alone, in float64 on a bundled tiny checkpoint, and compares the JSON they write: the new tokens of every
schedule, the NFE (the same drafts were proposed), and that the model really was sharded (each rank held half of an
attention projection).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_packed_ss.models.nemotron import NemotronLabsDiffusionConfig

TIMEOUT_S = 240
ALL_SCHEDULES = ["ar", "linear_ss", "quadratic_ss", "packed_ss", "hybrid_ss:2"]
# configuration_nemotron_labs_diffusion.py of the release ("Default tensor parallel plan for base model `Ministral`")
RELEASE_TP_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shard(out: Path, *args: str, ranks: int = 1) -> dict:
    """Run the shard script (under torchrun when ranks > 1) and return its JSON; on failure show its output."""
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
                     "--master-port", str(_free_port())]
    command = [*launcher, "-m", "hf_packed_ss.tools.shard", "--dtype", "float64", "--max-new-tokens", "24",
               "--out", str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{' '.join(command)} timed out after {TIMEOUT_S} s\n{error.stdout}\n{error.stderr}")
    if done.returncode != 0 or not out.is_file():
        pytest.fail(f"{' '.join(command)} exited {done.returncode}\nstdout:\n{done.stdout[-4000:]}\n"
                    f"stderr:\n{done.stderr[-8000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def nemotron_one(tmp_path_factory) -> dict:
    """One process, the bundled tiny Nemotron, every schedule (shared by the checks below)."""
    return _shard(tmp_path_factory.mktemp("one") / "one.json", "--model", "tiny-nemotron-gsm8k", "--schedules",
                  *ALL_SCHEDULES)


def _compare(tmp_path: Path, *args: str, one: dict | None = None) -> tuple[dict, dict]:
    one = one or _shard(tmp_path / "one.json", *args)
    tp = _shard(tmp_path / "tp.json", *args, ranks=2)
    assert (one["world_size"], tp["world_size"], tp["backend"]) == (1, 2, "gloo")
    assert tp["outputs"] == one["outputs"]
    assert tp["nfe"] == one["nfe"]
    for schedule, tokens in one["outputs"].items():  # and each schedule is the AR mode's greedy output
        assert tokens == one["outputs"]["ar"], schedule
        assert all(len(t) == 24 for t in tokens)
    return one, tp


def _assert_sharded(tp: dict, name: str, dim: int) -> None:
    shapes = tp["sharded"][name]
    assert shapes["dtensor"], name
    full = shapes["full_shape"]
    for local in shapes["local_shapes"]:
        assert local[dim] * 2 == full[dim] and local[1 - dim] == full[1 - dim], (name, shapes)


def test_config_carries_the_release_tp_plan():
    assert NemotronLabsDiffusionConfig.base_model_tp_plan == RELEASE_TP_PLAN
    assert set(NemotronLabsDiffusionConfig.base_model_pp_plan) == {"embed_tokens", "layers", "norm"}


def test_nemotron_every_schedule_tensor_parallel_equals_one_process(tmp_path, nemotron_one):
    one, tp = _compare(tmp_path, "--model", "tiny-nemotron-gsm8k", "--schedules", *ALL_SCHEDULES, one=nemotron_one)
    assert tp["tp_plan"]["encoder.layers.*.self_attn.q_proj"] == "colwise"
    assert tp["tp_plan"]["diffusion_head"] == "colwise_gather_output"
    _assert_sharded(tp, "encoder.layers.0.self_attn.q_proj.weight", 0)  # colwise: output features split
    assert not one["sharded"]["encoder.layers.0.self_attn.q_proj.weight"]["dtensor"]


def test_setdlm_tensor_parallel_equals_one_process(tmp_path):
    _, tp = _compare(tmp_path, "--model", "tiny-setdlm-gsm8k", "--schedules", "ar", "packed_ss")
    _assert_sharded(tp, "model.layers.0.self_attn.q_proj.weight", 0)


def test_proposal_only_lora_on_sharded_weights(tmp_path, nemotron_one):
    """A saved PEFT adapter loaded onto the sharded model: PEFT shards it with its base layers, the gate adds it to
    the proposal rows only (tokens stay the AR mode's) and drafts what it drafts in one process (same NFE), which
    differs from the base model's drafting (the adapter is live)."""
    from peft import LoraConfig, get_peft_model

    from hf_packed_ss import bundled

    base, _ = bundled.load("tiny-nemotron-gsm8k", torch.float64)
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    schedules = ["ar", "packed_ss", "linear_ss"]
    one, tp = _compare(tmp_path, "--model", "tiny-nemotron-gsm8k", "--schedules", *schedules,
                       "--adapter", str(tmp_path / "adapter"))
    prefix = "base_model.model.encoder.layers.0.self_attn.q_proj."
    _assert_sharded(tp, prefix + "base_layer.weight", 0)
    _assert_sharded(tp, prefix + "lora_B.default.weight", 0)  # the adapter's B is split with its colwise base
    plain = {s: nemotron_one["outputs"][s] for s in schedules}, {s: nemotron_one["nfe"][s] for s in schedules}
    assert plain[0] == one["outputs"]
    assert plain[1] != one["nfe"]


def test_misconfigured_world_is_a_clear_error(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "hf_packed_ss.tools.shard", "--out", str(tmp_path / "x.json")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "torchrun --nproc-per-node" in done.stderr and "RANK" in done.stderr


def test_a_released_model_with_remote_code_under_tensor_parallelism(tmp_path, monkeypatch):
    """A release folder (its own modeling code) loaded with trust_remote_code=True and `enable`d: the twin it decodes
    through shares the DTensor weights and gets the model's TP forwards (`copy_tensor_parallel_forwards`), so greedy
    decoding, seeded sampling (every rank the same seed) and a batch all give what one process gives, and every
    rank the same. Without those forwards the twin fails ("mixed torch.Tensor and DTensor")."""
    from release import release_folder

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = release_folder(tmp_path)
    one, tp = _compare(tmp_path, "--model", str(folder), "--trust-remote-code", "--schedules", "ar", "packed_ss",
                       "--sample-seed", "3", "--batch")
    assert tp["ranks_agree"] and tp["sampled"] == one["sampled"] and tp["batched"] == one["batched"]
    assert one["batched"] == one["outputs"]  # a batched row is its prompt decoded alone
    assert one["sampled"]["ar"] != one["outputs"]["ar"]  # it sampled
    _assert_sharded(tp, "encoder.layers.0.self_attn.q_proj.weight", 0)
