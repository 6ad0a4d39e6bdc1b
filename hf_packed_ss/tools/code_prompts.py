"""Code prompts made from the Python standard library: a drafter's second kind of training text (issue 36).

Each prompt is a function's signature and docstring, in the shape of a HumanEval problem (``def f(...):`` and its
docstring, the body left to the model), taken from the `.py` files of the running interpreter's standard library
(Python Software Foundation License 2.0). They are made here rather than downloaded, so nothing reaches a hub; the
HumanEval test problems never enter them. The list is sorted and shuffled with a fixed seed, then cut into a
train, a dev and a held-out split (`SPLITS`), so a run chooses on dev and reports on held-out.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from pathlib import Path

SPLITS = {"dev": (0, 40), "held_out": (40, 80), "train": (80, None)}  # index ranges of the shuffled list
LICENSE = "PSF-2.0 (the Python standard library's own source, read from the interpreter that runs the command)"
SEED = 0


def _stub(source: list[str], node: ast.FunctionDef) -> str | None:
    """The function's lines from `def` to the end of its docstring, dedented; None when it has no fitting one."""
    doc = ast.get_docstring(node)
    if not doc or not 40 <= len(doc) <= 600 or node.name.startswith("_") or not node.body:
        return None
    lines = source[node.lineno - 1 : node.body[0].end_lineno]
    if any(line.lstrip().startswith("@") for line in lines[:1]):
        return None
    text = textwrap.dedent("\n".join(lines)) + "\n"
    return text if len(text) <= 900 and text.startswith("def ") else None


def stdlib_stubs(root: Path | None = None) -> list[str]:
    """Every public module-level function with a docstring of 40-600 characters, in a fixed
    order (sorted files, then source order), deduplicated."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    seen, stubs = set(), []
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root).parts
        if any(p in ("test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "tkinter") for p in parts):
            continue
        try:
            text = file.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        source = text.splitlines()
        for node in tree.body:  # module-level functions: no `self`, like a benchmark problem
            if isinstance(node, ast.FunctionDef):
                stub = _stub(source, node)
                if stub is not None and stub not in seen:
                    seen.add(stub)
                    stubs.append(stub)
    return stubs


def code_prompts(split: str, n: int | None = None) -> list[str]:
    """The first `n` prompts of `split` (`SPLITS`: dev, held_out, train) of the shuffled stubs."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; choose one of {sorted(SPLITS)}.")
    stubs = stdlib_stubs()
    random.Random(SEED).shuffle(stubs)
    start, stop = SPLITS[split]
    chosen = stubs[start:stop]
    return chosen if n is None else chosen[:n]
