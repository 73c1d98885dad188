"""Automatic retry and one logical run on the local backend, with real torchrun: a node fault
on the first attempt starts a second one (HALO_RESTART_COUNT 1) that completes; a Python
exception is not retried; ``status RUN`` shows each attempt with its node-hours and GPU-hours."""
from __future__ import annotations

import json
import shutil

import pytest

from helpers import REPO, cli, example_job, free_port

pytestmark = pytest.mark.torch
#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


def _job(tmp_path, trainer: str, retry: dict, args=()):
    shutil.copy(REPO / "tests" / "trainers" / trainer, tmp_path / trainer)
    return example_job(tmp_path, free_port(), nproc_per_node=1, retry=retry,
                       trainer={"script": trainer, "args": list(args)})


def test_a_node_fault_is_retried_and_the_run_completes(tmp_path):
    """...and ``status RUN`` measures its effective training time from the run itself: the ranks'
    progress reports (steps 1-4, then node 1 dies; steps 3-8 on the second attempt), the failure
    line, the scheduler's times; each figure checked against the same arithmetic on the files."""
    job = _job(tmp_path, "node_fault_once.py", {"attempts": 2, "on": ["node"]}, args=["--progress"])
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = r.stdout.strip().splitlines()[-1]
    # The run's keeper (halo_sched/keeper.py) submitted the second attempt; --wait followed it.
    assert "retrying (node fault) as " in r.stderr, r.stderr[-3000:]
    # Each rank saw its attempt's number: 0 on the first (2 nodes), 1 on the second.
    counts = sorted(line.split()[0] for line in (tmp_path / "attempts.log").read_text().splitlines())
    assert counts == ["0", "0", "1", "1"], counts

    st = cli("status", run_id, cwd=tmp_path)
    assert st.returncode == 0, st.stderr
    lines = st.stdout.splitlines()
    assert "FAILED (node fault" in lines[0], lines
    a1 = [ln for ln in lines if "\tattempt 1: " in ln]
    a2 = [ln for ln in lines if "\tattempt 2: " in ln]
    assert len(a1) == 1 and "FAILED (node fault" in a1[0] and REASON in a1[0], lines
    assert len(a2) == 1 and " COMPLETED;" in a2[0] and "2 nodes x " in a2[0], lines
    assert any("\trun: 2 attempts, " in ln and "GPU-h (0.0000 lost to failures)" in ln for ln in lines), lines

    from halo_sched.runs import attempts_of, totals

    rows = attempts_of(run_id, "local")
    assert [a.status for a in rows] == ["FAILED", "COMPLETED"] and rows[0].id == run_id
    assert all(a.clock == "scheduler" and a.wall_s and a.wall_s > 0 for a in rows), rows
    t = totals(rows)
    assert t["node_hours"] > t["node_hours_lost"] > 0 and t["gpu_hours"] == 0  # a CPU job: GPU-hours 0
    js = json.loads(cli("status", run_id, "--json", cwd=tmp_path).stdout)["run"]
    assert [a["status"] for a in js["attempts"]] == ["FAILED", "COMPLETED"] and js["totals"]["attempts"] == 2, js
    _effective_time_matches_the_files(run_id, rows[1].id, js["totals"])
    later = json.loads(cli("status", rows[1].id, "--json", cwd=tmp_path).stdout)["run"]
    assert later == {"id": run_id, "attempt": 1}, later
    listed = [json.loads(ln) for ln in cli("list", "--json", cwd=tmp_path).stdout.splitlines()]
    assert sorted((x["run"]["id"], x["run"]["attempt"]) for x in listed) == [(run_id, 0), (run_id, 1)], listed
    text = cli("list", cwd=tmp_path).stdout
    assert f"[run {run_id}, attempt 1]" in text and f"[run {run_id}, attempt 2]" in text, text


def _effective_time_matches_the_files(first: str, second: str, t: dict) -> None:
    """The figures of ``status RUN --json`` by hand, from the files and records the run left."""
    import pytest

    from halo_sched import records
    from halo_sched.backends.local import state_root

    def reports(job: str) -> list[tuple[float, int]]:
        out = []
        for p in (state_root() / job / "ranks").glob("node-*/progress/rank-*"):
            if p.name.count(".") == 0:
                out += [(float(b), int(a)) for a, b in (ln.split() for ln in p.read_text().splitlines())]
        return sorted(out)

    r1, r2 = (records.find(j, "local")[0] for j in (first, second))
    s1, e1 = r1["last_state"]["started_at"], r1["last_state"]["ended_at"]
    s2, e2 = r2["last_state"]["started_at"], r2["last_state"]["ended_at"]
    one, two = reports(first), reports(second)
    assert [s for _, s in one].count(4) == 2 and min(s for _, s in two) == 3, (one, two)
    died = min(f["time"] for f in r1["last_state"]["failure"]["failures"] if f["trusted"] and f["time"] > one[0][0])
    last1 = max(t for t, _ in one)
    known = max(died, last1)  # a crash is dated by the death, at most the peers' last report later
    q_from = max(e1, r2["submitted"])
    again = min(t for t, s in two if s >= 4)  # step 4, the top before the fault, reported again
    want = {"startup": (one[0][0] - s1) + (e2 - max(t for t, _ in two)),
            "detection": known - last1,
            "restart": (q_from - known) + (two[0][0] - s2),
            "queue": s2 - q_from,
            "rework": again - two[0][0], "maintenance": 0.0,
            "spares_idle": 0.0}
    assert t["lost_s"] == pytest.approx(want, abs=2e-3), (t, want)
    assert t["train_s"] == pytest.approx((last1 - one[0][0]) + (max(t for t, _ in two) - again), abs=2e-3)
    assert t["held_s"] == pytest.approx(e2 - s1, abs=2e-3) and 0 < t["ettr"] < 1 and t["failures"] == 1
    assert t["checkpoint"]["cost_s"] == 0.5 and t["checkpoint"]["mtbf_s"] == pytest.approx((e1 - s1) + (e2 - s2),
                                                                                         abs=2e-3)


def test_a_printed_xid_or_nccl_line_is_not_retried_as_a_node_fault(tmp_path):
    """Issue 43: a rank that prints an Xid and an NCCL line and exits 1 was classified a node fault
    and retried, though nothing from the node's side said so. Its words now label the failure
    (unknown cause), which retry.on: [node] never retries; the local backend ledgers nothing."""
    job = _job(tmp_path, "prints_node_fault.py", {"attempts": 3, "on": ["node", "hang", "preflight"]})
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "retrying" not in r.stderr and "node fault" not in r.stderr, r.stderr[-3000:]
    assert "FAILED (unknown cause: the rank reported a GPU Xid error (its own output; no node-side evidence)" \
        in r.stderr, r.stderr[-3000:]
    assert sorted((tmp_path / "attempts.log").read_text().split()) == ["0", "0", "0", "1"]  # one attempt, 2 nodes
    run_id = r.stdout.strip().splitlines()[-1]
    js = json.loads(cli("status", run_id, "--json", cwd=tmp_path).stdout)
    assert js["failure_class"]["class"] == "unknown" and js["failure_class"]["said"] is True, js["failure_class"]
    assert js["failure_class"]["host"] == "", js["failure_class"]
    from halo_sched import ledger

    assert ledger.entries() == []


def test_a_python_exception_is_not_retried(tmp_path):
    job = _job(tmp_path, "raise_always.py", {"attempts": 3, "on": ["node", "hang", "preflight"]})
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "retrying" not in r.stderr and "ValueError: bad learning rate" in r.stderr, r.stderr[-3000:]
    assert (tmp_path / "attempts.log").read_text().split() == ["0"]
    assert "run: 1 attempts" in r.stderr


def test_a_run_submitted_without_wait_is_retried_by_its_keeper(tmp_path):
    """No client waits: the run's keeper (halo_sched/keeper.py, started detached by ``submit``)
    submits the next attempt after the node fault; ``watch`` later follows the run to its end."""
    job = _job(tmp_path, "node_fault_once.py", {"attempts": 2, "on": ["node"]})
    r = cli("submit", str(job), "--backend", "local", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    import time

    log = tmp_path / "attempts.log"

    def second_attempt_ran() -> bool:
        return log.exists() and sum(ln.startswith("1 ") for ln in log.read_text().splitlines()) == 2

    deadline = time.monotonic() + 120
    while not second_attempt_ran() and time.monotonic() < deadline:
        time.sleep(0.5)  # no process of ours waits meanwhile
    assert second_attempt_ran(), log.read_text() if log.exists() else "no attempt ran"
    w = cli("watch", run_id, "--quiet", "--timeout", "120", cwd=tmp_path)
    assert w.returncode == 0 and " was followed by " in w.stderr, w.stderr[-3000:]
    assert f"{run_id}: run: 2 attempts" in w.stderr, w.stderr[-3000:]
    counts = sorted(line.split()[0] for line in (tmp_path / "attempts.log").read_text().splitlines())
    assert counts == ["0", "0", "1", "1"], counts


def test_the_python_run_retries_and_counts_its_attempts(tmp_path, monkeypatch):
    import halo_sched
    from halo_sched.backends.base import JobStatus
    from halo_sched.runs import Run

    job = _job(tmp_path, "node_fault_once.py", {"attempts": 2, "on": ["node"]})
    monkeypatch.chdir(tmp_path)
    run = Run.submit(halo_sched.load(job), "local")
    retried = []
    state = run.wait(timeout_per_attempt=120, on_retry=lambda old, st, why, new: retried.append((old, why, new)))
    assert state.status is JobStatus.COMPLETED and retried and retried[0][0] == run.id and retried[0][1] == "node"
    assert run.current.id == retried[0][2] != run.id
    rows = run.attempts()
    assert [(a.number, a.status) for a in rows] == [(1, "FAILED"), (2, "COMPLETED")], rows
    assert REASON in rows[0].cause and run.totals()["node_hours_lost"] > 0
