"""Small helpers for calling transformers models: cache keyword, mask format, kept logit rows."""

from __future__ import annotations

import inspect

import torch


def cache_keyword(module: torch.nn.Module) -> str:
    """transformers 5.24 renamed `past_key_values` to `cache`; accept either."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def mask_for_backend(mask: torch.Tensor, config, dtype: torch.dtype) -> torch.Tensor:
    """sdpa takes a boolean mask (True = attend); eager silently misreads one, so give it an additive mask."""
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def keep_rows(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """transformers' `logits_to_keep`: an int keeps the last that many rows (0 = all), a 1D tensor those rows."""
    rows = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, rows, :]
