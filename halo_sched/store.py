"""halo-sched's state directory and the small files in it, read and written safely: the job
records (records.py), the node ledger (ledger.py) and the local backend's jobs live here. Nothing
else: it loads fast (the render path reads the ledger through it).
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

#: The largest file of the store read whole (a job record, the ledger).
MAX_RECORD_BYTES = 4 << 20
#: The deepest nesting of a value the store reads: a job file nests at most 64 levels (spec.py),
#: its record a few more. Deeper is not a record, and would exhaust Python's recursion on the way
#: (json.loads, a copy, a comparison): one such file or row costs only itself.
MAX_NESTING = 100


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value`` (dicts and lists) nests more than ``limit`` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))
    return False


def deep_text(text: str | bytes, limit: int = MAX_NESTING) -> bool:
    """A cheap first look: JSON ``text`` with fewer than ``limit`` opening brackets cannot nest deeper."""
    if isinstance(text, str):
        return text.count("{") + text.count("[") > limit
    return text.count(b"{") + text.count(b"[") > limit


def home() -> Path:
    """halo-sched's state directory: job records (``jobs/``) and the local backend's jobs (``local/``)."""
    env = os.environ.get("HALO_SCHED_HOME")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "halo-sched"


def check_home() -> Path:
    """:func:`home`, refused (exit 2, naming the variable it came from) when it names something
    that is not a directory (a file, or a path through one): every command that keeps state
    would otherwise fail deep inside with NotADirectoryError."""
    from .errors import UsageError

    where = home()
    var = "HALO_SCHED_HOME" if os.environ.get("HALO_SCHED_HOME") else (
        "XDG_STATE_HOME" if os.environ.get("XDG_STATE_HOME") else "the state directory")
    try:
        st = os.stat(where)
    except FileNotFoundError:
        return where  # made when first written
    except OSError as err:  # ENOTDIR: a file on the way; EACCES; ELOOP
        raise UsageError(f"{var}: {str(where)[:200]!r} cannot be used as halo-sched's state directory "
                         f"({err.strerror or err})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{var}: {str(where)[:200]!r} is not a directory (halo-sched keeps its job records "
                         "there); name a directory")
    return where


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # the rename itself survives a crash once the directory is synced
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


class Unreadable(ValueError):
    """A file of the store that cannot be used: not a regular file, too big, not JSON, wrong types."""


def read_small(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a small regular file, never blocking: a FIFO, device or directory of that name
    is :class:`Unreadable` (checked with lstat, then opened O_NONBLOCK and checked again, so a
    file swapped in between cannot block either), and so is a file over ``limit`` bytes.
    A missing file raises FileNotFoundError; other OSErrors propagate."""
    limit = MAX_RECORD_BYTES if limit is None else limit
    try:
        st = os.lstat(path)
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise FileNotFoundError(errno.ENOENT, "no such file (name too long)", str(path)) from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable("not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC  # POSIX, as is the whole tool
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Unreadable("not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable("not a regular file")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Unreadable(f"larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: Path, limit: int | None = None) -> Any:
    """A small JSON file (see :func:`read_small`); bad JSON is :class:`Unreadable` with a short reason."""
    data = read_small(path, limit)
    try:
        value = json.loads(data)
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8 text") from None
    except json.JSONDecodeError as err:
        if err.pos >= len(data.rstrip()) or err.msg.startswith("Unterminated string"):
            raise Unreadable(f"truncated JSON ({len(data)} bytes)") from None
        raise Unreadable(f"not valid JSON ({err.msg}, byte {err.pos})") from None
    except ValueError as err:  # a number too long to convert, for one
        raise Unreadable(f"not valid JSON ({err})") from None
    except RecursionError:
        raise Unreadable("nested too deeply") from None
    if deep_text(data) and too_deep(value):
        raise Unreadable(f"nested more than {MAX_NESTING} levels deep")
    if b"\\ud" in data.lower() or b"\xed" in data:
        # A lone surrogate, escaped ("\ud800") or as raw bytes (json decodes bytes with
        # surrogatepass): U+FFFD, so that no str read here fails a later write or print.
        from .node.text import valid_data

        value = valid_data(value)
    return value
