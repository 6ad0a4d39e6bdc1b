"""Regenerate the results blocks of the docs pages from bench `results.json` files, so no figure is typed by hand.

    python -m hf_packed_ss.tools.bench.readme bench-nemotron/results.json bench-setdlm/results.json

replaces everything between the two marker comments with, per results file, the command that produced it,
the machine, and the paired-ratio (for `bench --compile`: compiled vs eager) and absolute tables of its report (a
`batched.json` of `bench --batch-size`:
its batch table, probe fit and crossovers); a `probe.json` beside a results file
(`hf-packed-ss probe --results R --json probe.json`) adds the fitted call cost tau + delta * rows and the
throughput it predicts next to the measured one. The page is `docs/results.md` by default; with `--auto` (the
auto figures block) `docs/auto.md`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .report import absolute_table, ratio_table

START, END = "<!-- bench-results:start -->", "<!-- bench-results:end -->"
AUTO_START, AUTO_END = "<!-- auto-results:start -->", "<!-- auto-results:end -->"  # `--auto`: the auto figures
RESULTS_PAGE, AUTO_PAGE = Path("docs/results.md"), Path("docs/auto.md")  # the pages holding the two blocks


def probe_lines(probe: dict) -> list[str]:
    """The cost-model fit and, per schedule, predicted (model time only) against measured throughput."""
    lines = [f"Call cost on this machine (`hf-packed-ss probe`): tau = {probe['tau_s'] * 1e3:.3f} ms, "
             f"delta = {probe['delta_s'] * 1e3:.4f} ms/row (R^2 = {probe['r2']:.3f}).", ""]
    if probe.get("measured"):
        lines += ["| schedule | rows/call | predicted ms/NFE | measured ms/NFE | predicted tokens/s "
                  "| measured tokens/s |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['schedule']} | {r['mean_rows_per_call']:.1f} | {r['predicted_time_per_nfe'] * 1e3:.2f} | "
                  f"{r['measured_time_per_nfe'] * 1e3:.2f} | {r['predicted_throughput']:.1f} | "
                  f"{r['measured_throughput']:.1f} |" for r in probe["measured"]]
        lines.append("")
    return lines


def section(results: dict, probe: dict | None = None) -> str:
    env, config = results["environment"], results["config"]
    machine = (env.get("gpu") or {}).get("name") or f"{env['cpu']}, {env['cpu_count']} cores"
    kind = "eager and compiled, " if results.get("compiled") else ""
    lines = [f"### {config['model']} — {kind}{results['suite']['name']}, {len(results['complete_prompts'])} prompts, "
             f"{'greedy' if results['greedy'] else 'sampling'} ({machine}, {env['dtype']}, "
             f"{env['torch_threads']} torch thread(s))", "", "```bash", results.get("command", "hf-packed-ss bench"),
             "```", ""]
    if results.get("compiled"):  # `bench --compile`: each schedule eager and compiled, then the absolute table
        from .compiled import markdown

        lines += ["Compiled (static cache + `torch.compile`) vs eager, one run, 95% bootstrap intervals over prompts:",
                  "", markdown(results["compiled"]), ""]
    elif results["ratios"]:
        lines += [f"Paired ratios to `{results['baseline']}`, 95% bootstrap intervals over prompts:", "",
                  ratio_table(results), ""]
    lines += [absolute_table(results), ""]
    if probe:
        lines += probe_lines(probe)
    return "\n".join(lines)


def batched_section(results: dict) -> str:
    """A `bench --batch-size` run (`batched.json`): its command, machine and tables."""
    from .batched import report

    env = results["environment"]
    machine = (env.get("gpu") or {}).get("name") or f"{env.get('cpu')}, {env.get('cpu_count')} cores"
    sizes = ", ".join(map(str, results["batch_sizes"]))
    return "\n".join([f"### {results['model']} — batches of {sizes} over {results['prompts']} prompts ({machine}, "
                      f"{env.get('dtype')}, {env.get('torch_threads')} torch thread(s))", "", "```bash",
                      results["command"], "```", "", report(results), ""])


def replace_block(readme: Path, start: str, end: str, body: str, heading: str) -> None:
    """Put `body` between the markers (appended under `heading` the first time)."""
    text = readme.read_text()
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + f"\n\n{heading}\n\n" + block + "\n"
    readme.write_text(text)


def update_auto(readme: Path, files: list[Path]) -> None:
    """The auto figures: one row per results file with an `auto` section, then the command of each."""
    from .auto import table

    commands = [json.loads(Path(f).read_text()).get("command", "hf-packed-ss bench") for f in files]
    body = "\n".join([table([str(f) for f in files]), "", "```bash", *commands, "```"])
    replace_block(readme, AUTO_START, AUTO_END, body, "### Auto figures")


def update(readme: Path, files: list[Path]) -> None:
    def probe(f: Path) -> dict | None:
        beside = Path(f).with_name("probe.json")
        return json.loads(beside.read_text()) if beside.is_file() else None

    def render(f: Path) -> str:
        results = json.loads(Path(f).read_text())
        return batched_section(results) if Path(f).name == "batched.json" else section(results, probe(f))

    replace_block(readme, START, END, "\n".join(render(f) for f in files), "## Results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_packed_ss.tools.bench.readme",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--page", "--readme", dest="page", type=Path, default=None,
                        help=f"the markdown file to rewrite (default: {RESULTS_PAGE}; with --auto: {AUTO_PAGE})")
    parser.add_argument("--auto", action="store_true",
                        help=f"the auto figures block (results of benches with auto), in {AUTO_PAGE} by default")
    args = parser.parse_args(argv)
    page = args.page or (AUTO_PAGE if args.auto else RESULTS_PAGE)
    (update_auto if args.auto else update)(page, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
