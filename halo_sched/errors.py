"""Errors a user can act on. The CLI maps each to an exit code and a message, never a traceback."""
from __future__ import annotations


class HaloError(Exception):
    """Base class: anything halo-sched reports to a user."""

    exit_code = 1


class SpecError(HaloError):
    """The job file (or options) are invalid. Each problem names its field."""

    exit_code = 2

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        lines = [f"{where}invalid job spec ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"]
        lines += [f"  {field or '<root>'}: {msg}" for field, msg in problems]
        super().__init__("\n".join(lines))


class UsageError(HaloError):
    """A bad command-line option or a backend that cannot do what was asked."""

    exit_code = 2


class SchedulerError(HaloError):
    """The scheduler refused or failed a request (sbatch error, Nomad 4xx, ...)."""

    exit_code = 1


class MissingDependency(HaloError):
    """An optional transport's library is not installed or built for another version."""

    exit_code = 2
