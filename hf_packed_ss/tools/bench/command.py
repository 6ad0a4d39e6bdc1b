"""`hf-packed-ss bench`: every schedule and the peer baselines on one suite, in one process on one loaded model.

Paper section 4 (metrics) and appendix E.5 (timing, intervals). Steps: load the suite and the model, warm up,
measure interleaved (`measure.py`), then, outside all timing, detokenise, grade and compare with `ar`, aggregate
with paired bootstrap intervals (`statistics.py`) and write `results.json`, `report.md` and plots (`report.py`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ...engine.schedules import DEFAULT_BRANCHES, HYBRID
from ...front.families import MODES, family
from ..loading import check_schedules, encode, load_model, resolve
from . import auto, compiled, report
from .grading import grade
from .measure import (
    COMPILED,
    DTYPE_MARK,
    PEERS,
    REFERENCE,
    STOCK,
    Measurement,
    ScheduleName,
    Settings,
    decoder_for,
    near_tie,
    run_interleaved,
    schedule_name,
)
from .statistics import RESAMPLES, aggregate, paired_intervals, per_prompt_totals
from .suites import CHAT_SHOTS, SUITES, Prompt, load_suite

DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")
BASELINE = "linear_ss"
BEST_STOCK = "best-stock"  # --baseline: whichever stock generate variant measured the highest throughput


def build_parser(prog: str = "hf-packed-ss bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-nemotron-random", help="bundled checkpoint name or local folder")
    p.add_argument("--suite", default="sample", help=f"one of {SUITES}; `sample` is 20 bundled GSM8K questions")
    p.add_argument("--data", default=None, help="the GSM8K (or HumanEval) file to read instead of the default "
                                                "(--suite gsm8k: test.jsonl in $HF_PACKED_SS_GSM8K, else "
                                                "../shared/data/gsm8k beside the source checkout)")
    p.add_argument("--prompt-field", default="prompt", help="field holding the prompt in a jsonl:<file> suite")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="put each prompt in the tokenizer's chat template (default: when the tokenizer has one; "
                        "GSM8K questions then follow --shots worked examples)")
    p.add_argument("--shots", type=int, default=CHAT_SHOTS, choices=range(5), metavar="K",
                   help="worked GSM8K train examples before each GSM8K question in a chat template (0 to 4)")
    p.add_argument("--schedules", nargs="+", default=None, type=schedule_name, metavar="SCHEDULE",
                   help=f"from {MODES + list(PEERS)}; {HYBRID}:K for K proposal branches (a bare {HYBRID} is "
                        f"{HYBRID}:{DEFAULT_BRANCHES}; e.g. --schedules packed_ss {HYBRID}:2 {HYBRID}:4 quadratic_ss) "
                        f"(default: ar linear_ss quadratic_ss packed_ss {HYBRID}:{DEFAULT_BRANCHES} stock "
                        "prompt_lookup, plus native on SetDLM)")
    p.add_argument("--baseline", default=BASELINE,
                   help=f"schedule the paired ratios divide by; {BEST_STOCK!r}: the stock generate variant (eager, "
                        "compiled, --stock-dtypes) with the highest throughput")
    p.add_argument("--stock-dtypes", nargs="+", default=[], choices=[d for d in DTYPES if d != "auto"],
                   metavar="DTYPE", help=f"also run stock generate eagerly on the checkpoint loaded in each DTYPE "
                                         f"(rows stock{DTYPE_MARK}DTYPE), interleaved with the rest: e.g. float32 "
                                         "beside a bfloat16 run, so the fastest stock configuration is in the race")
    p.add_argument("--width", type=int, default=None, help="speculative width W (default: each schedule's)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sampling only; 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling only; 1 = off")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10,
                   help="prompt_lookup_num_tokens of the prompt_lookup baseline")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of the suite")
    p.add_argument("--repeats", type=int, default=1, help="responses per prompt and schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bfloat16 on CUDA and on CPUs with native bfloat16 (AVX512-BF16, AMX), else float32")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--out", default="bench-out", help="folder for results.json, report.md and the plots")
    p.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples")
    p.add_argument("--humaneval-timeout", type=float, default=5.0, help="seconds per HumanEval program")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--compile", action="store_true",
                   help="also run every schedule (stock and prompt lookup included) with a static cache and "
                        "torch.compile, side by side with its eager run: compiled vs eager, vs compiled stock, and "
                        "the compiled Packed-SS call against a bare compiled forward")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of --compile (default: CompileConfig's, 'reduce-overhead': CUDA graphs "
                        "on a GPU)")
    p.add_argument("--batch-size", type=int, nargs="+", default=None, metavar="N",
                   help="decode the prompts in left-padded batches of N (a list: each), against stock batched "
                        "generate at the same N and our schedules at batch 1; writes batched.json (schedules "
                        "default: stock ar packed_ss)")
    return p


def default_schedules(model) -> list[str]:
    ours = ["ar", "linear_ss", "quadratic_ss", "packed_ss", f"{HYBRID}:{DEFAULT_BRANCHES}", auto.AUTO]
    fam = family(model.config)
    inexact = [m for m, s in fam.schedules.items() if not s.exact] if fam is not None else []  # SetDLM's native
    return ours + inexact + list(PEERS)


def finish(m: Measurement, prompts: list[Prompt], tokenizer, greedy: bool, timeout_s: float, model=None,
           inputs: list[torch.Tensor] | None = None) -> None:
    """After all timing: detokenise, grade (in parallel; each distinct text once) and, under greedy decoding,
    mark responses whose tokens differ from `ar`'s on the same prompt and repeat (and, given the model and the
    inputs, whether each difference starts at a near-tie of the AR mode's logits)."""
    ok = [r for r in m.records if r.error is None]
    for r in ok:
        r.text = tokenizer.decode(r.tokens, skip_special_tokens=True)
    if greedy and REFERENCE in m.schedules:
        reference = {(r.prompt, r.repeat): r.tokens for r in ok if r.schedule == REFERENCE}
        for r in ok:
            if r.schedule != REFERENCE and (r.prompt, r.repeat) in reference:
                r.differs_from_ar = r.tokens != reference[r.prompt, r.repeat]
                if r.differs_from_ar and model is not None:
                    r.near_tie = near_tie(model, inputs[r.prompt], reference[r.prompt, r.repeat], r.tokens)
    jobs = sorted({(r.prompt, r.text) for r in ok if prompts[r.prompt].grader})
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        grades = dict(zip(jobs, pool.map(
            lambda job: grade(prompts[job[0]].grader, prompts[job[0]].reference, job[1], timeout_s), jobs),
            strict=True))
    for r in ok:
        r.correct = grades.get((r.prompt, r.text))


def summarise(m: Measurement, prompts: list[Prompt], args: argparse.Namespace, settings: Settings,
              env: dict) -> dict:
    """results.json's content: configuration, environment, order, every record, aggregates and paired ratios
    over the prompts every schedule completed."""
    complete = m.complete_prompts()
    done = set(complete)
    kept = [r for r in m.records if r.prompt in done]
    active = m.active
    baseline, note = args.baseline, None
    if baseline == BEST_STOCK and complete:
        stock = [s for s in active if ScheduleName.parse(s).mode == STOCK]
        totals = per_prompt_totals(kept, stock, complete)
        baseline = max(stock, key=lambda s: totals[s].tokens.sum() / totals[s].time_s.sum(), default=BEST_STOCK)
        note = f"baseline: the fastest stock variant, {baseline!r}"
        failed = [s for s in m.schedules if s in m.errors and ScheduleName.parse(s).mode == STOCK]
        if failed:  # the best stock is then only the best of those that ran: say so beside every ratio
            note += f" of those that ran ({', '.join(failed)} failed: see Errors)"
    if baseline not in active and active:
        baseline, note = active[0], f"baseline {args.baseline!r} was not measured; ratios are to {active[0]!r}"
    ratios = {}
    if complete and active:
        intervals = paired_intervals(per_prompt_totals(kept, active, complete), baseline, args.resamples, args.seed)
        ratios = {s: {k: asdict(v) for k, v in row.items()} for s, row in intervals.items()}
    return {
        "config": vars(args) | {"settings": asdict(settings)},
        "environment": env,
        "suite": {"name": args.suite, "prompts": len(prompts), "graders": sorted({p.grader for p in prompts
                                                                                    if p.grader})},
        "schedules": active,
        "baseline": baseline,
        "baseline_note": note,
        "greedy": settings.greedy,
        "interrupted": m.interrupted,
        "complete_prompts": complete,
        "prompts": [{"index": i, "id": p.id} for i, p in enumerate(prompts)],
        "orders": m.orders,
        "errors": m.errors,
        "aggregates": {s: aggregate([r for r in kept if r.schedule == s]) for s in active},
        "ratios": ratios,
        "bootstrap": {"resamples": args.resamples, "seed": args.seed, "level": 0.95, "over": "prompts"},
        "records": [r.to_dict() for r in m.records],
    }


def batched_main(args, model, tokenizer, inputs, schedules: list[str], settings: Settings,
                 argv: list[str] | None = None) -> int:
    """`--batch-size`: the batched comparison (`batched.py`) instead of the per-prompt one."""
    from . import batched

    bad = [n for n in args.batch_size if n < 1 or n > len(inputs)]
    if bad:
        raise SystemExit(f"--batch-size {bad}: each must be between 1 and the number of prompts ({len(inputs)}).")
    peers = [s for s in schedules if s in PEERS and s != STOCK]
    if peers:
        raise SystemExit(f"{peers} cannot decode a batch in stock generate: drop them with --batch-size.")
    command = "hf-packed-ss bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    batched.run(model, tokenizer, inputs, [s for s in schedules if s != STOCK], args.batch_size, settings,
                args.repeats, Path(args.out), args.seed, command=command,
                environment=report.environment(model.device, model.dtype, args.seed), name=args.model)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("limit", "repeats", "max_new_tokens", "resamples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1 (got {value}).")

    device, dtype = resolve(args.device, args.dtype)
    torch.manual_seed(args.seed)
    prompts = load_suite(args.suite, args.data, args.limit, args.prompt_field)
    model, tokenizer = load_model(args.model, dtype)
    model.to(device)
    schedules = args.schedules or (["ar", "packed_ss"] if args.batch_size else default_schedules(model))
    check_schedules(schedules, model)
    stock_models = {d: load_model(args.model, getattr(torch, d))[0].to(device) for d in args.stock_dtypes}
    inputs = [encode(tokenizer, p, args.chat, args.shots).to(device) for p in prompts]
    settings = Settings(args.max_new_tokens, args.width, args.temperature, args.top_k, args.top_p,
                        args.prompt_lookup_tokens)
    if args.batch_size:
        return batched_main(args, model, tokenizer, inputs, schedules, settings, argv)
    if args.compile:
        schedules = compiled.variants(schedules)
        settings = replace(settings, compile_mode=args.compile_mode,
                           cache_lengths=compiled.cache_lengths(model, schedules, inputs, settings))
    # compiled decoders warm up on the shortest and the longest prompt too: a stock graph that recompiles for a
    # new length (its automatic dynamic shapes) does so before timing, as ours never needs to
    ends = [inputs[0]] + ([min(inputs, key=lambda x: x.shape[1]), max(inputs, key=lambda x: x.shape[1])]
                          if args.compile else [])
    schedules += [STOCK + DTYPE_MARK + d for d in stock_models]
    decode = decoder_for(model, settings, stock_models)
    if auto.AUTO in schedules:  # every response's time as the cost model predicted it just before the decode
        decode = auto.forecasting(decode, model)
    m = run_interleaved(decode, schedules, prompts, inputs, args.repeats, args.seed,
                        progress=not args.no_progress, warmup_inputs=ends)
    if m.interrupted:
        print("Interrupted: writing what was measured.")
    finish(m, prompts, tokenizer, settings.greedy, args.humaneval_timeout, model, inputs)
    results = summarise(m, prompts, args, settings, report.environment(device, dtype, args.seed))
    if args.compile:
        done = set(results["complete_prompts"])
        kept = [r for r in m.records if r.prompt in done]
        section = compiled.summary(m, kept, results["complete_prompts"], results["aggregates"], args.resamples,
                                   args.seed)
        ours = [r for r in kept if r.schedule == compiled.PACKED + COMPILED]
        if ours:
            section["limit"] = compiled.call_limit(model, ours, settings, inputs)
        results["compiled"] = section
    results["auto"] = auto.summary(model, m.records, results["schedules"], results["complete_prompts"],
                                   results["aggregates"], args.resamples, args.seed)
    results["command"] = "hf-packed-ss bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    files = report.write(Path(args.out), results)
    print(report.absolute_table(results))
    if results["ratios"]:
        print(f"\nPaired ratios to {results['baseline']} (95% bootstrap intervals):")
        print(report.ratio_table(results))
    if results.get("compiled"):
        print("\nCompiled (static cache + torch.compile) vs eager:")
        print(compiled.markdown(results["compiled"]))
    if results.get("auto"):
        print("\nauto (speculative_width / assistant_mode chosen per call):")
        print(auto.markdown(results["auto"]))
    for schedule, error in m.errors.items():
        print(f"error [{schedule}]: {error}")
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 130 if m.interrupted else 0
