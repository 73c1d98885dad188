"""Tag each output line with where it came from: ``[node K rank R] text`` (or ``[node K] text``).

Lines reach us with the node in front, put there by the backend (local and Nomad: ``[node K] ``;
SLURM's ``srun --label``: ``K: ``), and, for a rank's own output, torchrun's ``[rank R] `` after
it (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, set by the entry script). Lines that are not a
rank's (the entry script, torchrun itself) keep the node alone.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

_NODE = re.compile(r"^(?:\[node (\d+)\] |\s*(\d+): )")
_RANK = re.compile(r"^\[rank (\d+)\] ")


def split(line: str) -> tuple[int | None, int | None, str]:
    """(node, rank, text) of one output line; None where the line does not say."""
    node = rank = None
    m = _NODE.match(line)
    if m:
        node = int(m.group(1) or m.group(2))
        line = line[m.end():]
    m = _RANK.match(line)
    if m:
        rank = int(m.group(1))
        line = line[m.end():]
    return node, rank, line


def tag(line: str) -> str:
    node, rank, text = split(line)
    if node is None:
        return line
    return f"[node {node}{f' rank {rank}' if rank is not None else ''}] {text}"


class LogLine(str):
    """One output line as data: ``node``, ``rank`` (None where the line does not say) and
    ``text`` (the line's own words, without the tag or the line end). The string itself is the
    line exactly as ``halo-sched logs`` prints it, ``[node K rank R] text`` with its newline."""

    node: int | None
    rank: int | None
    text: str

    def __new__(cls, line: str) -> "LogLine":
        node, rank, text = split(line)
        self = super().__new__(cls, tag(line))
        self.node, self.rank, self.text = node, rank, text.rstrip("\r\n")
        return self

    def __repr__(self) -> str:
        return f"LogLine(node={self.node!r}, rank={self.rank!r}, text={self.text!r})"


def parsed(lines: Iterable[str], node: int | None = None, rank: int | None = None) -> Iterator[LogLine]:
    """The lines of ``node`` and/or ``rank`` (the CLI's ``--node``/``--rank``), as :class:`LogLine`."""
    for line in lines:
        item = LogLine(line)
        if (node is None or item.node == node) and (rank is None or item.rank == rank):
            yield item


def select(lines: Iterable[str], node: int | None = None, rank: int | None = None) -> Iterator[str]:
    """The lines of ``node`` and/or ``rank``, each tagged (``halo-sched logs``): :func:`parsed`."""
    return parsed(lines, node, rank)
