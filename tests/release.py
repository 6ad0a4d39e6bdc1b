"""A local folder with the structure of a released Nemotron-Labs-Diffusion checkpoint: remote-code files
(`configuration_nemotron_labs_diffusion.py`, `modeling_nemotron_labs_diffusion.py`), a config.json whose
`model_type` is ours and whose `auto_map` points at those files, and tiny random float64 weights.

The remote class keeps the release's traits that matter here: `encoder` + `diffusion_head`, a plain
forward in diffusion (bidirectional) mode, its own `generate(prompt_ids, max_new_tokens, block_length)`,
the release's `ar_generate`, and a `linear_spec_generate` that crops its cache to a positive length as the
release's does. The decoders return `(output_ids, nfe)`."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import torch
from conftest import tiny_config
from safetensors.torch import save_file

from hf_packed_ss import NemotronLabsDiffusionModel

CONFIGURATION = '''
from transformers import Ministral3Config


class NemotronLabsDiffusionConfig(Ministral3Config):
    model_type = "nemotron_labs_diffusion"
    mask_token_id: int | None = 100
    block_size: int = 32
    dlm_paradigm: str = "bidirectional"
    dlm_loss_weight: float | None = None
    ar_loss_weight: float = 1.0
    dp_varying_mask_ratio: bool = False
'''

MODELING = '''
import torch
from torch import nn
from transformers import DynamicCache, Ministral3Model, PreTrainedModel

from .configuration_nemotron_labs_diffusion import NemotronLabsDiffusionConfig


class NemotronLabsDiffusionModel(PreTrainedModel):
    config_class = NemotronLabsDiffusionConfig
    base_model_prefix = "encoder"
    _no_split_modules = ["Ministral3DecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        self.encoder = Ministral3Model(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, **kwargs):  # the release's plain forward is the bidirectional mode
        n = input_ids.shape[1]
        everything = torch.ones(1, 1, n, n, dtype=torch.bool, device=input_ids.device)
        return self.diffusion_head(self.encoder(input_ids, attention_mask=everything).last_hidden_state)

    @torch.no_grad()
    def ar_generate(self, prompt_ids, max_new_tokens=32):
        ids, nfe = prompt_ids, 0
        for _ in range(max_new_tokens):
            logits = self.diffusion_head(self.encoder(ids).last_hidden_state[:, -1:])
            ids, nfe = torch.cat([ids, logits.argmax(-1).to(ids.device)], dim=1), nfe + 1
        return ids, nfe

    @torch.no_grad()
    def linear_spec_generate(self, prompt_ids, max_new_tokens=32, block_length=8):
        cache = DynamicCache()
        self.encoder(prompt_ids, past_key_values=cache, use_cache=True)
        cache.crop(prompt_ids.shape[1] - 1)  # the release crops to a length
        return self.ar_generate(prompt_ids, max_new_tokens)

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens=32, block_length=8):
        self(prompt_ids)
        return self.ar_generate(prompt_ids, max_new_tokens)
'''


def release_folder(root: Path, seed: int = 4) -> Path:
    """Write the folder under `root` (a unique name: transformers caches remote code by folder name)."""
    folder = root / f"release_{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "configuration_nemotron_labs_diffusion.py").write_text(textwrap.dedent(CONFIGURATION))
    (folder / "modeling_nemotron_labs_diffusion.py").write_text(textwrap.dedent(MODELING))
    config = tiny_config().to_dict()
    config.update(
        architectures=["NemotronLabsDiffusionModel"],
        auto_map={"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                  "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
        dtype="float64",
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    weights = NemotronLabsDiffusionModel(tiny_config()).to(torch.float64).state_dict()
    save_file({k: v.contiguous() for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder
