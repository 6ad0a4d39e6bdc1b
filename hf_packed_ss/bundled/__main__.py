"""Refresh a bundled checkpoint, written only into the folder given as --out.

``python -m hf_packed_ss.bundled --out FOLDER [DATA] [--run RUN --name NAME [--drafter [--targets P ...] [--rank R]]
[--width W]]``.
Without ``--run`` it rebuilds `tiny-nemotron-random` from a GSM8K train file (the optional positional DATA);
with ``--run RUN --name NAME`` it copies a trained run (``--drafter``: a drafter adapter run) as NAME. Either
way it writes only ``FOLDER/NAME``; in a source checkout ``--out hf_packed_ss/bundled`` refreshes the copy
that ships with the package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..tools.paths import GSM8K_HELP, gsm8k_split
from . import RANDOM, build_random, bundle, bundle_drafter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hf_packed_ss.bundled", description=__doc__.splitlines()[0],
                                epilog="In a source checkout: python -m hf_packed_ss.bundled --out hf_packed_ss/bundled"
                                       " (then check the result with python -m pytest -q tests/test_bundled.py).")
    p.add_argument("data", nargs="?", type=Path, default=None,
                   help=f"GSM8K train file for {RANDOM} (default: train.jsonl in {GSM8K_HELP})")
    p.add_argument("--out", type=Path, required=True,
                   help="folder that receives NAME/ (required; hf_packed_ss/bundled in a source checkout)")
    p.add_argument("--run", type=Path, default=None, help="a trained run folder to bundle (default: rebuild "
                                                          f"{RANDOM} instead)")
    p.add_argument("--name", default=None, help=f"the bundled name (default: {RANDOM}; required with --run)")
    p.add_argument("--drafter", action="store_true", help="--run is a drafter adapter run (bundle_drafter)")
    p.add_argument("--width", type=int, default=None, help="speculative_width for the generation config (--run)")
    p.add_argument("--targets", nargs="+", default=None, metavar="PROJ",
                   help="--drafter: keep only these projections' adapters (e.g. q_proj k_proj v_proj gate_proj "
                        "up_proj); default: all")
    p.add_argument("--rank", type=int, default=None,
                   help="--drafter: keep each adapter's best rank-R approximation (truncated SVD); default: as trained")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.run is None:
        if args.drafter or args.width is not None or args.targets is not None or args.rank is not None:
            p.error("--drafter, --width, --targets and --rank apply to --run")
        data = args.data or gsm8k_split("train")
        if not data.is_file():
            p.error(f"GSM8K train file not found at {data}: pass it as DATA or set the folder in {GSM8K_HELP}")
        name = args.name or RANDOM
        build_random(data, out=args.out / name)
    else:
        if args.name is None:
            p.error("--run needs --name")
        if args.data is not None:
            p.error("DATA applies to the rebuild of the random checkpoint, not to --run")
        name = args.name
        if args.drafter:
            bundle_drafter(args.run, name, args.width, out=args.out, targets=args.targets, rank=args.rank)
        elif args.targets is not None or args.rank is not None:
            p.error("--targets and --rank apply to a drafter run (--drafter)")
        else:
            bundle(args.run, name, args.width, out=args.out)
    print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
