"""The watcher ends a Nomad job with server roles (issue 11's lifecycle), against the fake API:
Nomad ends nothing across groups, so whoever watches the job must stop it when a server dies
under a running trainer (the server is then the dead rank) and when the trainer completes while
servers still run or wait to be placed (the job is then COMPLETED, not FAILED or CANCELLED)."""
from __future__ import annotations

import re

from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from halo_sched.spec import JobSpec
from helpers import free_port, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-srv"


def spec(server_nodes=1):
    port = free_port()
    return JobSpec.model_validate({
        "name": "rl", "nodes": 2, "nproc_per_node": 1,
        "trainer": {"script": "train.py"},
        "rendezvous": {"port": free_port(), "timeout_s": 30},
        "nomad": {"driver": "raw_exec"},
        "servers": [{"name": "vllm", "nodes": server_nodes, "port": port, "command": ["vllm", "serve"]}],
    })


def submit(fake, server_nodes=1):
    sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)))
    job_id = sched.schedule(sched.dryrun(spec(server_nodes)))
    return sched, job_id


def nodes(n):
    return [FakeNode(f"n{i}", gpus=0) for i in range(n)]


def test_dead_server_under_a_running_trainer_stops_the_job_and_is_the_dead_rank():
    with FakeNomad(nodes(3), token=TOKEN) as fake:
        sched, job_id = submit(fake)
        fake.set_running(job_id)
        alloc = fake.alloc_for(job_id, "server-vllm")["ID"]
        fake.write_log(alloc, "INFO loading weights\nRuntimeError: CUDA out of memory\n", task="server", type="stderr")
        fake.finish(job_id, "server-vllm", exit_code=3)
        st = sched.wait(job_id, timeout=20)
        rec = fake.job_record(job_id)
        assert rec["Stop"] is True  # deregistered by the watcher
        assert st.status is JobStatus.FAILED and st.nomad.dead[0]["server"] == "vllm[0]"
        assert "server vllm[0] died first" in st.reason, st.reason
        # The trainer's ranks were stopped, not left holding their nodes.
        assert {a["ClientStatus"] for a in fake.allocs_of(job_id) if a["TaskGroup"] != "server-vllm"} == {"complete"}
        # Status afterwards still names the server, with its own last error line.
        later = sched.query([job_id])[job_id]
        assert later.status is JobStatus.FAILED and later.nomad.dead[0]["server"] == "vllm[0]"
        assert re.match(r"FAILED: server vllm\[0\] \(Nomad node n\d\) exit 3 at \d\d:\d\d:\d\d: "
                        r"RuntimeError: CUDA out of memory", later.describe()), later.describe()


def test_trainer_completes_while_servers_run_the_job_is_stopped_and_completed():
    with FakeNomad(nodes(3), token=TOKEN) as fake:
        sched, job_id = submit(fake)
        fake.set_running(job_id)
        fake.finish(job_id, "trainer[0]", 0)
        fake.finish(job_id, "trainer[1]", 0)
        st = sched.wait(job_id, timeout=20)
        assert st.status is JobStatus.COMPLETED, st.describe()
        assert fake.job_record(job_id)["Stop"] is True
        server = fake.alloc_for(job_id, "server-vllm")
        assert server["ClientStatus"] == "complete" and server["DesiredStatus"] == "stop"
        later = sched.query([job_id])[job_id]
        assert later.status is JobStatus.COMPLETED and later.failure is None, later.describe()
        # A second watch of the finished job stops nothing more.
        stops = len(fake.requests_to(f"/v1/job/{job_id}", method="DELETE"))
        assert sched.wait(job_id, timeout=5).status is JobStatus.COMPLETED
        assert len(fake.requests_to(f"/v1/job/{job_id}", method="DELETE")) == stops


def test_trainer_completes_while_a_server_still_waits_for_a_node_the_job_is_stopped():
    # No free client for the server: its allocation never places, and the blocked evaluation
    # would place it (and hold a node) after the trainer is done. No server runs to notice.
    with FakeNomad(nodes(2), token=TOKEN) as fake:
        sched, job_id = submit(fake)
        fake.set_running(job_id)
        assert any(e["Status"] == "blocked" for e in fake.evals_of(job_id))
        assert not [a for a in fake.allocs_of(job_id) if a["TaskGroup"] == "server-vllm"]
        fake.finish(job_id, "trainer[0]", 0)
        fake.finish(job_id, "trainer[1]", 0)
        st = sched.wait(job_id, timeout=20)
        assert st.status is JobStatus.COMPLETED, st.describe()
        assert fake.job_record(job_id)["Stop"] is True
        assert sched.query([job_id])[job_id].status is JobStatus.COMPLETED
