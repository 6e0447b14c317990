"""The docs a reader follows: every relative link in README.md and docs/ resolves (anchors included), and no
doc is named (file name or heading) after an issue number. Dated numbers live in docs/lab/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissue[ -]?\d+|\bissue\d+", re.IGNORECASE)


def _docs() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [ROOT / "README.md", *docs, *sorted((ROOT / "benchmarks").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)  # no headings in code blocks
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def _broken(doc: Path, root: Path = ROOT) -> list[str]:
    out = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        dest = doc.parent / path if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            out.append(f"{doc.relative_to(root)}: {target}")
    return out


def test_relative_links_resolve():
    broken = [b for doc in _docs() for b in _broken(doc)]
    assert not broken, broken


def test_link_check_sees_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("## The rule: K, `--budget` (v2)\n"
                   "[ok](a.md) [url](https://x.org/y) [gone](lab/missing.md#top)\n"
                   "[here](#the-rule-k---budget-v2) [there](a.md#the-rule-k---budget-v2) "
                   "[nowhere](#the-rules)\n")
    assert _broken(doc, tmp_path) == ["a.md: lab/missing.md#top", "a.md: #the-rules"]


def test_no_doc_named_after_an_issue():
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*") if ISSUE.search(p.name)]
    named += [f"{d.relative_to(ROOT)}: {line}" for d in _docs() for line in d.read_text().splitlines()
              if line.startswith("#") and ISSUE.search(line)
              and not re.search(r"vLLM issue", line)]
    assert not named, named
    assert ISSUE.search("## Side by side (issue 18 4c)") and ISSUE.search("issue18_side_by_side.md")
