"""`hf-packed-ss bench --batch-size N [N ...]`: throughput over a batch, against stock batched `generate`.

The suite's prompts are cut into consecutive batches of N (left-padded, as stock batched `generate` takes them).
Every batch is decoded by every schedule, in rotating order, `--repeats` times, after an untimed warm-up at each
batch size; our schedules at batch 1 are always measured too. Per schedule and batch size: throughput (all
generated tokens over all decoder time, the median repeat and the range of the repeats), its ratio to stock at
the same batch size and to the same schedule at batch 1 (paired by repeat, 95% bootstrap interval over
(batch, repeat) units), the engine's own share (decoder time over the model time inside it: 1.00 would be a
bare batched forward over the same rows) and rows per call. Speculation trades compute for fewer sequential
calls, so its ratio to stock falls as rows per call (batch x about 2B) grow: the report gives the crossover
batch size where stock overtakes and the probe's prediction of it (`probe.time_batched`, a call of r rows in
all costing tau + delta * r).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .measure import REFERENCE, STOCK, CallMeter, Settings, schedule_mode, sync
from .repeats import spread
from .statistics import rotation
from .timing import fit, time_batched


@dataclass
class BatchRecord:
    """One batch decoded by one schedule."""

    schedule: str
    batch_size: int
    batch: int
    repeat: int
    new_tokens: int = 0
    nfe: int = 0
    decoder_time_s: float = 0.0
    model_time_s: float = 0.0
    rows: int = 0  # input rows computed over all calls, padding included
    tokens: list[list[int]] = field(default_factory=list)  # each row's new tokens (before padding)


def left_pad(inputs: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(1, n_i)` prompts -> `(ids, attention_mask)` padded on the left."""
    width = max(x.shape[-1] for x in inputs)
    ids = torch.full((len(inputs), width), pad, dtype=torch.long, device=inputs[0].device)
    mask = torch.zeros_like(ids)
    for b, x in enumerate(inputs):
        ids[b, width - x.shape[-1]:], mask[b, width - x.shape[-1]:] = x[0], 1
    return ids, mask


def decode_batch_with(model, schedule: str, ids: torch.Tensor, mask: torch.Tensor, settings: Settings,
                      pad: int) -> dict:
    """One batch with one schedule: our statistics from `decoding_stats`, stock's from forward hooks (decoder time
    from its first forward, as the single-sequence bench times it)."""
    common = dict(attention_mask=mask, max_new_tokens=settings.max_new_tokens, pad_token_id=pad,
                  **settings.sampling())
    n = ids.shape[1]
    if schedule == STOCK:
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        with CallMeter(inner) as meter:
            out = model.generate(ids, assistant_mode=None, **common)
            sync(ids.device)
            end = time.perf_counter()
        new = out[:, n:]
        eos = model.generation_config.eos_token_id
        tokens = [_unpad(row.tolist(), pad, eos) for row in new]
        return dict(new_tokens=sum(map(len, tokens)), nfe=len(meter.rows), decoder_time_s=end - meter.first_start,
                    model_time_s=meter.model_time_s, rows=ids.shape[0] * sum(meter.rows), tokens=tokens)
    mode, extra = schedule_mode(schedule)
    out = model.generate(ids, assistant_mode=mode, speculative_width=settings.width, return_dict_in_generate=True,
                         **common, **extra)
    stats = out.decoding_stats
    rows = stats.per_row or [stats]
    tokens = [out.sequences[b, n : n + r.new_tokens].tolist() for b, r in enumerate(rows)]
    return dict(new_tokens=stats.new_tokens, nfe=stats.nfe, decoder_time_s=stats.decoder_time_s,
                model_time_s=stats.model_time_s, rows=sum(stats.rows_per_call), tokens=tokens)


def _unpad(tokens: list[int], pad: int, eos) -> list[int]:
    """A stock row's new tokens up to and including its first EOS (stock pads after it)."""
    ends = {eos} if isinstance(eos, int) else set(eos or ())
    for i, t in enumerate(tokens):
        if t in ends:
            return tokens[: i + 1]
    return tokens


def measure(model, inputs: list[torch.Tensor], schedules: list[str], batch_sizes: list[int], settings: Settings,
            repeats: int, pad: int, seed: int = 0) -> list[BatchRecord]:
    """Every batch of every batch size, every schedule in rotating order, `repeats` times."""
    records = []
    for size in batch_sizes:
        batches = [left_pad(inputs[i : i + size], pad) for i in range(0, len(inputs) - size + 1, size)]
        for s in schedules:  # untimed warm-up at this batch size
            decode_batch_with(model, s, *batches[0], Settings(**{**asdict(settings), "max_new_tokens": 4}), pad)
        for r in range(repeats):
            for i, (ids, mask) in enumerate(batches):
                for s in rotation(schedules, r * len(batches) + i):
                    torch.manual_seed(seed * 1_000_003 + i * 1_009 + r)
                    fields = decode_batch_with(model, s, ids, mask, settings, pad)
                    records.append(BatchRecord(s, size, i, r, **fields))
    return records


def throughput(records: list[BatchRecord]) -> float:
    time_s = sum(r.decoder_time_s for r in records)
    return sum(r.new_tokens for r in records) / time_s if time_s else 0.0


def paired_ratio(ours: list[BatchRecord], base: list[BatchRecord], resamples: int, seed: int) -> dict:
    """Throughput ratio with a 95% bootstrap interval over the (batch, repeat) units both measured."""
    key = {(r.batch, r.repeat): r for r in base}
    pairs = [(r, key[r.batch, r.repeat]) for r in ours if (r.batch, r.repeat) in key]
    a = np.array([[p.new_tokens, p.decoder_time_s] for p, _ in pairs])
    b = np.array([[q.new_tokens, q.decoder_time_s] for _, q in pairs])
    value = (a[:, 0].sum() / a[:, 1].sum()) / (b[:, 0].sum() / b[:, 1].sum())
    pick = np.random.default_rng(seed).integers(len(pairs), size=(resamples, len(pairs)))
    boot = (a[pick, 0].sum(1) / a[pick, 1].sum(1)) / (b[pick, 0].sum(1) / b[pick, 1].sum(1))
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"value": float(value), "low": float(low), "high": float(high), "units": len(pairs)}


def summarise(records: list[BatchRecord], schedules: list[str], batch_sizes: list[int], resamples: int = 2000,
              seed: int = 0) -> list[dict]:
    """One row per (schedule, batch size)."""
    rows = []
    for size in batch_sizes:
        for s in schedules:
            mine = [r for r in records if r.schedule == s and r.batch_size == size]
            if not mine:
                continue
            per_repeat = [throughput([r for r in mine if r.repeat == k]) for k in sorted({r.repeat for r in mine})]
            row = {"schedule": s, "batch_size": size, "throughput": asdict(spread(per_repeat)),
                   "tokens_per_nfe": sum(r.new_tokens for r in mine) / sum(r.nfe for r in mine),
                   "rows_per_call": sum(r.rows for r in mine) / sum(r.nfe for r in mine),
                   "engine_share": sum(r.decoder_time_s for r in mine) / sum(r.model_time_s for r in mine),
                   "ms_per_call": 1e3 * sum(r.decoder_time_s for r in mine) / sum(r.nfe for r in mine)}
            stock = [r for r in records if r.schedule == STOCK and r.batch_size == size]
            if s != STOCK and stock:
                row["vs_stock"] = paired_ratio(mine, stock, resamples, seed)
                row["same_tokens_as_stock"] = all(
                    r.tokens == q.tokens for r in mine for q in stock if (q.batch, q.repeat) == (r.batch, r.repeat))
            alone = [r for r in records if r.schedule == s and r.batch_size == 1]
            if size != 1 and alone:
                row["vs_batch_1"] = throughput(mine) / throughput(alone)
            rows.append(row)
    return rows


def crossover(rows: list[dict], schedule: str) -> int | None:
    """The smallest measured batch size where stock is faster than `schedule` (None: it never was)."""
    for r in sorted((r for r in rows if r["schedule"] == schedule and "vs_stock" in r), key=lambda r: r["batch_size"]):
        if r["vs_stock"]["value"] < 1:
            return r["batch_size"]
    return None


def predicted_crossover(tau: float, delta: float, tokens_per_nfe: float, rows_per_call: float) -> float | None:
    """Where the cost model puts it: a batch of N decoded by a schedule making calls of `rows_per_call` rows per
    sequence and `tokens_per_nfe` tokens per sequence and call, against stock's calls of one row per sequence:
    tokens_per_nfe (tau + delta N) = tau + delta N rows_per_call, so N = tau (tpn - 1) / (delta (rows - tpn))."""
    if tokens_per_nfe <= 1:
        return 1.0
    if rows_per_call <= tokens_per_nfe or delta <= 0:
        return None  # never: speculation costs no more rows than it saves calls
    return max(1.0, tau * (tokens_per_nfe - 1) / (delta * (rows_per_call - tokens_per_nfe)))


def table(rows: list[dict]) -> str:
    lines = ["| schedule | batch | tokens/s [range] | vs stock [95% CI] | vs batch 1 | tokens/NFE per row | rows/call "
             "| decoder / model time | same tokens as stock |", "|---" * 9 + "|"]
    for r in rows:
        t, v = r["throughput"], r.get("vs_stock")
        lines.append(
            f"| {r['schedule']} | {r['batch_size']} | {t['value']:.1f} [{t['low']:.1f}, {t['high']:.1f}] | "
            + (f"{v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]" if v else "-") + " | "
            + (f"{r['vs_batch_1']:.2f}" if "vs_batch_1" in r else "-") + f" | "
            f"{r['tokens_per_nfe'] / r['batch_size']:.2f} | {r['rows_per_call']:.1f} | {r['engine_share']:.3f} | "
            + ("-" if "same_tokens_as_stock" not in r else "yes" if r["same_tokens_as_stock"] else "no") + " |")
    return "\n".join(lines)


def report(results: dict) -> str:
    """The table, the probe's fit and the crossovers of a `batched.json`."""
    probe, sizes = results["probe"], results["batch_sizes"]
    lines = [table(results["rows"]), "", f"Probe: a call of r rows in all costs {probe['tau_s'] * 1e3:.3f} + "
             f"{probe['delta_s'] * 1e3:.4f} r ms (R^2 = {probe['r2']:.3f}, {probe['context']} cached tokens)."]
    for s, c in results["crossover"].items():
        measured = f"batch {c['measured']}" if c["measured"] else f"not within batch {sizes[-1]}"
        predicted = "never" if c["predicted"] is None else f"batch {c['predicted']:.1f}"
        lines.append(f"{s}: stock overtakes at {measured} (measured); the probe predicts {predicted}.")
    return "\n".join(lines)


def run(model, tokenizer, inputs: list[torch.Tensor], schedules: list[str], batch_sizes: list[int],
        settings: Settings, repeats: int, out: Path, seed: int = 0, probe_iters: int = 5, command: str = "",
        environment: dict | None = None, name: str = "") -> dict:
    """Measure, summarise, probe, print and write `batched.json` (with the `command` and `environment` that
    produced it, for the results section of docs/results.md); returns the results."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if STOCK not in schedules:
        schedules = [STOCK, *schedules]
    sizes = sorted({1, *batch_sizes})
    records = measure(model, inputs, schedules, sizes, settings, repeats, pad, seed)
    rows = summarise(records, schedules, sizes, seed=seed)
    context = int(np.mean([x.shape[-1] for x in inputs]))
    shapes = sorted({(n, 1) for n in sizes} | {(n, max(1, round(r["rows_per_call"] / n))) for r in rows
                                                 for n in [r["batch_size"]] if r["schedule"] != STOCK})
    latency = time_batched(model, shapes, context, iters=probe_iters)
    tau, delta, r2 = fit({b * n: t for (b, n), t in latency.items()})
    crossings = {}  # the speculative schedules' (AR makes stock's calls: nothing to trade)
    for s in schedules:
        if s in (STOCK, REFERENCE):
            continue
        one = next((r for r in rows if r["schedule"] == s and r["batch_size"] == 1), None)
        crossings[s] = {"measured": crossover(rows, s),
                        "predicted": None if one is None else predicted_crossover(
                            tau, delta, one["tokens_per_nfe"], one["rows_per_call"])}
    results = {"command": command, "environment": environment or {}, "prompts": len(inputs),
               "model": name or getattr(model.config, "_name_or_path", ""),
               "schedules": schedules, "batch_sizes": sizes, "repeats": repeats, "settings": asdict(settings),
               "device": str(model.device), "rows": rows, "crossover": crossings,
               "probe": {"tau_s": tau, "delta_s": delta, "r2": r2, "context": context,
                         "latency_s": {f"{b}x{n}": t for (b, n), t in latency.items()}},
               "records": [asdict(r) for r in records]}
    print(report(results))
    out.mkdir(parents=True, exist_ok=True)
    (out / "batched.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'batched.json'}")
    return results
