"""`hf-packed-ss probe`: the introduction's cost model on this machine, a call of n rows costing tau + delta * n.

It times model forwards of n new rows (4D boolean mask, the packed-call path) against a KV cache holding a prompt,
cropping the cache back after each call, fits tau and delta by least squares, and predicts which schedule and
width is fastest: from a bench `results.json` (measured tokens/NFE and rows per call; prediction next to the
measured throughput), or else from the rows per call the engine's layouts build for each schedule
(`rows_per_iteration`, the layout's default shapes unless `--static-shapes`) with a per-token acceptance rate
alpha. The model covers model execution only; what it misses is non-model decoder time (appendix F.3).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ...engine.schedules import SCHEDULES
from .rows import layout_default_static_shapes, rows_per_iteration
from .timing import fit, time_rows

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)


def expected_tokens(schedule: str, width: int, alpha: float) -> float:
    """Tokens per iteration when each draft token is accepted independently with probability alpha: the accepted
    run plus the correction/bonus token, 1 + alpha + ... + alpha^W (AR: 1)."""
    if not SCHEDULES[schedule].speculative:
        return 1.0
    return float(sum(alpha**j for j in range(width + 1)))


def formula_predictions(tau: float, delta: float, max_width: int, alpha: float, any_order: bool = False,
                        static_shapes: bool | None = None) -> list[dict]:
    """Predicted tokens/s of every schedule and width from the rows the engine lays out per iteration
    (`rows_per_iteration`). `static_shapes` None (default) uses the layout's own default, the shapes `generate`
    decodes with and a bench measures, so the prediction describes the decoder the bench ran; their row counts are
    those of the steady state's largest call (after a rejection)."""
    static = layout_default_static_shapes(any_order) if static_shapes is None else static_shapes
    out = []
    for schedule in ("ar", "linear_ss", "packed_ss", "quadratic_ss"):
        for width in range(1, max_width + 1) if SCHEDULES[schedule].speculative else [0]:
            calls = rows_per_iteration(schedule, max(width, 1), any_order, static)
            seconds = sum(tau + delta * n for n in calls)
            tokens = expected_tokens(schedule, width, alpha)
            out.append({"schedule": schedule, "width": width, "rows_per_iteration": sum(calls),
                        "tokens_per_iteration": tokens, "seconds_per_iteration": seconds,
                        "predicted_throughput": tokens / seconds})
    return out


def measured_predictions(tau: float, delta: float, results: dict) -> list[dict]:
    """For every schedule a bench measured: predicted time/NFE = tau + delta * (its mean rows per call),
    predicted tokens/s = measured tokens/NFE over that, next to the measured figures."""
    out = []
    for schedule, a in results["aggregates"].items():
        if not a.get("responses") or not a.get("nfe"):
            continue
        per_nfe = tau + delta * a["mean_rows_per_call"]
        out.append({"schedule": schedule, "width": a["width"], "tokens_per_nfe": a["tokens_per_nfe"],
                    "mean_rows_per_call": a["mean_rows_per_call"], "predicted_time_per_nfe": per_nfe,
                    "measured_model_time_per_nfe": a["model_time_s"] / a["nfe"],
                    "measured_time_per_nfe": a["time_per_nfe_s"],
                    "predicted_throughput": a["tokens_per_nfe"] / per_nfe, "measured_throughput": a["throughput"]})
    return out


def _best(rows: list[dict], key: str) -> dict:
    return max(rows, key=lambda r: r[key] if r[key] is not None else float("-inf"))


def measure_cost(model, ids: torch.Tensor, max_new_tokens: int = 48, rounds: int = 2):
    """The call cost `auto` measures online, measured ahead of time: greedy `assistant_mode="auto"` decodes of `ids`
    at every width (each decode times its own calls: AR and Packed-SS at that width, in the loop's real calls,
    the loop's own work included), `rounds` times, starting from nothing. Returns (the `CallCost`, its key)."""
    from ...front.families import family
    from ...front.measured import decoder_of, forget, measured_for, measured_key

    decoder = decoder_of(model)
    forget()
    for _ in range(rounds):
        for width in range(1, family(decoder.config).widths(decoder.config)[0] + 1):
            model.generate(ids, assistant_mode="auto", speculative_width=width, max_new_tokens=max_new_tokens,
                           do_sample=False)
    return measured_for(decoder).cost, measured_key(decoder)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hf-packed-ss probe", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="bundled name or local folder (default: the results' model, "
                                                 "else tiny-nemotron-random)")
    p.add_argument("--results", default=None, help="a bench results.json to predict from and compare with")
    p.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS), help="new rows per timed call")
    p.add_argument("--context", type=int, default=128, help="cached prompt length")
    p.add_argument("--iters", type=int, default=10, help="timed calls per row count (median taken)")
    p.add_argument("--alpha", type=float, default=0.7, help="per-token acceptance rate for the formula prediction")
    p.add_argument("--dtype", default=None, choices=("auto", "float32", "float64", "bfloat16", "float16"),
                   help="default: the results' dtype, else auto")
    p.add_argument("--device", default=None, help="default: the results' device, else auto")
    p.add_argument("--static-shapes", action=argparse.BooleanOptionalAction, default=None,
                   help="rows per call of the formula prediction with appendix D.3's static shapes (default: the "
                        "layout's own default, what generate decodes with)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the probe's numbers to this file")
    p.add_argument("--cost-model", default=None, metavar="FILE",
                   help="measure the call cost auto uses (real decodes at every width, the loop included) and write "
                        "it to FILE for generate(..., cost_model=FILE); nothing else is probed")
    p.add_argument("--curve", default=None, metavar="FOLDER",
                   help="the call-cost curve instead: bare forwards and Packed-SS calls against rows for each "
                        "--dtypes, eager and compiled, the context a real prompt's; writes FOLDER/curve.json and "
                        "curve.png (nothing else is probed)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16", "float16"),
                   help="--curve: the dtypes")
    p.add_argument("--compiled", nargs="+", default=["eager", "compiled"], choices=("eager", "compiled"),
                   help="--curve: eager, compiled (static cache + torch.compile) or both")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 3, 7, 15, 31],
                   help="--curve: Packed-SS widths timed (static shapes: 2W + 2 rows)")
    return p


def main(argv: list[str] | None = None) -> int:
    from ...front.families import family
    from ..loading import load_model, resolve

    args = build_parser().parse_args(argv)
    results = json.loads(Path(args.results).read_text()) if args.results else None
    config = (results or {}).get("config", {})
    device, dtype = resolve(args.device or config.get("device", "auto"), args.dtype or config.get("dtype", "auto"))
    model_name = args.model or config.get("model", "tiny-nemotron-random")
    torch.manual_seed(args.seed)
    if args.curve:
        return curve_main(args, model_name, device)
    model, tokenizer = load_model(model_name, dtype)
    model.to(device)
    if args.cost_model:
        return write_cost_model(model, tokenizer, model_name, Path(args.cost_model))
    rows = sorted(set(args.rows))
    latency = time_rows(model, rows, args.context, args.iters, seed=args.seed)
    tau, delta, r2 = fit(latency)
    print(f"{model_name} on {device} ({str(dtype).removeprefix('torch.')}), {args.context} cached tokens:")
    print(f"{'rows':>6}{'ms/call':>10}{'fit ms':>10}")
    for n, t in latency.items():
        print(f"{n:>6}{t * 1e3:>10.3f}{(tau + delta * n) * 1e3:>10.3f}")
    print(f"tau = {tau * 1e3:.3f} ms, delta = {delta * 1e3:.4f} ms/row (R^2 = {r2:.3f})"
          + (f"; a call of {tau / delta:.0f} rows costs 2 tau" if tau > 0 and delta > 0 else ""))
    out = {"model": model_name, "device": str(device), "dtype": str(dtype), "context": args.context,
           "latency_s": latency, "tau_s": tau, "delta_s": delta, "r2": r2}
    fam = family(model.config)
    if fam is None:
        raise SystemExit(f"{type(model).__name__} has no packed layout: there is nothing to predict.")
    any_order, max_width = fam.any_order, fam.widths(model.config)[0]
    static = layout_default_static_shapes(any_order) if args.static_shapes is None else args.static_shapes
    formula = formula_predictions(tau, delta, max_width, args.alpha, any_order, static)
    best = _best(formula, "predicted_throughput")
    out["formula"], out["static_shapes"] = formula, static
    print(f"\nCost model with per-token acceptance alpha = {args.alpha} ({'static' if static else 'lean'} shapes): "
          f"fastest is {best['schedule']} "
          f"W={best['width']} ({best['predicted_throughput']:.1f} tokens/s predicted, model time only)")
    for s in ("ar", "linear_ss", "packed_ss", "quadratic_ss"):
        top = _best([r for r in formula if r["schedule"] == s], "predicted_throughput")
        print(f"  {s:<14} best W={top['width']:<4} {top['predicted_throughput']:>10.1f} tokens/s")
    if results:
        measured = measured_predictions(tau, delta, results)
        out["measured"] = measured
        print(f"\nAgainst the bench ({args.results}):")
        print(f"{'schedule':<14}{'W':>4}{'tok/NFE':>9}{'rows/call':>10}{'pred ms/NFE':>12}{'model ms/NFE':>13}"
              f"{'wall ms/NFE':>12}{'pred tok/s':>11}{'meas tok/s':>11}")
        for r in measured:
            print(f"{r['schedule']:<14}{r['width']:>4}{r['tokens_per_nfe']:>9.2f}{r['mean_rows_per_call']:>10.1f}"
                  f"{r['predicted_time_per_nfe'] * 1e3:>12.3f}{r['measured_model_time_per_nfe'] * 1e3:>13.3f}"
                  f"{r['measured_time_per_nfe'] * 1e3:>12.3f}{r['predicted_throughput']:>11.1f}"
                  f"{r['measured_throughput']:>11.1f}")
        if measured:
            p, m = _best(measured, "predicted_throughput"), _best(measured, "measured_throughput")
            print(f"predicted fastest: {p['schedule']} (W={p['width']}); measured fastest: {m['schedule']} "
                  f"(W={m['width']})")
            out["predicted_fastest"], out["measured_fastest"] = p["schedule"], m["schedule"]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


def write_cost_model(model, tokenizer, name: str, path: Path) -> int:
    from ..loading import encode
    from .suites import load_suite

    ids = encode(tokenizer, load_suite("sample", limit=1)[0], None).to(model.device)
    cost, key = measure_cost(model, ids)
    cost.save(path, key)
    print(f"{name}: seconds per iteration by call rows (auto's cost model; loop included), wrote {path}")
    for kind, table in cost.points.items():
        print(f"  {kind:<7}" + ", ".join(f"{rows}: {point[0] * 1e3:.2f} ms" for rows, point in sorted(table.items())))
    print(f"Use it: model.generate(..., assistant_mode='auto', cost_model={str(path)!r})")
    return 0


def curve_main(args, model_name: str, device: torch.device) -> int:
    from ..loading import QUESTION, load_model
    from . import curve
    from .suites import question_ids

    def load(dtype: torch.dtype):
        return load_model(model_name, dtype)[0].to(device)

    tokenizer = load_model(model_name, torch.float32)[1]
    return curve.main(model_name, question_ids(tokenizer, QUESTION)[0].to(device), load, args.dtypes,
                      [c == "compiled" for c in args.compiled], sorted(set(args.rows)), args.widths, args.iters,
                      Path(args.curve))
