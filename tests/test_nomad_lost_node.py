"""A node lost under a running torchrun world, end to end: the fake Nomad API as the servers
(Nomad 2.0.5's rules, tests/nomad/fake_api.py node_down) and the client simulator as the
clients (tests/nomad/client_sim.py, attached: real entry scripts, torchrun and gloo). The
rendered job's ``disconnect { lost_after, replace = false }`` keeps the lost rank unreplaced;
with no watcher the survivors end on their own and the job ends once lost_after has passed
(the late replacement fails within rendezvous.timeout_s); with a watcher the job is stopped
within one poll."""
from __future__ import annotations

import os
import sys
import time

import pytest

import halo_sched.spec  # the module itself: `import halo_sched` loads it lazily, on first use
from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from halo_sched.backends.nomad.watchdog import watch_job
from helpers import REPO, free_port, load_nomad_helper, loopback_hosts

fake_api = load_nomad_helper("fake_api")
client_sim = load_nomad_helper("client_sim")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
pytestmark = pytest.mark.torch
TOKEN = "t0ken"
RDZV_TIMEOUT_S = 10


def _spec():
    return halo_sched.spec.JobSpec.model_validate({
        "name": "lost-sim", "nodes": 2, "nproc_per_node": 1,
        "trainer": {"script": str(REPO / "examples" / "train_ddp.py"), "args": ["--steps", "100000", "--step-time", "0.05"]},
        "env": {"OMP_NUM_THREADS": "1"},
        "rendezvous": {"port": free_port(), "timeout_s": RDZV_TIMEOUT_S},
        "nomad": {"driver": "raw_exec", "max_run_duration": "2h"},
    })


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    return env


def _until(what, cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _running_world(fake, cluster, sched, dry):
    fake.attach_sim(cluster)
    job_id = sched.schedule(dry)
    assert job_id == cluster.job_id
    leader = f"{job_id}.trainer[0]"
    # The world formed: rank 0 trains (a step needs both ranks).
    _until("the world trains", lambda: "step   20" in cluster.stdout(leader), 120)
    return job_id, dry.payload["Job"]


def _setup(fake):
    client = NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1))
    sched = NomadScheduler(client=client)
    return client, sched, sched.dryrun(_spec())


def test_lost_node_without_a_watcher_is_not_replaced_and_the_job_ends_within_its_bound(tmp_path):
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "spare")], token=TOKEN, nomad_version="2.0.5") as fake:
        client, sched, dry = _setup(fake)
        with client_sim.SimCluster(dry.payload["Job"], tmp_path / "nomad", host_env=_env(),
                                   hosts=loopback_hosts(3, ["n0", "n1", "spare"])) as cluster:
            job_id, job = _running_world(fake, cluster, sched, dry)
            lost_after_s = 3 * 3600  # max_run_duration 2h + the hour (asserted below)
            victim = fake.alloc_for(job_id, "trainer[1]")
            fake.node_down(victim["NodeName"])
            # Any halo-sched process that looks says NODE_FAIL at once; nobody stops the job.
            assert sched.query([job_id])[job_id].status is JobStatus.NODE_FAIL
            # The survivor ends on its own (gloo sees its peer gone), well within its timeouts.
            t0 = time.monotonic()
            _until("rank 0 fails on its own", lambda: sched.query([job_id])
                   and fake.alloc_for(job_id, "trainer[0]")["ClientStatus"] == "failed", 120)
            print(f"survivor ended {time.monotonic() - t0:.1f} s after the node went down")
            assert fake.job_record(job_id)["Stop"] is False
            # Not replaced: Nomad 2.0.5 keeps it unknown for lost_after (the job's 2 h + 1 h).
            fake.advance(lost_after_s - 60)
            rank1 = [a for a in fake.allocs_of(job_id) if a["Name"] == f"{job_id}.trainer[1]"]
            assert [(a["ID"], a["ClientStatus"]) for a in rank1] == [(victim["ID"], "unknown")]
            assert fake.job_record(job_id)["Status"] == "running"  # unknown is not terminal
            # Then it is expired, lost and replaced; the replacement finds no rank 0 and fails
            # within rendezvous.timeout_s: the Nomad job is dead.
            fake.advance(120)
            t1 = time.monotonic()
            _until("the job is dead", lambda: sched.query([job_id]) and fake.job_record(job_id)["Status"] == "dead",
                   RDZV_TIMEOUT_S + 60)
            late = time.monotonic() - t1
            replacement = fake.alloc_for(job_id, "trainer[1]")
            assert replacement["ID"] != victim["ID"] and replacement["ClientStatus"] == "failed"
            assert f"rendezvous.timeout_s={RDZV_TIMEOUT_S}s" in cluster.stderr(replacement["Name"])
        assert sched.query([job_id])[job_id].status is JobStatus.NODE_FAIL
        assert {g["Disconnect"]["LostAfter"] for g in job["TaskGroups"]} == {lost_after_s * 10**9}
        print(f"late replacement failed {late:.1f} s after lost_after ran out")


def test_lost_node_with_a_watcher_stops_the_job_within_one_poll(tmp_path):
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "spare")], token=TOKEN, nomad_version="2.0.5") as fake:
        client, sched, dry = _setup(fake)
        with client_sim.SimCluster(dry.payload["Job"], tmp_path / "nomad", host_env=_env(),
                                   hosts=loopback_hosts(3, ["n0", "n1", "spare"])) as cluster:
            job_id, _ = _running_world(fake, cluster, sched, dry)
            victim = fake.alloc_for(job_id, "trainer[1]")
            fake.node_down(victim["NodeName"])
            seen = len(fake.requests)
            result = watch_job(client, job_id, wait_s=0, poll_s=1.0)
            assert result.stopped and result.state.status is JobStatus.NODE_FAIL, result
            assert "node rank 1" in result.stop_reason and "died first" in result.stop_reason
            # The first look stopped it: one allocations read, then the stop.
            calls = [(r.method, r.path) for r in fake.requests[seen:]]
            stop_at = calls.index(("DELETE", f"/v1/job/{job_id}"))
            assert sum(path.endswith("/allocations") for _, path in calls[:stop_at]) == 1, calls
            assert fake.job_record(job_id)["Stop"] is True
            # The survivor was killed by the stop (complete), not left to fail on its own; nothing
            # replaced the lost rank.
            assert cluster.alloc(f"{job_id}.trainer[0]").terminal
            assert fake.alloc_for(job_id, "trainer[0]")["ClientStatus"] == "complete"
            assert [a["ID"] for a in fake.allocs_of(job_id) if a["Name"] == f"{job_id}.trainer[1]"] == [victim["ID"]]
