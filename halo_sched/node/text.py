"""Text that came from a job, made safe to carry and to show. Standard library only.

A job's output is hostile: a rank can print a JSON escape of a lone surrogate (``\\ud800``),
which Python's ``json`` decodes into a ``str`` that no UTF-8 stream can write and strict JSON
parsers refuse, and it can print terminal control sequences (``ESC]0;title BEL``, ``ESC[2J``)
that retitle a window or clear the screen of whoever reads a status line.

- :func:`valid_text` at the point job text enters halo-sched (parsing its lines and records):
  a lone surrogate becomes U+FFFD, so it never reaches a record, JSON output or a webhook.
- :func:`escape_controls` where text reaches a terminal: control characters (C0 but tab and new
  line, DEL, C1) and the invisible characters that reorder or hide text (bidi overrides,
  zero-width spaces) are shown as escapes (``\\x1b``, ``\\u202e``) that a reader can see and a
  terminal does not act on.
"""
from __future__ import annotations

import errno
import os
import re
import stat

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064"
                      "\u2066-\u2069\ufeff\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate (what ``json.loads`` makes of ``"\\ud800"``) replaced by
    U+FFFD: a ``str`` that every UTF-8 writer and strict JSON parser accepts."""
    return _SURROGATE.sub("\ufffd", text)


def valid_data(value):
    """A value decoded from JSON with :func:`valid_text` applied to every string in it, keys too
    (the same object when nothing needed replacing)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list):
        return [valid_data(v) for v in value]
    if isinstance(value, dict):
        return {valid_data(k) if isinstance(k, str) else k: valid_data(v) for k, v in value.items()}
    return value


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_controls(text: str) -> str:
    """``text`` for a terminal: every control or invisible reordering character as a visible
    escape (``ESC`` -> ``\\x1b``); tab and new line stay."""
    return _CONTROL.sub(_escape, text)


#: The latest time a job's record or output may name (2**34 s: the year 2514): 1e300, Infinity or
#: NaN are no clock's, and overflow every clock that shows them (``localtime``).
MAX_TIME = float(2 ** 34)


def epoch_time(value) -> float | None:
    """A time read from a job's output, a record or a scheduler (epoch seconds) that every clock
    can show: a finite number within [0, MAX_TIME), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return value if 0 <= value < MAX_TIME else None



def open_regular(path, append: bool = False):
    """``path`` opened as UTF-8 text (bad bytes replaced) for reading, or with ``append`` for
    appending (created 0644 when missing), when it is a regular file; else OSError, at once. A
    file a job can name or put there is no promise: anyone who can write its directory can put a
    FIFO at the path, and ``open`` would wait for the other end forever (a device would be read
    forever), holding the batch script's nodes or a ``status``."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT) if append else os.O_RDONLY
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)  # a FIFO: no wait
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fsdecode(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a" if append else "r", encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise
