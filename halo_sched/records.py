"""One record per submitted job, so that every command works from the job id alone.

``submit`` writes the job's record into the history store (halo_sched/db.py,
``$HALO_SCHED_HOME/halo-sched.db``; default home: ``$XDG_STATE_HOME/halo-sched``, else
``~/.local/state/halo-sched``): the backend and scheduler id, where it went (cluster, region,
namespace), its output files as absolute paths, a copy of what was submitted, the job file's hash,
the resolved spec, the submit time and directory, and what ran (git commit, dirty tree with its
diff beside the store in ``rendered/``). ``status``/``logs``/``cancel`` then find the backend
without ``--backend``; ``logs`` finds the output after the scheduler forgot the job; ``list``
shows a page of recent jobs with their last known state.

Concurrency: a record changes only inside one store transaction that reads it, changes what it
knows (:func:`update`: the last state, a run's observed times) and writes it back, so concurrent
observers never lose each other's updates. Reading never trusts a record: one with the wrong
types (or an imported file that was torn, not a regular file, too big) is skipped with one
warning line and ``list`` shows it as unreadable; no bad record can fail a command about another
job. Secrets never reach a record: the spec holds ``secret_env`` names only, never values.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from .models import JobSpec

VERSION = 1

# The state directory and its files (store.py), named here too for the record's readers.
from . import store  # noqa: E402
from .store import MAX_RECORD_BYTES, Unreadable, atomic_write, home, read_json, read_small  # noqa: E402,F401 - re-exported


def jobs_dir() -> Path:
    """Where earlier releases kept one JSON file per job (imported into the store: db.py)."""
    return home() / "jobs"


def rendered_dir() -> Path:
    """The text each job was submitted as, and its dirty tree's diff, named from the store."""
    return home() / "rendered"


def _stem(job_id: str, backend: str) -> str:
    # Nomad ids carry ':' and '/' ([REGION:][NAMESPACE/]ID): encoded, so one id is one file name.
    return f"{quote(job_id, safe='')}@{quote(backend, safe='')}"


def ref(job_id: str, backend: str) -> str:
    """Where the record is, for a person: the store and the record's key in it."""
    from . import db

    return f"{db.path()}#{_stem(job_id, backend)}"


def _columns(record: dict) -> tuple:
    last = record.get("last_state") if isinstance(record.get("last_state"), dict) else {}
    run = record.get("run") if isinstance(record.get("run"), dict) else {}
    submitted = record.get("submitted")
    attempt = run.get("attempt")
    return (submitted if isinstance(submitted, (int, float)) and not isinstance(submitted, bool) else 0.0,
            record.get("name") if isinstance(record.get("name"), str) else None,
            last.get("status") if isinstance(last.get("status"), str) else None,
            run.get("id") if isinstance(run.get("id"), str) else None,
            attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None)


def _store():
    """The history store, with an earlier release's record files imported first (db.imported)."""
    from . import db

    db.imported("jobs", jobs_dir(), import_files)
    return db


def _put(con, record: dict) -> None:
    from . import db

    con.execute("INSERT OR REPLACE INTO jobs (id, backend, submitted, name, status, run_id, attempt, data, bad) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                (record["id"], record["backend"], *_columns(record), db.dumps(record)))


def write(record: dict) -> str:
    """Store ``record`` whole (a new job's; anything that changes a stored one uses :func:`update`)."""
    with _store().write() as con:
        _put(con, record)
    return ref(record["id"], record["backend"])


def adopt(record: dict, run_id: str, from_job: str) -> bool:
    """Keep a run's attempt that was submitted elsewhere (by the attempt before it, from inside
    its allocation: halo_sched/runs.py ``follow``) and the successor row that links it to
    ``from_job``, in one transaction, once: True when this call stored it. Reads may call it (it
    records, never submits); racing readers on one store keep one record and one row."""
    with _store().write() as con:
        if con.execute("SELECT 1 FROM jobs WHERE id = ? AND backend = ?", (record["id"], record["backend"])).fetchone():
            stored = False
        else:
            _put(con, record)
            stored = True
        _link(con, run_id, record["backend"], from_job, record["id"])
        return stored


def update(job_id: str, backend: str, change: Callable[[dict], bool]) -> dict | None:
    """Read-modify-write of one record in one transaction: ``change(record)`` edits the stored
    record in place and says whether it changed anything; the record as stored after (None: no
    usable record)."""
    with _store().write() as con:
        row = con.execute("SELECT data FROM jobs WHERE id = ? AND backend = ? AND data IS NOT NULL",
                          (job_id, backend)).fetchone()
        rec = _parse(row[0]) if row else None
        if rec is None or _problem(rec) is not None:
            return None
        if change(rec):
            _put(con, rec)
        return rec


#: A record is a few kB (the resolved spec is the largest part); anything this big is not one.


_STR = (str, type(None))
_NUM = (int, float, type(None))
_DICT = (dict, type(None))
#: The types each field must have when present (None always allowed); what the commands rely on.
_FIELDS: dict[str, tuple] = {
    "name": _STR, "submitted_iso": _STR, "submit_dir": _STR, "job_file": _STR, "job_file_sha256": _STR, "script_dir": _STR,
    "rendered_file": _STR, "submitted": _NUM, "nodes": (int, type(None)), "nproc_per_node": (int, type(None)),
    "last_state": _DICT, "spec": _DICT, "scheduler": _DICT, "git": _DICT, "outputs": (list, type(None)),
    "result": _DICT,
}


def _problem(data: Any) -> str | None:
    """Why ``data`` is not a usable record, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in ("id", "backend"):
        if not isinstance(data.get(key), str) or not data[key]:
            return f"{key!r} is missing or not a string"
    for key, types in _FIELDS.items():
        value = data.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{key!r} is a {type(value).__name__}"
    if not isinstance((data.get("spec") or {}).get("slurm"), _DICT):
        return "'spec.slurm' is not an object"
    if any(not isinstance(o, str) for o in data.get("outputs") or ()):
        return "'outputs' holds a non-string"
    for key in ("status", "describe"):
        if not isinstance((data.get("last_state") or {}).get(key), _STR):
            return f"'last_state.{key}' is not a string"
    return None


class BadRecord(NamedTuple):
    """A record that cannot be used: its id and backend (for an imported file, as its name said),
    where it is, and why."""

    path: Path
    id: str
    backend: str
    reason: str
    mtime: float = 0.0


def _from_name(p: Path) -> tuple[str, str]:
    stem = p.name[:-len(".json")] if p.name.endswith(".json") else p.name
    job_id, at, backend = stem.rpartition("@")
    return (unquote(job_id), unquote(backend)) if at else (unquote(stem), "")


_reported: set[str] = set()


def warn_bad(bad: BadRecord) -> None:
    """One short stderr line per unreadable record, once per process."""
    import sys

    key = str(bad.path)
    if key in _reported:
        return
    _reported.add(key)
    from .errors import shown

    print(f"halo-sched: warning: skipping unreadable job record {shown(_stem(bad.id, bad.backend), 120)}: "
          f"{bad.reason}", file=sys.stderr, flush=True)


def _parse(text: str) -> Any:
    """A stored record's JSON; None when it cannot be one (not JSON, or nested deeper than any
    record: store.MAX_NESTING)."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    if store.deep_text(text) and store.too_deep(value):
        return None
    return value


def _row(row: tuple, on_bad: Callable[[BadRecord], None] | None) -> dict | None:
    """The record of a ``(id, backend, submitted, data, bad)`` row; None when unusable (then
    ``on_bad`` hears why)."""
    job_id, backend, submitted, data, bad = row
    rec = None
    if bad is None:
        rec = _parse(data) if isinstance(data, str) else None
        bad = "not a JSON object (or nested too deeply)" if rec is None else _problem(rec)
    if bad is None:
        return rec
    if on_bad is not None:
        on_bad(BadRecord(Path(ref(job_id, backend)), job_id, backend, bad, float(submitted or 0)))
    return None


_COLS = "id, backend, submitted, data, bad"


def _select(where: str = "", args: tuple = (), tail: str = "") -> list[tuple]:
    from . import db

    if not db.exists():  # nothing was ever recorded here: a reader creates no store
        return []
    return _store().read(f"SELECT {_COLS} FROM jobs {where} {tail}", args)


def _query(limit: int, backend: str | None, status: str | None, name: str | None, run: str | None,
           since: float | None) -> tuple[str, tuple]:
    """The SQL of ``list``'s records: the newest ``limit`` (0: all) matching every filter given,
    newest first, read by index (the rest of the history is never loaded)."""
    conds, args = [], []
    for column, value in (("backend", backend), ("status", status), ("name", name), ("run_id", run)):
        if value is not None:
            conds.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        conds.append("submitted >= ?")
        args.append(since)
    where = ("WHERE " + " AND ".join(conds)) if conds else ""
    limit = 0 if limit >= 1 << 63 else limit  # more than SQLite counts: every record
    tail = "ORDER BY submitted DESC" + (" LIMIT ?" if limit else "")
    return f"SELECT {_COLS} FROM jobs {where} {tail}", tuple(args) + ((limit,) if limit else ())


def _items(rows: Iterable[tuple], on_bad: Callable[[BadRecord], None] | None) -> Iterator[dict | BadRecord]:
    bad: list[BadRecord] = []

    def seen(b: BadRecord) -> None:
        bad.append(b)
        if on_bad is not None:
            on_bad(b)

    for row in rows:
        rec = _row(row, seen)
        yield rec if rec is not None else bad.pop()


def page(limit: int = 50, backend: str | None = None, status: str | None = None, name: str | None = None,
         run: str | None = None, since: float | None = None,
         on_bad: Callable[[BadRecord], None] | None = warn_bad) -> list[dict | BadRecord]:
    """One page of ``list``: the newest ``limit`` records (0: all) matching every filter given,
    newest first, read by index (the rest of the history is never loaded). Unusable records are
    items too (:class:`BadRecord`), after ``on_bad`` heard of them. Every record of a long
    history at once: :func:`stream`."""
    from . import db

    if not db.exists():  # nothing was ever recorded here: a reader creates no store
        return []
    sql, args = _query(limit, backend, status, name, run, since)
    return list(_items(_store().read(sql, args), on_bad))


#: Rows fetched from SQLite at a time by :func:`stream`.
FETCH = 100


def stream(limit: int = 0, backend: str | None = None, status: str | None = None, name: str | None = None,
           run: str | None = None, since: float | None = None,
           on_bad: Callable[[BadRecord], None] | None = warn_bad) -> Iterator[dict | BadRecord]:
    """:func:`page`, one record at a time, from one snapshot of the store read by a connection of
    its own (db.reading): the first record comes at once and memory stays flat at 50,000 records
    as at 50 (``list --limit 0``, ``export``: issue 43). What this thread writes meanwhile (a
    state ``list`` keeps) is not read again."""
    from . import db

    if not db.exists():
        return
    _store()  # an earlier release's files imported first
    sql, args = _query(limit, backend, status, name, run, since)
    with db.reading() as con:
        cur = con.execute(sql, args)
        while rows := cur.fetchmany(FETCH):
            yield from _items(rows, on_bad)


def find(job_id: str, backend: str | None = None,
         on_bad: Callable[[BadRecord], None] | None = warn_bad) -> list[dict]:
    """Records of ``job_id`` (one per backend that has such an id); unusable ones go to ``on_bad``."""
    if backend:
        rows = _select("WHERE id = ? AND backend = ?", (job_id, backend))
    else:
        rows = _select("WHERE id = ?", (job_id,), "ORDER BY backend")
    return [r for row in rows if (r := _row(row, on_bad)) is not None and r["id"] == job_id]


def of_run(run_id: str, backend: str | None = None) -> list[dict]:
    """The usable records of every attempt of run ``run_id``, by attempt number (by index)."""
    if backend:
        rows = _select("WHERE run_id = ? AND backend = ?", (run_id, backend), "ORDER BY attempt")
    else:
        rows = _select("WHERE run_id = ?", (run_id,), "ORDER BY attempt")
    return [r for row in rows if (r := _row(row, None)) is not None]


def failure_key(job_id: str, backend: str) -> str:
    """The job's failure key (``failure_key``, made at submit: the key its nodes sign their
    failure lines with, halo_sched/node/failures.py); '' without a record that has one."""
    for rec in find(job_id, backend, on_bad=None):
        key = rec.get("failure_key")
        if isinstance(key, str):
            return key
    return ""


def exists(job_id: str, backend: str) -> bool:
    """Whether a record (usable or not) names this job."""
    return bool(_select("WHERE id = ? AND backend = ?", (job_id, backend)))


def _same(old: Any, new: dict) -> bool:
    return isinstance(old, dict) and {k: v for k, v in old.items() if k != "at"} == {k: v for k, v in new.items()
                                                                                  if k != "at"}


#: States a SLURM job may leave again (requeue): a later observation may follow them.
_MAY_RETURN = {"NODE_FAIL", "PREEMPTED", "REQUEUED"}


def update_state(record: dict, state, observed: bool = False) -> None:
    """Keep ``state`` as the record's last known one (only when the scheduler still knows the
    job), in one transaction with the stored record (never over a newer end another process kept),
    and in ``record`` too. ``observed``: a process waiting on the job saw it now (an actor's
    note, core.note): an attempt of a run also keeps when it was first seen running and seen
    ended (``run.observed_start``/``observed_end``), the clock of its hours when the scheduler
    reports neither (runs.py)."""
    from .jobstate import JobStatus, in_place_fields

    if state.status is JobStatus.UNKNOWN:
        return
    last = {"status": state.status.value, "describe": state.describe(), "at": time.time(),
            "exit_code": state.exit_code}
    if state.failure is not None and state.failure.first is not None:
        last["failure"] = state.failure.to_dict()
    for key in ("started_at", "ended_at"):  # the scheduler's own clock: a run's GPU-hours
        value = getattr(state, key, None)
        if isinstance(value, (int, float)):
            last[key] = value
    cls = state.failure_class()
    if cls is not None:  # whose fault (the node ledger hears of a node's: core.keep_state)
        last["failure_class"] = cls.to_dict()
    if getattr(state, "spares", None):  # hot spares: how many are left, which node each replaced
        last["spares"] = state.spares
    last.update(in_place_fields(getattr(state, "in_place", None)))  # restarts in place (SLURM), a crash loop
    from . import db

    last = db.clean(last)
    seen = _seen(state.status, last["at"]) if observed else None
    if _same(record.get("last_state"), last) and (seen is None or not seen(dict(record))):
        return  # what the record already says (the common case in list): no write

    def change(rec: dict) -> bool:
        stamped = seen is not None and seen(rec)
        old = rec.get("last_state") if isinstance(rec.get("last_state"), dict) else {}
        if _same(old, last):
            return stamped
        try:
            was_end = JobStatus(old.get("status")).terminal
        except ValueError:
            was_end = False
        if was_end and not state.status.terminal and old.get("status") not in _MAY_RETURN:
            return stamped  # an observation older than the end another process already kept
        rec["last_state"] = last
        return True

    stored = update(record["id"], record["backend"], change)
    if stored is not None:
        record["last_state"] = stored.get("last_state")
        if isinstance(stored.get("run"), dict):
            record["run"] = stored["run"]


def _seen(status, now: float) -> Callable[[dict], bool] | None:
    """What a waiting process's sight of ``status`` at ``now`` adds to a run's attempt: when it was
    first seen running, and seen ended (its start then too, if never seen running), each kept
    once; a function that adds them to a record (a copy, when only asking) and says whether it did."""
    if not (status.value == "RUNNING" or status.terminal):
        return None

    def stamp(rec: dict) -> bool:
        run = rec.get("run")
        if not isinstance(run, dict):
            return False
        if status.terminal:
            if "observed_end" in run:
                return False
            rec["run"] = run = dict(run)
            run.setdefault("observed_start", now)
            run["observed_end"] = now
            return True
        if "observed_start" in run:
            return False
        rec["run"] = run = dict(run)
        run["observed_start"] = now
        return True

    return stamp


def public(record: dict) -> dict:
    """A record as it is shown (``export``, ``Job.describe()``): all of it but the job's failure
    key, which stays in the store (what a node's failure line is checked with)."""
    return {k: v for k, v in record.items() if k != "failure_key"}


def keep_result(job_id: str, backend: str, result: dict) -> dict | None:
    """Keep rank 0's result as read at the job's end (``{"value", "note", "for", "at"}``:
    halo_sched/outcome.py ``attach_value``) in the job's record, in one transaction; a result
    kept already for the same end stays (the first reader's). The record as stored after."""
    from . import db

    result = db.clean(result)

    def change(rec: dict) -> bool:
        old = rec.get("result")
        if isinstance(old, dict) and old.get("for") == result.get("for"):
            return False
        rec["result"] = result
        return True

    return update(job_id, backend, change)


def import_files(con) -> int:
    """Import earlier releases' record files (``jobs/*.json``) into the store (db.imported calls
    this under its import lock): each file is read once (bounded, never blocking), stored (an unusable
    one as a row saying why), and moved to ``jobs/imported/`` after its row committed. A record
    the store already holds is replaced only by a file that knows a later state. How many files."""
    d = jobs_dir()
    try:
        names = sorted(e.name for e in os.scandir(d) if e.name.endswith(".json") and not e.name.startswith("."))
    except OSError:
        return 0
    done = d / "imported"
    moved = 0
    for chunk in range(0, len(names), 500):
        batch = names[chunk:chunk + 500]
        con.execute("BEGIN IMMEDIATE")
        try:
            for name in batch:
                _import_one(con, d / name)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        done.mkdir(exist_ok=True)
        for name in batch:
            try:
                os.replace(d / name, done / name)
                moved += 1
            except OSError:
                pass
    return moved


def _import_one(con, p: Path) -> None:
    from . import db

    job_id, backend = _from_name(p)
    try:
        data = read_json(p)
        why = _problem(data)
    except FileNotFoundError:
        return
    except (OSError, Unreadable) as err:
        data, why = None, (str(err) if isinstance(err, Unreadable) else (err.strerror or type(err).__name__))
    if why is None:
        job_id, backend = data["id"], data["backend"]
    if not job_id:
        return
    row = con.execute("SELECT data, bad FROM jobs WHERE id = ? AND backend = ?", (job_id, backend)).fetchone()
    if why is not None:
        if row is None:
            try:
                mtime = os.lstat(p).st_mtime
            except OSError:
                mtime = 0.0
            con.execute("INSERT INTO jobs (id, backend, submitted, data, bad) VALUES (?, ?, ?, NULL, ?)",
                        (job_id, backend, mtime, why[:200]))
        return
    if row is not None and row[1] is None:
        have = _parse(row[0]) or {}
        at_have = ((have.get("last_state") or {}) if isinstance(have.get("last_state"), dict) else {}).get("at") or 0
        at_file = (data.get("last_state") or {}).get("at") or 0
        if not (isinstance(at_file, (int, float)) and isinstance(at_have, (int, float)) and at_file > at_have):
            return
    con.execute("INSERT OR REPLACE INTO jobs (id, backend, submitted, name, status, run_id, attempt, data, bad) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)", (job_id, backend, *_columns(data), db.dumps(data)))


# ---- building a record at submit ------------------------------------------------------------


def _git(cwd: Path, *args: str) -> str | None:
    import subprocess  # on submit only: render reads the ledger, not this

    try:
        out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(where: Path) -> dict | None:
    """The commit ``where`` is at and whether the tree is dirty (with its diff), or None outside git."""
    d = where if where.is_dir() else where.parent
    # Two git calls, not four: each costs 5-25 ms of a library submit whose sbatch takes ~7 ms.
    # `diff HEAD` is empty exactly when the tracked files match the commit (what
    # `status --untracked-files=no` would say), and is the diff the record keeps.
    out = _git(d, "rev-parse", "--show-toplevel", "HEAD")
    if out is None:
        top = _git(d, "rev-parse", "--show-toplevel")  # a repository without a commit yet
        if top is None:
            return None
        return {"repo": top.strip(), "commit": None, "dirty": False, "diff": ""}
    top, _, commit = out.strip().partition("\n")
    diff = _git(d, "diff", "HEAD") or ""
    return {"repo": top, "commit": commit.strip() or None, "dirty": bool(diff), "diff": diff}


def _trainer_tree(spec) -> Path:
    cwd = Path.cwd()
    # The script the nodes run (a job file's relative one: from its directory), as a path here.
    trainer = cwd / spec.script_check("local").on_nodes if spec.trainer.script else cwd
    return trainer if trainer.exists() else cwd


def git_state_started(spec) -> Callable[[], dict | None]:
    """``git_state`` of the trainer's tree, read in a thread while the job is being submitted (its
    git calls then cost a submit nothing on top of sbatch's own round trip); call the result for it."""
    import threading

    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("git", git_state(_trainer_tree(spec))), daemon=True)
    t.start()

    def result() -> dict | None:
        t.join()
        return box["git"] if "git" in box else git_state(_trainer_tree(spec))

    return result


def build(backend: str, spec: "JobSpec", job_id: str, fields: dict | None = None, job_file=None,
          git_result: Callable[[], dict | None] | None = None) -> dict[str, Any]:
    """The record of a job just submitted (nothing written yet): ``fields`` are the backend's
    (``outputs``, ``scheduler``), ``job_file`` the spec's (path, sha256) when it came from one."""
    cwd = Path.cwd()
    now = time.time()
    rec: dict[str, Any] = {
        "version": VERSION,
        "id": job_id,
        "backend": backend,
        "name": spec.name,
        "submitted": now,
        "submitted_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "submit_dir": str(cwd),
        "job_file": job_file.path if job_file else None,
        "job_file_sha256": job_file.sha256 if job_file else None,
        # Where a relative trainer.script is read from (the job file's directory): a retry reads it there too.
        "script_dir": spec._script_base.job_dir if spec._script_base is not None else None,
        "nodes": spec.nodes,
        "nproc_per_node": spec.nproc_per_node,
        # The resolved spec (defaults filled in). secret_env holds names; values are never here.
        "spec": spec.model_dump(mode="json"),
        "outputs": [],
        "scheduler": {},
    }
    rec.update(fields or {})
    attempt = spec._attempt
    if attempt is not None or spec.retry is not None:
        # One logical run (halo_sched/runs.py): the first attempt's id names it.
        rec["run"] = {"id": attempt.run_id if attempt is not None else job_id,
                      "attempt": attempt.number if attempt is not None else 0,
                      "excluded": list(attempt.exclude) if attempt is not None else []}
    if attempt is not None and attempt.git is not None:  # the run's git state, as first recorded
        rec["git"] = dict(attempt.git)
        rec["_diff"] = ""
        return rec
    git = git_result() if git_result is not None else git_state(_trainer_tree(spec))
    rec["git"] = git and {k: v for k, v in git.items() if k != "diff"}
    rec["_diff"] = git["diff"] if git and git["dirty"] else ""
    return rec


def save_new(record: dict, rendered: str) -> str:
    """Write a new record, with the submitted text (and the dirty tree's diff) beside it."""
    return write(_with_text(record, rendered))


def decide(record: dict, rendered: str, from_job: str | None = None) -> dict:
    """Keep ``record``, a run's next attempt not started yet, unless a record of the same attempt
    of the run is kept already: one transaction, so that the attempt's identity is decided once,
    before it starts, and whoever carries a dead actor's work on starts that one (the local
    keeper: halo_sched/keeper.py). With ``from_job`` (the failed attempt it follows), the same
    transaction marks ``from_job``'s successor as being started: a ``successors`` row with no job
    yet, so that no reader takes the attempt for started before :func:`link` names it. The
    record kept: this one, or the earlier decision."""
    run = record["run"]
    with _store().write() as con:
        if from_job is not None:
            con.execute("INSERT OR IGNORE INTO successors (run_id, backend, from_job, job) VALUES (?, ?, ?, NULL)",
                        (run["id"], record["backend"], from_job))
        for (data,) in con.execute("SELECT data FROM jobs WHERE run_id = ? AND backend = ? AND attempt = ? "
                                   "AND data IS NOT NULL ORDER BY submitted", (run["id"], record["backend"],
                                                                              run["attempt"])):
            rec = _parse(data)
            if rec is not None and _problem(rec) is None:
                return rec
        _put(con, _with_text(record, rendered))
        return record


def successor(run_id: str, backend: str, job_id: str) -> str | None:
    """The attempt of run ``run_id`` started after ``job_id`` failed, as the store knows it (a
    ``successors`` row: :func:`link`, :func:`adopt`); None while it is being started (the row
    has no job yet: :func:`decide`) or when none was. A run recorded without rows (an earlier
    release's files, a record written by hand): the record of the next attempt number, when
    there is exactly one. One query."""
    from . import db

    if not db.exists():
        return None
    rows = db.read("SELECT 1, job FROM successors WHERE run_id = ? AND backend = ? AND from_job = ? "
                   "UNION ALL SELECT 0, b.id FROM jobs a JOIN jobs b ON b.run_id = a.run_id AND b.backend = a.backend "
                   "AND b.attempt = a.attempt + 1 WHERE a.id = ? AND a.backend = ? AND a.run_id = ? "
                   "AND a.data IS NOT NULL AND b.data IS NOT NULL",
                   (run_id, backend, job_id, job_id, backend, run_id))
    named = [job for kind, job in rows if kind == 1]
    if named:  # None while it is being started (its record may be there: decided, perhaps not started)
        return named[0]
    later = [job for _, job in rows]
    return later[0] if len(later) == 1 else None


def being_started(run_id: str, backend: str, job_id: str) -> bool:
    """Whether ``job_id``'s successor was decided and not named yet (:func:`decide`, :func:`link`)."""
    from . import db

    return db.exists() and bool(db.read("SELECT 1 FROM successors WHERE run_id = ? AND backend = ? AND from_job = ? "
                                        "AND job IS NULL", (run_id, backend, job_id)))


def position(job_id: str, backend: str) -> tuple[str, int]:
    """The run ``job_id`` is an attempt of and its number from 0, as its record says (the job
    itself and 0 without one)."""
    run = (find(job_id, backend) or [{}])[0].get("run")
    run = run if isinstance(run, dict) else {}
    attempt = run.get("attempt")
    number = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and 0 <= attempt < 2 ** 31 else 0
    return (run.get("id") if isinstance(run.get("id"), str) and run.get("id") else job_id), number


def unended(ids: list[str], backend: str) -> list[str]:
    """Of ``ids``, the jobs whose last state kept has the scheduler's start but not its end."""
    out = []
    for job_id in ids:
        last = (find(job_id, backend, on_bad=None) or [{}])[0].get("last_state") or {}
        if isinstance(last.get("started_at"), (int, float)) and not isinstance(last.get("ended_at"), (int, float)):
            out.append(job_id)
    return out


def keep_states(backend: str, states: dict) -> None:
    """Keep each job's state (job id -> JobState) in its record (:func:`update_state`)."""
    for job_id, state in states.items():
        for rec in find(job_id, backend, on_bad=None)[:1]:
            update_state(rec, state)


def link(run_id: str, backend: str, from_job: str, job: str) -> None:
    """Name ``job`` as the successor of ``from_job`` in run ``run_id``, once it was started
    (:func:`decide` marked it being started): from now on every reader follows it."""
    with _store().write() as con:
        _link(con, run_id, backend, from_job, job)


def _link(con, run_id: str, backend: str, from_job: str, job: str) -> None:
    con.execute("INSERT OR IGNORE INTO successors (run_id, backend, from_job, job) VALUES (?, ?, ?, ?)",
                (run_id, backend, from_job, job))
    con.execute("UPDATE successors SET job = ? WHERE run_id = ? AND backend = ? AND from_job = ? AND job IS NULL",
                (job, run_id, backend, from_job))


def _with_text(record: dict, rendered: str) -> dict:
    """``record`` naming the submitted text (and the dirty tree's diff), written beside the store."""
    stem = _stem(record["id"], record["backend"])
    diff = record.pop("_diff", "")
    rendered_path = rendered_dir() / f"{stem}.rendered"
    atomic_write(rendered_path, rendered.encode())
    record["rendered_file"] = str(rendered_path)
    if diff:
        diff_path = rendered_dir() / f"{stem}.diff"
        atomic_write(diff_path, diff.encode())
        record["git"]["diff_file"] = str(diff_path)
    return record


def record_submit(backend: str, spec: "JobSpec", rendered: str, job_id: str, fields: dict | None = None, job_file=None,
                  git_result: Callable[[], dict | None] | None = None) -> str | None:
    """Write the record of a job just submitted (``rendered``: the text submitted); a failure to
    write it is a warning, not an error (the job runs either way)."""
    import sys

    try:
        return save_new(build(backend, spec, job_id, fields, job_file, git_result), rendered)
    except (OSError, ValueError, TypeError) as err:
        print(f"halo-sched: warning: could not write the job record under {home()}: {err}", file=sys.stderr)
        return None
    except Exception as err:  # noqa: BLE001 - the store (db.StoreError), or a bug reading it: the job
        # runs either way, and submit must print its id; what went wrong is said, never hidden
        from .errors import HaloError

        why = str(err) if isinstance(err, HaloError) else f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        print(f"halo-sched: warning: the job record was not kept: {why}", file=sys.stderr)
        return None
