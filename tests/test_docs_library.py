"""docs/library.md's blocks for results as values, finding jobs again and logs as data run as
written, in order, in one namespace (a later block uses what an earlier one made), on the local
backend with real torchrun: what a reader copies works."""
from __future__ import annotations

import re

import pytest

from helpers import REPO

pytestmark = pytest.mark.torch

SECTIONS = ("## Results as values", "## Finding jobs again", "## Logs as data")


def _blocks() -> list[str]:
    text = (REPO / "docs" / "library.md").read_text()
    out = []
    for head in SECTIONS:
        start = text.index(head)
        end = text.index("\n## ", start + len(head))
        out += re.findall(r"```python\n(.*?)```", text[start:end], re.S)
    return out


def test_the_library_blocks_in_docs_run_in_order(monkeypatch, capsys):
    """Two real torchrun jobs (one diverges on purpose) serve every block of the three sections."""
    blocks = _blocks()
    assert len(blocks) == 6, "a block of docs/library.md was added or lost: count it here"
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("HALO_SCHED_BACKEND", raising=False)
    monkeypatch.delenv("HALO_RESULT_FILE", raising=False)
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/library.md block {i}", "exec"), namespace)  # noqa: S102 - the documented examples
    out = capsys.readouterr().out
    runs = namespace["runs"]
    assert f"'{runs[0].id}', 'COMPLETED', {{'loss'" in out, out  # list()'s row carries rank 0's value
    assert "['--lr', '0.1']" in out and "COMPLETED" in out, out  # describe(): the spec and the kept result
