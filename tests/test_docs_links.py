"""Every relative link in README.md and docs/*.md reaches a file that exists, and an anchor that
file has: a heading (GitHub's slug of it) or an explicit ``<a id="...">``/``<a name="...">``.
Links inside code (fenced blocks, inline code) are text, not links, and are skipped; so are
links with a scheme (``https:``, ``mailto:``)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without link targets and markup, lower-cased,
    everything but letters, digits, ``_``, ``-`` and spaces dropped, spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(path: Path):
    for n, line in prose_lines(path.read_text()):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            yield n, m.group(1)


def broken(path: Path) -> list[str]:
    problems = []
    for n, target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no anchor #{anchor} in {dest.relative_to(REPO)}")
    return problems


def test_the_pages_exist():
    names = {p.name for p in pages()}
    assert {"README.md", "architecture.md", "cli.md", "job-file.md"} <= names, names


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_its_file_and_anchor(page):
    assert broken(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for _, t in links(REPO / "README.md")}
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link to: {missing}"


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    """The checker itself: a missing file, a missing anchor, a heading's slug, an <a id>, and a
    link inside code that is not one."""
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        (tmp_path / "b.md").write_text("# Rollout servers (`servers:`)\n\n<a id=\"here\"></a>text\n")
        a = tmp_path / "a.md"
        a.write_text("[ok](b.md#rollout-servers-servers) [ok](b.md#here) `[code](nowhere.md)`\n"
                     "```\n[fenced](nowhere.md)\n```\n[bad](missing.md) [bad](b.md#nope) [ok](#top)\n# Top\n")
        got = broken(a)
    finally:
        REPO = saved
    assert len(got) == 2, got
    assert "no file" in got[0] and "missing.md" in got[0]
    assert "no anchor #nope" in got[1]
