"""Where the tools (train, bench, quality, publish, the bundled-checkpoint refresh) find files that are not
part of the installed package. Every such location is read here, and each one can be given explicitly.

- GSM8K (`train.jsonl`, `test.jsonl`): the folder in the environment variable ``HF_PACKED_SS_GSM8K``, else
  ``../shared/data/gsm8k`` beside the source checkout this package runs from (beside the working directory
  when it runs from an installed wheel). Every tool that reads GSM8K also takes an explicit file (`--data`), and
  the ones that can fall back to the GSM8K questions shipped in ``tools/bench/data/`` do so when the folder is
  absent.
- Model cards: ``model_cards/`` of the source checkout (`hf-packed-ss publish --cards DIR` otherwise).
- The Gradio demo: ``demo/app.py`` of the source checkout (it is no part of the package; `hf-packed-ss demo` runs it).

Nothing here is ever written to; the tools write only where they are told (`--out`).
"""

from __future__ import annotations

import os
from pathlib import Path

GSM8K_ENV = "HF_PACKED_SS_GSM8K"
GSM8K_DEFAULT = "../shared/data/gsm8k"  # relative to the source checkout (documented default of GSM8K_ENV)
GSM8K_HELP = (f"${GSM8K_ENV}, else {GSM8K_DEFAULT} beside the source checkout (beside the working directory for "
              "an installed package)")


def source_checkout() -> Path | None:
    """The source checkout this package runs from (a clone, editable install or not): the folder above the
    package when it holds the project's pyproject.toml; None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]  # <root>/hf_packed_ss/tools/paths.py
    return root if (root / "pyproject.toml").is_file() and (root / "hf_packed_ss").is_dir() else None


def gsm8k_folder() -> Path:
    """The GSM8K data folder, read at call time: ``$HF_PACKED_SS_GSM8K``, else ``../shared/data/gsm8k`` beside
    the source checkout (beside the working directory for an installed package). It may not exist."""
    value = os.environ.get(GSM8K_ENV)
    if value:
        return Path(value).expanduser()
    return Path(os.path.normpath((source_checkout() or Path.cwd()) / GSM8K_DEFAULT))


def gsm8k_split(split: str) -> Path:
    """`train.jsonl` or `test.jsonl` (``split`` = "train" / "test") in `gsm8k_folder()`; it may not exist."""
    return gsm8k_folder() / f"{split}.jsonl"


def model_cards() -> Path | None:
    """``model_cards/`` of the source checkout, or None when the package does not run from one."""
    root = source_checkout()
    return root / "model_cards" if root is not None else None


def demo_app() -> Path | None:
    """``demo/app.py`` of the source checkout (the Gradio app ships with the repository, not the package), or
    None when the package does not run from one."""
    root = source_checkout()
    return root / "demo" / "app.py" if root is not None else None
