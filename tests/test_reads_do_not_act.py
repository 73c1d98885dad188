"""Reading is not acting (halo_sched/core.py): ``status``, ``list``, ``logs``, ``timeline`` and the
library's ``status()`` never submit and never send a notification. What they learn they record
(the state, a notification queued in the outbox); delivering is the actors' (``submit --wait``,
``watch``, ``Run.wait``) or ``halo-sched notify``'s.

The jobs here are local jobs that already ended, written as the supervisor leaves them (its
``state.json``, ``job.json``, the node logs with a signed failure line): no torchrun needed."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import halo_sched
from halo_sched import db, records
from halo_sched.node.failure_collector import sign

from helpers import REPO, cli, example_job, free_port
from test_notify import Receiver

KEY = "7a" * 32  # the jobs' failure key, as made at submit
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")


def _ended_local_job(tmp_path: Path, job_id: str, status: str, **overrides) -> dict:
    """A local job that ended (``status``), with its record as submit writes it."""
    home = Path(os.environ["HALO_SCHED_HOME"])
    spec = halo_sched.load(example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, **overrides))
    d = home / "local" / job_id
    d.mkdir(parents=True)
    now = time.time()
    (d / "job.json").write_text(json.dumps({"name": spec.name, "nodes": 1, "cwd": str(REPO)}))
    (d / "state.json").write_text(json.dumps({"state": status, "submitted": now - 60, "started": now - 50,
                                              "ended": now - 1, "exit_code": 0 if status == "COMPLETED" else 1,
                                              "nodes_running": 0}))
    body = json.dumps({"node": 0, "rank": 0, "local_rank": 0, "host": "localhost", "exit_code": 1, "signal": None,
                       "time": now - 2, "error": NCCL, "tail": [], "stopped": False,
                       # the node's own evidence (failure_collector.node_evidence): a node fault
                       "evidence": ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."]})
    line = f'halo-sched-failure {body[:-1]},"mac":"{sign(body, KEY)}"}}\n' if status == "FAILED" else ""
    (d / "node-0.log").write_text("[node 0 rank 0] step 1\n" + line)
    (d / "job.log").write_text("[node 0 rank 0] step 1\n" + line)
    rec = records.build("local", spec, job_id, {"outputs": [str(d / "job.log")], "failure_key": KEY},
                        git_result=lambda: None)
    records.save_new(rec, "rendered")
    return rec


def _reads(job_id: str, env: dict) -> list:
    out = [cli("status", job_id, env=env), cli("status", job_id, "--json", env=env), cli("list", env=env),
           cli("logs", job_id, env=env), cli("timeline", job_id, env=env)]
    for r in out:
        assert "Traceback" not in r.stderr, r.stderr
    return out


def test_reads_with_a_webhook_configured_send_nothing_and_say_how_it_gets_sent(tmp_path):
    """A loopback webhook that counts: status, list, logs, timeline and the library's status()
    of an ended job whose file asks for notify: no request. The event is queued (recorded) and
    status says how it gets delivered; `halo-sched notify` then sends it, once."""
    hook = Receiver()
    try:
        env = {**os.environ, "HOOK_URL": hook.url}
        _ended_local_job(tmp_path, "read-done-1", "COMPLETED", notify={"webhook_env": "HOOK_URL",
                                                                        "on": ["completed", "failed"]})
        reads = _reads("read-done-1", env)
        os.environ["HOOK_URL"] = hook.url  # this process's own status() too
        try:
            assert halo_sched.job("read-done-1", "local").status().status.value == "COMPLETED"
        finally:
            del os.environ["HOOK_URL"]
        time.sleep(3)  # a detached delivery, had a read started one, would have sent by now
        assert hook.posts == [], hook.posts
        # Recorded (once), not sent; status says how it gets delivered.
        assert db.read("SELECT event, state, tries FROM outbox WHERE job = 'read-done-1'") == [("completed", "pending", 0)]
        assert "the completed notification is queued, not sent; `halo-sched notify`" in reads[0].stderr, reads[0].stderr
        # The explicit actor delivers it.
        r = cli("notify", env=env)
        assert r.returncode == 0 and "1 delivered" in r.stderr, r.stderr
        assert [b["state"] for _, b in hook.posts] == ["completed"] and hook.posts[0][1]["job"] == "read-done-1"
        assert "notification" not in cli("status", "read-done-1", env=env).stderr
    finally:
        hook.close()


def test_reads_never_submit_the_next_attempt_of_a_run(tmp_path):
    """A run's attempt that failed as a node would (a signed line with the node's Xid), with retry: on: [node]
    attempts left: reading it records its state and class but never submits the next attempt."""
    _ended_local_job(tmp_path, "read-run-1", "FAILED", retry={"attempts": 3, "on": ["node"]})
    home = Path(os.environ["HALO_SCHED_HOME"])
    reads = _reads("read-run-1", dict(os.environ))
    assert reads[0].returncode == 0 and "node fault" in reads[0].stderr + reads[0].stdout, reads[0]
    assert halo_sched.job("read-run-1", "local").status().failure_class().node
    assert sorted(p.name for p in (home / "local").iterdir()) == ["read-run-1"]
    assert [r["id"] for r in records.page(0)] == ["read-run-1"]
    last = records.find("read-run-1", "local")[0]["last_state"]
    assert last["status"] == "FAILED" and last["failure_class"]["failure"] == "node"
    assert db.read("SELECT COUNT(*) FROM successors")[0][0] == 0
