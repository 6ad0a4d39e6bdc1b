"""Log every call auto times and every decode of a bench run, then replay the log into a cost model variant.

    python docs/experiments/auto_log.py log LOG.json --model tiny-nemotron-gsm8k --suite gsm8k --limit 20 \\
        --max-new-tokens 128 --schedules ar packed_ss@1 packed_ss@2 packed_ss@4 packed_ss@8 auto --out /tmp/b
    python docs/experiments/auto_log.py replay LOG.json [LOG.json ...] [--recent 48]

`log` runs `hf-packed-ss bench` with the rest of the arguments, recording each `CallCost.observe` (time, kind,
rows, seconds, the arm timed) and each decode (start, schedule, NFE, decoder time, rows, modes and widths per
iteration). `replay` feeds the logged observations, in time order, into a fresh `CallCost` and forecasts every
decode after the warm-up from the model as it stood when that decode began, as the bench's auto section does:
a cost-model idea is judged on a real run's calls in seconds instead of a bench run per idea (the calls auto
chose are the logged ones, so ideas that change the choice still need a run, and the first sweep's restart is not
replayed: the figures come within a few percent of the bench's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def log(path: str, argv: list[str]) -> int:
    from hf_packed_ss.engine import cost, width
    from hf_packed_ss.tools.bench import command, measure

    entries, arm = [], [None]
    observe, choose, decoder_for = cost.CallCost.observe, width.WidthChooser.choose, measure.decoder_for

    def observing(self, kind, rows, seconds):
        observe(self, kind, rows, seconds)
        entries.append(("obs", time.perf_counter(), kind, int(rows), seconds, arm[0]))

    def choosing(self, last_rows):
        arm[0] = self.arm  # the arm of the call this choose times
        return choose(self, last_rows)

    def logged(model, settings):
        decode = decoder_for(model, settings)

        def run(schedule, ids):
            start = time.perf_counter()
            fields = decode(schedule, ids)
            entries.append(("dec", start, schedule, fields.get("nfe"), fields.get("decoder_time_s"),
                            fields.get("rows_per_call"), fields.get("schedule_per_iteration"),
                            fields.get("width_per_iteration")))
            return fields

        return run

    cost.CallCost.observe, width.WidthChooser.choose, command.decoder_for = observing, choosing, logged
    code = command.main(argv)
    with open(path, "w") as f:
        json.dump(entries, f)
    return code


def replay(entries: list, recent: int) -> dict[str, float]:
    """Each schedule's forecast error (predicted over measured decoder time, minus 1) for the decodes after the
    bench's warm-up (one per schedule)."""
    from dataclasses import replace

    from hf_packed_ss.engine import cost
    from hf_packed_ss.engine.policy import AUTO_POLICY

    warm = len({e[2] for e in entries if e[0] == "dec"})
    model, totals, seen = cost.CallCost(policy=replace(AUTO_POLICY, recent=recent)), {}, 0
    for entry in sorted(entries, key=lambda e: (e[1], e[0] == "obs")):  # a decode before its own calls
        if entry[0] == "obs":
            model.observe(entry[2], entry[3], entry[4])
            continue
        seen += 1
        _, _, schedule, _, seconds, rows, modes, _ = entry
        if seen <= warm or not modes or len(modes) != len(rows):
            continue
        kinds = [cost.VERIFY if m == "ar" else cost.DRAFT for m in modes]
        predicted = [model.predict(k, r) for k, r in zip(kinds, rows, strict=True)]
        if None not in predicted:
            total = totals.setdefault(schedule, [0.0, 0.0])
            total[0] += sum(predicted)
            total[1] += seconds
    return {s: p / m - 1 for s, (p, m) in totals.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["log"] and len(argv) > 1:
        return log(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["replay"])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--recent", type=int, default=48, help="the cost model's window (`AutoPolicy.recent`)")
    args = parser.parse_args(argv)
    for path in args.logs:
        with open(path) as f:
            errors = replay(json.load(f), args.recent)
        worst = max(errors, key=lambda s: abs(errors[s]))
        print(path, " ".join(f"{s} {100 * e:+.1f}%" for s, e in errors.items()), f"(worst {worst})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
