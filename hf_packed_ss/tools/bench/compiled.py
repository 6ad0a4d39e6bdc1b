"""`hf-packed-ss bench --compile`: every schedule and stock baseline eager and compiled, side by side in one run.

A `+compile` variant is the same decode with `cache_implementation="static"` and a `CompileConfig` (stock
`generate` and prompt lookup with their own static cache and compile, so the comparison stays fair), one cache
size per schedule for the whole suite so no timed decode recompiles (each record counts the graphs compiled while
it ran).
Compile time is the warm-up's and is reported apart from decoding time. The section adds, from the same run:
compiled vs eager throughput per schedule, compiled vs compiled stock with the break-even tokens/NFE, and the
compiled Packed-SS call against a bare compiled forward of the same rows (`probe.bare_call`).
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, replace

from ...engine import Greedy
from ...engine.schedules import AutoSchedule
from ...engine.static import steady_rows
from ...front.families import default_width, family
from ...front.generate import compile_options
from .measure import COMPILED, PEERS, PROMPT_LOOKUP, STOCK, ScheduleName, Settings, compiled_variant, schedule_mode
from .statistics import paired_intervals, per_prompt_totals

PACKED = "packed_ss"


def variants(schedules: list[str]) -> list[str]:
    """Each schedule followed by its compiled variant (auto has none: its calls change rows, which a static
    cache's one compiled shape refuses; nor has stock in another dtype, `--stock-dtypes`, an eager reference)."""
    out = []
    for name in map(ScheduleName.parse, schedules):
        alone = name.mode == AutoSchedule.name or name.dtype is not None
        out += [str(name)] if alone else [str(name), str(replace(name, compiled=True))]
    return out


def cache_lengths(model, schedules: list[str], inputs, settings: Settings) -> tuple[tuple[str, int], ...]:
    """One static cache size per schedule for the whole suite, as `generate` sizes one for its longest request:
    the longest prompt, the new tokens and twice the schedule's widest call (ours: the engine's static shapes,
    `steady_rows`; prompt lookup: its candidates and the correction; stock: none), a multiple of 128. Every slot
    costs attention in every compiled call, so each decoder gets what it needs and no more (stock generate and
    prompt lookup share one size: they share one compiled call)."""
    decoder = getattr(model, "_hf_packed_ss_twin", model)
    fam, config = family(decoder.config), decoder.config
    longest = max(int(ids.shape[1]) for ids in inputs) + settings.max_new_tokens
    out = []
    for name in dict.fromkeys(compiled_variant(s)[0] for s in schedules):
        mode, extra = schedule_mode(name)
        widest = settings.prompt_lookup_tokens + 1 if name == PROMPT_LOOKUP else 0
        if fam is not None and mode in fam.schedules:
            # the width generate will use: asked, else at most the larger of the model's default and its config's
            width = settings.width or max(default_width(config, mode), getattr(model.generation_config,
                                                                                   "speculative_width", None) or 1)
            if "config" in inspect.signature(fam.schedules[mode]).parameters:
                extra = extra | {"config": config}
            schedule = fam.schedules[mode](width, Greedy(), **extra)
            widest = steady_rows(schedule, fam.layout(config.mask_token_id, static_shapes=True))
        out.append((name, -(-(longest + 2 * widest) // 128) * 128))
    # stock generate and prompt lookup share the model's one compiled call: one size for both (another would
    # recompile it whenever the two alternate)
    peers = max((n for name, n in out if name in PEERS), default=0)
    return tuple((name, peers if name in PEERS else n) for name, n in out)


def _per_call(records) -> tuple[float, float]:
    """(model, decoder) seconds per call after the prompt's, from aggregate totals."""
    calls = sum(r.nfe - 1 for r in records)
    model = sum(r.model_time_s - r.prompt_time_s for r in records)
    decoder = sum(r.decoder_time_s - r.prompt_time_s for r in records)
    return model / calls, decoder / calls


def call_limit(model, records, settings: Settings, inputs, iters: int = 200) -> dict | None:
    """A compiled Packed-SS call against a bare compiled forward of as many rows (plain causal mask, transformers'
    `StaticCache` of the same size, the same cached context: `probe.bare_call`), timed interleaved.
    Ours is a real steady call of a decode of the suite's first prompt, through the very `StaticForward` and
    slot cache `generate` used (padding, in-graph mask and slot bookkeeping included). Also, from the timed
    records: the model call and the whole iteration inside real decodes, where the loop's work between calls
    (layout, acceptance, bookkeeping, and colder CPU caches for the next call) comes on top."""
    from transformers import GenerationConfig

    from .timing import bare_call, packed_call, time_interleaved

    ok = [r for r in records if r.error is None and r.nfe > 1]
    if not ok:
        return None
    options = compile_options(GenerationConfig(**settings.compiled(PACKED)), model.device)
    packed, rows, context, slots = packed_call(model, ok[0].width, settings.compiled(PACKED)["max_cache_len"],
                                               options, inputs[0][0], settings.max_new_tokens)
    bare = bare_call(model, rows, slots, options, context=context)
    timed = time_interleaved({"packed": packed, "bare": bare}, iters)
    ours, bare_s = timed["packed"], timed["bare"]
    model_s, decoder_s = _per_call(ok)
    return {"rows": rows, "context": context, "cache_slots": slots, "bare_forward_ms": bare_s * 1e3,
            "call_ms": ours * 1e3, "call_ratio": ours / bare_s, "in_decode_model_call_ms": model_s * 1e3,
            "in_decode_iteration_ms": decoder_s * 1e3, "in_decode_model_call_ratio": model_s / bare_s,
            "in_decode_iteration_ratio": decoder_s / bare_s}


def summary(measurement, records, complete: list[int], aggregates: dict, resamples: int, seed: int) -> dict:
    """Compiled vs eager per schedule and compiled vs compiled stock, paired over the prompts every variant
    finished (95% bootstrap intervals); compile time from the warm-up."""
    active = measurement.active
    totals = per_prompt_totals(records, active, complete) if complete else {}
    out = {"schedules": [], "vs_stock": []}
    for name in active:
        base, compiled = compiled_variant(name)
        if not compiled or base not in active:
            continue
        pair = paired_intervals({k: totals[k] for k in (base, name)}, base, resamples, seed) if totals else {}
        warm = measurement.warmup.get(name, {})
        out["schedules"].append({
            "schedule": base, "eager_throughput": aggregates[base].get("throughput"),
            "compiled_throughput": aggregates[name].get("throughput"),
            "throughput_ratio": _cell(pair.get(name, {}).get("throughput")),
            "eager_ms_per_nfe": _ms(aggregates[base].get("time_per_nfe_s")),
            "compiled_ms_per_nfe": _ms(aggregates[name].get("time_per_nfe_s")),
            "warmup_s": warm.get("generate_wall_s"), "compile_s": warm.get("compile_time_s"),
            "graphs_while_timed": aggregates[name].get("compiled_graphs"),
            "differs_from_ar": aggregates[name].get("differs_from_ar"),
            "near_ties": aggregates[name].get("differs_at_near_ties"),
        })
    stock = STOCK + COMPILED
    if stock in active and totals:
        ratios = paired_intervals({k: v for k, v in totals.items() if k.endswith(COMPILED)}, stock, resamples, seed)
        base = aggregates[stock]
        for name in active:
            if name.endswith(COMPILED) and name != stock:
                a = aggregates[name]
                even = (a["time_per_nfe_s"] / base["time_per_nfe_s"] * base["tokens_per_nfe"]
                        if base.get("time_per_nfe_s") else None)
                ratio = _cell(ratios.get(name, {}).get("throughput"))
                out["vs_stock"].append({"schedule": name, "throughput_ratio": ratio,
                                        "tokens_per_nfe": a.get("tokens_per_nfe"), "break_even_tokens_per_nfe": even})
    return out


def _cell(interval):
    return None if interval is None else asdict(interval)


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(cell) -> str:
    return "-" if not cell else f"{cell['value']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]"


def markdown(section: dict) -> str:
    """The report's compiled section."""
    lines = ["| schedule | eager tokens/s | compiled tokens/s | compiled / eager throughput | eager ms/NFE | "
             "compiled ms/NFE | warm-up s (compile s) | graphs compiled while timed | differs from ar |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in section["schedules"]:
        compile_s = f" ({_f(row['compile_s'])})" if row.get("compile_s") else ""
        differs = "-" if row["differs_from_ar"] is None else (
            f"{row['differs_from_ar']}" + (f" ({row['near_ties']} near-tie)" if row["differs_from_ar"] else ""))
        lines.append(f"| {row['schedule']} | {_f(row['eager_throughput'], 1)} | {_f(row['compiled_throughput'], 1)} | "
                     f"{_interval(row['throughput_ratio'])} | {_f(row['eager_ms_per_nfe'])} | "
                     f"{_f(row['compiled_ms_per_nfe'])} | {_f(row['warmup_s'])}{compile_s} | "
                     f"{row['graphs_while_timed']} | {differs} |")
    if section["vs_stock"]:
        lines += ["", f"Against compiled stock `generate` ({STOCK}{COMPILED}): throughput ratio and the tokens/NFE at "
                  "which each would match it.", "",
                  "| schedule | throughput / stock+compile | tokens/NFE | break-even tokens/NFE |", "|---|---|---|---|"]
        lines += [f"| {r['schedule']} | {_interval(r['throughput_ratio'])} | {_f(r['tokens_per_nfe'])} | "
                  f"{_f(r['break_even_tokens_per_nfe'])} |" for r in section["vs_stock"]]
    limit = section.get("limit")
    if limit:
        lines += ["", f"The limit: a compiled {PACKED} call of {limit['rows']} rows (a real steady call through the "
                  f"decode's own compiled forward: padding, in-graph mask, slot cache) against a bare compiled forward "
                  f"of {limit['rows']} rows (plain causal mask, transformers' static cache), both of "
                  f"{limit['cache_slots']} slots with {limit['context']} cached, timed interleaved: "
                  f"{limit['call_ms']:.3f} vs {limit['bare_forward_ms']:.3f} ms, **{limit['call_ratio']:.3f}x**. "
                  f"Inside the timed decodes the model call took {limit['in_decode_model_call_ms']:.3f} ms "
                  f"({limit['in_decode_model_call_ratio']:.3f}x the bare forward) and the whole iteration "
                  f"{limit['in_decode_iteration_ms']:.3f} ms ({limit['in_decode_iteration_ratio']:.3f}x: plus the "
                  "loop's layout, acceptance and bookkeeping, and the colder CPU caches they leave the next call)."]
    return "\n".join(lines)
