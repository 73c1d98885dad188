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
- ``jobids.py``: which backend each job id went to
"""
from __future__ import annotations

import io
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
        sys.stderr.write("\r\033[K")
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
            self.stream.write("\r\033[K" + line + ("\n" if state.status.terminal else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def tick(self, state) -> None:
        if self.tty and not state.status.terminal:
            self.stream.write("\r\033[K" + self._line(state))
            self.stream.flush()


class PipeGuard:
    """sys.stdout or sys.stderr, minus the broken pipe: when the reader goes away (``| head``),
    the stream's descriptor is pointed at /dev/null (as Python's documentation of SIGPIPE
    advises) and everything after is discarded. The command itself carries on to its own exit
    code, which a pipeline under ``set -o pipefail`` then sees; no write, flush or interpreter
    exit raises BrokenPipeError. ``broken`` tells a command that streams (``logs``) to stop."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

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

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._discard()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._discard()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

