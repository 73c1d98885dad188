"""The history store (halo_sched/db.py): concurrent processes lose no update, a run's next attempt
is submitted once however many processes wait on it, earlier releases' files are imported, and a
broken store is a clear error (exit 2), never a traceback."""
from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import time
from pathlib import Path

import pytest

import halo_sched.errors  # noqa: F401 - the module itself: `import halo_sched` loads it lazily
from halo_sched import db, records, runs
from halo_sched.jobstate import JobState, JobStatus
from halo_sched.node.failure_classes import NODE_FAULT, Classification
from helpers import cli, example_job, load_all


def _join(procs, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} processes did not finish within {seconds} s"
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _start_all(target, argsets) -> list:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in argsets]
    for p in procs:
        p.start()
    return procs


# ---- no lost update -------------------------------------------------------------------------


def _lister(home: str, stop: str) -> None:
    """As ``list`` does: a record read once, then its state kept, again and again (until the
    observers are done, and a few times after)."""
    os.environ["HALO_SCHED_HOME"] = home
    stale = records.find("r1", "local")[0]
    deadline, after = time.monotonic() + 90, 0
    i = 0
    while time.monotonic() < deadline and after < 5:
        after += os.path.exists(stop)
        records.update_state(dict(stale), JobState("r1", JobStatus.RUNNING if i % 2 else JobStatus.PENDING))
        i += 1


def _observer(home: str, rounds: int) -> None:
    """As a waiting process does (core.note: records.update_state, observed): each state kept,
    and when it saw the attempt run and end."""
    os.environ["HALO_SCHED_HOME"] = home
    stale = records.find("r1", "local")[0]
    for _ in range(rounds):
        records.update_state(dict(stale), JobState("r1", JobStatus.RUNNING), observed=True)
    records.update_state(dict(stale), JobState("r1", JobStatus.FAILED), observed=True)


def test_twenty_processes_updating_one_record_lose_nothing(tmp_path, monkeypatch):
    home = str(tmp_path / "shared-home")
    monkeypatch.setenv("HALO_SCHED_HOME", home)
    records.write({"id": "r1", "backend": "local", "submitted": 1.0, "run": {"id": "r1", "attempt": 0}})
    stop = str(tmp_path / "observers-done")
    listers = _start_all(_lister, [(home, stop)] * 10)
    _join(_start_all(_observer, [(home, 5)] * 10))
    Path(stop).touch()
    _join(listers)
    rec = records.find("r1", "local")[0]
    assert {"observed_start", "observed_end"} <= set(rec["run"]), rec["run"]
    assert rec["last_state"]["status"] == "FAILED"  # the end kept: no stale lister's state over it


# ---- one next attempt per failed attempt: readers follow, none submits -----------------------

NODE = Classification(NODE_FAULT, "NCCL network error", "n1", "nccl-ib")


class FakeScheduler:
    """A scheduler whose failed attempt started its successor itself (SLURM's marker: j1 -> j2,
    n1 kept off); a submit writes a line to a file (none may come)."""

    name = "slurm"
    starts_successor = True

    def __init__(self, log: str):
        self.log = log

    def successor_of(self, record):
        if record.get("id") == "j1":
            return {"job": "j2", "excluded": ["n1"], "submitted_at": 2.0, "retry_on": "node"}
        return None

    def attempt_fields(self, record, job_id):
        return {}

    def owner_gone(self, run_id):
        return False

    def guardian_alive(self, job_id):
        return False

    def submit(self, spec, **opts):
        with open(self.log, "a") as f:
            f.write("submitted\n")
        raise AssertionError("a reader submitted")

    submit_attempt = submit


def _state(job_id: str) -> JobState:
    if job_id == "j1":
        st = JobState(job_id, JobStatus.FAILED)
        st.failure_class = lambda: NODE
        return st
    return JobState(job_id, JobStatus.COMPLETED)


def _watcher(home: str, job: str, log: str, out: str) -> None:
    os.environ["HALO_SCHED_HOME"] = home
    spec = halo_sched.load(job)
    last, state = runs.wait_run(FakeScheduler(log), spec, "j1", lambda job_id: _state(job_id))
    with open(out, "a") as f:
        f.write(f"{last} {state.status.value}\n")


def test_readers_of_one_failed_attempt_record_its_one_successor_and_submit_nothing(tmp_path, monkeypatch):
    """Six processes wait on a run whose first attempt failed and started its successor itself:
    each follows it to its end, the store keeps one record of it and one row linking it (records.adopt,
    one transaction), and nothing is submitted; three more readers of the finished run neither."""
    home = str(tmp_path / "shared-home")
    monkeypatch.setenv("HALO_SCHED_HOME", home)
    job = str(example_job(tmp_path, 29500, retry={"attempts": 3, "on": ["node"]}))
    records.write({"id": "j1", "backend": "slurm", "submitted": 1.0, "name": "t",
                   "run": {"id": "j1", "attempt": 0, "excluded": []}})
    log, out = tmp_path / "submits", tmp_path / "ends"
    _join(_start_all(_watcher, [(home, job, str(log), str(out))] * 6))
    assert not log.exists(), log.read_text()
    assert out.read_text().split("\n")[:-1] == ["j2 COMPLETED"] * 6
    assert [r["id"] for r in records.of_run("j1", "slurm")] == ["j1", "j2"]
    assert records.find("j2", "slurm")[0]["run"]["excluded"] == ["n1"]
    assert db.read("SELECT run_id, backend, from_job, job FROM successors") == [("j1", "slurm", "j1", "j2")]
    _join(_start_all(_watcher, [(home, job, str(log), str(out))] * 3))
    assert not log.exists() and out.read_text().split("\n")[:-1] == ["j2 COMPLETED"] * 9


def test_an_older_stores_successors_are_read_without_its_claims(tmp_path, monkeypatch):
    """A store of schema 2 (a waiting client's claims: who, until when) migrates to one without
    them: a named successor stays; a local attempt being started stays being started (the next
    keeper starts it); a claim another backend's client left without a job goes, so the attempt
    it may have registered is followed by its number."""
    home = tmp_path / "old-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HALO_SCHED_HOME", str(home))
    con = sqlite3.connect(home / "halo-sched.db")
    for v in (1, 2):
        for stmt in db._statements(db.MIGRATIONS[v]):
            con.execute(stmt)
    con.execute("PRAGMA user_version = 2")
    rows = [("s1", "slurm", "s1", "s2", "the attempt", 0), ("l1", "local", "l1", None, "host:1", 1e12),
            ("n1", "nomad", "n1", None, "gone-host:2", 1e12)]
    con.executemany("INSERT INTO successors VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    records.write({"id": "n1", "backend": "nomad", "submitted": 1.0, "run": {"id": "n1", "attempt": 0}})
    records.write({"id": "n1~v1", "backend": "nomad", "submitted": 2.0, "run": {"id": "n1", "attempt": 1}})
    records.write({"id": "l2", "backend": "local", "submitted": 2.0, "run": {"id": "l1", "attempt": 1}})
    assert db.read("PRAGMA user_version") == [(db.SCHEMA_VERSION,)]
    assert [r[1] for r in db.read("PRAGMA table_info(successors)")] == ["run_id", "backend", "from_job", "job"]
    assert records.successor("s1", "slurm", "s1") == "s2"
    assert records.successor("l1", "local", "l1") is None and records.being_started("l1", "local", "l1")
    assert records.successor("n1", "nomad", "n1") == "n1~v1"


# ---- earlier releases, a broken store -------------------------------------------------------


def test_a_broken_store_is_exit_2_naming_the_file_and_what_to_do(tmp_path):
    home = Path(os.environ["HALO_SCHED_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "halo-sched.db").write_bytes(b"this is not a database" * 100)
    r = cli("list", timeout=60)
    assert r.returncode == 2 and "halo-sched.db is not a usable SQLite database" in r.stderr, r.stderr
    assert "move it aside" in r.stderr and "Traceback" not in r.stderr


def test_a_newer_schema_is_refused_and_an_older_one_migrates(tmp_path):
    home = Path(os.environ["HALO_SCHED_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(home / "halo-sched.db")
    con.execute(f"PRAGMA user_version = {db.SCHEMA_VERSION + 1}")
    con.close()
    r = cli("status", "123", "--backend", "local", timeout=60)
    assert r.returncode == 2 and f"written by a newer halo-sched (schema {db.SCHEMA_VERSION + 1}" in r.stderr, r.stderr
    (home / "halo-sched.db").unlink()
    con = sqlite3.connect(home / "halo-sched.db")  # version 0: an empty database
    con.close()
    records.write({"id": "x", "backend": "local", "submitted": 1.0})
    assert records.find("x", "local")[0]["id"] == "x"
    assert sqlite3.connect(home / "halo-sched.db").execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION


def test_a_home_that_is_a_file_is_exit_2():
    home = Path(os.environ["HALO_SCHED_HOME"])
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("not a directory")
    r = cli("list", timeout=60)
    assert r.returncode == 2 and "is not a directory" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_import_is_idempotent_and_keeps_a_later_state():
    d = records.jobs_dir()
    d.mkdir(parents=True)
    rec = {"id": "5", "backend": "slurm", "submitted": 1.0, "last_state": {"status": "RUNNING", "describe": "RUNNING",
                                                                           "at": 10.0}}
    (d / "5@slurm.json").write_text(json.dumps(rec))
    assert records.find("5", "slurm")[0]["last_state"]["status"] == "RUNNING"
    # The same file again (a second copy of an old home): an older state never replaces a newer one.
    later = dict(rec, last_state={"status": "COMPLETED", "describe": "COMPLETED exit=0", "at": 20.0})
    (d / "5@slurm.json").write_text(json.dumps(later))
    assert records.find("5", "slurm")[0]["last_state"]["status"] == "COMPLETED"
    (d / "5@slurm.json").write_text(json.dumps(rec))
    assert records.find("5", "slurm")[0]["last_state"]["status"] == "COMPLETED"
    assert len(load_all()) == 1


def test_a_lone_surrogate_in_a_job_s_text_never_reaches_the_store():
    st = JobState("s1", JobStatus.FAILED, reason="bad \ud800 text")
    records.write({"id": "s1", "backend": "local", "submitted": 1.0})
    records.update_state(records.find("s1", "local")[0], st)
    raw = db.read("SELECT data FROM jobs WHERE id = 's1'")[0][0]
    raw.encode("utf-8")  # strict UTF-8: no surrogate
    json.loads(raw)
    r = cli("list", "--json", timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_list_filters_by_name_run_state_and_time():
    now = time.time()
    for i in range(6):
        records.write({"id": f"f{i}", "backend": "local", "submitted": now - 3600 * i, "name": "a" if i % 2 else "b",
                       "run": {"id": "f0" if i < 3 else f"f{i}", "attempt": i if i < 3 else 0},
                       "last_state": {"status": "COMPLETED", "describe": "COMPLETED exit=0"}})
    ids = lambda *a: [json.loads(x)["id"] for x in cli("list", "--json", *a, timeout=60).stdout.splitlines()]  # noqa: E731
    assert ids() == [f"f{i}" for i in range(6)]
    assert ids("--name", "a") == ["f1", "f3", "f5"]
    assert ids("--run", "f0") == ["f0", "f1", "f2"]
    assert ids("--since", "150m") == ["f0", "f1", "f2"]
    assert ids("--limit", "2", "--name", "b") == ["f0", "f2"]
    r = cli("list", "--since", "yesterday", timeout=60)
    assert r.returncode == 2 and "--since" in r.stderr


def test_export_writes_what_the_store_holds(tmp_path):
    records.write({"id": "e1", "backend": "slurm", "submitted": 1.0, "name": "n", "failure_key": "k-0123456789abcdef"})
    from halo_sched import ledger

    ledger.add("h1", "NCCL network error", "e1", "slurm")
    r = cli("export", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema"] == db.SCHEMA_VERSION and [j["id"] for j in data["jobs"]] == ["e1"]
    assert [e["host"] for e in data["ledger"]] == ["h1"] and data["notifications"] == []
    assert "k-0123456789abcdef" not in r.stdout  # the key its nodes sign failure lines with stays in the store
    lines = [json.loads(x) for x in cli("export", timeout=60).stdout.splitlines()]
    assert [(x["kind"], x.get("id") or x.get("host")) for x in lines] == [("job", "e1"), ("ledger", "h1")]


@pytest.mark.parametrize("n", [3])
def test_status_finds_a_job_by_index_among_many(n):
    with db.write() as con:
        for i in range(2000):
            records._put(con, {"id": f"m{i}", "backend": "local", "submitted": float(i), "name": "m"})
    plan = db.read("EXPLAIN QUERY PLAN SELECT id, backend, submitted, data, bad FROM jobs WHERE id = ? AND backend = ?",
                   ("m1", "local"))
    assert any("USING INDEX" in str(row) or "PRIMARY KEY" in str(row) for row in plan), plan
    plan = db.read("EXPLAIN QUERY PLAN SELECT id FROM jobs ORDER BY submitted DESC LIMIT 50")
    assert any("jobs_by_time" in str(row) for row in plan), plan
    assert [r["id"] for r in records.page(n)] == ["m1999", "m1998", "m1997"]
