"""The benchmark: throughput, tokens/NFE, time/NFE and the model / non-model time split per schedule, with paired
bootstrap intervals and plots (paper section 4, appendices E.5 and F.3), and the tau + delta * n cost probe.

`hf-packed-ss bench` (or `python -m hf_packed_ss.tools.bench`) runs `command.main` (not imported here: a
module that needs one of the bench's modules would otherwise load the whole command); `hf-packed-ss probe` runs
`probe.main`. Modules: `suites` (prompt sets), `measure` (timing, interleaving), `statistics` (aggregates,
bootstrap), `grading` (GSM8K, HumanEval), `report` (results.json, report.md, PNGs), `probe` (cost model).
"""
