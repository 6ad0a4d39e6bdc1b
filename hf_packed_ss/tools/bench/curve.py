"""`hf-packed-ss probe --curve`: what a call costs against its rows, per dtype, eager and compiled, as a picture.

For each dtype and each of eager / compiled (a static cache and `torch.compile`, with the options `generate`
compiles with) it times a bare forward of n rows (`probe.bare_call`), our AR call and a real steady Packed-SS
call of each width (`probe.packed_call`: the proposal-only adapter, padding and mask included), all of one
configuration interleaved in one loop. The plot draws ms against rows, one line per configuration, and marks the
rows each schedule's steady call has at the model's default width (`probe.rows_per_iteration`, static shapes),
so a reader sees where on the curve each schedule sits: the method wins where the curve is flat.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .rows import rows_per_iteration
from .timing import bare_call, packed_call, time_interleaved

SCHEDULES = ("ar", "linear_ss", "packed_ss", "quadratic_ss")


def measure(model, prompt: torch.Tensor, rows: list[int], widths: list[int], compile_kwargs: dict | None,
            iters: int) -> dict:
    """Median ms of a bare forward per row count, of our AR call and of a Packed-SS call per width (with its
    rows), one configuration, interleaved."""
    calls, packed_rows, slots = {}, {}, None
    for width in widths:
        calls["packed", width], packed_rows[width], context, slots = packed_call(
            model, width, prompt.numel() + 64 + 4 * (width + 1), compile_kwargs, prompt, new_tokens=64)
        calls["packed", width]()  # compiles here, not while timed
    calls["ar"], _, _, _ = packed_call(model, 0, prompt.numel() + 64 + 4, compile_kwargs, prompt, 64, mode="ar")
    calls["ar"]()
    context = prompt.numel()
    slots = slots or -(-(context + 64 + max(rows)) // 128) * 128
    for n in rows:
        calls["bare", n] = bare_call(model, n, max(slots, -(-(context + n) // 128) * 128), compile_kwargs, context)
        calls["bare", n]()
    timed = time_interleaved(calls, iters=iters, warmup=2)
    return {"bare_ms": {n: timed["bare", n] * 1e3 for n in rows}, "ar_ms": timed["ar"] * 1e3,
            "packed_ms": {packed_rows[w]: timed["packed", w] * 1e3 for w in widths},
            "packed_widths": {packed_rows[w]: w for w in widths}, "context": context}


def schedule_rows(any_order: bool, width: int) -> dict[str, int]:
    """Rows of each schedule's largest steady call at `width` (static shapes), from the engine."""
    return {s: max(rows_per_iteration(s, width, any_order, static_shapes=True)) for s in SCHEDULES}


def plot(curve: dict, file: Path) -> Path:
    """ms against rows: solid lines bare forwards, dashed our Packed-SS calls, one colour per configuration;
    dotted verticals where each schedule's steady call sits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (name, c) in enumerate(curve["configurations"].items()):
        colour = f"C{i}"
        bare = sorted((int(n), t) for n, t in c["bare_ms"].items())
        ax.plot(*zip(*bare, strict=True), "-o", color=colour, ms=3, label=f"{name}: bare forward")
        if c["packed_ms"]:
            packed = sorted((int(n), t) for n, t in c["packed_ms"].items())
            ax.plot(*zip(*packed, strict=True), "--s", color=colour, ms=3, label=f"{name}: Packed-SS call")
        ax.plot([1], [c["ar_ms"]], "^", color=colour, ms=6, label=f"{name}: AR call")
    ax.set_ylim(bottom=0)
    top, widest = ax.get_ylim()[1], max(int(n) for c in curve["configurations"].values() for n in c["bare_ms"])
    for s, n in curve["schedule_rows"].items():  # a schedule past the widest call measured is named at the edge
        ax.axvline(min(n, widest), color="grey", ls=":", lw=0.8)
        ax.text(min(n, widest), top, f" {s} ({n} rows)", rotation=90, va="top", ha="left", fontsize=7,
                color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows per call (log scale)")
    ax.set_ylabel("ms per call")
    ax.set_title(f"{curve['model']}: call cost against rows, {curve['context']} cached tokens, "
                 f"{curve['threads']} thread(s); verticals: steady calls at W={curve['width']}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(file, dpi=120)
    return file


def main(model_name: str, prompt: torch.Tensor, load, dtypes: list[str], compiled: list[bool], rows: list[int],
         widths: list[int], iters: int, out: Path) -> int:
    """Measure every configuration, write `curve.json` and `curve.png` into `out`, print a table."""
    from ...front.families import default_width, family
    from ...front.generate import INDUCTOR_OPTIONS

    out.mkdir(parents=True, exist_ok=True)
    configurations, config, generation_config = {}, None, None
    for dtype in dtypes:
        model = load(getattr(torch, dtype))
        config, generation_config = model.config, model.generation_config
        for compile_ in compiled:
            name = f"{dtype} {'compiled' if compile_ else 'eager'}"
            options = {"fullgraph": False, "dynamic": False, "options": dict(INDUCTOR_OPTIONS)} if compile_ else None
            configurations[name] = measure(model, prompt, rows, widths, options, iters)
            c = configurations[name]
            bare = ", ".join(f"{n}: {t:.1f}" for n, t in c["bare_ms"].items())
            packed = ", ".join(f"{n} rows (W={c['packed_widths'][n]}): {t:.1f}" for n, t in c["packed_ms"].items())
            print(f"{name}: AR call {c['ar_ms']:.1f} ms; bare forward {bare} ms; Packed-SS {packed} ms", flush=True)
        del model
    fam = family(config)
    width = getattr(generation_config, "speculative_width", None) or default_width(config, "packed_ss")
    curve = {"model": model_name, "context": int(prompt.numel()), "threads": torch.get_num_threads(),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "width": width,
             "schedule_rows": schedule_rows(fam.any_order, width), "configurations": configurations}
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    print(f"wrote {out / 'curve.json'} and {plot(curve, out / 'curve.png')}")
    return 0
