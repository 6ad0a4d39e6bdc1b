"""The engine stands alone: it imports no model class, no front and no tool, and the old import paths of its
parts still name the same objects."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import hf_packed_ss

ENGINE = Path(hf_packed_ss.__file__).parent / "engine"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) of every import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_the_engine_imports_no_model_front_or_tool():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) >= 10
    for path in files:
        depth = len(path.relative_to(ENGINE).parts) - 1  # 0 for engine/x.py, 1 for engine/layouts/x.py
        for level, module in _imports(path):
            if level:
                assert level <= depth + 1, (path, level, module)  # stays inside engine/
            else:
                top = module.split(".")[0]
                assert top != "hf_packed_ss", (path, module)
                assert not module.startswith("transformers.models"), (path, module)  # no model class


def test_old_import_paths_name_the_engine_objects():
    from hf_packed_ss import engine

    pairs = {
        "hf_packed_ss.runner:run": None,
        "hf_packed_ss.schedules:PackedSSSchedule": engine.schedules.PackedSSSchedule,
        "hf_packed_ss.schedules.packed_ss:BranchedSSSchedule": engine.schedules.PackedSSSchedule,
        "hf_packed_ss.schedules.any_order:WindowHybridSSSchedule": engine.schedules.HybridSSSchedule,
        "hf_packed_ss.schedules.any_order:NativeSchedule": engine.schedules.NativeSchedule,
        "hf_packed_ss.layouts:NemotronLayout": engine.ShiftedBlockLayout,
        "hf_packed_ss.layouts.setdlm:SetDLMLayout": engine.SamePositionLayout,
        "hf_packed_ss.plan:CallPlan": engine.Plan,
        "hf_packed_ss.plan:WindowPlan": engine.Plan,
        "hf_packed_ss.acceptance:RejectionSampler": engine.RejectionSampler,
        "hf_packed_ss.stats:DecodingStats": engine.DecodingStats,
        "hf_packed_ss.generation:model_forward": None,
    }
    for path, expected in pairs.items():
        module, name = path.split(":")
        value = getattr(importlib.import_module(module), name)
        assert expected is None or value is expected, path
