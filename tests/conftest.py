"""Shared fixtures: tiny random models of the Nemotron format in float64, and a reference greedy loop
written independently of the Runner (full causal forward per step, no cache)."""

from __future__ import annotations

import pytest
import torch

import hf_packed_ss  # noqa: F401  (registers the Auto classes)
from hf_packed_ss import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, SetDLMConfig, SetDLMModel
from hf_packed_ss.bundled import yarn_rope

# Tiny models gain nothing from intra-op threads, and with one pytest-xdist worker per core extra
# OpenMP threads oversubscribe the machine and spin.
torch.set_num_threads(1)

VOCAB = 48
MASK = VOCAB - 1


def tiny_config(**overrides) -> NemotronLabsDiffusionConfig:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mask_token_id=MASK,
        block_size=32,
        max_position_embeddings=4096,
        rope_parameters=yarn_rope(4096),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    fields.update(overrides)
    return NemotronLabsDiffusionConfig(**fields)


def tiny_model(seed: int, **overrides) -> NemotronLabsDiffusionModel:
    torch.manual_seed(seed)
    model = NemotronLabsDiffusionModel(tiny_config(**overrides)).to(torch.float64).eval()
    with torch.no_grad():  # larger weights than the default init: sharper, less repetitive outputs
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


SETDLM_MASK = 39


def tiny_setdlm(seed: int, **overrides) -> SetDLMModel:
    """A random SetDLM-format model (vocabulary 40, MASK = 39) in float64 with sharp logits."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, mask_token_id=SETDLM_MASK, max_position_embeddings=512,
                  max_block_size=16)
    fields.update(overrides)
    model = SetDLMModel(SetDLMConfig(**fields)).to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def reference_greedy(model, prompt: torch.Tensor, max_new_tokens: int, eos: set[int] = frozenset()) -> list[int]:
    """Plain greedy decoding: recompute the full causal forward every step, no cache."""
    seq = prompt.tolist()
    out: list[int] = []
    with torch.no_grad():
        while len(out) < max_new_tokens:
            tok = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(tok)
            out.append(tok)
            if tok in eos:
                break
    return out


@pytest.fixture(scope="session")
def models():
    return {seed: tiny_model(seed) for seed in range(3)}
