"""Tag each output line with where it came from: ``[node K rank R] text`` (or ``[node K] text``).

Lines reach us with the node in front, put there by the backend (local and Nomad: ``[node K] ``;
SLURM's ``srun --label``: ``K: ``), and, for a rank's own output, torchrun's ``[rank R] `` after
it (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, set by the entry script). Lines that are not a
rank's (the entry script, torchrun itself) keep the node alone.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator, NamedTuple

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


#: The streams a line may come from, where the backend keeps them apart (``LogLine.stream``).
STREAMS = ("stdout", "stderr")
#: What a backend knows of each line besides its text (``Scheduler.log_fields``): when it was
#: written (``time``) and which stream it came from (``stream``).
TIME, STREAM = "time", "stream"


class Raw(str):
    """A line as a backend reads it (``[node K] text``), with what that backend knows of it:
    ``time`` (epoch seconds: local, when its supervisor read the line) and ``stream`` (``stdout``
    or ``stderr``: local, Nomad); None where it does not know. A plain ``str`` knows neither."""

    time: float | None
    stream: str | None

    def __new__(cls, line: str, time: float | None = None, stream: str | None = None) -> "Raw":
        self = super().__new__(cls, line)
        self.time, self.stream = time, stream
        return self


class LogLine(str):
    """One output line as data: ``node``, ``rank`` (None where the line does not say), ``text``
    (the line's own words, without the tag or the line end), and where the backend keeps them,
    ``time`` (epoch seconds) and ``stream`` (``stdout``/``stderr``), else None. The string itself
    is the line exactly as ``halo-sched logs`` prints it, ``[node K rank R] text`` with its newline."""

    node: int | None
    rank: int | None
    text: str
    time: float | None
    stream: str | None

    def __new__(cls, line: str) -> "LogLine":
        node, rank, text = split(line)
        self = super().__new__(cls, tag(line))
        self.node, self.rank, self.text = node, rank, text.rstrip("\r\n")
        self.time, self.stream = getattr(line, "time", None), getattr(line, "stream", None)
        return self

    def __repr__(self) -> str:
        return f"LogLine(node={self.node!r}, rank={self.rank!r}, text={self.text!r})"


#: The longest ``--grep`` pattern taken.
MAX_PATTERN = 1000


class LogFilter(NamedTuple):
    """Which lines ``halo-sched logs`` and ``Job.logs()`` keep: one node's, one rank's, those
    whose text a regular expression finds (``grep``), those written at or after ``since`` (epoch
    seconds), those of one stream. Made by :func:`log_filter`, which checks each against what
    the backend can tell."""

    node: int | None = None
    rank: int | None = None
    grep: "re.Pattern | None" = None
    since: float | None = None
    stream: str | None = None

    def keeps(self, item: LogLine) -> bool:
        return ((self.node is None or item.node == self.node) and (self.rank is None or item.rank == self.rank)
                and (self.stream is None or item.stream == self.stream)
                and (self.since is None or (item.time is not None and item.time >= self.since))
                and (self.grep is None or self.grep.search(item.text) is not None))


def log_filter(node: int | None = None, rank: int | None = None, grep: str | None = None,
               since: float | None = None, stream: str | None = None, *, backend: str = "",
               fields: Iterable[str] = (), flag: str = "--") -> LogFilter:
    """The filter of ``halo-sched logs --node --rank --grep --since --stream`` and of the
    library's ``logs(node=, rank=, grep=, since=, stream=)`` alike (``flag``: the prefix their
    names carry in an error, ``--`` or none). ``fields``: what the backend keeps of each line
    (``Scheduler.log_fields``): a filter it cannot answer is a UsageError naming it, never an
    empty answer. ``since``: epoch seconds (the CLI's and the library's forms are read into them
    before: values.parse_since)."""
    from .errors import UsageError, shown

    fields = set(fields)
    pattern = None
    if grep is not None:
        if not isinstance(grep, str) or len(grep) > MAX_PATTERN:
            raise UsageError(f"{flag}grep: give a regular expression of at most {MAX_PATTERN} characters")
        try:
            pattern = re.compile(grep)
        except re.error as err:
            raise UsageError(f"{flag}grep {shown(grep)}: not a regular expression ({err})") from None
    if stream is not None:
        if stream not in STREAMS:
            raise UsageError(f"{flag}stream {shown(stream)}: give stdout or stderr")
        if STREAM not in fields:
            raise UsageError(f"{flag}stream: the {backend} backend keeps a job's stdout and stderr in one output, "
                             "line by line indistinguishable (local and Nomad keep them apart: docs/cli.md)")
    if since is not None and TIME not in fields:
        raise UsageError(f"{flag}since: the {backend} backend's output keeps no time per line (the local "
                         "backend's does: docs/cli.md)")
    return LogFilter(node, rank, pattern, since, stream)


def parsed(lines: Iterable[str], node: int | None = None, rank: int | None = None,
           keep: LogFilter | None = None) -> Iterator[LogLine]:
    """The lines ``keep`` keeps (:func:`log_filter`), else those of ``node`` and/or ``rank``
    (the CLI's ``--node``/``--rank``), as :class:`LogLine`."""
    keep = keep if keep is not None else LogFilter(node, rank)
    for line in lines:
        item = LogLine(line)
        if keep.keeps(item):
            yield item


def select(lines: Iterable[str], node: int | None = None, rank: int | None = None,
           keep: LogFilter | None = None) -> Iterator[str]:
    """The lines kept, each tagged (``halo-sched logs``): :func:`parsed`."""
    return parsed(lines, node, rank, keep)
