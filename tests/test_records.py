"""Job records: written at submit, found from the id alone, listed with one query per backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from halo_sched import cli, records, store
from halo_sched.backends.base import JobState, JobStatus
from halo_sched.backends.slurm import SlurmScheduler
from helpers import REPO, example_job, free_port, load_all

FAKE_SBATCH = """#!/bin/bash
cat > /dev/null
sleep 0.3  # both submits are in flight at once
echo $$
"""


def _fake_bin(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "sbatch").write_text(FAKE_SBATCH)
    (b / "sbatch").chmod(0o755)
    return b


def test_two_concurrent_submits_write_two_whole_records(tmp_path):
    job = example_job(tmp_path, 29555)
    env = {**os.environ, "PATH": f"{_fake_bin(tmp_path)}:{os.environ['PATH']}", "HALO_SUBMIT_RETRY_S": "0"}
    procs = [subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "submit", str(job), "--backend", "slurm"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = sorted(o[0].strip().splitlines()[-1] for o in outs)
    recs = sorted(load_all(), key=lambda r: r["id"])
    assert [r["id"] for r in recs] == ids and len(set(ids)) == 2
    for r in recs:
        assert r["backend"] == "slurm" and r["name"] == "ddp-cpu"
        # The output path as sbatch will write it, absolute, in the submit directory.
        assert r["outputs"] == [str(REPO / f"halo-ddp-cpu-{r['id']}.out")]
        assert r["job_file"] == str(job) and len(r["job_file_sha256"]) == 64
        assert open(r["rendered_file"]).read().startswith("#!/bin/bash")
        assert r["spec"]["nodes"] == 2 and r["git"]["repo"] == str(REPO) and len(r["git"]["commit"]) == 40


def test_an_earlier_releases_files_are_imported_once_and_a_torn_one_costs_only_itself(tmp_path):
    records.write({"id": "7", "backend": "slurm", "submitted": 1.0})
    d = records.jobs_dir()
    d.mkdir(parents=True)
    (d / "6@slurm.json").write_text(json.dumps({"id": "6", "backend": "slurm", "submitted": 2.0, "name": "old"}))
    (d / ".tmp-crash").write_text('{"id": "8", "backe')  # a crash mid-write: not a record
    (d / "9@slurm.json").write_text('{"id": "9"')  # torn by something else
    bad = []
    assert [r["id"] for r in load_all(on_bad=bad.append)] == ["6", "7"]
    assert [(b.id, b.reason) for b in bad] == [("9", "truncated JSON (10 bytes)")]
    # Imported once: the files moved aside, the store holds them; importing again changes nothing.
    assert sorted(p.name for p in (d / "imported").iterdir()) == ["6@slurm.json", "9@slurm.json"]
    assert not list(d.glob("*.json")) and (d / ".tmp-crash").exists()
    assert records.find("6", "slurm")[0]["name"] == "old"


def test_ids_with_region_and_namespace_are_one_file_each():
    records.write({"id": "eu:ml/train-1", "backend": "nomad"})
    assert records.find("eu:ml/train-1")[0]["backend"] == "nomad"
    assert records.find("train-1") == []


def test_secrets_never_reach_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cret-value")
    job = example_job(tmp_path, 29556, secret_env=["HF_TOKEN"])
    env = {**os.environ, "PATH": f"{_fake_bin(tmp_path)}:{os.environ['PATH']}", "HALO_SUBMIT_RETRY_S": "0"}
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", str(job), "--backend", "slurm"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rec = load_all()[0]
    assert rec["spec"]["secret_env"] == ["HF_TOKEN"]
    # (A .diff is the trainer tree's own uncommitted change, which may hold this test's literal.)
    files = [p for p in records.home().rglob("*") if p.is_file() and p.suffix != ".diff"]
    assert any(p.name == "halo-sched.db" for p in files)
    for p in files:
        assert b"s3cret-value" not in p.read_bytes(), p


class CountingTransport:
    def __init__(self):
        self.queries: list[list[str]] = []

    def query(self, ids):
        self.queries.append(list(ids))
        # Half the jobs are forgotten by SLURM (MinJobAge): UNKNOWN.
        return {i: JobState(i, JobStatus.RUNNING if int(i) % 2 else JobStatus.UNKNOWN) for i in ids}


def test_list_of_50_jobs_is_one_scheduler_query(monkeypatch, capsys):
    for i in range(50):
        records.write({"id": str(1000 + i), "backend": "slurm", "submitted": float(i), "name": "j",
                       "last_state": {"status": "COMPLETED", "describe": "COMPLETED exit=0"}})
    t = CountingTransport()
    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=t))
    assert cli.main(["list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(t.queries) == 1 and sorted(t.queries[0]) == [str(1000 + i) for i in range(50)]
    assert len(rows) == 50 and rows[0]["id"] == "1049"  # newest first
    live = {r["id"]: r for r in rows}
    assert live["1001"]["status"] == "RUNNING" and live["1001"]["live"]
    # Forgotten by the scheduler: the last state the record kept.
    assert live["1000"]["status"] == "COMPLETED" and not live["1000"]["live"]
    assert cli.main(["list", "--state", "completed"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 25


def test_an_id_finds_its_backend_from_the_record(monkeypatch, capsys):
    records.write({"id": "4242", "backend": "slurm", "submitted": 1.0})
    t = CountingTransport()
    seen = []
    monkeypatch.setattr(cli, "_scheduler", lambda name: seen.append(name) or SlurmScheduler(transport=t))
    assert cli.main(["status", "4242"]) == 0
    assert seen == ["slurm"]
    # --backend given explicitly still wins (there, no record and the stand-in does not know
    # the id: bad input).
    assert cli.main(["status", "4242", "--backend", "nomad"]) == 2
    assert seen[-1] == "nomad"


class ForgetfulTransport(CountingTransport):
    def job_info(self, job_id):
        from halo_sched.errors import SchedulerError

        raise SchedulerError(f"scontrol: Invalid job id specified ({job_id})")


def test_slurm_logs_and_failure_after_the_scheduler_forgot_the_job(tmp_path, monkeypatch, capsys):
    from halo_sched.node.failure_collector import record_line

    out = tmp_path / "halo-j-77.out"
    fail = {"node": 1, "rank": 3, "local_rank": 1, "host": "n2", "exit_code": 1, "signal": None,
            "time": 1000.0, "error": "ValueError: boom", "tail": [], "stopped": False}
    key = "3d" * 32  # the job's failure key (its record): the node signed its line with it
    out.write_text("0: [rank 0] hello\n1: [rank 3] bye\n1: " + record_line(fail, key, []))
    records.write({"id": "77", "backend": "slurm", "submitted": 1.0, "outputs": [str(out)], "failure_key": key})
    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=ForgetfulTransport()))
    assert cli.main(["logs", "77", "--rank", "3"]) == 0
    assert capsys.readouterr().out == "[node 1 rank 3] bye\n"
    assert cli.main(["logs", "77", "--node", "0"]) == 0
    assert capsys.readouterr().out == "[node 0 rank 0] hello\n"

    class Failed(ForgetfulTransport):
        def query(self, ids):
            return {i: JobState(i, JobStatus.FAILED, exit_code=1) for i in ids}

    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=Failed()))
    assert cli.main(["status", "77"]) == 0
    assert "FAILED: ValueError: boom [rank 3 (node 1, host n2, local rank 1) exit 1 at" in capsys.readouterr().out


# ---- a bad file fails its own job, never every command ----------------------------------------


def _local_job(job_id: str, state: str = '{"state": "COMPLETED", "exit_code": 0}', meta: str = '{"nodes": 2}',
               submitted: float = 1.0) -> None:
    """A finished local job as its directory and record show it (no process behind it)."""
    from halo_sched.backends.local import state_root

    d = state_root() / job_id
    d.mkdir(parents=True)
    (d / "state.json").write_text(state)
    (d / "job.json").write_text(meta)
    (d / "job.log").write_text("[node 0] hello\n[node 1] hello\n")
    records.write({"id": job_id, "backend": "local", "submitted": submitted, "nodes": 2, "nproc_per_node": 2})


def _run(*args, timeout=30):
    # A subprocess with a deadline: a read that blocks (a FIFO) fails the test instead of hanging it.
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HALO_SCHED_BACKEND": "local"})


BAD_RECORDS = {
    "torn@local.json": '{"id": "torn", "backend": "lo',
    "types@local.json": json.dumps({"id": "types", "backend": "local", "submitted": "yesterday"}),
    "state@local.json": json.dumps({"id": "state", "backend": "local", "last_state": ["RUNNING"]}),
    "outs@slurm.json": json.dumps({"id": "outs", "backend": "slurm", "outputs": [7]}),
    "intid@local.json": json.dumps({"id": 12, "backend": "local"}),
    "list@local.json": "[1, 2]",
}


def test_a_torn_or_mistyped_record_is_shown_unreadable_and_fails_no_other_command():
    _local_job("good-1", submitted=2.0)
    _local_job("good-2", submitted=3.0)
    records.jobs_dir().mkdir()  # files of an earlier release, imported by the first command
    for name, text in BAD_RECORDS.items():
        (records.jobs_dir() / name).write_text(text)
    r = _run("list")
    assert r.returncode == 0, r.stderr
    rows = {line.split("\t")[0]: line for line in r.stdout.splitlines()}
    assert "COMPLETED exit=0" in rows["good-1"] and "COMPLETED exit=0" in rows["good-2"]
    # Every bad one is a row saying so, and one short stderr line: none vanishes silently.
    for name in BAD_RECORDS:
        assert "UNREADABLE record (" in rows[records._from_name(records.jobs_dir() / name)[0]], (name, r.stdout)
    warnings = [line for line in r.stderr.splitlines() if "unreadable job record" in line]
    assert len(warnings) == len(BAD_RECORDS) and all(len(w) < 200 for w in warnings), r.stderr
    assert "truncated JSON" in r.stderr and "'submitted' is a str" in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    js = [json.loads(line) for line in _run("list", "--json", "--state", "unreadable").stdout.splitlines()]
    assert sorted(j["id"] for j in js) == sorted(records._from_name(records.jobs_dir() / n)[0] for n in BAD_RECORDS)
    for args in (["status", "good-1", "good-2"], ["cancel", "good-1"], ["logs", "good-1"], ["watch", "good-2"]):
        r = _run(*args)
        assert r.returncode == 0 and "internal error" not in r.stderr, (args, r.stderr)
    assert records.find("good-1")[0]["id"] == "good-1"


def test_a_fifo_named_like_a_record_never_blocks():
    _local_job("good-1")
    records.jobs_dir().mkdir()
    os.mkfifo(records.jobs_dir() / "pipe@local.json")  # nobody ever writes it: a plain open blocks
    os.mkfifo(records.jobs_dir() / "good-2@local.json")
    r = _run("list")
    assert r.returncode == 0, r.stderr
    assert "good-1\tlocal" in r.stdout and "pipe\tlocal\t\tUNREADABLE record (not a regular file)" in r.stdout
    r = _run("status", "good-2")  # its record is the FIFO: the id is still known, nothing blocks
    assert r.returncode == 0 and "not a regular file" in r.stderr, r.stderr


def test_a_huge_record_is_refused_unread(monkeypatch):
    monkeypatch.setattr(store, "MAX_RECORD_BYTES", 1000)
    (records.jobs_dir()).mkdir(parents=True)
    (records.jobs_dir() / "big@local.json").write_text(json.dumps({"id": "big", "backend": "local", "pad": "x" * 5000}))
    bad = []
    assert load_all(on_bad=bad.append) == []
    assert [b.reason for b in bad] == ["larger than 1000 bytes"]


@pytest.mark.parametrize("state", ['{"state": "RUNN', '{"state": 5}', '[]', '{"state": "COMPLETED", "exit_code": "0"}'])
def test_a_torn_local_state_file_fails_only_its_own_job(state):
    _local_job("good-1")
    _local_job("torn-1", state=state)
    r = _run("list")
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    assert "good-1\tlocal" in r.stdout and "COMPLETED exit=0" in r.stdout
    r = _run("status", "good-1", "torn-1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("good-1\tCOMPLETED") and lines[1].startswith("torn-1\tUNKNOWN")
    assert "unreadable state.json" in lines[1]
    # Cancel still works on it (the job may be running): the state file is rewritten whole.
    r = _run("cancel", "torn-1")
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    assert _run("status", "torn-1").stdout.startswith("torn-1\tCANCELLED")


# ---- one submit pipeline: the library's record is the CLI's ------------------------------------


def test_a_library_submit_records_the_job_file_as_the_cli_does(tmp_path):
    import hashlib

    import halo_sched

    job = example_job(tmp_path, free_port(), nodes=1)
    sha = hashlib.sha256(job.read_bytes()).hexdigest()
    handle = halo_sched.submit(halo_sched.load(job), "local")
    # The same file names the same rendezvous port: the first job must let it go before the second
    # starts, or the second is refused ("rendezvous.port N is in use") once the first has bound it.
    handle.cancel(wait=True)
    r = _run("submit", str(job), "--backend", "local")
    assert r.returncode == 0, r.stderr
    cli_id = r.stdout.strip().splitlines()[-1]
    try:
        by_library = records.find(handle.id, "local")[0]
        by_cli = records.find(cli_id, "local")[0]
    finally:
        _run("cancel", cli_id, "--backend", "local")
    for rec in (by_cli, by_library):
        assert rec["job_file"] == str(job.resolve()) and rec["job_file_sha256"] == sha
    same = ("name", "nodes", "nproc_per_node", "spec", "submit_dir", "job_file", "job_file_sha256")
    assert {k: by_library[k] for k in same} == {k: by_cli[k] for k in same}
    assert {**by_library["git"], "diff_file": None} == {**by_cli["git"], "diff_file": None}
