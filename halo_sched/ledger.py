"""The node ledger: hosts that failed a job as a node would, for a while, so new jobs avoid them.

One table of the history store (halo_sched/db.py): an entry per (host, job, backend) with the
reason, the failure class's ``by``, ``since`` and ``expires``.

Who writes: whichever halo-sched process observes a node-class failure (halo_sched/node/
failure_classes.py) where job records are updated (``status``, ``submit --wait``, ``watch``,
``list``: :func:`halo_sched.core.keep_state`). One entry per job and host: seeing the same
failure again changes nothing (``INSERT OR IGNORE`` in one transaction, so concurrent observers
land once and never lose each other's entries). An entry lasts ``HALO_SCHED_NODE_EXPIRY_HOURS``
(default 24, at most ten years) from when it was first written; expired entries are dropped at
the next write.

What fences a host off (:func:`exclusions`): a node fault known from the node's side (the
scheduler's word, the node's own evidence, a signal nothing in the job sent: node/failure_classes.py)
fences it at once; a failure only its rank's words blame on the node (an Xid or NCCL line it
printed: ``Classification.said``) is kept too, marked ``by`` ``rank-said:PATTERN``, and fences the
host only once :data:`REPEATED` different jobs failed so there within the expiry: repeated failures
there, not one printed line.

Earlier releases kept the ledger in ``$HALO_SCHED_HOME/nodes.json``: the store imports it once
(renamed ``nodes.json.imported`` after). A file that is torn, not JSON, of the wrong shape, or
written by a newer version is not imported: one warning line per process says why, and it stays
as it is. An entry whose times are not finite, or that would last more than ten years, is
dropped on import (a hand edit must not fence a host off for ever).
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import store
from .node.failure_classes import Classification
from .node.text import MAX_TIME
from .errors import UsageError
from .values import valid_host

VERSION = 1
DEFAULT_EXPIRY_HOURS = 24.0
EXPIRY_ENV = "HALO_SCHED_NODE_EXPIRY_HOURS"
MAX_BYTES = 4 << 20
#: The longest expiry (ten years), and the latest time an entry may start (2**34 s: year 2514).
MAX_EXPIRY_HOURS = 24 * 365 * 10
#: How many different jobs must have failed on a host, each blamed on the node by its rank's own
#: words alone, before new jobs avoid that host ("repeated failures there").
REPEATED = 2
#: The ``by`` of an entry that only a rank's words support (then the failure pattern's name).
SAID = "rank-said:"


def path() -> Path:
    """Where the ledger is (the history store)."""
    from . import db

    return db.path()


def legacy_path() -> Path:
    """Where earlier releases kept it (imported into the store: :func:`import_file`)."""
    return store.home() / "nodes.json"


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

    @property
    def said(self) -> bool:
        """Only its rank's words blamed the node: it fences the host only with REPEATED jobs."""
        return self.by.startswith(SAID)

    def to_dict(self) -> dict:
        return self._asdict()


class Corrupt(ValueError):
    """The ledger file of an earlier release cannot be used (why in words); it is not imported."""


_warned: set[str] = set()


def _warn(why: str, where: Path | None = None) -> None:
    if why in _warned:
        return
    _warned.add(why)
    print(f"halo-sched: warning: skipping the node ledger {where or path()}: {why}", file=sys.stderr, flush=True)


def _entry(d: Any) -> Entry:
    if not isinstance(d, dict):
        raise Corrupt("an entry is not an object")
    try:
        e = Entry(host=d["host"], reason=d["reason"], job=d["job"], backend=d["backend"],
                  since=float(d["since"]), expires=float(d["expires"]), by=d.get("by", ""))
    except (KeyError, TypeError, ValueError, OverflowError):  # noqa: B014
        raise Corrupt("an entry lacks host, reason, job, backend, since or expires") from None
    if not valid_host(e.host) or not all(isinstance(x, str) for x in (e.reason, e.job, e.backend, e.by)):
        raise Corrupt("an entry has a field of the wrong type")
    return e


def _sane(e: Entry) -> bool:
    """Times are read, not trusted: Infinity, NaN or 1e300 would fence a host off for ever and
    overflow every clock that shows it. An entry starts before MAX_TIME and lasts at most the
    longest expiry."""
    return 0 <= e.since < MAX_TIME and e.since <= e.expires <= e.since + MAX_EXPIRY_HOURS * 3600


def _load_legacy() -> list[Entry]:
    """The entries of an earlier release's ``nodes.json`` (none without one); Corrupt when it
    cannot be used."""
    try:
        data = store.read_json(legacy_path(), MAX_BYTES)
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


def import_file(con) -> int:
    """Import ``nodes.json`` of an earlier release (db.imported calls this under its import lock); how
    many entries. A file that cannot be used stays where it is and says why at every reading."""
    where = legacy_path()
    try:
        items = _load_legacy()
    except Corrupt as err:
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT OR REPLACE INTO meta VALUES ('ledger_legacy_error', ?)", (str(err)[:300],))
        con.execute("COMMIT")
        return 0
    if not where.exists():
        return 0
    sane = [e for e in items if _sane(e)]
    if len(sane) < len(items):
        n = len(items) - len(sane)
        _warn(f"{n} entr{'y' if n == 1 else 'ies'} with since/expires out of range (not finite, or more than "
              f"{MAX_EXPIRY_HOURS / 24 / 365:g} years apart): not imported", where)
    con.execute("BEGIN IMMEDIATE")
    try:
        con.executemany("INSERT OR IGNORE INTO ledger (host, job, backend, reason, by, since, expires) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [(e.host, e.job, e.backend, e.reason, e.by, e.since, e.expires) for e in sane])
        con.execute("DELETE FROM meta WHERE key = 'ledger_legacy_error'")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    try:
        os.replace(where, where.with_name("nodes.json.imported"))
    except OSError:
        pass
    return len(sane)


def _store():
    """The history store, with an earlier release's ``nodes.json`` imported first (db.imported)."""
    from . import db

    db.imported("ledger", legacy_path(), import_file)
    return db


def _rows() -> list[tuple]:
    from . import db

    if not db.exists():  # nothing recorded here: reading the ledger (render) creates no store
        return []
    db = _store()
    if legacy_path().exists():
        why = db.read("SELECT value FROM meta WHERE key = 'ledger_legacy_error'")
        if why:
            _warn(why[0][0], legacy_path())
    return db.read("SELECT host, reason, job, backend, since, expires, by FROM ledger")


def entries() -> list[Entry]:
    """Every entry, expired or not (a row that is not sane, from a hand edit of the store, is skipped)."""
    out = []
    for row in _rows():
        try:
            e = _entry(dict(zip(("host", "reason", "job", "backend", "since", "expires", "by"), row)))
        except Corrupt:
            continue
        if _sane(e):
            out.append(e)
    return out


def active(now: float | None = None) -> list[Entry]:
    """The entries not yet expired, oldest first."""
    now = time.time() if now is None else now
    return sorted((e for e in entries() if e.active(now)), key=lambda e: (e.since, e.host))


def fenced(entries_: list[Entry]) -> set[tuple[str, str]]:
    """The (backend, host) pairs these active entries keep new jobs off: a host with a node-side
    entry, or one that REPEATED different jobs' ranks blamed."""
    out = {(e.backend, e.host) for e in entries_ if not e.said}
    said: dict[tuple[str, str], set[str]] = {}
    for e in entries_:
        if e.said:
            said.setdefault((e.backend, e.host), set()).add(e.job)
    return out | {k for k, jobs in said.items() if len(jobs) >= REPEATED}


def exclusions(now: float | None = None) -> tuple[tuple[str, str], ...]:
    """What new jobs keep off, as (backend, host): the hosts the active entries fence (:func:`fenced`),
    each once, sorted. The backends hand it to the launch plan (``launch.compile_launch(spec,
    ledgered=...)``)."""
    return tuple(sorted(fenced(active(now))))


def add(host: str, reason: str, job: str, backend: str, *, by: str = "", now: float | None = None,
        hours: float | None = None) -> Entry | None:
    """Ledger ``host`` for the failure of ``job`` on ``backend``; the entry (the one already there
    for this job and host, unchanged), or None when ``host`` is not a host name."""
    if not valid_host(host):
        return None
    now = time.time() if now is None else now
    hours = expiry_hours() if hours is None else hours
    reason, by = str(reason)[:300], str(by)[:60]
    with _store().write() as con:
        row = con.execute("SELECT host, reason, job, backend, since, expires, by FROM ledger "
                          "WHERE host = ? AND job = ? AND backend = ?", (host, job, backend)).fetchone()
        if row is not None:
            return Entry(*row[:6], by=row[6])
        con.execute("DELETE FROM ledger WHERE expires <= ?", (now,))
        new = Entry(host=host, reason=reason, job=job, backend=backend, since=now, expires=now + hours * 3600, by=by)
        con.execute("INSERT INTO ledger (host, job, backend, reason, by, since, expires) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (host, job, backend, reason, by, new.since, new.expires))
        return new


def clear(host: str) -> int:
    """Forget every entry of ``host``; how many there were (0: the ledger does not know it)."""
    check_host(host)
    with _store().write() as con:
        return con.execute("DELETE FROM ledger WHERE host = ?", (host,)).rowcount


def observe(job: str, backend: str, classification: Classification) -> Entry | None:
    """A job was seen to fail as a node would: ledger its host (never raises: a record update
    must not fail over the ledger). A failure only its rank's words blame on the node is ledgered
    as such (``by`` SAID + pattern): it fences the host only once REPEATED jobs failed so there."""
    if backend == "local":
        return None  # the local backend runs on this one host: nothing to avoid
    if classification.node and classification.host:
        host, by = classification.host, classification.by
    elif classification.said and classification.suspect:
        host, by = classification.suspect, SAID + classification.by
    else:
        return None
    from .db import ReadOnlyStore

    try:
        return add(host, classification.reason, job, backend, by=by)
    except ReadOnlyStore:  # a read of a store this user cannot write (said once when it opened)
        return None
    except UsageError as err:  # a bad expiry in the environment: said once, nothing written
        _warn(str(err))
    except OSError as err:
        _warn(f"cannot write it ({err.strerror or err})")
    return None


def observe_swaps(job: str, backend: str, swaps) -> list[Entry]:
    """A job's batch script swapped these hosts for spares (their node's fault: the swap line
    says why): ledger each, once per job and host (never raises, as :func:`observe`). A planned
    swap (the host left for maintenance: drained, or reserved) is no fault: never ledgered."""
    from .db import ReadOnlyStore

    out = []
    for s in (s for s in swaps if not s.get("planned")):
        try:
            e = add(s["bad"], s.get("reason") or "swapped for a spare", job, backend, by=s.get("by") or "")
        except ReadOnlyStore:  # a read of a store this user cannot write (said once when it opened)
            break
        except UsageError as err:
            _warn(str(err))
            break
        except OSError as err:
            _warn(f"cannot write it ({err.strerror or err})")
            break
        if e is not None:
            out.append(e)
    return out


__all__ = ["DEFAULT_EXPIRY_HOURS", "EXPIRY_ENV", "Entry", "REPEATED", "SAID", "VERSION", "active", "add", "check_host",
           "clear", "entries", "exclusions", "expiry_hours", "fenced", "import_file", "legacy_path", "observe", "observe_swaps", "path",
           "valid_host"]
