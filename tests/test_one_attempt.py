"""One failure, one next attempt, whichever actor dies at whichever step (issue 43 item 4).

A local run's keeper (halo_sched/keeper.py), the run's only actor, starts the next attempt in
steps: it sees the failure (``seen``), records the new attempt's identity, its job id and failure
key, before anything runs, marking the failed attempt's successor as being started
(``decided``), writes its job directory (``laid-out``), starts its supervisor (``started``) and
names it the failed attempt's successor (``recorded``). Here the keeper is SIGKILLed at each step
(``halo_sched.backends.base.step``, replaced in the keeper's process only), left unreaped as
``submit --wait`` would leave it, and ``watch RUN`` finds it gone: it starts a new keeper, which
carries the run on from the decided attempt, and submits nothing itself. Exactly one second
attempt ran, ``status RUN`` and ``list`` show it, and no job directory is left over. Real
torchrun (the trainer itself needs no torch)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, cli, example_job, free_port

#: The keeper, killed by SIGKILL when starting the next attempt reaches step argv[3].
KEEPER = """
import os, signal, sys
from halo_sched.backends import base

def step(name):
    if name == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)

base.step = step
from halo_sched import keeper
sys.exit(keeper.main(sys.argv[1:3]))
"""

STEPS = ["seen", "decided", "laid-out", "started", "recorded"]


@pytest.mark.torch
@pytest.mark.parametrize("at", STEPS)
def test_a_keeper_killed_at_any_step_leaves_exactly_one_next_attempt(tmp_path, monkeypatch, at):
    import halo_sched
    from halo_sched.backends import local
    from halo_sched.node.processes import same_process

    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", tmp_path / "node_fault_once.py")
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "node_fault_once.py", "args": []})
    monkeypatch.setenv("FAULT_NODE", "0")  # the one node fails on the first attempt
    monkeypatch.chdir(tmp_path)
    keepers = []

    def start_keeper(backend: str, run_id: str) -> None:
        with open(tmp_path / "keeper.log", "ab") as log:
            keepers.append(subprocess.Popen([sys.executable, "-c", KEEPER, backend, run_id, at],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))

    monkeypatch.setattr(local, "_start_keeper", start_keeper)
    run = halo_sched.submit(halo_sched.load(job), "local")
    (keeper,) = keepers
    deadline = time.monotonic() + 120
    while same_process(keeper.pid, None) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first attempt fails, the keeper starts the next one and dies on the way
    assert not same_process(keeper.pid, None), "the keeper is still running"

    # Found gone while it is a zombie, not reaped by a parent that lives on (as under `submit
    # --wait`): its lock is free. Unless the attempt was named already, the watcher starts a new
    # keeper (its log beside the lock, where the killed one, started by this test, wrote
    # nothing), which starts the attempt.
    w = cli("watch", run.id, "--quiet", "--timeout", "120", cwd=tmp_path)
    assert keeper.wait(timeout=10) == -signal.SIGKILL, (tmp_path / "keeper.log").read_text()[-3000:]
    assert w.returncode == 0, w.stderr[-3000:]
    log = local.keeper_lock("local", run.id).with_suffix(".log")
    second = log.read_text() if log.exists() else ""
    if at == "recorded":  # the attempt was named the successor: followed, no keeper needed
        assert "retrying" not in second, second
    else:
        assert "retrying (node fault) as" in second and f"run {run.id} ended with" in second, second
    counts = sorted(line.split()[0] for line in (tmp_path / "attempts.log").read_text().splitlines())
    assert counts == ["0", "1"], counts  # one first attempt, exactly one second

    jobs = sorted(p.name for p in local.state_root().iterdir() if not p.name.startswith("."))
    st = json.loads(cli("status", run.id, "--json", cwd=tmp_path).stdout)["run"]
    assert [(a["attempt"], a["status"]) for a in st["attempts"]] == [(0, "FAILED"), (1, "COMPLETED")], st
    assert sorted(a["id"] for a in st["attempts"]) == jobs, (st, jobs)  # no directory the run does not know
    listed = [json.loads(ln) for ln in cli("list", "--json", cwd=tmp_path).stdout.splitlines()]
    assert sorted((x["id"], x["run"]["attempt"]) for x in listed) == sorted((a["id"], a["attempt"])
                                                                            for a in st["attempts"])


# ---- the pieces, without torchrun ---------------------------------------------------------------


def _attempt(job_id: str, number: int) -> dict:
    return {"id": job_id, "backend": "local", "submitted": time.time(), "name": "t",
            "run": {"id": "r1", "attempt": number, "excluded": []}}


def test_an_attempt_is_decided_once():
    """Two actors deciding attempt 2 of one run keep one record: the second gets the first's."""
    from halo_sched import records

    first = records.decide(_attempt("a2", 1), "text")
    again = records.decide(_attempt("b2", 1), "text")
    assert first["id"] == again["id"] == "a2"
    assert [r["id"] for r in records.of_run("r1", "local")] == ["a2"]
    assert records.decide(_attempt("a3", 2), "text")["id"] == "a3"  # the next attempt is another decision


def test_an_attempt_decided_but_not_started_is_not_followed():
    """While the failed attempt's successor is being started (decided, perhaps never started),
    no reader takes the decided record for the successor; once the keeper names it, all do."""
    from halo_sched import db, records, runs

    records.write(_attempt("r1", 0))
    records.write(_attempt("a2", 1))
    # No row at all: a run recorded before successors were, followed by its attempt numbers.
    assert records.successor("r1", "local", "r1") == "a2"
    records.decide(_attempt("a3", 2), "text", "a2")
    assert records.successor("r1", "local", "a2") is None
    records.link("r1", "local", "a2", "a3")
    assert records.successor("r1", "local", "a2") == "a3"
    assert db.read("SELECT from_job, job FROM successors") == [("a2", "a3")]
