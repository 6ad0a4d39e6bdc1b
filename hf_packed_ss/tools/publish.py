"""`hf-packed-ss publish NAME --repo-id ID [--local-dir DIR]`: a Hub-ready folder for a bundled checkpoint.

The folder holds the weights (safetensors), config, tokenizer and generation config (or, for the
SmolLM2 drafter, the PEFT adapter and its MASK embedding), the model card `NAME/README.md` from `--cards DIR`
(default: `model_cards/` of the source checkout this package runs from; an installed package has no default), and
our `custom_generate` folder where the model can use it. Without `--local-dir` the folder is
assembled in a temporary directory and uploaded with `huggingface_hub`; with it, nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from .. import bundled
from .paths import model_cards

CARDS = model_cards()  # `model_cards/` of the source checkout, None for an installed package
HUB = Path(__file__).parents[1] / "hub"  # the package's hub/ folder
SKIP = {"trainer_state.pt"}


def card(name: str, cards: Path | None = None) -> Path:
    """The model card of `name`: `cards/NAME/README.md` (default `CARDS`, the source checkout's `model_cards/`),
    else one packaged beside the checkpoint."""
    folder = Path(cards) if cards is not None else CARDS
    candidates = ([folder / name / "README.md"] if folder is not None else []) + [bundled.path(name) / "README.md"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"No model card for {name!r} (looked at {[str(c) for c in candidates]}): write "
                            f"model_cards/{name}/README.md first, or pass --cards DIR (cards=DIR) holding {name}/.")


def assemble(name: str, out: Path, cards: Path | None = None) -> Path:
    """Write the Hub folder of bundled checkpoint `name` into `out` and return it (`cards`: see `card`)."""
    source = bundled.path(name)
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name not in SKIP:
            shutil.copy2(item, out / item.name)
    shutil.copy2(card(name, cards), out / "README.md")
    if (source / "config.json").is_file():  # a full model (not an adapter): add our custom_generate
        shutil.copytree(HUB / "custom_generate", out / "custom_generate", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-packed-ss publish", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=bundled.names(), help="bundled checkpoint")
    parser.add_argument("--repo-id", required=True, help="Hub repository, e.g. user/tiny-nemotron-gsm8k")
    parser.add_argument("--local-dir", type=Path, default=None, help="write the folder here and do not upload")
    parser.add_argument("--cards", type=Path, default=CARDS,
                        help="folder of model cards, CARDS/NAME/README.md (default: model_cards/ of the source "
                             "checkout: %(default)s)")
    parser.add_argument("--private", action="store_true")
    args = parser.parse_args(argv)
    if args.local_dir is not None:
        print(assemble(args.name, args.local_dir, args.cards))
        return 0
    from huggingface_hub import HfApi

    api = HfApi()
    with tempfile.TemporaryDirectory() as tmp:
        folder = assemble(args.name, Path(tmp) / args.name, args.cards)
        api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=args.repo_id)
    print(f"https://huggingface.co/{args.repo_id}")
    return 0
