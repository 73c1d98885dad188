"""On Nomad, `status` names the slowest rank and `timeline` draws the steps while a job runs, from
the allocations' progress files read through the clients' fs API (backends/nomad/progress.py).
Real torchrun in the client simulator behind the fake API (no Nomad binary here)."""
from __future__ import annotations

import os
import re
import time

import pytest

from helpers import REPO, SIM_TOKEN, cli, nomad_sim_job


def nomad_env(fake):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=SIM_TOKEN)
    return env


@pytest.mark.torch
def test_sim_status_names_the_straggler_and_timeline_draws_steps_on_nomad(tmp_path):
    # Rank 1 computes 0.6 s a step, the others 0.1 s; each rank reports after its compute, before
    # the step's all_reduce (as test_hang_local's straggler test).
    args = ["--steps", "400", "--step-time", "0.1", "--slow-rank", "1", "--slow-time", "0.6", "--report-before"]
    fields = {"name": "sim-strag", "nodes": 2, "hang": {"timeout_s": 30},
              "trainer": {"script": str(REPO / "tests" / "trainers" / "hang.py"), "args": args}}
    with nomad_sim_job(tmp_path, fields) as (fake, sched, cluster, job_id):
        deadline, text, took = time.monotonic() + 150, "", 0.0
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            text = cli("status", job_id, "--backend", "nomad", env=nomad_env(fake), timeout=60).stdout
            took = time.monotonic() - t0
            m = re.search(r"over the last (\d+) steps", text)
            if m and int(m[1]) >= 5 and "node 1: step" in text:
                break
            time.sleep(2)
        logs = {a.name: cluster.stderr(a.name)[-2000:] for a in cluster.allocations}
        print(text)
        assert "slowest: rank 1 (node 0), " in text and " s behind the median rank each step" in text, (text, logs)
        assert "RUNNING" in text and "node 0: step " in text and "s/step" in text, text
        print(f"status took {took:.1f} s")
        # A client that cannot serve the files: the line goes, the status stays (no error).
        fake.drop_next(20, "/v1/client/fs/")
        r = cli("status", job_id, "--backend", "nomad", env=nomad_env(fake), timeout=60)
        assert r.returncode == 0 and "RUNNING" in r.stdout and "slowest" not in r.stdout, (r.stdout, r.stderr)
        fake.fail_next(20, 403, "Permission denied", "/v1/client/fs/")
        r = cli("status", job_id, "--backend", "nomad", env=nomad_env(fake), timeout=60)
        assert r.returncode == 0 and "RUNNING" in r.stdout and "slowest" not in r.stdout, (r.stdout, r.stderr)
        with fake._lock:
            fake._drop_queue.clear()
            fake._fail_queue.clear()
        t = cli("timeline", job_id, "--backend", "nomad", "--width", "100", env=nomad_env(fake), timeout=120)
        print(t.stdout)
        assert t.returncode == 0, t.stderr
        rows = {int(m[1]): ln for ln in t.stdout.splitlines() if (m := re.match(r" .rank (\d+) ", ln))}
        assert sorted(rows) == [0, 1, 2, 3], t.stdout
        assert "stays on the nodes" not in t.stdout, t.stdout
        assert all(re.search(r"\d", ln.split("rank", 1)[1][3:]) or "█" in ln for ln in rows.values()), t.stdout


class SlowClient:
    """A stand-in whose every file call takes ``delay`` s (a client the servers reach slowly)."""

    def __init__(self, delay: float):
        self.delay, self.calls = delay, 0

    def fs_list(self, alloc_id, path, timeout_s=2.0):
        self.calls += 1
        time.sleep(min(self.delay, timeout_s))
        if path.endswith("halo-logs"):
            return [{"Name": "node-0", "IsDir": True}, {"Name": "../../x", "IsDir": True}]
        return [{"Name": "rank-0", "IsDir": False}, {"Name": "rank-0/../../y", "IsDir": False}]

    def fs_cat(self, alloc_id, path, max_bytes=65536, timeout_s=2.0):
        self.calls += 1
        time.sleep(min(self.delay, timeout_s))
        return b"1 100.0\n2 101.0\n"


def test_one_status_pass_is_bounded_whatever_the_number_of_allocations(tmp_path, monkeypatch):
    from halo_sched.backends.nomad import progress

    monkeypatch.setattr(progress, "PASS_S", 2.0)
    allocs = [{"ID": f"a{i}", "ClientStatus": "running", "TaskStates": {"torchrun": {}}} for i in range(100)]
    t0 = time.monotonic()
    slow = SlowClient(0.5)
    line = progress.stragglers_line(slow, allocs)
    took = time.monotonic() - t0
    assert took < progress.PASS_S + progress.REQUEST_S + 2, took  # 100 allocations x 3 calls x 0.5 s unbounded
    assert slow.calls < 20 and line.startswith("node 0: step 2"), (slow.calls, line)
    # Only node and rank names are used: nothing lands outside the copy.
    n = progress.snapshot(SlowClient(0), allocs[:1], tmp_path / "copy")
    assert n == 1 and [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()] == \
        ["copy/node-0/progress/rank-0"]
