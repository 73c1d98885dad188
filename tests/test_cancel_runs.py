"""Cancelling a run stops its newest attempt, pending or running, on every backend (issue 43 item
10): ``cancel RUN`` (or the id of any of its attempts) follows the chain of attempts as ``status
RUN`` does (halo_sched/runs.py ``newest_attempt``: the store's successors, the marker a failed
SLURM attempt left beside its output) and cancels the newest, saying which attempt of which run
it was; one whose successor is being started (decided by the run's live keeper, not started yet)
waits for it. A first
attempt that FAILED is no reason to say "already ended" while its successor waits to run.
Stand-ins only: local job directories, the fake Nomad API, a SLURM marker file."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import pytest
import yaml

from halo_sched import db, records, runs
from helpers import REPO, cli, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
TOKEN = "tok-cancel"


def _attempt(job_id: str, run_id: str, number: int, backend: str = "local", **extra) -> dict:
    return {"id": job_id, "backend": backend, "submitted": time.time(), "name": "t", "nodes": 1,
            "nproc_per_node": 1, "run": {"id": run_id, "attempt": number, "excluded": []}, **extra}


def _local_attempt(job_id: str, run_id: str | None, number: int, state: str) -> None:
    """A local attempt as its supervisor leaves it (no process: a RUNNING one is cancelled by its mark)."""
    from halo_sched.backends.local import state_root

    d = state_root() / job_id
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"submitted": time.time(), "state": state, "exit_code": 1}))
    (d / "job.json").write_text(json.dumps({"nodes": 1}))
    (d / "job.log").write_text("")
    rec = _attempt(job_id, run_id or job_id, number, last_state={"status": state, "describe": f"{state}: node 0 exit 1"})
    if run_id is None:  # a job of no run: no retry:
        del rec["run"]
    records.write(rec)


def _settled(run_id: str, backend: str, old: str, new: str) -> None:
    records.link(run_id, backend, old, new)


@contextlib.contextmanager
def _keeper_alive(run_id: str):
    """The run's keeper, as its lock says: held here for the block."""
    import fcntl

    from halo_sched.backends.local import keeper_lock

    fd = os.open(keeper_lock("local", run_id), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _state_of(job_id: str) -> str:
    from halo_sched.backends.local import state_root

    return json.loads((state_root() / job_id / "state.json").read_text())["state"]


def test_cancel_of_a_local_run_stops_its_newest_attempt_and_says_which():
    _local_attempt("r1", "r1", 0, "FAILED")
    _local_attempt("a2", "r1", 1, "RUNNING")
    _settled("r1", "local", "r1", "a2")
    for given in ("r1", "a2"):  # the run's id or any attempt's: the run's newest attempt
        r = cli("cancel", given, timeout=60)
        assert r.returncode == 0, r.stderr
        if given == "r1":
            assert "halo-sched: cancel requested for a2 (attempt 2 of run r1)" in r.stderr, r.stderr
            assert _state_of("a2") == "CANCELLED" and _state_of("r1") == "FAILED"
        else:  # ended now: said of the newest attempt, nothing sent
            assert "halo-sched: a2 (attempt 2 of run r1) already ended (" in r.stderr, r.stderr


def test_a_job_of_no_run_is_cancelled_as_it_is():
    _local_attempt("solo", None, 0, "RUNNING")
    r = cli("cancel", "solo", timeout=60)
    assert r.returncode == 0 and "halo-sched: cancel requested for solo\n" in r.stderr, r.stderr


def test_a_successor_being_started_is_waited_for_and_is_what_is_cancelled(monkeypatch):
    """The run's keeper decided the next attempt (records.decide marked it being started) and has
    not started it yet: the cancel waits for it (polled, at most runs.STARTING_WAIT_S) instead of
    calling the run ended; here the keeper names it at the first poll."""
    from halo_sched.backends import get

    records.write(_attempt("r1", "r1", 0, last_state={"status": "FAILED"}))
    records.decide(_attempt("a2", "r1", 1), "text", "r1")
    polls = []

    def poll(_s: float) -> None:
        polls.append(_s)
        records.link("r1", "local", "r1", "a2")

    monkeypatch.setattr(runs.time, "sleep", poll)
    with _keeper_alive("r1"):
        newest = runs.newest_attempt(get("local"), "r1")
    assert (newest.id, newest.attempt, newest.run, len(polls)) == ("a2", 1, "r1", 1)
    assert newest.words() == " (attempt 2 of run r1)"
    # An attempt decided by a keeper that is gone is not waited for (the next keeper starts it).
    records.decide(_attempt("a3", "r1", 2), "text", "a2")
    assert runs.newest_attempt(get("local"), "r1").id == "a2" and len(polls) == 1


def test_a_slurm_run_is_followed_through_the_marker_its_failed_attempt_left(tmp_path):
    """SLURM: the failed attempt's batch script submitted the successor and left the signed
    marker beside its output file; the store knows nothing of it yet."""
    from halo_sched.backends import get
    from halo_sched.node import successor

    key = "k" * 64
    out = tmp_path / "halo-t-100.out"
    records.write(_attempt("100", "100", 0, backend="slurm", outputs=[str(out)], failure_key=key,
                           last_state={"status": "FAILED"}))
    path = successor.marker_path(str(tmp_path), "100", 1)
    successor._write(path, {"run": "100", "attempt": 1, "from_job": "100", "excluded": ["node2"], "job": "101"}, key)
    newest = runs.newest_attempt(get("slurm"), "100")
    assert (newest.id, newest.words()) == ("101", " (attempt 2 of run 100)")


def _nomad_job(tmp_path) -> str:
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=4, nproc_per_node=4, retry={"attempts": 3, "on": ["node"]})
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_cancel_of_a_nomad_run_stops_the_version_its_newest_attempt_is(tmp_path, monkeypatch):
    """Nomad: attempt 1 (version 0) FAILED and its record says so; attempt 2 is version 1 of the
    same job, running. ``cancel RUN`` stops it and names it, instead of "already ended"."""
    import halo_sched
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig
    from halo_sched.runs import next_spec

    with fake_api.FakeNomad([fake_api.FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")],
                            token=TOKEN) as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(tmp_path / "home"),
                   PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        r = cli("submit", _nomad_job(tmp_path), "--backend", "nomad", env=env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        fake.set_running(job_id)
        fake.finish(job_id, "trainer[1]", 1)
        fake.finish(job_id, "trainer[0]", 0)
        assert "FAILED" in cli("status", job_id, env=env).stdout  # the record says it ended
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)),
                               retry_s=5)
        # Version 1 registered as the run's keeper would (here by this process) and followed.
        new = sched.submit_attempt(next_spec(halo_sched.load(str(tmp_path / "job.yaml")), job_id, 1, ("g1",), None),
                                   job_id).id
        records.link(job_id, "nomad", job_id, new)
        fake.set_running(job_id)
        r = cli("cancel", job_id, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"halo-sched: cancel requested for {new} (attempt 2 of run {job_id})" in r.stderr, r.stderr
        assert len(fake.requests_to(f"/v1/job/{job_id}", "DELETE")) == 1
