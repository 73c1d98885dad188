"""Does every heading and paragraph of an older README appear in README.md or docs/*.md?

    python tests/docs_coverage.py [REV]      # REV: the commit whose README.md is the old one

Run by hand when text moves between the README and docs/ (not collected by pytest). The old
README is cut into headings and blocks (paragraphs, list items, table rows, whole code blocks);
each is looked for, whitespace collapsed and link targets dropped (``[text](target)`` reads as
``text``, ``<a id>`` anchors vanish), in the text of README.md and docs/*.md together. Prints
each block that is not found verbatim, with the share of its lines that are, and a summary.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def normal(text: str) -> str:
    text = re.sub(r"<a\s+(?:id|name)=\"[^\"]*\"></a>", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)\s]*\)", r"\1", text)
    return " ".join(text.split())


def blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line, kind, text): headings, code blocks, list items, table rows, paragraphs."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    i = 0
    cur: list[str] = []
    start = 0

    def flush(kind="paragraph"):
        nonlocal cur
        if cur:
            out.append((start, kind, "\n".join(cur)))
            cur = []

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((i + 1, "code", "\n".join(lines[i:j + 1])))
            i = j + 1
            continue
        if line.startswith("#"):
            flush()
            out.append((i + 1, "heading", line.lstrip("#").strip()))
        elif not line.strip():
            flush()
        elif line.startswith("|"):
            flush()
            out.append((i + 1, "table row", line))
        elif re.match(r"^\s*(-|\d+\.) ", line):
            flush()
            start, cur = i + 1, [line]
        else:
            if not cur:
                start = i + 1
            cur.append(line)
        i += 1
    flush()
    return out


def main(rev: str) -> int:
    old = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:README.md"], capture_output=True,
                         text=True, check=True).stdout
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    new_text = "\n".join(p.read_text() for p in pages)
    new = normal(new_text)
    headings = {normal(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", new_text, re.M)}
    found = missing = 0
    for line, kind, text in blocks(old):
        if kind == "heading":
            ok = any(h == normal(text) or h.startswith(normal(text) + ":") for h in headings)
        else:
            ok = normal(text) in new
        if ok:
            found += 1
            continue
        missing += 1
        parts = [ln for ln in text.splitlines() if ln.strip()]
        kept = sum(normal(ln) in new for ln in parts)
        print(f"--- README.md:{line} ({kind}; {kept} of {len(parts)} lines found verbatim)")
        for ln in parts:
            print(("   " if normal(ln) in new else " ! ") + ln[:110])
    print(f"{found} of {found + missing} headings and blocks found verbatim; {missing} not")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))
