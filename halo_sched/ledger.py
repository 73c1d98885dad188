"""The node ledger: hosts that failed a job as a node would, for a while, so new jobs avoid them.

``$HALO_SCHED_HOME/nodes.json`` (see :func:`halo_sched.store.home`)::

    {"version": 1,
     "entries": [{"host": "h2", "reason": "NCCL network error", "job": "1234", "backend": "slurm",
                  "by": "nccl-system", "since": 1764590000.0, "expires": 1764676400.0}]}

Who writes: whichever halo-sched process observes a node-class failure (halo_sched/node/
failure_classes.py) where job records are updated (``status``, ``submit --wait``, ``watch``,
``list``: :func:`halo_sched.records.update_state`). One entry per job and host: seeing the same
failure again changes nothing. An entry lasts ``HALO_SCHED_NODE_EXPIRY_HOURS`` (default 24) from
when it was first written; expired entries are dropped at the next write.

Concurrency: every change takes an exclusive ``fcntl.flock`` on ``nodes.lock`` beside the file,
reads the file, changes it and writes a temporary file in the same directory, fsynced and
renamed over ``nodes.json`` (atomic on POSIX). Readers take no lock: they always see a whole file,
the old one or the new one. Two processes adding at once both land (tests/test_ledger.py).

A file that is torn, not JSON, of the wrong shape, or written by a newer version (``version`` >
:data:`VERSION`) is reported with one warning line and treated as empty: never fatal to
``submit`` or ``render``; so is one with an entry whose times are not finite or are more than
:data:`MAX_EXPIRY_HOURS` apart (``"expires": Infinity`` would fence a host off for ever). A
writer then leaves such a file alone (it would lose a newer version's entries) and warns
instead; ``halo-sched nodes clear`` says so.
"""
from __future__ import annotations

import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import store
from .errors import UsageError

VERSION = 1
DEFAULT_EXPIRY_HOURS = 24.0
EXPIRY_ENV = "HALO_SCHED_NODE_EXPIRY_HOURS"
MAX_BYTES = 4 << 20
#: A host name as schedulers report it: an RFC 1123 label or dotted name (SLURM NodeName, Nomad
#: node name). Nothing else can reach ``--exclude=`` or a Nomad constraint.
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}))*")
MAX_HOST_CHARS = 253
#: The longest expiry (ten years), and the latest time an entry may start (2**34 s: year 2514).
MAX_EXPIRY_HOURS = 24 * 365 * 10
MAX_TIME = float(2 ** 34)


def path() -> Path:
    return store.home() / "nodes.json"


def _lock_path() -> Path:
    return store.home() / "nodes.lock"


def valid_host(host: Any) -> bool:
    return isinstance(host, str) and len(host) <= MAX_HOST_CHARS and HOST_RE.fullmatch(host) is not None


def check_host(host: Any, field: str = "HOST") -> str:
    if not valid_host(host):
        raise UsageError(f"{field}: {host!r} is not a host name (letters, digits, '-', '_', dots between labels)")
    return host


def expiry_hours(value: Any = None) -> float:
    """The ledger's expiry in hours: ``value``, else ``$HALO_SCHED_NODE_EXPIRY_HOURS``, else 24.
    Not a positive finite number: UsageError naming it (exit 2)."""
    field = "--expiry-hours"
    if value is None:
        value = os.environ.get(EXPIRY_ENV)
        field = EXPIRY_ENV
        if value is None or value == "":
            return DEFAULT_EXPIRY_HOURS
    try:
        hours = float(value)
    except (TypeError, ValueError):
        hours = float("nan")
    if not math.isfinite(hours) or hours <= 0 or hours > MAX_EXPIRY_HOURS:
        raise UsageError(f"{field}: {value!r} is not a positive number of hours (at most ten years)")
    return hours


class Entry(NamedTuple):
    host: str
    reason: str
    job: str
    backend: str
    since: float
    expires: float
    by: str = ""

    def active(self, now: float | None = None) -> bool:
        return self.expires > (time.time() if now is None else now)

    def to_dict(self) -> dict:
        return self._asdict()


class Corrupt(ValueError):
    """The ledger file cannot be used (why in words); it is skipped."""


_warned: set[str] = set()


def _warn(why: str) -> None:
    if why in _warned:
        return
    _warned.add(why)
    print(f"halo-sched: warning: skipping the node ledger {path()}: {why}", file=sys.stderr, flush=True)


def _entry(d: Any) -> Entry:
    if not isinstance(d, dict):
        raise Corrupt("an entry is not an object")
    try:
        e = Entry(host=d["host"], reason=d["reason"], job=d["job"], backend=d["backend"],
                  since=float(d["since"]), expires=float(d["expires"]), by=d.get("by", ""))
    except (KeyError, TypeError, ValueError):
        raise Corrupt("an entry lacks host, reason, job, backend, since or expires") from None
    if not valid_host(e.host) or not all(isinstance(x, str) for x in (e.reason, e.job, e.backend, e.by)):
        raise Corrupt("an entry has a field of the wrong type")
    # Times are read, not trusted: Infinity, NaN or 1e300 would fence a host off for ever, and
    # overflow every clock that shows it. An entry lasts at most the longest expiry.
    if not (0 <= e.since < MAX_TIME and e.since <= e.expires <= e.since + MAX_EXPIRY_HOURS * 3600):
        raise Corrupt(f"an entry of {e.host} has since/expires out of range (at most {MAX_EXPIRY_HOURS / 24 / 365:g} "
                      "years apart)")
    return e


def _load() -> list[Entry]:
    """The entries in the file (none when there is no file); Corrupt when it cannot be used."""
    try:
        data = store.read_json(path(), MAX_BYTES)
    except FileNotFoundError:
        return []
    except store.Unreadable as err:
        raise Corrupt(str(err)) from None
    except OSError as err:
        raise Corrupt(err.strerror or type(err).__name__) from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise Corrupt("not a ledger (an object with 'version' and 'entries')")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise Corrupt(f"version {version!r} is not a ledger version")
    if version > VERSION:
        raise Corrupt(f"written by a newer halo-sched (ledger version {version}, this one reads {VERSION})")
    return [_entry(d) for d in data["entries"]]


def entries() -> list[Entry]:
    """Every entry, expired or not; a bad file is reported once and reads as empty."""
    try:
        return _load()
    except Corrupt as err:
        _warn(str(err))
        return []


def active(now: float | None = None) -> list[Entry]:
    """The entries not yet expired, oldest first."""
    now = time.time() if now is None else now
    return sorted((e for e in entries() if e.active(now)), key=lambda e: (e.since, e.host))


def active_hosts(now: float | None = None) -> tuple[str, ...]:
    """The hosts new jobs avoid, sorted, each once."""
    return tuple(sorted({e.host for e in active(now)}))


class _Locked:
    """An exclusive lock on the ledger for one read-change-write."""

    def __enter__(self):
        import fcntl

        lp = _lock_path()
        lp.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(lp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def _save(items: list[Entry]) -> None:
    import json

    data = {"version": VERSION, "entries": [e.to_dict() for e in items]}
    store.atomic_write(path(), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def add(host: str, reason: str, job: str, backend: str, *, by: str = "", now: float | None = None,
        hours: float | None = None) -> Entry | None:
    """Ledger ``host`` for the failure of ``job`` on ``backend``; the entry (the one already there
    for this job and host, unchanged), or None when the file cannot be written over (corrupt or
    newer: warned) or ``host`` is not a host name."""
    if not valid_host(host):
        return None
    now = time.time() if now is None else now
    hours = expiry_hours() if hours is None else hours
    with _Locked():
        try:
            items = _load()
        except Corrupt as err:
            _warn(f"{err}; not recording {host}")
            return None
        for e in items:
            if e.host == host and e.job == job and e.backend == backend:
                return e
        new = Entry(host=host, reason=reason, job=job, backend=backend, since=now, expires=now + hours * 3600, by=by)
        _save([e for e in items if e.active(now)] + [new])
        return new


def clear(host: str) -> int:
    """Forget every entry of ``host``; how many there were (0: the ledger does not know it)."""
    check_host(host)
    with _Locked():
        try:
            items = _load()
        except Corrupt as err:
            raise UsageError(f"the node ledger {path()} cannot be changed: {err}") from None
        keep = [e for e in items if e.host != host]
        gone = len(items) - len(keep)
        if gone:
            _save(keep)
        return gone


def observe(job: str, backend: str, classification) -> Entry | None:
    """A job was seen to fail as a node would: ledger its host (never raises: a record update
    must not fail over the ledger)."""
    host = getattr(classification, "host", "")
    if not getattr(classification, "node", False) or not host or backend == "local":
        return None  # the local backend runs on this one host: nothing to avoid
    try:
        return add(host, classification.reason, job, backend, by=getattr(classification, "by", ""))
    except UsageError as err:  # a bad expiry in the environment: said once, nothing written
        _warn(str(err))
    except OSError as err:
        _warn(f"cannot write it ({err.strerror or err})")
    return None


class Ledger:
    """The node ledger as one object, for code that prefers one (the module's functions)."""

    add = staticmethod(add)
    active = staticmethod(active)
    active_hosts = staticmethod(active_hosts)
    clear = staticmethod(clear)
    entries = staticmethod(entries)
    observe = staticmethod(observe)
    path = staticmethod(path)


__all__ = ["DEFAULT_EXPIRY_HOURS", "Ledger", "EXPIRY_ENV", "Entry", "VERSION", "active", "active_hosts", "add", "check_host",
           "clear", "entries", "expiry_hours", "observe", "path", "valid_host"]
