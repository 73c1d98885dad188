"""The command-line habits people bring (issue 41, item 5): ``--set key.path=value`` on the
commands that read a job file (``halo_sched.with_changes``'s rules, the value read as YAML),
``--json`` on ``submit``, ``validate`` and ``cancel``, and ``cancel --wait`` bounded by
``--timeout`` with an exit code that says whether the job ended."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import halo_sched
from halo_sched import cli, records
from halo_sched.backends.base import JobState, JobStatus, Scheduler
from halo_sched.spec import load, with_changes
from helpers import FAKE_TORCHRUN, free_port, write_tool

JOB = "name: habits\nnodes: 2\nnproc_per_node: 1\ntrainer: {script: train.py, args: [--steps, '2']}\n"


def run(*args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def job(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path / "job.yaml"


# ---- --set ---------------------------------------------------------------------------------------


def test_set_changes_the_job_as_with_changes_does(job, monkeypatch):
    d = job.parent
    monkeypatch.chdir(d)  # the library renders from where the CLI runs
    changes = {"nodes": 3, "trainer.args": ["--lr", "0.1"], "slurm.partition": "gpu", "env.TAG": "007"}
    sets = ["--set", "nodes=3", "--set", 'trainer.args=[--lr, "0.1"]', "--set", "slurm.partition=gpu",
            "--set", 'env.TAG="007"']
    r = run("render", str(job), "--backend", "slurm", *sets, cwd=d)
    assert r.returncode == 0, r.stderr
    want = halo_sched.render(with_changes(load(job), changes), "slurm")
    assert r.stdout == (want if want.endswith("\n") else want + "\n"), "the CLI's --set is the library's with_changes"
    assert "#SBATCH --partition=gpu" in r.stdout and "#SBATCH --nodes=3" in r.stdout
    r = run("validate", str(job), "--json", "--set", "nodes=2", "--set", "nodes=4", cwd=d)  # the last one wins
    assert r.returncode == 0 and json.loads(r.stdout)["nodes"] == 4, r.stderr
    r = run("submit", str(job), "--dry-run", "--backend", "slurm", *sets, cwd=d)
    assert r.returncode == 0 and "#SBATCH --partition=gpu" in r.stdout and "--lr 0.1" in r.stdout, r.stderr


@pytest.mark.parametrize("setting, words", [
    ("nodes", "argument --set: 'nodes': give KEY.PATH=VALUE"),
    ("=4", "argument --set: '=4': give KEY.PATH=VALUE"),
    ("trainer.args=[a", "argument --set: trainer.args: not a YAML value"),
    ("nodes=zero", "nodes: Input should be a valid integer"),
    ("env.TAG=007", "env"),  # YAML reads 007 as a number: env values are text
    ("slurm.partiton=gpu", "slurm.partiton: unknown key; did you mean partition?"),
    ("trainer.args.3=x", "trainer.args.3: no item 3 in a list of 2"),
    ("nodes.count=2", "nodes.count: nodes is a value, not a section"),
    ("a..b=1", "a..b: a field path is dotted names"),
    ("x" * 300 + "=1", "a field path of 300 characters (at most 200)"),
    ("trainer.args=" + "[" * 100 + "]" * 100, "trainer.args: not a YAML value"),
])
def test_a_bad_set_is_exit_2_naming_its_path(job, setting, words):
    for cmd in (["validate", str(job)], ["render", str(job)], ["submit", str(job), "--dry-run"]):
        r = run(*cmd, "--set", setting, cwd=job.parent, timeout=60)
        assert r.returncode == 2, (cmd, r.stderr)
        assert words in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
        assert r.stdout == ""


# ---- --json ------------------------------------------------------------------------------------


def test_validate_json_says_ok_or_each_problem_with_its_field_and_line(job):
    bad = job.parent / "bad.yaml"
    bad.write_text(JOB.replace("nodes: 2", "nodes: zero") + "slurm: {qos: 'a b'}\n")
    r = run("validate", str(job), str(bad), "--json", cwd=job.parent)
    assert r.returncode == 2
    ok, no = (json.loads(line) for line in r.stdout.splitlines())
    assert ok == {"file": str(job), "ok": True, "name": "habits", "nodes": 2, "nproc_per_node": 1, "world_size": 2,
                  "warnings": []}
    assert no["file"] == str(bad) and no["ok"] is False
    assert [(p["field"], p["line"]) for p in no["problems"]] == [("nodes", 2), ("slurm.qos", 5)]
    assert all(p["message"] for p in no["problems"])
    # A warning is in the object (and on stderr, for a person).
    (job.parent / "img.yaml").write_text(JOB + "image: repo/x:1\n")
    r = run("validate", str(job.parent / "img.yaml"), "--backend", "nomad", "--json", cwd=job.parent)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"] and out["warnings"] == [
        f"{job.parent / 'img.yaml'}: trainer.script train.py: not checked (read inside image repo/x:1)"]
    assert "not checked" in r.stderr


def _fake_torchrun(tmp_path):
    """A torchrun that records its call and exits 0: a local job completes without torch."""
    bindir, out = tmp_path / "bin", tmp_path / "torchrun-out"
    bindir.mkdir()
    out.mkdir()
    write_tool(bindir, "torchrun", FAKE_TORCHRUN)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_TORCHRUN_DIR": str(out)}


def test_submit_json_gives_the_id_backend_and_with_wait_the_final_state(job, tmp_path):
    env = _fake_torchrun(tmp_path)
    job.write_text(JOB + f"rendezvous: {{port: {free_port()}}}\n")
    r = run("submit", str(job), "--json", "--wait", "-q", cwd=job.parent, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert set(out) == {"id", "backend", "name", "state"} and out["backend"] == "local" and out["name"] == "habits"
    assert out["state"]["id"] == out["id"] and out["state"]["status"] == "COMPLETED" and out["state"]["exit_code"] == 0
    # Without --wait: the id and where it went; then cancel --json --wait says what it cancelled.
    job.write_text(JOB + "setup: ['sleep 60']\n")
    r = run("submit", str(job), "--json", cwd=job.parent, env=env)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and set(out) == {"id", "backend", "name"}, r.stdout
    r = run("cancel", out["id"], "--json", "--wait", "--timeout", "60", cwd=job.parent)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["cancelled"] == [out["id"]] and got["already_ended"] == {} and got["unknown"] == []
    assert got["ended"][out["id"]]["status"] == "CANCELLED"
    assert f"halo-sched: {out['id']} CANCELLED" in r.stderr
    r = run("cancel", out["id"], "--json", cwd=job.parent)  # again: nothing to do, said so
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["cancelled"] == [] and out["id"] in got["already_ended"]


def test_submit_json_refuses_a_dry_run_and_cancel_options_that_do_not_go_together(job):
    r = run("submit", str(job), "--json", "--dry-run", cwd=job.parent)
    assert r.returncode == 2 and "--json and --dry-run" in r.stderr
    r = run("cancel", "x-1", "--timeout", "5", cwd=job.parent)
    assert r.returncode == 2 and "--timeout applies to cancel --wait" in r.stderr
    r = run("cancel", "x-1", "--wait", "--signal", "USR2", cwd=job.parent)
    assert r.returncode == 2 and "a warning does not end the job" in r.stderr


# ---- cancel --wait ------------------------------------------------------------------------------


class Stubborn(Scheduler):
    """A scheduler whose jobs run on whatever is asked: ``ends`` of them end when cancelled."""

    name = "slurm"

    def __init__(self, ends=()):
        self.ends, self.cancelled = set(ends), set()

    def query(self, ids):
        return {i: JobState(i, JobStatus.CANCELLED if i in self.cancelled and i in self.ends else JobStatus.RUNNING,
                            raw_state="RUNNING") for i in ids}

    def render(self, spec, **opts):  # pragma: no cover - not used
        return ""

    def schedule(self, dryrun):  # pragma: no cover - not used
        raise NotImplementedError

    def cancel(self, ids, **opts):
        self.cancelled |= set(ids)

    def logs(self, job_id, follow=False):  # pragma: no cover - not used
        yield from ()


def _cancel(monkeypatch, capsys, sched, *args):
    monkeypatch.setattr(cli, "_scheduler", lambda name: sched)
    rc = cli.main(["cancel", *args, "--backend", "slurm"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cancel_wait_exit_1_when_the_job_still_runs_at_the_timeout(monkeypatch, capsys):
    rc, out, err = _cancel(monkeypatch, capsys, Stubborn(), "101", "--wait", "--timeout", "1", "--json")
    assert rc == 1 and "halo-sched: 101 still RUNNING after --timeout 1s" in err, err
    assert json.loads(out)["ended"]["101"]["status"] == "RUNNING"
    rc, out, err = _cancel(monkeypatch, capsys, Stubborn(ends={"102"}), "102", "--wait", "--timeout", "30")
    assert rc == 0 and "halo-sched: 102 CANCELLED" in err and out == "", err


def test_cancel_wait_says_when_the_run_went_on(monkeypatch, capsys, tmp_path):
    """An attempt of a run whose next attempt was started (decided before the cancel): the run
    has not ended, whatever the attempt did."""
    spec = halo_sched.spec_from_yaml(JOB + "retry: {attempts: 2, on: [node]}\n")
    records.record_submit("slurm", spec, "#!/bin/bash\n", "201", {})
    from halo_sched import runs

    sched = Stubborn(ends={"201"})
    # Decided as the cancel went out: `cancel RUN` follows the run to its newest attempt before it
    # cancels, so the next attempt shows only once 201 was cancelled.
    monkeypatch.setattr(runs, "next_attempt",
                        lambda s, run_id, job_id: "202" if job_id == "201" and "201" in sched.cancelled else None)
    rc, _, err = _cancel(monkeypatch, capsys, sched, "201", "--wait", "--timeout", "30")
    assert rc == 1 and "201: its run went on as 202" in err and "halo-sched cancel 202" in err, err
