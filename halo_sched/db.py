"""The history store: one SQLite database in halo-sched's state directory
(``$HALO_SCHED_HOME/halo-sched.db``) holding the job records (records.py), which attempt of a
run followed which (records.py: written by the run's actor or by whoever first found the
attempt), the node ledger (ledger.py) and the notification outbox (notify.py).

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
SCHEMA_VERSION = 3

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

# A run's next attempt is started by its actor alone (the SLURM batch script or guardian, the
# local keeper, the Nomad keeper group), never claimed by a waiting client (runs.py): the claim
# columns go. A row without a job stays where it says a local attempt is being started (the next
# keeper starts it: records.decide); one an earlier release's waiting client left on another
# backend, its claimant gone, goes, so that the attempt it may have registered is followed by
# its number (records.successor).
_SCHEMA_3 = """
CREATE TABLE successors_3 (
    run_id TEXT NOT NULL,
    backend TEXT NOT NULL,
    from_job TEXT NOT NULL,  -- the failed attempt
    job TEXT,                -- its successor, once started (NULL: being started)
    PRIMARY KEY (run_id, backend, from_job)
);
INSERT INTO successors_3 (run_id, backend, from_job, job)
    SELECT run_id, backend, from_job, job FROM successors WHERE job IS NOT NULL OR backend = 'local';
DROP TABLE successors;
ALTER TABLE successors_3 RENAME TO successors;
"""

#: version -> the script that takes a database of version-1 to it (run inside one transaction).
MIGRATIONS: dict[int, str] = {1: _SCHEMA_1, 2: _SCHEMA_2, 3: _SCHEMA_3}


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


class ReadOnlyStore(StoreError):
    """The store can be read but not written by this user (a read-only file, directory or
    filesystem): every read works; whatever would record or change something is refused, naming
    HALO_SCHED_HOME (exit 2), and reads that would only record what they saw skip it."""


def _open(where: Path) -> tuple[sqlite3.Connection, str]:
    """A connection to the store at ``where``, and why it is read-only ('' when it can be written).
    A store this user cannot write is opened read-only (``mode=ro``; ``immutable=1`` when not even
    SQLite's shared-memory file can be made beside it): reads work from a store they cannot write."""
    store.check_home()  # a file there, a link to nothing: exit 2 naming the variable
    why = ""
    if os.path.lexists(where):
        if not os.access(where, os.R_OK):
            raise StoreError(f"the history store {where} cannot be read by this user (uid {os.geteuid()}); check "
                             f"{store._var()} and the file's permissions")
        if not os.access(where, os.W_OK):
            why = f"{FILE_NAME} is read-only for this user"
    else:
        store.make_home()  # made private (0700); cannot be made or written: exit 2 naming the variable
        try:  # the database file made private (0600) before SQLite makes it 0644 (its -wal, -shm follow it)
            os.close(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass
        except OSError as err:
            raise _problem(err, where) from None
    if not why:
        try:
            return _open_rw(where), ""
        except StoreError:
            if os.access(where.parent, os.W_OK | os.X_OK):
                raise  # not a question of permissions
            why = "its directory is read-only for this user"
    return _open_ro(where), why


def _open_rw(where: Path) -> sqlite3.Connection:
    try:
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


def _open_ro(where: Path) -> sqlite3.Connection:
    from urllib.parse import quote

    uri = f"file:{quote(str(where.absolute()))}?mode=ro"
    last: BaseException | None = None
    for extra in ("", "&immutable=1"):  # immutable: no -shm could be made (a read-only directory)
        con = None
        try:
            con = sqlite3.connect(uri + extra, uri=True, timeout=BUSY_S, isolation_level=None, check_same_thread=False)
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as err:
            last = err
            if con is not None:
                con.close()
            continue
        if version > SCHEMA_VERSION:
            con.close()
            raise StoreError(f"the history store {where} was written by a newer halo-sched (schema {version}; this one "
                             f"reads {SCHEMA_VERSION}); upgrade halo-sched or point HALO_SCHED_HOME elsewhere")
        if version < SCHEMA_VERSION:
            con.close()
            raise ReadOnlyStore(f"the history store {where} is read-only for this user and of an older schema "
                                f"({version}; this one reads {SCHEMA_VERSION}): it is migrated by the first "
                                f"command that can write it; check {store._var()} and its permissions")
        return con
    raise _problem(last, where)


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
        con, why = _open(where)
        _local.con, _local.key, _local.stamps, _local.readonly = con, key, {}, why
        if why:
            _say_read_only(where, why)
    return con


_said_read_only: set[str] = set()


def _say_read_only(where: Path, why: str) -> None:
    import sys

    if str(where) in _said_read_only:
        return
    _said_read_only.add(str(where))
    print(f"halo-sched: the history store {where} is read-only here ({why}): reading it; what this command "
          "sees is not recorded", file=sys.stderr, flush=True)


def read_only() -> str:
    """Why this process's store cannot be written ('' when it can)."""
    connection()
    return getattr(_local, "readonly", "")


def writable() -> None:
    """Raise :class:`ReadOnlyStore` (exit 2) when this user cannot write the store."""
    connection()
    _refuse_write(path())


def _refuse_write(where: Path) -> None:
    why = getattr(_local, "readonly", "")
    if why:
        raise ReadOnlyStore(f"the history store {where} cannot be written ({why}); this command must record or "
                            f"change something there: check {store._var()} and its permissions, or point "
                            "HALO_SCHED_HOME at a directory you can write")


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
    _refuse_write(where)
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


@contextmanager
def reading() -> Iterator[sqlite3.Connection]:
    """A connection of its own for one long read (every record, streamed): its query reads one
    snapshot of the store from its first row to its last, whatever this thread's connection
    writes meanwhile (WAL: the writer never waits for it), and rows come as they are read, so
    memory stays flat whatever the history holds."""
    connection()  # opened (migrated, or read-only) as every command opens it
    where = path()
    try:
        if getattr(_local, "readonly", ""):
            con = _open_ro(where)
        else:
            con = sqlite3.connect(str(where), timeout=BUSY_S, isolation_level=None, check_same_thread=False)
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
    except sqlite3.Error as err:
        raise _problem(err, where) from None
    try:
        yield con
    except sqlite3.DatabaseError as err:
        raise _problem(err, where) from None
    finally:
        con.close()


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
    if _local.stamps.get(name) == stamp or _local.readonly:
        return  # a read-only store: the files stay where they are, unread (reads see the store alone)
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


__all__ = ["BUSY_S", "FILE_NAME", "SCHEMA_VERSION", "ReadOnlyStore", "StoreError", "read_only", "reading", "writable", "clean", "connection", "dumps", "exists", "imported",
           "path", "read", "write"]
