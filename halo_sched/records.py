"""One record per submitted job, so that every command works from the job id alone.

``submit`` writes ``$HALO_SCHED_HOME/jobs/<id>@<backend>.json`` (default home:
``$XDG_STATE_HOME/halo-sched``, else ``~/.local/state/halo-sched``): the backend and scheduler id,
where it went (cluster, region, namespace), its output files as absolute paths, a copy of what was
submitted, the job file's hash, the resolved spec, the submit time and directory, and what ran
(git commit, dirty tree with its diff beside the record). ``status``/``logs``/``cancel`` then find
the backend without ``--backend``; ``logs`` finds the output after the scheduler forgot the job;
``list`` shows recent jobs with their last known state.

Concurrency: one file per record, never a shared index. Each write goes to a temporary file in the
same directory, is fsynced and renamed over the record (atomic on POSIX), so two submits at once
write two whole records, and a crash mid-write leaves a ``.tmp-*`` file that readers ignore.
Reading never trusts a file: one that is torn, has the wrong types, is not a regular file (a FIFO
would block a plain open) or is too big is skipped with one warning line, and ``list`` shows it as
unreadable; no bad record can fail a command about another job.
Secrets never reach a record: the spec holds ``secret_env`` names only, never values.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple
from urllib.parse import quote, unquote

VERSION = 1

# The state directory and its files (store.py), named here too for the record's readers.
from .store import MAX_RECORD_BYTES, Unreadable, atomic_write, home, read_json, read_small  # noqa: E402,F401 - re-exported


def jobs_dir() -> Path:
    return home() / "jobs"


def _stem(job_id: str, backend: str) -> str:
    # Nomad ids carry ':' and '/' ([REGION:][NAMESPACE/]ID): encoded, so one id is one file name.
    return f"{quote(job_id, safe='')}@{quote(backend, safe='')}"


def path_for(job_id: str, backend: str) -> Path:
    return jobs_dir() / f"{_stem(job_id, backend)}.json"


def write(record: dict) -> Path:
    p = path_for(record["id"], record["backend"])
    atomic_write(p, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return p


#: A record is a few kB (the resolved spec is the largest part); anything this big is not one.


_STR = (str, type(None))
_NUM = (int, float, type(None))
_DICT = (dict, type(None))
#: The types each field must have when present (None always allowed); what the commands rely on.
_FIELDS: dict[str, tuple] = {
    "name": _STR, "submitted_iso": _STR, "submit_dir": _STR, "job_file": _STR, "job_file_sha256": _STR,
    "rendered_file": _STR, "submitted": _NUM, "nodes": (int, type(None)), "nproc_per_node": (int, type(None)),
    "last_state": _DICT, "spec": _DICT, "scheduler": _DICT, "git": _DICT, "outputs": (list, type(None)),
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
    """A record file that cannot be used: its id and backend as its name says, and why."""

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
    print(f"halo-sched: warning: skipping unreadable job record {bad.path.name}: {bad.reason}", file=sys.stderr,
          flush=True)


def _read(p: Path, on_bad: Callable[[BadRecord], None] | None = warn_bad) -> dict | None:
    """The record in ``p``; None when there is none or it is unusable (then ``on_bad`` hears why)."""
    try:
        data = read_json(p)
        why = _problem(data)
    except FileNotFoundError:
        return None
    except (OSError, Unreadable) as err:
        why = str(err) if isinstance(err, Unreadable) else (err.strerror or type(err).__name__)
    if why is None:
        return data
    if on_bad is not None:
        try:
            mtime = os.lstat(p).st_mtime
        except OSError:
            mtime = 0.0
        on_bad(BadRecord(p, *_from_name(p), why, mtime))
    return None


def _record_files(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.glob("*.json") if not p.name.startswith("."))
    except OSError:
        return []


def load_all(on_bad: Callable[[BadRecord], None] | None = warn_bad) -> list[dict]:
    """Every usable record, newest first. Temporary files are skipped; an unusable record file
    (torn, wrong types, not a regular file, too big) is skipped and passed to ``on_bad`` (by
    default: one short warning line on stderr)."""
    d = jobs_dir()
    if not d.is_dir():
        return []
    out = [r for p in _record_files(d) if (r := _read(p, on_bad)) is not None]
    return sorted(out, key=lambda r: r.get("submitted") or 0, reverse=True)


def find(job_id: str, backend: str | None = None,
         on_bad: Callable[[BadRecord], None] | None = warn_bad) -> list[dict]:
    """Records of ``job_id`` (one per backend that has such an id); unusable ones go to ``on_bad``."""
    d = jobs_dir()
    if backend:
        r = _read(path_for(job_id, backend), on_bad)
        return [r] if r and r["id"] == job_id and r["backend"] == backend else []
    prefix = quote(job_id, safe="") + "@"
    if len(prefix) > 255 or not d.is_dir():  # no file can have that name
        return []
    return [r for p in _record_files(d) if p.name.startswith(prefix) and _from_name(p)[0] == job_id
            and (r := _read(p, on_bad)) is not None and r["id"] == job_id]


def failure_key(job_id: str, backend: str) -> str:
    """The job's failure key (``failure_key``, made at submit: the key its nodes sign their
    failure lines with, halo_sched/node/failures.py); '' without a record that has one."""
    for rec in find(job_id, backend, on_bad=None):
        key = rec.get("failure_key")
        if isinstance(key, str):
            return key
    return ""


def exists(job_id: str, backend: str) -> bool:
    """Whether a record file (usable or not) names this job."""
    try:
        os.lstat(path_for(job_id, backend))
    except OSError:
        return False
    return True


def update_state(record: dict, state) -> None:
    """Keep ``state`` as the record's last known one (only when the scheduler still knows the job)."""
    from .backends.jobstate import JobStatus

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
    old = record.get("last_state") or {}
    if {k: v for k, v in old.items() if k != "at"} == {k: v for k, v in last.items() if k != "at"}:
        return
    record["last_state"] = last
    write(record)


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
    trainer = cwd / spec.trainer.script if spec.trainer.script else cwd
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


def build(backend: str, spec, job_id: str, fields: dict | None = None, job_file=None,
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
        "nodes": spec.nodes,
        "nproc_per_node": spec.nproc_per_node,
        # The resolved spec (defaults filled in). secret_env holds names; values are never here.
        "spec": spec.model_dump(mode="json"),
        "outputs": [],
        "scheduler": {},
    }
    rec.update(fields or {})
    attempt = getattr(spec, "_attempt", None)
    if attempt is not None or getattr(spec, "retry", None) is not None:
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


def save_new(record: dict, rendered: str) -> Path:
    """Write a new record, with the submitted text (and the dirty tree's diff) beside it."""
    stem = _stem(record["id"], record["backend"])
    diff = record.pop("_diff", "")
    rendered_path = jobs_dir() / f"{stem}.rendered"
    atomic_write(rendered_path, rendered.encode())
    record["rendered_file"] = str(rendered_path)
    if diff:
        diff_path = jobs_dir() / f"{stem}.diff"
        atomic_write(diff_path, diff.encode())
        record["git"]["diff_file"] = str(diff_path)
    return write(record)


def record_submit(backend: str, spec, rendered: str, job_id: str, fields: dict | None = None, job_file=None,
                  git_result: Callable[[], dict | None] | None = None) -> Path | None:
    """Write the record of a job just submitted (``rendered``: the text submitted); a failure to
    write it is a warning, not an error (the job runs either way)."""
    import sys

    try:
        return save_new(build(backend, spec, job_id, fields, job_file, git_result), rendered)
    except (OSError, ValueError, TypeError) as err:
        print(f"halo-sched: warning: could not write the job record under {jobs_dir()}: {err}", file=sys.stderr)
        return None
