"""The README stays short, every relative link in it and in docs/*.md points at a file (and heading) that exists,
and the generated results blocks live in the pages their tool writes by default."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (neither holds links or headings)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_github():
    assert slug("Auto: the width and the mode chosen per call") == "auto-the-width-and-the-mode-chosen-per-call"
    assert slug("Hybrid-SS (k proposal branches)") == "hybrid-ss-k-proposal-branches"
    assert slug("Tensor parallelism (`torchrun`)") == "tensor-parallelism-torchrun"
    assert slug("Fast on a CPU: bfloat16 and compiled") == "fast-on-a-cpu-bfloat16-and-compiled"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_relative_link_resolves():
    assert len(PAGES) > 5
    broken = []
    for page in PAGES:
        for target in LINK.findall(_prose(page.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_generated_blocks_live_where_their_tool_writes():
    from hf_packed_ss.tools.bench.readme import AUTO_END, AUTO_PAGE, AUTO_START, END, RESULTS_PAGE, START

    readme = (ROOT / "README.md").read_text()
    for page, markers in ((RESULTS_PAGE, (START, END)), (AUTO_PAGE, (AUTO_START, AUTO_END))):
        text = (ROOT / page).read_text()
        for marker in markers:
            assert text.count(marker) == 1, (page, marker)
            assert marker not in readme, marker
