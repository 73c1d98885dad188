"""The Nomad client simulator on the multi-host rig (issue 31, item 3): its client nodes are the
rig's hosts h0..h3 (network namespaces, tests/cluster/multihost.sh), each allocation's tasks run
inside its host (nsenter), and each node's address is its own network fingerprint
(tests/nomad/client_sim.py ``fingerprint_address``, after client/fingerprint/network.go): the
ports' HostIP, the services' address, so the worker's ``nomadService`` template reads rank 0's
address on rank 0's host. The servers are the fake Nomad API (tests/nomad/fake_api.py). Real
torchrun and gloo, 2 nodes x 2 ranks; the interfaces' byte counters say where the traffic went."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from cluster.multihost_fixtures import _rig_session, rig, veth_bytes  # noqa: F401  (the fixtures)
from helpers import REPO, load_nomad_helper, nomad_sim_job, wait_dead

# slurm too: the rig it runs on is a SLURM cluster (multihost.sh up starts slurmctld and a slurmd per host).
pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.multihost]

client_sim = load_nomad_helper("client_sim")
MB = 1 << 20


def traffic(before, after) -> dict[str, int]:
    out = {"mgmt0": 0, "data0": 0}
    for (h, net), v in after.items():
        out[net] += v["sent"] - before[(h, net)]["sent"]
    return out


@pytest.mark.parametrize("client_interface", ["mgmt0", "data0"])
def test_a_nomad_job_trains_across_two_hosts_on_data0(tmp_path, rig, client_interface):
    """The Nomad clients' ``network_interface`` is ``client_interface`` (a site's choice: its
    management NIC, or the training network). Rank 0's address, as the leader's NOMAD_IP_ and
    the worker's nomadService template give it, is that interface's address on rank 0's host;
    with ``network.interface: data0`` gloo binds data0 on every rank, so the collectives' bytes
    are on data0 either way, and rank 0's address (its TCP store) is on the client's interface."""
    hosts = [client_sim.SimHost(h, rig.enter(h), network_interface=client_interface) for h in ("h0", "h1")]
    net = {"mgmt0": "10.77.0.", "data0": "10.78.0."}[client_interface]
    # Fingerprinted on each host itself (SimCluster does it for a host without an address).
    assert [client_sim.fingerprint_address(h) for h in hosts] == [f"{net}10", f"{net}11"], hosts
    fields = {"name": "mh-nomad", "nodes": 2, "network": {"interface": "data0"},
              "trainer": {"script": str(REPO / "tests" / "trainers" / "net_probe.py"), "args": ["--steps", "10"]}}
    before = veth_bytes()
    t0 = time.monotonic()
    with nomad_sim_job(tmp_path, fields, hosts=hosts) as (fake, sched, cluster, job_id):
        wait_dead(fake, sched, job_id, 240)
        took = time.monotonic() - t0
        after = veth_bytes()
        status = sched.query([job_id])[job_id].status
        allocs = {a.name: a for a in cluster.allocations}
        out = "".join(cluster.stdout(n) + cluster.stderr(n) for n in allocs)
        worker = next(a for n, a in allocs.items() if n.endswith(".trainer[1]"))
        leader = next(a for n, a in allocs.items() if n.endswith(".trainer[0]"))
        master_file = (worker.tasks[next(iter(worker.tasks))].dir + "/local/halo-master-addr")
        master = open(master_file).read().split()
    t = traffic(before, after)
    print(out[-4000:], f"status {status.name}; leader on {leader.host.name}, worker on {worker.host.name}; "
          f"master file {master}; bytes sent {t}; {took:.1f} s", sep="\n")
    assert status.name == "COMPLETED", out[-4000:]
    assert {leader.host.name, worker.host.name} == {"h0", "h1"}
    # The registration's address is the leader's host's own (its port's HostIP), read by the worker:
    # every rank's MASTER_ADDR below. The worker's template file is read after the job ended, when
    # its service may be gone and the file rendered empty again (seen once under load).
    assert leader.host.ip.startswith(net) and (not master or master[0] == leader.host.ip), master
    probes = re.findall(r"net-probe rank (\d) host (h\d) master_addr (\S+) gloo_ifname ([^\s\[]+)", out)
    assert len(probes) == 4 and {p[1] for p in probes} == {"h0", "h1"}, probes
    assert all(a == leader.host.ip and i == "data0" for _, _, a, i in probes), probes
    assert t["data0"] > 40 * MB, t
    assert t["mgmt0"] < 4 * MB, t


def test_a_host_cut_mid_training_on_nomad_is_named_and_the_job_stopped(tmp_path, rig):
    """`cut h1` while a 2-node job trains on h0 and h1: h1's client stops heartbeating with its
    link (client_sim.Heartbeats: the heartbeats cross the host's own mgmt0 to the rig's bridge),
    the servers mark it down 20 s later (TTL 10 s + grace 10 s, nomad/heartbeat.go; fake_api
    node_down, 2.0.5 rules: the rank stays `unknown`), and halo-sched's watcher stops the job,
    naming node rank 1 on Nomad node h1, within hang.timeout_s + 30 s; nothing is left running
    on h0."""
    from halo_sched.backends.nomad.watchdog import watch_job

    hosts = [client_sim.SimHost(h, rig.enter(h), network_interface="data0") for h in ("h0", "h1")]
    fields = {"name": "mh-nomad-cut", "nodes": 2, "network": {"interface": "data0"}, "hang": {"timeout_s": 30},
              "trainer": {"script": str(REPO / "tests" / "trainers" / "hang.py"),
                          "args": ["--steps", "300", "--step-time", "0.2"]}}
    with nomad_sim_job(tmp_path, fields, hosts=hosts) as (fake, sched, cluster, job_id), \
            client_sim.Heartbeats(hosts, "10.77.0.1", fake.node_down) as beats:
        allocs = {a.host.name: a for a in cluster.allocations}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                f" of 2 on {h}" in cluster.stdout(a.name) + cluster.stderr(a.name) for h, a in allocs.items()):
            time.sleep(0.5)
        allocs = {a.host.name: a for a in cluster.allocations}
        assert set(allocs) == {"h0", "h1"}, allocs
        time.sleep(8)  # training: the world formed, steps of 0.2 s
        assert sched.query([job_id])[job_id].status.name == "RUNNING"
        rig.cut("h1")
        cut_at = time.monotonic()
        result = watch_job(sched._client, job_id, wait_s=0, poll_s=1.0, timeout=120)
        took = time.monotonic() - cut_at
        text = result.state.describe() if result.state else ""
        print(f"stopped={result.stopped} after {took:.1f} s; down: {beats.down}; {result.stop_reason}; {text}")
        assert beats.down == ["h1"], beats.down
        assert result.stopped and result.state.status.name == "NODE_FAIL", (result, text)
        assert took <= 30 + 30, took
        assert "node rank 1" in result.stop_reason and "h1" in text, (result.stop_reason, text)
        # The survivor's task stops within its kill_timeout (30 s); then nothing of it is left.
        deadline = time.monotonic() + 30 + 30
        while time.monotonic() < deadline and (not allocs["h0"].terminal or rig.job_pids("h0", "hang.py")):
            time.sleep(0.5)
        assert allocs["h0"].terminal and rig.job_pids("h0", "hang.py") == [], "left running on h0"


def test_a_runs_keeper_cut_off_comes_back_on_another_host_and_carries_the_run_on(tmp_path, rig):
    """The run's keeper (node/nomad_keeper.py, the job's ``keeper`` group) on the rig, nobody
    waiting: node ranks on two hosts, the keeper on a third (distinct_hosts). `cut` the keeper's
    host: its heartbeats stop, the servers mark it down 20 s later (client_sim.Heartbeats ->
    fake_api.node_down) and its allocation lost; Nomad places it again (no ``disconnect`` block:
    replaced at once) on the fourth host, where the keeper starts again with its own Task API
    socket and workload identity and reads where the run is. The cut host is healed (ready again,
    fake_api.node_up). Then node 1 fails as a bad node: the keeper now on the other host registers
    attempt 2 keeping off node 1's host, and the run completes; no process but the keeper
    registered anything after the submit. Deviation: the cut keeper's process reaches the fake's
    Task API socket through the file system until the servers mark its node down (a real one
    would reach only its own agent, cut off too); nothing happens in those 20 s."""
    import shutil

    from halo_sched import records
    from halo_sched.backends.base import failure_key_in_env, new_failure_key
    from halo_sched.backends.nomad import NomadScheduler, with_failure_key
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig
    from halo_sched.models import JobSpec
    from helpers import SIM_TOKEN

    fake_api = load_nomad_helper("fake_api")
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_on_cue.py", tmp_path / "node_fault_on_cue.py")
    names = ("h0", "h1", "h2", "h3")
    hosts = [client_sim.SimHost(h, rig.enter(h), network_interface="data0") for h in names]
    spec = JobSpec.model_validate({
        "name": "mh-keeper", "nodes": 2, "nproc_per_node": 1, "env": {"OMP_NUM_THREADS": "1"},
        "network": {"interface": "data0"}, "rendezvous": {"timeout_s": 60},  # a dynamic port: each version its own
        "nomad": {"driver": "raw_exec"}, "retry": {"attempts": 2, "on": ["node"]},
        "trainer": {"script": str(tmp_path / "node_fault_on_cue.py")}})
    import os
    import sys

    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    sims: list = []
    with fake_api.FakeNomad([fake_api.FakeNode(n, gpus=0) for n in names], token=SIM_TOKEN) as fake:
        fake.attach_policy("default", ("read-job", "submit-job", "read-logs"))

        def make(job: dict):
            sim = client_sim.SimCluster(job, tmp_path / "nomad" / f"v{job.get('Version', 0)}", host_env=env, hosts=hosts)
            sims.append(sim)
            return sim

        fake.attach_sims(make)
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=SIM_TOKEN, retry_attempts=1)))
        dry = sched.dryrun(spec)
        key = new_failure_key()
        dry.payload.update(with_failure_key(dry.payload, key))
        try:
            with client_sim.Heartbeats(hosts, "10.77.0.1", fake.node_down, on_up=fake.node_up) as beats:
                with failure_key_in_env(key):
                    job_id = sched.schedule(dry)
                records.record_submit("nomad", spec, dry.text, job_id, {**sched.record_fields(dry, job_id), "failure_key": key})

                def keeper_on(host_not: str | None = None, timeout: float = 120) -> dict:
                    deadline = time.monotonic() + timeout
                    while time.monotonic() < deadline:
                        fake.tick()
                        a = fake.alloc_for(job_id, "keeper[0]")
                        if a["ClientStatus"] == "running" and a["NodeName"] != host_not \
                                and "keeping" in sims[0].stdout(f"{job_id}.keeper[0]"):
                            return a
                        time.sleep(0.5)
                    raise AssertionError(f"no keeper running (not on {host_not}) within {timeout} s")

                first = keeper_on()
                trainers = {fake.alloc_for(job_id, f"trainer[{i}]")["NodeName"] for i in (0, 1)}
                assert first["NodeName"] not in trainers, (first["NodeName"], trainers)
                rig.cut(first["NodeName"])
                cut_at = time.monotonic()
                second = keeper_on(host_not=first["NodeName"], timeout=120)
                moved = time.monotonic() - cut_at
                assert beats.down == [first["NodeName"]] and second["NodeName"] not in trainers, (beats.down, second)
                rig.heal(first["NodeName"])
                deadline = time.monotonic() + 60
                while first["NodeName"] in beats.down and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert first["NodeName"] not in beats.down, "the healed host did not heartbeat again"
                # Node 1 fails as a bad node: its cue file in its task directory.
                node1 = sims[0].alloc(f"{job_id}.trainer[1]")
                culprit = node1.host.name
                cue, cued_at = Path(node1.tasks["torchrun"].dir), time.time()
                (cue / "fault").touch()
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline:
                    fake.tick()
                    job = fake.job_record(job_id)
                    if job["Version"] >= 1 and job["Status"] == "dead":
                        break
                    time.sleep(0.5)
                said = sims[0].stdout(f"{job_id}.keeper[0]")
                print(f"keeper on {first['NodeName']}, cut; back on {second['NodeName']} after {moved:.1f} s", said, sep="\n")
                job = fake.job_record(job_id)
                assert job["Version"] >= 1 and job["Status"] == "dead", (job["Version"], job["Status"], said)
                assert "attempt 2 registered as version" in said or "registering attempt 2" in said, said
                # Failed on the cue, in its task dir (not on the trainer's own 120 s deadline, elsewhere).
                assert (cue / "fault_at").exists() and float((cue / "fault_at").read_text()) >= cued_at, \
                    "node 1 did not fail on its cue in its task dir"
                assert {"LTarget": "${node.unique.name}", "RTarget": culprit, "Operand": "!="} in job["Constraints"]
                writes = [(r.via, r.method, r.path) for r in fake.requests if r.method in ("PUT", "POST", "DELETE")
                          and "/v1/var/" not in r.path]
                assert writes == [("http", "POST", "/v1/jobs"), ("task-api", "PUT", f"/v1/job/{job_id}")], writes
                assert all(a["ClientStatus"] == "complete" for a in fake.allocs_of(job_id)
                           if a["JobVersion"] == job["Version"] and a["TaskGroup"] == "trainer"), fake.allocs_of(job_id)
        finally:
            for h in names:
                rig.heal(h)
            for sim in sims:
                sim.stop()
