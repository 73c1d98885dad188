"""The history store: one SQLite database in halo-sched's state directory
(``$HALO_SCHED_HOME/halo-sched.db``) holding the job records (records.py), a run's successor
claims (runs.py), the node ledger (ledger.py) and the notification outbox (notify.py).

Why a database: every command reads or changes shared state, from many processes at once (two
watchers, a pipeline's eight workers, ``list`` while ``submit --wait`` runs). In WAL mode one
writer at a time commits whole transactions and readers are never blocked; every
read-modify-write here is one ``BEGIN IMMEDIATE`` transaction (:func:`write`), so no update is
lost whatever the number of processes. Indexes make ``status ID`` and a page of ``list`` cost
the same at 50 records as at 50,000.

The schema carries its version (``PRAGMA user_version``); :data:`MIGRATIONS` takes an older
database forward inside one transaction; a newer one is refused with a clear error. A file that
is not a database, or one locked beyond :data:`BUSY_S`, is a :class:`StoreError` naming the file
and what to do (exit 2), never a traceback.

Records written by earlier releases (one JSON file per job in ``jobs/``, the ledger in
``nodes.json``) are imported before they are first read (:func:`imported`, called by their
owners, records.py and ledger.py), under a lock, each file at most once; a torn or hostile file
costs only itself (it is kept as an unreadable row saying why). The files are moved to
``jobs/imported/`` (and ``nodes.json.imported``) once their import committed. A JSON record
dropped into ``jobs/`` later is imported the same way.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from . import store
from .node.text import valid_text
from .errors import UsageError

FILE_NAME = "halo-sched.db"
#: How long a command waits for another process's write transaction before saying the store is busy.
BUSY_S = 30.0
SCHEMA_VERSION = 2

_SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT NOT NULL,
    backend TEXT NOT NULL,
    submitted REAL NOT NULL DEFAULT 0,
    name TEXT,
    status TEXT,
    run_id TEXT,
    attempt INTEGER,
    data TEXT,           -- the record, JSON; NULL when it could not be used (then bad says why)
    bad TEXT,
    PRIMARY KEY (id, backend)
);
CREATE INDEX IF NOT EXISTS jobs_by_time ON jobs (submitted DESC);
CREATE INDEX IF NOT EXISTS jobs_by_run ON jobs (run_id, attempt);
CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs (name, submitted DESC);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, submitted DESC);
CREATE TABLE IF NOT EXISTS successors (
    run_id TEXT NOT NULL,
    backend TEXT NOT NULL,
    from_job TEXT NOT NULL,  -- the failed attempt
    job TEXT,                -- its successor, once submitted
    claimed_by TEXT NOT NULL,
    claimed_until REAL NOT NULL,
    PRIMARY KEY (run_id, backend, from_job)
);
CREATE TABLE IF NOT EXISTS ledger (
    host TEXT NOT NULL,
    job TEXT NOT NULL,
    backend TEXT NOT NULL,
    reason TEXT NOT NULL,
    by TEXT NOT NULL DEFAULT '',
    since REAL NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (host, job, backend)
);
CREATE TABLE IF NOT EXISTS outbox (
    job TEXT NOT NULL,
    backend TEXT NOT NULL,
    event TEXT NOT NULL,
    webhook_env TEXT NOT NULL,  -- the variable naming the URL: the URL itself is never stored
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',  -- pending, delivered, given-up
    tries INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    claimed_until REAL NOT NULL DEFAULT 0,
    done_at REAL,
    PRIMARY KEY (job, backend, event)
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (state, created);
"""

# A notification's delivery backs off across runs (next_try) and is leased by one named delivery
# run at a time (claimed_by: host:pid:nonce, so that a lease whose run died on this host is
# taken over at once): halo_sched/notify.py.
_SCHEMA_2 = """
ALTER TABLE outbox ADD COLUMN next_try REAL NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN claimed_by TEXT NOT NULL DEFAULT '';
"""

#: version -> the script that takes a database of version-1 to it (run inside one transaction).
MIGRATIONS: dict[int, str] = {1: _SCHEMA_1, 2: _SCHEMA_2}


class StoreError(UsageError):
    """The store cannot be used (not a database, newer schema, locked too long, unwritable): the
    message names the file and what to do (exit 2)."""


def path() -> Path:
    return store.home() / FILE_NAME


_local = threading.local()


def _problem(err: BaseException, where: Path) -> StoreError:
    text = str(err)
    if isinstance(err, sqlite3.OperationalError) and "locked" in text:
        return StoreError(f"the history store {where} stayed locked by another halo-sched process for "
                          f"{BUSY_S:g} s; try again, or find the process holding it (fuser {where})")
    if isinstance(err, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text
                                                    or "disk image" in text):
        return StoreError(f"the history store {where} is not a usable SQLite database ({text}); move it "
                          f"aside (halo-sched starts a new one; `sqlite3 {where} .recover` may save its rows)")
    if isinstance(err, OSError) or "unable to open" in text or "readonly" in text:
        return StoreError(f"the history store {where} cannot be opened or written ({text}); check "
                          f"HALO_SCHED_HOME and the directory's permissions")
    return StoreError(f"the history store {where}: {text}")


def _open(where: Path) -> sqlite3.Connection:
    home = store.check_home()  # a file there: exit 2 naming the variable
    try:
        home.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(where), timeout=BUSY_S, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as err:
        raise _problem(err, where) from None
    try:
        con.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
        if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives a crash of the process
        _migrate(con, where)
    except sqlite3.Error as err:
        con.close()
        raise _problem(err, where) from None
    return con


def _migrate(con: sqlite3.Connection, where: Path) -> None:
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise StoreError(f"the history store {where} was written by a newer halo-sched (schema {version}; this one "
                         f"reads {SCHEMA_VERSION}); upgrade halo-sched or point HALO_SCHED_HOME elsewhere")
    con.execute("BEGIN IMMEDIATE")
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]  # another process may have done it
        for v in range(version + 1, SCHEMA_VERSION + 1):
            for stmt in _statements(MIGRATIONS[v]):
                con.execute(stmt)
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """The statements of ``script`` (executescript would commit the open transaction first)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return out


def connection() -> sqlite3.Connection:
    """This thread's connection to the store of the current ``HALO_SCHED_HOME`` (opened and
    migrated on first use in this process, thread or home)."""
    where = path()
    key = (os.getpid(), str(where))
    con = getattr(_local, "con", None)
    if con is None or getattr(_local, "key", None) != key:
        con = _open(where)
        _local.con, _local.key, _local.stamps = con, key, {}
    return con


def exists() -> bool:
    """Whether there is a store (or files of an earlier release to import) to read: readers on the
    render path do not create one."""
    home = store.check_home()  # a file there: exit 2 naming the variable
    return (home / FILE_NAME).exists() or (home / "jobs").is_dir() or (home / "nodes.json").exists()


@contextmanager
def write() -> Iterator[sqlite3.Connection]:
    """One read-modify-write: ``BEGIN IMMEDIATE`` (this process holds the write lock from the
    first read, so nothing it read can change under it), COMMIT, or ROLLBACK on any error."""
    con = connection()
    where = path()
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as err:
        raise _problem(err, where) from None
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    try:
        con.execute("COMMIT")
    except sqlite3.Error as err:
        con.execute("ROLLBACK")
        raise _problem(err, where) from None


def read(sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of one query (a consistent snapshot: readers never wait for writers in WAL mode)."""
    try:
        return connection().execute(sql, args).fetchall()
    except sqlite3.DatabaseError as err:
        raise _problem(err, path()) from None


# ---- earlier releases' files ------------------------------------------------------------------


def _stamp(p: Path) -> str:
    try:
        st = os.stat(p)
    except OSError:
        return ""
    return f"{st.st_mtime_ns}:{st.st_ino}"


def imported(name: str, source: Path, do_import: Callable[[sqlite3.Connection], object]) -> None:
    """Import an earlier release's files at ``source`` (a directory or a file) with
    ``do_import(con)`` when they changed since the last import (one ``stat`` when they did not):
    under an exclusive lock, so one process imports and the others then find nothing to do. The
    owner of each kind of file calls this before it reads (records.py: ``jobs/``, ledger.py:
    ``nodes.json``)."""
    stamp = _stamp(source)
    if not stamp:
        return
    con = connection()
    if _local.stamps.get(name) == stamp:
        return
    row = con.execute("SELECT value FROM meta WHERE key = ?", (f"imported:{name}",)).fetchone()
    if row is not None and row[0] == stamp:
        _local.stamps[name] = stamp
        return
    import fcntl

    fd = os.open(store.home() / "import.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            do_import(con)
            stamp = _stamp(source)
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"imported:{name}", stamp))
            con.execute("COMMIT")
        except sqlite3.Error as err:
            raise _problem(err, path()) from None
        _local.stamps[name] = stamp
    finally:
        os.close(fd)


def clean(value):
    """``value`` as strict JSON can hold it: a non-finite number becomes None and a lone surrogate
    U+FFFD (what a job prints is hostile; one bad value must not make its record unwritable or
    unreadable by strict parsers)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def dumps(value) -> str:
    """JSON for the store (see :func:`clean`)."""
    return json.dumps(clean(value), sort_keys=True, allow_nan=False, ensure_ascii=False)


__all__ = ["BUSY_S", "FILE_NAME", "SCHEMA_VERSION", "StoreError", "clean", "connection", "dumps", "exists", "imported",
           "path", "read", "write"]
