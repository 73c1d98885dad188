"""The commands of ``halo-sched``, one module per group; halo_sched/cli.py parses the command line
and runs the one named (its ``COMMANDS`` table says which module holds each), so start-up imports
only that command's module.

This module holds what the commands and the CLI write to the terminal: a line on stderr
(``say``), an outage line, the live progress of a wait, and the guard that keeps a reader going
away (``| head``) from breaking a command. Standard library only: every command's start-up
imports it.

Each command is ``cmd_NAME(args, scheduler) -> exit code``: ``args`` is the parsed command line,
``scheduler(backend)`` gives a backend's scheduler (halo_sched.cli passes its ``_scheduler``, which
tests replace). Errors are raised as ``HaloError``; the CLI prints them and exits with their code.

- ``jobfile.py``: commands that read a job file (validate, render, plan, schema, preflight)
- ``wait.py``: submit and watch (waiting for a job's end, a run's retries)
- ``show.py``: status, list and logs (reading jobs)
- ``manage.py``: cancel, nodes (the node ledger) and gc (Nomad secrets)
- ``completion.py``: the shell completion scripts, made from the parser
- ``jobids.py``: which backend each job id went to
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
import time


def say(msg: str) -> None:
    """One line on stderr, flushed (human text: stdout is for results)."""
    print(msg, file=sys.stderr, flush=True)


def outage_line(line: str) -> None:
    """A line about the scheduler being unreachable, on a line of its own (a terminal's
    rewritten progress line is cleared first)."""
    if sys.stderr.isatty():
        raw(sys.stderr, "\r\033[K")
    say(f"halo-sched: {line}")


class Progress:
    """Live progress for --wait: one rewritten line on a terminal, plain lines otherwise."""

    def __init__(self, scheduler, job_id: str, stream=None):
        # sys.stderr at call time, not at import (it may have been replaced since).
        self.scheduler, self.job_id, self.stream = scheduler, job_id, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()

    def _line(self, state) -> str:
        el = int(time.monotonic() - self.start)
        return f"[{el // 60:02d}:{el % 60:02d}] {self.job_id}: {self.scheduler.progress(state)}"

    def change(self, state) -> None:
        line = self._line(state)
        if self.tty:
            raw(self.stream, "\r\033[K")
            self.stream.write(line + ("\n" if state.status.terminal else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def tick(self, state) -> None:
        if self.tty and not state.status.terminal:
            raw(self.stream, "\r\033[K")
            self.stream.write(self._line(state))
            self.stream.flush()


class PipeGuard:
    """sys.stdout or sys.stderr for the CLI: whatever a command writes reaches the terminal
    escaped, and a stream that cannot be written never breaks the command.

    - Escaped: every text a job produced (a rank's error line, a host name, a log line) can hold
      terminal control sequences; each write goes through ``escape`` (the CLI passes
      ``halo_sched.node.text.escape_controls``), so none reaches a terminal, whichever path it
      took. What must reach the stream as it is goes through :meth:`raw`: halo-sched's own
      control sequences (the rewritten progress line), and a rendered job (``render``,
      ``submit --dry-run``), which is the user's own job file made script, byte for byte.
    - A reader that goes away (``| head``): the stream's descriptor is pointed at /dev/null (as
      Python's documentation of SIGPIPE advises) and everything after is discarded; the command
      carries on to its own exit code, which a pipeline under ``set -o pipefail`` then sees.
      ``broken`` tells a command that streams (``logs``) to stop.
    - A closed stream (``>&-``: Python then has None for it) or one that fails to write (a full
      disk): the output is discarded, ``lost`` says so, and the CLI says it once on stderr; the
      command's action and exit code stand.
    """

    def __init__(self, stream, escape):
        self._stream, self._escape = stream, escape
        self.broken = stream is None
        #: Why output cannot be written (None: it can, or the reader went away, which is no
        #: fault); ``dropped``: some was lost for that reason.
        self.lost: str | None = "is closed" if stream is None else None
        self.dropped = False

    def _discard(self) -> None:
        self.broken = True
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return
        try:
            self._stream.flush()  # what the buffer still holds goes to /dev/null now
        except (OSError, ValueError):
            pass

    def _failed(self, err: Exception) -> None:
        if not isinstance(err, BrokenPipeError):
            self.lost = f"cannot be written ({getattr(err, 'strerror', None) or err})"
        self._discard()

    def _write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as err:  # ValueError: the stream was closed
                self._failed(err)
        if self.lost and text:
            self.dropped = True
        return len(text)

    def write(self, text: str) -> int:
        return self._write(self._escape(text))

    def raw(self, text: str) -> None:
        """Write ``text`` as it is: halo-sched's own terminal control, or a rendered job (never
        a job's output)."""
        self._write(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError) as err:
                self._failed(err)

    def isatty(self) -> bool:
        if self.broken:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def raw(stream, text: str) -> None:
    """Write ``text`` to ``stream`` past its escaping (see :meth:`PipeGuard.raw`)."""
    (stream.raw if isinstance(stream, PipeGuard) else stream.write)(text)


def json_line(value) -> str:
    """One JSON document on one line for stdout: strict JSON whatever the value holds (a number
    that is not finite, read from a file, is null: ``Infinity`` and ``NaN`` are not JSON), and
    ASCII (so no text a job produced can drive a terminal)."""
    return json.dumps(_finite(value))


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
