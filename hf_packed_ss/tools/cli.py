"""``hf-packed-ss``: the command-line entry point.

``hf-packed-ss train`` trains a model of either format (`train.py`). ``hf-packed-ss bench`` measures every
schedule on a prompt suite and writes a report; ``hf-packed-ss probe`` fits the tau + delta * n call cost
(`bench/`). ``hf-packed-ss run`` decodes one prompt with every schedule on one loaded model and prints the text
and a table: tokens, NFE, tokens/NFE, time per NFE, wall time, tokens/s, speed-up over AR, the break-even
tokens/NFE, and whether the tokens equal AR's. It times the way the benchmark does (`bench.measure`): every
schedule is warmed up first, then decodes `--repeats` times, schedules interleaved in rotating order, and the
median repeat is reported with the range of the repeats; a short call-cost probe (`bench.timing.time_rows`) says
why the fastest schedule wins. Exit code 1 when an exact schedule's tokens differ from AR's, 2 on an error.
Claims over many prompts belong to the benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

import torch

from ..engine.schedules import DEFAULT_BRANCHES, HYBRID, SCHEDULES
from ..front.families import FAMILIES, MODES
from .bench.measure import REFERENCE
from .loading import QUESTION, check_schedules, encode_prompt, load_model, resolve

DRAFTER, TINY = "smollm2-135m-drafter", "tiny-nemotron-gsm8k"
# Schedules whose tokens may differ from AR's, which is no failure (SetDLM's native decoder), from the engine
NOT_EXACT = {m for fam in FAMILIES.values() for m, s in fam.schedules.items() if not s.exact}
# `run` decodes every prefix-family schedule but the hybrid by default (each schedule adds its share to the default
# run's few minutes on a 2-core CPU): those with no option of their own; `--schedules ... hybrid_ss:K` adds it.
RUN_DEFAULT = [s for s, schedule in SCHEDULES.items() if not schedule.options]


def default_model() -> str:
    """The SmolLM2 drafter when its base model is installed, else the tiny trained checkpoint (with a hint)."""
    from .. import bundled
    from ..models import smollm2

    if smollm2.installed() and DRAFTER in bundled.names():
        return DRAFTER
    print(f"(using {TINY}; for the SmolLM2-135M drafter: {smollm2.HINT})", file=sys.stderr)
    return TINY


def summarise_run(records: list, schedules: list[str], exact: bool = True) -> list[dict]:
    """One row per schedule from the timed repeats (`bench.record.Record`s of one prompt): the median repeat's
    figures (the repeat of median tokens/s), the speed-up over `ar` (tokens/s, median over median, with the range
    of the per-round ratios), the break-even tokens/NFE (the tokens/NFE at which the schedule would exactly match
    AR here: its time per NFE over AR's, times AR's tokens/NFE) and whether every repeat's tokens equal AR's of
    the same round (not `exact`, in reduced precision, a difference is a rounding, not a failure)."""
    from .bench.repeats import median_index, relative_range, speedup, spread

    by = {s: sorted((r for r in records if r.schedule == s and r.error is None), key=lambda r: r.repeat)
          for s in schedules}

    def rate(r) -> float:
        return r.new_tokens / r.decoder_time_s if r.decoder_time_s > 0 else 0.0

    ar = by.get(REFERENCE) or []
    ar_tokens = {r.repeat: r.tokens for r in ar}
    ar_rates = {r.repeat: rate(r) for r in ar}
    if ar:
        mid = ar[median_index([rate(r) for r in ar])]
        ar_per_nfe, ar_tokens_per_nfe = mid.decoder_time_s / mid.nfe, mid.tokens_per_nfe
    rows = []
    for s in schedules:
        recs = by[s]
        if not recs:
            continue
        times = [r.decoder_time_s for r in recs]
        mid = recs[median_index([rate(r) for r in recs])]
        per_nfe = mid.decoder_time_s / mid.nfe if mid.nfe else float("nan")
        later = mid.rows_per_call[1:] or mid.rows_per_call
        row = dict(schedule=s, width=mid.width, tokens=mid.new_tokens, nfe=mid.nfe,
                   tokens_per_nfe=mid.tokens_per_nfe, ms_per_nfe=1e3 * per_nfe, wall_s=mid.decoder_time_s,
                   tokens_per_s=rate(mid), repeats=len(recs), wall=spread(times),
                   wall_range=relative_range(spread(times)),
                   rows_per_call=sum(later) / len(later) if later else 0.0, text_tokens=mid.tokens,
                   speedup=None, break_even=None, same="-")
        paired = [r for r in recs if r.repeat in ar_rates]
        if paired:
            row["speedup"] = speedup([ar_rates[r.repeat] for r in paired], [rate(r) for r in paired])
        if ar and s != REFERENCE:
            row["break_even"] = per_nfe / ar_per_nfe * ar_tokens_per_nfe
            equal = all(r.tokens == ar_tokens[r.repeat] for r in paired)
            row["same"] = "yes" if equal else ("no (not exact)" if s in NOT_EXACT else "NO" if exact
                                               else "no (rounding)")
        rows.append(row)
    return rows


def _table(rows: list[dict]) -> str:
    head = (f"{'schedule':<14}{'W':>3}{'tokens':>8}{'NFE':>6}{'tokens/NFE':>12}{'ms/NFE':>9}{'wall s':>9}"
            f"{'tokens/s':>10}  {'speed-up vs ar':<20}{'break-even':>11}{'same as ar':>16}")
    lines = [head, "-" * len(head)]
    for r in rows:
        up = r["speedup"]
        speed = "-" if up is None else (f"{up.value:.2f}" if r["schedule"] == REFERENCE or r["repeats"] < 2
                                        else f"{up.value:.2f} [{up.low:.2f}, {up.high:.2f}]")
        even = "-" if r["break_even"] is None else f"{r['break_even']:.2f}"
        lines.append(f"{r['schedule']:<14}{r['width']:>3}{r['tokens']:>8}{r['nfe']:>6}{r['tokens_per_nfe']:>12.2f}"
                     f"{r['ms_per_nfe']:>9.1f}{r['wall_s']:>9.3f}{r['tokens_per_s']:>10.1f}  {speed:<20}"
                     f"{even:>11}{r['same']:>16}")
    return "\n".join(lines)


def best_speculative(rows: list[dict]) -> dict | None:
    """The row of the schedule other than `ar` with the highest speed-up over `ar` (None without both)."""
    speculative = [r for r in rows if r["schedule"] != REFERENCE and r["break_even"] is not None]
    return max(speculative, key=lambda r: r["speedup"].value, default=None)


def verdict(rows: list[dict], probe: dict[int, float] | None, device: torch.device, adapter: bool) -> list[str]:
    """The lines under the table: which schedule is fastest here and why (break-even tokens/NFE against the
    tokens/NFE reached, the probe's cost of a bare forward of that many rows), and how noisy the timing was."""
    if not rows:
        return []
    fastest = max(rows, key=lambda r: r["tokens_per_s"])
    best = best_speculative(rows)
    if best is None:
        return [f"Fastest here: {fastest['schedule']} ({fastest['tokens_per_s']:.1f} tokens/s); add ar and a "
                "speculative schedule to --schedules for the speed-up and the break-even tokens/NFE."]
    up, name = best["speedup"], best["schedule"]
    if fastest["schedule"] == REFERENCE:
        head = (f"Fastest on this machine: ar ({fastest['tokens_per_s']:.1f} tokens/s); the best speculative "
                f"schedule, {name}, runs at {up.value:.2f}x AR's speed: it would match AR at "
                f"{best['break_even']:.2f} tokens/NFE and reaches {best['tokens_per_nfe']:.2f}")
    else:
        head = (f"Fastest on this machine: {name}, {up.value:.2f}x AR's speed: it reaches "
                f"{best['tokens_per_nfe']:.2f} tokens/NFE where {best['break_even']:.2f} would match AR")
    if up.low <= 1 <= up.high and best["repeats"] > 1:
        head += " (within the timing noise of AR: its repeats fall on both sides of 1.00x)"
    lines = [head + "."]
    cost = best["ms_per_nfe"] / next(r["ms_per_nfe"] for r in rows if r["schedule"] == REFERENCE)
    why = f"One {name} call costs {cost:.2f}x an AR call here (ms/NFE)"
    rows_n = max(1, round(best["rows_per_call"]))
    if probe and 1 in probe and rows_n in probe:
        bare = probe[rows_n] / probe[1]
        rest = "the drafter's adapter and the decoder loop" if adapter else "the packed layout and the decoder loop"
        why += (f"; a bare forward of its {rows_n} rows costs {bare:.2f}x one of 1 row (probe: "
                f"{probe[rows_n] * 1e3:.3g} vs {probe[1] * 1e3:.3g} ms)"
                + (f", {rest} add the rest" if bare < 0.95 * cost else ", which accounts for it"))
    if device.type == "cpu":
        why += ". On a GPU call cost is nearly flat in rows, so there tokens/NFE decides"
    lines.append(why + ".")
    return lines


def auto_repeats(round_s: float, budget_s: float = 30.0, least: int = 3, most: int = 25) -> int:
    """Timed repeats when `--repeats` is not given: `least`, or more while the estimated rounds (`round_s`
    seconds each, estimated from the warm-up) fit in `budget_s`, at most `most`."""
    if round_s <= 0:
        return least
    return max(least, min(most, int(budget_s // round_s)))


def write_json(path: Path, args: argparse.Namespace, name: str, device, dtype, repeats: int, rows: list[dict],
               probe: dict[int, float] | None, m) -> None:
    """`--json`: the settings, the table's rows (speed-ups with their ranges), the probe and every timed repeat."""
    import json
    from dataclasses import asdict

    table = [{k: asdict(v) if hasattr(v, "low") else v for k, v in r.items() if k != "text_tokens"} for r in rows]
    path.write_text(json.dumps({
        "model": name, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens, "repeats": repeats,
        "warmup_tokens": args.warmup_tokens, "rows": table, "probe_s": probe, "orders": m.orders,
        "errors": m.errors, "records": [r.to_dict() for r in m.records]}, indent=1, default=str))


def decoder(model, settings, compiled: bool):
    """The bench's decoder for `run`'s schedule names; `compiled`: each one's `+compile` variant, under its name."""
    from .bench.measure import COMPILED, decoder_for

    decode = decoder_for(model, settings)
    return (lambda schedule, ids: decode(schedule + COMPILED, ids)) if compiled else decode


def run_command(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import hf_packed_ss  # noqa: F401

    from .bench.auto import AUTO
    from .bench.compiled import cache_lengths
    from .bench.measure import COMPILED, Settings, run_interleaved
    from .bench.suites import Prompt

    for flag in ("repeats", "max_new_tokens"):
        if (getattr(args, flag) or 1) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)}).")
    begin = time.perf_counter()
    device, dtype = resolve(args.device, args.dtype)
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    name = args.model or default_model()
    model, tokenizer = load_model(name, dtype)
    model.to(device)
    check_schedules(args.schedules, model)
    ids = encode_prompt(tokenizer, args.prompt).to(device)
    threads = f", {torch.get_num_threads()} torch thread(s)" if device.type == "cpu" else ""
    warm = f"a {args.warmup_tokens}-token warm-up of every schedule" if args.warmup_tokens else "no warm-up"
    print(f"{name} on {device} ({str(dtype).removeprefix('torch.')}{threads}), greedy, up to {args.max_new_tokens} "
          f"new tokens; {warm}, then timed repeats, schedules interleaved in rotating order; medians reported.",
          flush=True)
    settings = Settings(args.max_new_tokens, args.width)
    if args.compile:
        if any(s.startswith(AUTO) for s in args.schedules):
            raise SystemExit("--compile: auto changes its call shape as it goes, which one compiled graph refuses; "
                             "drop auto from --schedules.")
        settings = replace(settings, cache_lengths=cache_lengths(model, [s + COMPILED for s in args.schedules], [ids],
                                                                 settings))
    per_token = 0.0  # estimated seconds per token of one round of all schedules, from the warm-up
    if args.warmup_tokens:  # one-time costs (first calls, allocator growth, compiling) stay out of the timings
        warm_up = decoder(model, replace(settings, max_new_tokens=min(args.warmup_tokens, args.max_new_tokens)),
                          args.compile)
        for mode in args.schedules:
            torch.manual_seed(0)
            try:
                done = warm_up(mode, ids)
            except ValueError as error:  # generate's own validation, e.g. a width out of range
                print(f"error [{mode}]: {error}", file=sys.stderr)
                return 2
            per_token += done["decoder_time_s"] / max(1, done["new_tokens"])
    repeats = args.repeats or auto_repeats(per_token * args.max_new_tokens)
    m = run_interleaved(decoder(model, settings, args.compile), args.schedules,
                        [Prompt("run", args.prompt or QUESTION)], [ids], repeats, warmup=False,
                        progress=not args.no_progress)
    rows = summarise_run(m.records, args.schedules, exact=dtype in (torch.float32, torch.float64))
    print()
    for r in rows:
        print(f"[{r['schedule']}] {tokenizer.decode(r['text_tokens'])!r}")
    print()
    print(_table(rows))
    probe, best = None, best_speculative(rows)
    if args.probe and best is not None:  # after the timing, so it never competes with it
        import warnings

        from .bench.timing import time_rows

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # a PEFT model's forward takes the old cache keyword
            probe = time_rows(model, sorted({1, max(1, round(best["rows_per_call"]))}), ids.shape[1],
                              iters=args.probe_iters, warmup=1)
    for line in verdict(rows, probe, device, adapter=hasattr(model, "peft_config")):
        print(line)
    noise = max((r["wall_range"] for r in rows), default=0.0)
    trim = f" without the {repeats // 4} highest and the {repeats // 4} lowest" if repeats >= 4 else ""
    load = ""
    if device.type == "cpu" and hasattr(os, "getloadavg"):
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    print(f"Timing: median of {repeats} repeat(s); [low, high] = the range of the per-round speed-ups{trim}; "
          f"the repeats of one schedule differed by up to {100 * noise:.0f}% in wall time{load}; "
          f"{time.perf_counter() - begin:.0f} s in all (shorter: --repeats, --max-new-tokens; over many prompts: "
          "hf-packed-ss bench).")
    for schedule, error in m.errors.items():
        print(f"error [{schedule}]: {error}", file=sys.stderr)
    if args.json:
        write_json(Path(args.json), args, name, device, dtype, repeats, rows, probe, m)
    if m.interrupted:
        return 130
    if m.errors:
        return 2
    return 0 if all(r["same"] != "NO" for r in rows) else 1


# Subcommands with their own parser: name -> (module, help).
DELEGATES = {
    "train": ("train", "train a model of either format, or the SmolLM2 drafter"),
    "bench": ("bench.command", "benchmark the schedules and peer baselines"),
    "probe": ("bench.probe", "fit the tau + delta * n call cost and predict the fastest schedule"),
    "overhead": ("bench.overhead", "the decoder's own time per call against the context length"),
    "publish": ("publish", "assemble (and upload) the Hub folder of a bundled checkpoint"),
    "serve": ("serve", "an OpenAI-compatible server that batches concurrent requests (pip install -e '.[serve]')"),
    "demo": ("demo", "start the Gradio app in which the schedules race side by side (pip install -e '.[demo]')"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in DELEGATES:
        module = importlib.import_module(f".{DELEGATES[argv[0]][0]}", __package__)
        return module.main(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="hf-packed-ss", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, text) in DELEGATES.items():
        sub.add_parser(name, help=f"{text} (see `hf-packed-ss {name} --help`)")
    run = sub.add_parser("run", help="decode one prompt with every schedule, time them fairly and compare",
                         description="Decode one prompt with every schedule on one model; warm-up, interleaved "
                         "repeats, medians, speed-up over AR and why (see the module docstring).")
    run.add_argument("--model", default=None, help=f"bundled checkpoint name or local folder (default: {DRAFTER} "
                     f"when the SmolLM2 base is installed, else {TINY})")
    run.add_argument("--prompt", default=None, help="raw prompt text (default: GSM8K test question 0, in the "
                     "model's prompt format: the chat template after four worked examples, as the benchmark)")
    from .bench.measure import schedule_name

    run.add_argument("--schedules", nargs="+", default=RUN_DEFAULT, type=schedule_name, metavar="SCHEDULE",
                     help=f"from {MODES}; {HYBRID}:K for K proposal branches (a bare {HYBRID} is "
                     f"{HYBRID}:{DEFAULT_BRANCHES}) (default: {' '.join(RUN_DEFAULT)})")
    run.add_argument("--width", type=int, default=None, help="speculative width W (default: the model's)")
    run.add_argument("--max-new-tokens", type=int, default=128)
    run.add_argument("--repeats", type=int, default=None, help="timed decodes per schedule, interleaved; the "
                     "median is reported with the range (default: 3, more while the rounds, estimated from the "
                     "warm-up, fit in about 30 s, at most 25)")
    run.add_argument("--warmup-tokens", type=int, default=16, help="untimed decode of this many tokens per "
                     "schedule before timing (0 = none)")
    run.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as the benchmark: the "
                     "fair setting on a shared CPU; 0 = torch's default)")
    run.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, ...")
    run.add_argument("--dtype", default="auto", choices=["auto", "float32", "float64", "bfloat16", "float16"],
                     help="auto: bfloat16 where the hardware runs it natively (CUDA, AVX512-BF16/AMX), else float32; "
                          "float32/float64 keep every exact schedule token-identical to AR, bfloat16 only AR to "
                          "stock generate (a schedule may leave AR at a near-tie)")
    run.add_argument("--compile", action="store_true",
                     help="every schedule (stock included) with a static cache and torch.compile (ours with "
                          "frozen bfloat16 weights on the CPU), the fastest configuration on a CPU with native "
                          "bfloat16; the warm-up compiles (about a minute per schedule on 2 CPU cores, cached on "
                          "disk after)")
    run.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                     help="time bare forwards of 1 and of each schedule's rows per call to explain the result")
    run.add_argument("--probe-iters", type=int, default=3, help="timed forwards per row count in the probe")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", default=None, help="also write the table, the probe and every timed repeat here")
    args = parser.parse_args(argv)
    return {"run": run_command}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
