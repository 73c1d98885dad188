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


#: The variable that names the home.
HOME_VAR = "HALO_SCHED_HOME"


def home() -> Path:
    """halo-sched's state directory: job records (``jobs/``) and the local backend's jobs (``local/``)."""
    env = os.environ.get(HOME_VAR)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "halo-sched"


def _var() -> str:
    """The variable the home came from, for an error that must name it."""
    if os.environ.get("HALO_SCHED_HOME"):
        return "HALO_SCHED_HOME"
    if os.environ.get("XDG_STATE_HOME"):
        return "XDG_STATE_HOME"
    return "the state directory (HALO_SCHED_HOME unset)"


def check_home() -> Path:
    """:func:`home`, refused (exit 2, naming the variable it came from) when it names something
    that is not a directory (a file, a path through one, a symbolic link to nothing), a shared
    directory (the sticky bit, as /tmp has), or one this user cannot read: every command that
    keeps state would otherwise fail deep inside. A home that exists is kept private to its
    owner (:func:`keep_private`)."""
    from .errors import UsageError

    where = home()
    var = _var()
    try:
        st = os.stat(where)
    except FileNotFoundError:
        if os.path.islink(where):  # a symbolic link to nothing: made when first written would fail
            try:
                target = os.readlink(where)
            except OSError:
                target = "?"
            raise UsageError(f"{var}: {str(where)[:200]!r} is a symbolic link to {target[:200]!r}, which does not "
                             "exist; create that directory, or name another") from None
        return where  # made when first written (make_home)
    except OSError as err:  # ENOTDIR: a file on the way; EACCES; ELOOP
        raise UsageError(f"{var}: {str(where)[:200]!r} cannot be used as halo-sched's state directory "
                         f"({err.strerror or err})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{var}: {str(where)[:200]!r} is not a directory (halo-sched keeps its job records "
                         "there); name a directory")
    if st.st_mode & stat.S_ISVTX:
        raise UsageError(f"{var}: {str(where)[:200]!r} is a shared directory (sticky bit, as /tmp has); halo-sched "
                         "keeps each user's job records private: name a directory of your own in it")
    if not os.access(where, os.R_OK | os.X_OK):
        raise UsageError(f"{var}: {str(where)[:200]!r} cannot be read by this user (uid {os.geteuid()}); name "
                         "a directory of your own, or fix its permissions")
    keep_private(where, st)
    return where


def make_home() -> Path:
    """The home, made private (0700) when it does not exist yet: whatever writes first into the
    home (a record, a local job, a keeper) comes here first. A home that cannot be made or
    written is exit 2 naming the variable."""
    from .errors import UsageError

    where = check_home()
    if not os.path.isdir(where):
        try:
            os.makedirs(where, mode=0o700, exist_ok=True)  # the home itself 0700; missing parents as usual
        except OSError as err:  # EACCES, EROFS; EEXIST: a symbolic link to nothing on the way
            raise UsageError(f"{_var()}: {str(where)[:200]!r} cannot be created ({err.strerror or err}); halo-sched "
                             "keeps its job records there: name a directory you can write") from None
        where = check_home()
    if not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"{_var()}: {str(where)[:200]!r} cannot be written by this user (uid {os.geteuid()}); "
                         "halo-sched keeps its job records and local jobs there: name a directory you can write, or "
                         "fix its permissions (reading commands still read it)")
    return where


#: The files of the store checked at every open (the home's own mode guards the rest).
_STORE_FILES = ("halo-sched.db", "halo-sched.db-wal", "halo-sched.db-shm")
_kept: set[str] = set()


def _private_mode(mode: int) -> int:
    return stat.S_IMODE(mode) & ~0o077


def keep_private(where: Path, st: os.stat_result | None = None) -> list[str]:
    """Keep the home private to its owner, as ssh keeps ``~/.ssh`` (issue 43): every record holds
    the job's failure key, its failure tails and its environment's names. Checked once per process
    and home: a home open to others (made by an earlier release: 0755, its database 0644) has the
    group and other bits taken off it and everything in it (directories 0700, files 0600; the
    owner's own bits are kept, so a read-only store stays read-only), said once on stderr. A home
    of another user is left as it is (said once). What was tightened, for the tests."""
    import sys

    key = str(where)
    if key in _kept:
        return []
    _kept.add(key)
    st = st or os.stat(where)
    if st.st_uid != os.geteuid():
        print(f"halo-sched: warning: {_var()} {key[:200]!r} belongs to uid {st.st_uid}, not to this user (uid "
              f"{os.geteuid()}): halo-sched cannot keep it private", file=sys.stderr)
        return []
    loose: dict[str, int] = {}
    if stat.S_IMODE(st.st_mode) & 0o077:
        loose[key] = st.st_mode
    for name in _STORE_FILES:
        try:
            fst = os.lstat(where / name)
        except OSError:
            continue
        if stat.S_ISREG(fst.st_mode) and stat.S_IMODE(fst.st_mode) & 0o077:
            loose[str(where / name)] = fst.st_mode
    if not loose:
        return []
    if stat.S_IMODE(st.st_mode) & 0o077:  # the home was open: so may be anything in it
        for top, dirs, files in os.walk(where, followlinks=False):
            for name in dirs + files:
                p = os.path.join(top, name)
                try:
                    fst = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISLNK(fst.st_mode) and stat.S_IMODE(fst.st_mode) & 0o077:
                    loose[p] = fst.st_mode
    failed = ""
    for p, mode in loose.items():
        try:
            os.chmod(p, _private_mode(mode))
        except OSError as err:
            failed = failed or (err.strerror or str(err))
    first = list(loose.items())[:3]
    shown = ", ".join(f"{os.path.relpath(p, where) if p != key else 'the directory'} {stat.S_IMODE(m):04o}"
                      for p, m in first) + (f" and {len(loose) - 3} more" if len(loose) > 3 else "")
    if failed:
        print(f"halo-sched: warning: {_var()} {key[:200]!r} is open to other users ({shown}) and could not be made "
              f"private ({failed}); make it 0700 yourself (chmod -R go= {key[:200]})", file=sys.stderr)
    else:
        print(f"halo-sched: {_var()} {key[:200]!r} was open to other users ({shown}); made it private to its owner "
              "(directories 0700, files 0600, as ssh keeps ~/.ssh)", file=sys.stderr)
    return list(loose)


def atomic_write(path: Path, data: bytes) -> None:
    if home() in path.parents:
        make_home()  # a home made here is private from the start (0700)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
