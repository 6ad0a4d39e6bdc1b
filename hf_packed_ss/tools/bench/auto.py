"""A bench's `auto` section: what `assistant_mode="auto"` chose, its throughput against the best fixed choice
measured in the same run (AR and every `packed_ss@W`) and against stock `generate`, with paired intervals, and how
close the process's cost model (what auto measured, `front.measured_for`) comes to every schedule's measured time
per NFE (the prediction sums the model's cost of each call's rows as it stood just before that response's decode;
measured is decoder time / NFE)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from ...engine.cost import DRAFT, VERIFY
from ...engine.schedules import AutoSchedule, PackedSSSchedule
from ...front.measured import decoder_of, measured_for
from .measure import REFERENCE, STOCK, Decode, schedule_mode
from .record import Record
from .statistics import paired_intervals, per_prompt_totals

AUTO = AutoSchedule.name


def fixed(schedule: str) -> bool:
    """The fixed choices auto is measured against: AR and Packed-SS at a width."""
    return schedule == REFERENCE or schedule_mode(schedule)[0] == PackedSSSchedule.name


def choices(records: list[Record]) -> dict[str, float]:
    """Share of iterations of every mode and width, e.g. {"ar": 0.1, "packed_ss@8": 0.9}."""
    counts = Counter(m if m == REFERENCE else f"{m}@{w}" for r in records
                     for m, w in zip(r.schedule_per_iteration, r.width_per_iteration, strict=True))
    total = sum(counts.values()) or 1
    return {k: counts[k] / total for k in sorted(counts, key=lambda k: (k != REFERENCE, len(k), k))}


def predicted_seconds(modes: list[str], rows: list[int], cost) -> float | None:
    """The cost model's time for one response: every call's predicted cost at its rows (an AR call's kind for
    AR iterations, a drafting call's otherwise); None where a call's cost is unknown or the calls do not map
    one to one onto iterations (Linear-SS, stock)."""
    if len(modes) != len(rows):
        return None
    total = 0.0
    for mode, n in zip(modes, rows, strict=True):
        seconds = cost.predict(VERIFY if mode == REFERENCE else DRAFT, n)
        if seconds is None:
            return None
        total += seconds
    return total


def forecasting(decode: Decode, model) -> Decode:
    """`decode`, each response also carrying `predicted_time_s`: its calls' cost from the cost model as it stood
    just before the decode (out of sample, also for auto's own decodes; what the same model says at the end of
    the run describes the end of the run, not the stretch of the machine each response ran in)."""
    measured = measured_for(decoder_of(model))

    def forecast(schedule: str, ids) -> dict:
        before = measured.cost.snapshot()
        fields = decode(schedule, ids)
        fields["predicted_time_s"] = predicted_seconds(fields.get("schedule_per_iteration", []),
                                                       fields.get("rows_per_call", []), before)
        return fields

    return forecast


def summary(model, records: list[Record], schedules: list[str], complete: list[int], aggregates: dict,
            resamples: int, seed: int) -> dict | None:
    """The section, or None when auto was not measured."""
    if AUTO not in schedules or not complete:
        return None
    measured = measured_for(decoder_of(model))
    done = set(complete)
    kept = [r for r in records if r.prompt in done and r.error is None]
    candidates = [s for s in schedules if fixed(s) and aggregates.get(s, {}).get("responses")]
    out: dict = {"choices": choices([r for r in kept if r.schedule == AUTO]), "fixed": candidates}
    if candidates:
        best = max(candidates, key=lambda s: aggregates[s]["throughput"])
        out["best_fixed"] = best
        for name, other in (("vs_best", best), ("vs_stock", STOCK)):
            if other in schedules:
                totals = per_prompt_totals(kept, [AUTO, other], complete)
                out[name] = asdict(paired_intervals(totals, other, resamples, seed)[AUTO]["throughput"])
    cost = []
    for s in schedules:
        # a response decoded before auto had timed every row count its calls have is left out (counted)
        mine = [r for r in kept if r.schedule == s and r.predicted_time_s is not None]
        if not mine:
            continue
        nfe, wall = sum(r.nfe for r in mine), sum(r.decoder_time_s for r in mine)
        predicted = sum(r.predicted_time_s for r in mine)
        cost.append({"schedule": s, "responses": len(mine), "predicted_ms_per_nfe": 1e3 * predicted / nfe,
                     "measured_ms_per_nfe": 1e3 * wall / nfe, "error": predicted / wall - 1})
    # divided by auto's own error, what is left is the error of the curve's shape (what the choice depends on)
    own = next((c["error"] for c in cost if c["schedule"] == AUTO), None)
    for c in cost:
        c["shape_error"] = None if own is None else (1 + c["error"]) / (1 + own) - 1
    out["cost_model"] = cost
    out["fitted_ms"] = {kind: {rows: 1e3 * point[0] for rows, point in sorted(table.items())
                               if rows <= 64} for kind, table in measured.cost.points.items()}
    out["acceptance"] = measured.profile.rates(max(len(measured.profile.tried), 2))[1:]
    return out


def markdown(section: dict) -> str:
    lines = ["Iterations by choice: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in section["choices"].items()), ""]
    for name, label in (("vs_best", f"the best fixed choice ({section.get('best_fixed')})"), ("vs_stock", "stock")):
        if name in section:
            i = section[name]
            lines.append(f"- auto / {label}: throughput {i['value']:.3f} [{i['low']:.3f}, {i['high']:.3f}] "
                         "(95% paired bootstrap over prompts)")
    lines += ["", "Cost model (as auto had measured it just before each response) against every schedule's measured "
              "time per NFE:",
              "", "| schedule | responses | predicted ms/NFE | measured ms/NFE | error | error over auto's own (the "
              "curve's shape) |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['schedule']} | {c.get('responses', '-')} | {c['predicted_ms_per_nfe']:.3f} | "
              f"{c['measured_ms_per_nfe']:.3f} | "
              f"{100 * c['error']:+.1f}% | {_percent(c.get('shape_error'))} |" for c in section["cost_model"]]
    for kind, table in section["fitted_ms"].items():
        if table:
            lines.append("")
            lines.append(f"Fitted {kind} calls, ms by rows: " + ", ".join(f"{r}: {ms:.2f}" for r, ms in table.items()))
    lines += ["", "Acceptance by drafter offset (r_1, r_2, ...): "
              + ", ".join(f"{r:.2f}" for r in section["acceptance"])]
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def table(files: list[str]) -> str:
    """One row per bench results.json with an auto section: the auto figures of docs/auto.md."""
    import json
    from pathlib import Path

    head = ("| checkpoint, suite | best fixed | auto / best fixed | auto / stock | auto chose | cost model error "
            "(worst schedule) | over auto's own error (worst) |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for file in files:
        results = json.loads(Path(file).read_text())
        section = results.get("auto")
        if not section:
            continue
        config = results["config"]

        def cell(i: dict) -> str:
            return f"{i['value']:.3f} [{i['low']:.3f}, {i['high']:.3f}]"

        chose = ", ".join(f"{k} {100 * v:.0f}%" for k, v in section["choices"].items() if v >= 0.05)
        worst = max(section["cost_model"], key=lambda c: abs(c["error"]), default=None)
        error = f"{100 * worst['error']:+.1f}% ({worst['schedule']})" if worst else "-"
        shapes = [c for c in section["cost_model"] if c.get("shape_error") is not None]
        shape = max(shapes, key=lambda c: abs(c["shape_error"]), default=None)
        error += f" | {_percent(shape['shape_error'])} ({shape['schedule']})" if shape else " | -"
        lines.append(f"| {config['model']}, {results['suite']['name']} ({len(results['complete_prompts'])} prompts) | "
                     f"{section.get('best_fixed', '-')} | {cell(section['vs_best'])} | "
                     f"{cell(section['vs_stock']) if 'vs_stock' in section else '-'} | {chose} | {error} |")
    return "\n".join(lines)

