"""Every relative link in README.md and docs/*.md points to a file that exists, and its #anchor to a heading there.

Pure: reads the pages, no network. Absolute links (http, mailto) are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.M)
ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The page without code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors as its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set(ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")  # GitHub numbers repeated headings
        seen[base] = seen.get(base, 0) + 1
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not ours to check


def shown(file: Path) -> Path:
    return file.relative_to(ROOT) if file.is_relative_to(ROOT) else file


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file {shown(file)}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{target}: no heading or anchor #{anchor} in {shown(file)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_pages_do_link_to_each_other() -> None:  # a checker that finds no links would pass anything
    assert sum(len(links(page)) for page in PAGES) > 100


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Dead man's switch\n\n<a id=\"kept\"></a>\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Two words\n\n[a](other.md#dead-mans-switch) [b](other.md#kept) [c](#two-words) "
                    "[d](https://example.com/x#y) `[e](nowhere.md)`\n\n```\n[f](nowhere.md)\n```\n"
                    "[g](missing.md) [h](other.md#nope) [i](#gone)\n")
    assert [problem.split(":")[0] for problem in broken(page)] == ["missing.md", "other.md#nope", "#gone"]


def test_headings_anchor_as_github_does() -> None:
    assert slug("Scaling benchmark: 1 worker against 2") == "scaling-benchmark-1-worker-against-2"
    assert slug("Reference: aggregates and comparisons") == "reference-aggregates-and-comparisons"
    assert slug("`stream_cost`, the cost of a query") == "stream_cost-the-cost-of-a-query"
