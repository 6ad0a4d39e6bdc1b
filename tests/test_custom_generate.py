"""The `custom_generate` folder works for a remote-code model in a fresh Python process that never
imports hf_packed_ss itself (only the folder's generate.py does)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from conftest import reference_greedy, tiny_config

import hf_packed_ss
from hf_packed_ss import NemotronLabsDiffusionModel

HUB = Path(hf_packed_ss.__file__).parent / "hub"

REMOTE_CODE = '''
import torch
from torch import nn
from transformers import GenerationMixin, Ministral3Config, Ministral3Model, PreTrainedModel


class RemoteDiffusionConfig(Ministral3Config):
    model_type = "remote_diffusion_lm"
    mask_token_id: int | None = None
    block_size: int = 32


class RemoteDiffusionModel(PreTrainedModel, GenerationMixin):
    """A remote-code model of the release's structure: `encoder` + `diffusion_head`."""

    config_class = RemoteDiffusionConfig

    def __init__(self, config):
        super().__init__(config)
        self.encoder = Ministral3Model(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, **kwargs):
        hidden = self.encoder(input_ids=input_ids, **kwargs).last_hidden_state
        return {"logits": self.diffusion_head(hidden)}
'''


def _remote_folder(tmp_path: Path) -> tuple[Path, list[int]]:
    code = tmp_path / "remote_code"
    code.mkdir()
    (code / "remote_diffusion.py").write_text(textwrap.dedent(REMOTE_CODE))
    sys.path.insert(0, str(code))
    try:
        import remote_diffusion
    finally:
        sys.path.remove(str(code))
    fields = {k: v for k, v in tiny_config().to_dict().items() if k not in ("model_type", "transformers_version")}
    config = remote_diffusion.RemoteDiffusionConfig(**fields)
    torch.manual_seed(4)
    remote = remote_diffusion.RemoteDiffusionModel(config).to(torch.float64)
    config.register_for_auto_class()
    remote.register_for_auto_class("AutoModel")
    folder = tmp_path / "model"
    remote.save_pretrained(folder)
    ours = NemotronLabsDiffusionModel(tiny_config()).to(torch.float64).eval()
    ours.load_state_dict(remote.state_dict())
    return folder, reference_greedy(ours, torch.tensor([5, 9, 2, 7]), 16)


def test_custom_generate_in_a_fresh_process(tmp_path):
    folder, expected = _remote_folder(tmp_path)
    script = f"""
import json, sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True, dtype=torch.float64)
results = {{}}
for mode in ("packed_ss", "linear_ss", "quadratic_ss"):
    out = model.generate(torch.tensor([[5, 9, 2, 7]]), custom_generate={str(HUB)!r}, trust_remote_code=True,
                         assistant_mode=mode, speculative_width=4, max_new_tokens=16,
                         return_dict_in_generate=True)
    results[mode] = [out.sequences[0, 4:].tolist(), out.decoding_stats.schedule]
print(json.dumps(results))
"""
    check = "import sys; print('hf_packed_ss' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for mode, (tokens, schedule) in results.items():
        assert tokens == expected and schedule == mode
    # the script itself imports nothing from hf_packed_ss: only the folder's generate.py does
    assert "hf_packed_ss" not in script.replace(str(HUB), "")
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout.strip() == "False"


def test_folder_layout():
    assert (HUB / "custom_generate" / "generate.py").is_file()
    assert "hf-packed-ss" in (HUB / "custom_generate" / "requirements.txt").read_text()
    assert "custom_generate" in (HUB / "README.md").read_text().split("---")[1]
