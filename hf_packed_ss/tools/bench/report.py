"""What the bench writes to `--out`: `results.json`, `report.md` and two PNG plots.

`ratios.png` is the paper's Figure 3 (efficiency ratios to the baseline with paired bootstrap whiskers);
`timing.png` is Figure 5 (mean model and non-model decoder time per response, normalised by the baseline's total,
appendix F.3). Plots use matplotlib's object API with the Agg canvas, so no display or global backend is touched.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import torch

RATIO_LABELS = {"throughput": "throughput", "tokens_per_nfe": "tokens/NFE", "time_per_nfe": "time/NFE",
                "mean_wall": "mean wall"}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, dtype: torch.dtype, seed: int) -> dict:
    """Versions, CPU/GPU, dtype and seed: enough to tell two results files apart."""
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in ("hf-packed-ss", "torch", "transformers", "numpy", "accelerate")},
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": gpu,
        "dtype": str(dtype).removeprefix("torch."),
        "seed": seed,
    }


def clean(value):
    """JSON without NaN/Infinity (strict parsers reject them): non-finite floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def _f(value, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


def _interval(cell: dict | None, digits: int = 3) -> str:
    if not cell:
        return "-"
    return f"{_f(cell['value'], digits)} [{_f(cell['low'], digits)}, {_f(cell['high'], digits)}]"


def absolute_table(results: dict) -> str:
    """Paper Table 6: means per response; rates from aggregate totals."""
    head = ("| schedule | W | responses | tokens | wall s | NFE | tokens/s | tokens/NFE | ms/NFE | model s | "
            "non-model s | rows/call | max rows/call | accepted/iter | accuracy | differs from ar |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in results["schedules"]:
        a = results["aggregates"].get(s)
        if not a or not a.get("responses"):
            continue
        tpn = a["time_per_nfe_s"] * 1000 if a["time_per_nfe_s"] is not None else None
        acc = None if a["accuracy"] is None else 100 * a["accuracy"]
        lines.append(
            f"| {s} | {a['width']} | {a['responses']} | {_f(a['mean_tokens'], 1)} | {_f(a['mean_wall_s'])} | "
            f"{_f(a['mean_nfe'], 1)} | {_f(a['throughput'], 1)} | {_f(a['tokens_per_nfe'], 2)} | {_f(tpn, 2)} | "
            f"{_f(a['mean_model_time_s'])} | {_f(a['mean_non_model_time_s'])} | "
            f"{_f(a['mean_rows_per_call_after_first'], 1)} | {a['max_rows_per_call_after_first']} | "
            f"{_f(a['mean_accepted_per_iteration'], 2)} | {_f(acc, 1) + ('%' if acc is not None else '')} | "
            f"{_differs(a)} |")
    return "\n".join(lines)


def _differs(a: dict) -> str:
    """Responses whose tokens differ from `ar`'s, with how many of them start at a near-tie of its logits."""
    if a.get("differs_from_ar") is None:
        return "-"
    ties = a.get("differs_at_near_ties")
    return f"{a['differs_from_ar']}" + (f" ({ties} near-tie)" if a["differs_from_ar"] and ties is not None else "")


def ratio_table(results: dict) -> str:
    """Paper Figure 3 in numbers: paired ratios to the baseline, accuracy differences in points."""
    graded = any("accuracy" in r for r in results["ratios"].values())
    cols = list(RATIO_LABELS) + (["accuracy"] if graded else [])
    head = "| schedule | " + " | ".join(RATIO_LABELS.get(c, "accuracy Δ pp") for c in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    for s in results["schedules"]:
        row = results["ratios"].get(s)
        if row:
            lines.append(f"| {s} | " + " | ".join(_interval(row.get(c), 2 if c == "accuracy" else 3) for c in cols)
                         + " |")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    c, env, boot = results["config"], results["environment"], results["bootstrap"]
    decoding = ("greedy" if results["greedy"]
                else f"sampling (T={c['temperature']}, top-k={c['top_k']}, top-p={c['top_p']})")
    n = len(results["complete_prompts"])
    parts = [
        f"# Benchmark: {c['model']} on {results['suite']['name']}",
        "",
        f"- {n} prompts x {c['repeats']} repeat(s), max_new_tokens={c['max_new_tokens']}, {decoding}, "
        f"width={c['width'] if c['width'] is not None else 'model default'}, seed={c['seed']}",
        f"- {env['device']} ({(env['gpu'] or {}).get('name') or env['cpu']}), dtype {env['dtype']}, "
        f"torch {env['packages']['torch']}, transformers {env['packages']['transformers']}",
        "- decoder time: prefill and all decoding, device-synchronised; no loading, tokenisation or detokenisation "
        "(appendix E.5). Schedules interleaved per prompt in rotating order after a warm-up.",
    ]
    if results["interrupted"]:
        parts.append(f"- **interrupted** (Ctrl-C): compared over the {n} prompt(s) every schedule finished")
    parts += ["", "## Absolute measurements", "", "Means per response; tokens/s, tokens/NFE and ms/NFE from "
              "aggregate totals; rows/call after the prompt call.", "", absolute_table(results), ""]
    if results["ratios"]:
        parts += [f"## Paired ratios to {results['baseline']}", "",
                  f"Point estimate [95% percentile interval], {boot['resamples']:,} bootstrap resamples over prompts "
                  "(same indices for every schedule); accuracy as a difference in percentage points.", "",
                  ratio_table(results), ""]
    if results.get("compiled"):
        from .compiled import markdown as compiled_markdown

        parts += ["## Compiled (static cache + torch.compile) vs eager", "",
                  "Each schedule's `+compile` variant ran in the same interleaved loop; compile time is the warm-up's, "
                  "kept out of every timed decode.", "", compiled_markdown(results["compiled"]), ""]
    if results.get("auto"):
        from .auto import markdown as auto_markdown

        parts += ["## auto: the width and mode chosen per call", "", auto_markdown(results["auto"]), ""]
    if results.get("baseline_note"):
        parts += [f"Note: {results['baseline_note']}", ""]
    if results["errors"]:
        parts += ["## Errors", ""] + [f"- `{s}`: {e}" for s, e in results["errors"].items()] + [""]
    if results.get("plots"):
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]] + [""]
    return "\n".join(parts)


def plot_ratios(results: dict, file: Path) -> Path:
    """Figure 3: one bar per schedule and metric, the ratio to the baseline with its interval as whiskers."""
    from matplotlib.figure import Figure

    schedules = [s for s in results["schedules"] if s in results["ratios"]]
    fig = Figure(figsize=(12, 1.6 + 0.35 * len(schedules)), layout="constrained")
    for ax, metric in zip(fig.subplots(1, 3), ("throughput", "tokens_per_nfe", "time_per_nfe"), strict=True):
        cells = [results["ratios"][s][metric] for s in schedules]
        values = [c["value"] for c in cells]
        errors = [[max(0.0, c["value"] - c["low"]) for c in cells], [max(0.0, c["high"] - c["value"]) for c in cells]]
        ax.barh(schedules, values, xerr=errors, capsize=3, color="tab:blue", alpha=0.8)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{RATIO_LABELS[metric]} / {results['baseline']}")
        ax.invert_yaxis()
    fig.suptitle("Paired ratios to the baseline, 95% bootstrap intervals")
    fig.savefig(file, dpi=120)
    return file


def plot_timing(results: dict, file: Path) -> Path:
    """Figure 5: mean model and non-model decoder time per response, stacked, divided by the baseline's total."""
    from matplotlib.figure import Figure

    aggs = {s: a for s, a in results["aggregates"].items() if a.get("responses")}
    schedules = [s for s in results["schedules"] if s in aggs]
    base = aggs.get(results["baseline"])
    scale = base["mean_wall_s"] if base and base["mean_wall_s"] else 1.0
    model = [aggs[s]["mean_model_time_s"] / scale for s in schedules]
    other = [aggs[s]["mean_non_model_time_s"] / scale for s in schedules]
    fig = Figure(figsize=(1.2 * len(schedules) + 2, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.bar(schedules, model, label="model execution", color="tab:blue")
    ax.bar(schedules, other, bottom=model, label="non-model decoder", color="tab:orange")
    if base:
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(f"time / {results['baseline']} total")
    else:
        ax.set_ylabel("seconds per response")
    ax.tick_params(axis="x", rotation=30)
    ax.legend()
    ax.set_title("Decoder time decomposition (mean per response)")
    fig.savefig(file, dpi=120)
    return file


def write(out: Path, results: dict) -> list[Path]:
    """Write plots (when matplotlib is installed and something was compared), report.md and results.json."""
    out.mkdir(parents=True, exist_ok=True)
    plots: list[Path] = []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        results["plot_note"] = "matplotlib is not installed: pip install matplotlib (or '.[bench]')"
    else:
        if results["ratios"]:
            plots.append(plot_ratios(results, out / "ratios.png"))
        if any(a.get("responses") for a in results["aggregates"].values()):
            plots.append(plot_timing(results, out / "timing.png"))
    results["plots"] = [p.name for p in plots]
    (out / "report.md").write_text(markdown(results))
    (out / "results.json").write_text(json.dumps(clean(results), indent=1))
    return [out / "results.json", out / "report.md", *plots]
