"""Retry, runs and GPU-hours on Nomad, end to end: the fake Nomad API as the servers
(tests/nomad/fake_api.py: placement with Nomad 2.0.5's ``${node.unique.name} !=`` feasibility)
and the client simulator as the clients (tests/nomad/client_sim.py, attached to every job the
waiting process registers: real entry scripts, torchrun and the trainer).

* A 2-node job with ``retry: {attempts: 2, "on": [node]}`` whose node 1 prints an NCCL NET/IB
  error and dies of a SIGKILL nothing in the job sent (the node's evidence) on the first attempt
  only (tests/trainers/node_fault_once.py): ``submit --wait``
  registers the second attempt as a new version of the same Nomad job (``JOB~vN``) with a
  constraint keeping off the culprit's Nomad node; the fake places that version on the other
  two nodes only; the node is in the ledger; the run ends COMPLETED; ``status RUN`` shows both
  attempts, each from its version's allocations. A Python exception is not retried.
* Exactly once: a second register of the next attempt against the JobModifyIndex the first one
  read is refused by Nomad's EnforceIndex; halo-sched registers nothing more.
* Each attempt's wall time is Nomad's own: the allocations' task ``StartedAt``/``FinishedAt``.
* ``preflight: {gate: true}``: a node whose interface is missing fails the attempt in the
  simulator as a node fault ``by: preflight``, ledgered under its Nomad node name.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time

import pytest
import yaml

from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad.state import go_time, job_state, task_times
from halo_sched.node_runtime import ITEM, runtime
from helpers import REPO, cli, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-runs"

#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


def _env(tmp_path, fake) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(tmp_path / "home"))
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    return env


def _job(tmp_path, trainer: str | None = None, trainer_spec: dict | None = None, keeper: bool = False,
         **extra) -> str:
    """A job file; ``keeper``: the job carries its run's keeper (the default of ``nomad.keeper``);
    without, a failed attempt is not retried (no client registers one)."""
    data = {"name": "nomad-run", "nodes": 2, "nproc_per_node": 1,
            "trainer": {"script": str(REPO / "examples" / "train_ddp.py"), "args": ["--steps", "5"]},
            "env": {"OMP_NUM_THREADS": "1"}, "rendezvous": {"timeout_s": 60},
            "nomad": {"driver": "raw_exec", "keeper": keeper, **extra.pop("nomad", {})}, **extra}
    if trainer:
        shutil.copy(REPO / "tests" / "trainers" / trainer, tmp_path / trainer)
        data["trainer"] = {"script": str(tmp_path / trainer), "args": []}
    if trainer_spec:
        data["trainer"] = trainer_spec
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@contextlib.contextmanager
def _cluster(tmp_path, names=("n0", "n1", "n2")):
    """The fake with three client nodes, each job it registers run by a simulator of its own."""
    client_sim = load_nomad_helper("client_sim")
    sims: list = []
    with FakeNomad([FakeNode(n, gpus=0) for n in names], token=TOKEN) as fake:
        env = _env(tmp_path, fake)

        def make(job: dict):
            sim = client_sim.SimCluster(job, tmp_path / "nomad" / f"{job['ID']}~v{job.get('Version', 0)}", host_env=env)
            sims.append(sim)
            return sim

        fake.attach_sims(make)
        try:
            yield fake, env, sims
        finally:
            for sim in sims:
                sim.stop()


def _allocs(fake, attempt_id: str) -> list[dict]:
    """The allocations of one attempt: ``JOB~vN``, version N of the job; a plain id, version 0."""
    job_id, _, version = attempt_id.partition("~v")
    return [a for a in fake.allocs_of(job_id) if a["JobVersion"] == int(version or 0)]


def _nodes_of(fake, attempt_id: str) -> dict[str, str]:
    return {a["Name"].split(".", 1)[1]: a["NodeName"] for a in _allocs(fake, attempt_id)}


#: What the keeper's workload identity needs (docs/nomad.md, "The run's keeper"), here attached to
#: the namespace (every job's tasks there), as a site with its own namespace for training does.
KEEPER_CAPS = ("read-job", "submit-job", "read-logs")


def _run_over(fake, sims, run_id: str, timeout: float) -> dict:
    """Wait, as nobody does, until the run's job is dead at a later version: the keeper registered
    the next attempt and that attempt ended (its own keeper ended with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = fake.job_record(run_id)
        if job and job["Status"] == "dead" and (job["Version"] >= 1 or job["Stop"]):
            return job
        if job and job["Status"] == "dead" and time.monotonic() > deadline - timeout + 60:
            break  # dead at its first version for a while: the keeper did not act
        fake.tick()
        time.sleep(0.5)
    said = {f"{s.job_id}~v{s.job.get('Version', 0)} {a.name}": (s.stdout(a.name) + s.stderr(a.name))[-3000:]
            for s in sims for a in s.allocations}
    events = {a["Name"]: [e.get("DisplayMessage") for ts in a["TaskStates"].values() for e in ts["Events"]][-4:]
              for a in fake.allocs_of(run_id)}
    raise AssertionError(f"the run did not end within {timeout} s: version {(job or {}).get('Version')}, "
                         f"{(job or {}).get('Status')}; {said}; {events}")


@pytest.mark.torch
def test_a_node_fault_on_nomad_is_retried_by_the_keeper_with_no_client_alive(tmp_path):
    """The submitting process is gone before the fault: ``submit`` without ``--wait`` exits, node 1
    fails as a bad node on the first attempt (tests/trainers/node_fault_once.py), and the run's
    keeper, a task of the job that the simulator runs like any task (node/nomad_keeper.py, through
    its Task API socket with its workload identity), registers attempt 2 as a new version of the
    same Nomad job keeping off the culprit's Nomad node; the run completes. A ``watch`` started
    afterwards follows the chain and records it; it registers nothing. Without the keeper the run
    stays failed (nobody waits): the break-it check."""
    with _cluster(tmp_path, names=("n0", "n1", "n2", "n3")) as (fake, env, sims):
        fake.attach_policy("default", KEEPER_CAPS)
        began = time.monotonic()
        r = cli("submit", _job(tmp_path, "node_fault_once.py", keeper=True, retry={"attempts": 2, "on": ["node"]}),
                "--backend", "nomad", "--quiet", cwd=tmp_path, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        run_id = r.stdout.strip().splitlines()[-1]
        job = _run_over(fake, sims, run_id, 300)
        took = time.monotonic() - began
        keeper_out = {s.job_id + f"~v{s.job.get('Version', 0)}": s.stdout(f"{run_id}.keeper[0]") for s in sims}
        # The keeper of the first version judged and registered; nobody else registered anything.
        first_keeper = keeper_out[f"{run_id}~v0"]
        assert "attempt 2 registered as version 1, keeping off n1" in first_keeper or \
            "registering attempt 2 against JobModifyIndex" in first_keeper, keeper_out
        assert "node fault: host n1" in first_keeper, first_keeper
        writes = [(r.via, r.method, r.path) for r in fake.requests if r.method in ("PUT", "POST", "DELETE")
                  and "/v1/var/" not in r.path]
        assert writes == [("http", "POST", "/v1/jobs"), ("task-api", "PUT", f"/v1/job/{run_id}")], writes
        assert job["Version"] == 1 and not job["Stop"] and job["Meta"]["halo_sched_attempt"] == "1", job["Meta"]
        first_job, second_job = fake.registered_versions(run_id)
        assert {"LTarget": "${node.unique.name}", "RTarget": "n1", "Operand": "!="} in second_job["Constraints"]
        assert second_job["TaskGroups"][0]["Tasks"][0]["Env"]["HALO_RESTART_COUNT"] == "1"
        assert "HALO_RESTART_COUNT" not in first_job["TaskGroups"][0]["Tasks"][0]["Env"]
        services = [{tg["Name"]: s["Name"] for tg in j["TaskGroups"] for s in tg.get("Services") or []}
                    for j in (first_job, second_job)]
        assert services[0]["trainer"] != services[1]["trainer"], services
        second = f"{run_id}~v1"
        assert _nodes_of(fake, run_id)["trainer[1]"] == "n1" and "n1" not in _nodes_of(fake, second).values()
        assert all(a["ClientStatus"] == "complete" for a in _allocs(fake, second) if a["TaskGroup"] == "trainer")
        # Each attempt's ranks saw their attempt's number; fault to every rank of attempt 2 started.
        rows = [ln.split() for p in (tmp_path / "nomad").rglob("attempts.log") for ln in p.read_text().splitlines()]
        assert sorted(r[0] for r in rows) == ["0", "0", "1", "1"], rows
        fault = next(float(r[3]) for r in rows if r[0] == "0" and r[1] == "1")
        recovery = max(float(r[3]) for r in rows if r[0] == "1") - fault
        assert recovery <= 60, recovery

        # A waiter that comes afterwards follows the chain and records it (it registers nothing).
        w = cli("watch", run_id, "--backend", "nomad", "--timeout", "60", cwd=tmp_path, env=env, timeout=120)
        assert w.returncode == 0, w.stderr[-3000:]
        assert [(r.method, r.path) for r in fake.requests if r.via == "http" and r.method in ("PUT", "POST")
                and "/v1/var/" not in r.path] == [("POST", "/v1/jobs")]
        st = cli("status", run_id, cwd=tmp_path, env=env)
        assert st.returncode == 0, st.stderr
        lines = st.stdout.splitlines()
        a1 = [ln for ln in lines if "\tattempt 1: " in ln]
        a2 = [ln for ln in lines if "\tattempt 2: " in ln]
        assert len(a1) == 1 and f"host n1, {REASON}" in a1[0] and " FAILED " in a1[0], lines
        assert len(a2) == 1 and f"{second} COMPLETED;" in a2[0] and "excluded n1" in a2[0], lines
        assert "(observed)" not in st.stdout, lines  # Nomad's task times, for both attempts
        nodes = cli("nodes", env=env).stdout
        assert "n1" in nodes and f"{run_id}@nomad" in nodes, nodes
        print(f"Nomad keeper retry, no client alive: fault to every rank of attempt 2 started {recovery:.1f} s; "
              f"whole run {took:.1f} s")


def _starts(tmp_path) -> list[tuple[str, str, str, float]]:
    """Every ``starts.log`` row of tests/trainers/slot_fault.py: (what, slot, node rank, time)."""
    return [(r[0], r[1], r[2], float(r[3])) for p in (tmp_path / "nomad").rglob("starts.log")
            for r in (ln.split() for ln in p.read_text().splitlines()) if len(r) == 4]


@pytest.mark.torch
def test_a_hot_spare_takes_a_bad_nodes_rank_on_nomad_with_no_client_alive(tmp_path):
    """``nomad.spare_nodes: 1``, 2 nodes: the trainer's group holds 3 allocations (slot 2 idle).
    With the submitting process gone, slot 1's rank fails as a bad node once the world formed
    (tests/trainers/slot_fault.py); the keeper (a task of the job, in the simulator) gives node
    rank 1 to the spare in the next world, and both ranks start again in the same allocations (no
    placement, no new version); the run completes. ``status`` shows the swap, the spare used, and
    the spare's idle GPU-hours in the run's. Without the keeper (or without the world loop in the
    entry script) the run fails: the break-it check."""
    shutil.copy(REPO / "tests" / "trainers" / "slot_fault.py", tmp_path / "slot_fault.py")
    with _cluster(tmp_path, names=("n0", "n1", "n2", "n3")) as (fake, env, sims):
        fake.attach_policy("default", KEEPER_CAPS, variables={"nomad/jobs/*": ("read", "write")})
        job = _job(tmp_path, keeper=True, trainer_spec={"script": str(tmp_path / "slot_fault.py"), "args": ["--steps", "20"]},
                   nomad={"driver": "raw_exec", "spare_nodes": 1}, retry={"attempts": 2, "on": ["node"]})
        r = cli("submit", job, "--backend", "nomad", "--quiet", cwd=tmp_path, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        run_id = r.stdout.strip().splitlines()[-1]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and fake.job_record(run_id)["Status"] != "dead":
            fake.tick()  # the clients' updates (nobody else asks the servers anything)
            time.sleep(0.5)
        (sim,) = sims  # one version: the spare took the rank inside it
        said = {a.name: (sim.stdout(a.name) + sim.stderr(a.name))[-2500:] for a in sim.allocations}
        assert fake.job_record(run_id)["Status"] == "dead", said
        rows = _starts(tmp_path)
        fault = next(t for what, slot, _, t in rows if what == "fault")
        restart = min(t for what, _, _, t in rows if what == "start" and t > fault)  # the next world's first start
        again = [(slot, node, t) for what, slot, node, t in rows if what == "trained" and t > restart]
        assert sorted((slot, node) for slot, node, _ in again) == [("0", "0"), ("2", "1")], (rows, said)
        recovery = max(t for _, _, t in again) - fault
        world = fake.variables[("default", f"nomad/jobs/{run_id}/trainer")]["Items"]
        assert (world["generation"], world["ranks"], world["state"]) == ("1", "0:0,2:1", "done"), world
        keeper = sim.stdout(f"{run_id}.keeper[0]")
        assert "node rank 1 moves from slot 1 (n" in keeper, keeper
        st = cli("status", run_id, "--backend", "nomad", cwd=tmp_path, env=env)
        assert st.returncode == 0 and "COMPLETED" in st.stdout, st.stdout + st.stderr
        bad = _nodes_of(fake, run_id)["trainer[1]"]
        assert f"0 of 1 spare left ({bad} -> " in st.stdout, st.stdout
        # The spare's hours are the run's: 3 nodes x the wall time.
        js = json.loads(cli("status", run_id, "--backend", "nomad", "--json", cwd=tmp_path, env=env).stdout)
        assert js["spares"]["left"] == 0 and js["run"]["attempts"][0]["nodes"] == 3, js
        assert bad in cli("nodes", env=env).stdout  # the swapped node is ledgered
        # Fault to every rank training again: about 15 s on a quiet machine, 52 s once beside the whole
        # suite (8 tests at once on 2 cores). The bound is below the rendezvous timeout (60 s) plus
        # a torchrun start: a swap that waited for a timeout to pass fails it; the same allocations
        # and world generation 1 (above) say no placement happened.
        assert recovery <= 75, recovery
        print(f"Nomad hot spare, no client alive: fault to every rank training again {recovery:.1f} s")


@pytest.mark.torch
def test_a_python_exception_on_nomad_is_not_retried(tmp_path):
    with _cluster(tmp_path) as (fake, env, sims):
        r = cli("submit", _job(tmp_path, "raise_always.py", retry={"attempts": 2, "on": ["node"]}),
                "--backend", "nomad", "--wait", "--quiet", "--timeout", "180", cwd=tmp_path, env=env, timeout=420)
        assert r.returncode == 1 and "retrying" not in r.stderr, r.stderr[-3000:]
        assert "ValueError: bad learning rate" in r.stderr, r.stderr[-3000:]
        assert len(sims) == 1  # one job registered: no second attempt
        assert "empty" in cli("nodes", env=env).stderr


def test_the_fake_places_off_a_node_the_constraint_names(tmp_path):
    """scheduler/feasible/feasible.go v2.0.5: ``${node.unique.name}`` resolves to the node's Name
    (:1110-1111) and ``!=`` holds where the values differ (:1148-1149); a node it rules out is
    counted under ConstraintFiltered by the constraint's text, and a group no node is left for is
    blocked."""
    import halo_sched
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig
    from halo_sched.runs import next_spec

    spec = halo_sched.load(_job(tmp_path))
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2")], token=TOKEN) as fake:
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)))
        job_id = sched.schedule(sched.dryrun(next_spec(spec, "r", 1, ("n0",), None)))
        assert set(_nodes_of(fake, job_id).values()) == {"n1", "n2"}
        job_id = sched.schedule(sched.dryrun(next_spec(spec, "r", 1, ("n0", "n2"), None)))
        assert set(_nodes_of(fake, job_id).values()) == {"n1"}  # node rank 0 placed; rank 1 blocked
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.PARTIAL and "${node.unique.name} != n0: 1" in st.reason, st.reason


# ---- GPU-hours from Nomad's own times ---------------------------------------------------------


def _alloc(name, status, started, finished, node="n1"):
    return {"ID": name + "-id", "Name": f"j.{name}", "TaskGroup": name.split("[")[0], "NodeName": node,
            "ClientStatus": status, "DesiredStatus": "run", "JobVersion": 0, "CreateIndex": 1, "ModifyTime": 0,
            "TaskStates": {"torchrun": {"State": "dead" if finished != fake_api.ZERO_TIME else "running",
                                        "Failed": False, "StartedAt": started, "FinishedAt": finished,
                                        "Events": []}}}


def test_nomad_times_are_the_tasks_started_and_finished_at():
    assert go_time(fake_api.ZERO_TIME) is None and go_time(None) is None and go_time("yesterday") is None
    assert go_time("2027-01-15T08:00:00.5Z") == 1_800_000_000.5
    assert go_time("2027-01-15T09:00:00+01:00") == 1_800_000_000.0
    job = {"ID": "j", "Status": "dead", "Stop": False, "Meta": {"halo_sched_nodes": "2"}}
    done = [_alloc("trainer[0]", "complete", "2027-01-15T08:00:00Z", "2027-01-15T08:30:00Z"),
            _alloc("trainer[1]", "complete", "2027-01-15T08:00:02Z", "2027-01-15T08:30:01Z")]
    st = job_state(job, done, [], "j")
    assert st.status is JobStatus.COMPLETED
    assert (st.started_at, st.ended_at) == (1_800_000_000.0, 1_800_000_000.0 + 1801)
    # Still running: a start, no end (FinishedAt is Go's zero time until the task is dead).
    running = [_alloc("trainer[0]", "running", "2027-01-15T08:00:00Z", fake_api.ZERO_TIME),
               _alloc("trainer[1]", "running", "2027-01-15T08:00:02Z", fake_api.ZERO_TIME)]
    st = job_state({**job, "Status": "running"}, running, [], "j")
    assert st.status is JobStatus.RUNNING and (st.started_at, st.ended_at) == (1_800_000_000.0, None)
    # Failed while the survivor is still being stopped: no end until every task that ran ended.
    mixed = [_alloc("trainer[0]", "running", "2027-01-15T08:00:00Z", fake_api.ZERO_TIME),
             {**_alloc("trainer[1]", "failed", "2027-01-15T08:00:02Z", "2027-01-15T08:10:00Z")}]
    st = job_state({**job, "Status": "running"}, mixed, [], "j")
    assert st.status is JobStatus.FAILED and st.ended_at is None
    # A lost node never reports its task's end: the allocation's ModifyTime stands in.
    lost = [_alloc("trainer[0]", "failed", "2027-01-15T08:00:00Z", "2027-01-15T08:05:00Z"),
            {**_alloc("trainer[1]", "lost", "2027-01-15T08:00:02Z", fake_api.ZERO_TIME),
             "ModifyTime": int((1_800_000_000 + 600) * 1e9)}]
    st = job_state(job, lost, [], "j")
    assert st.status is JobStatus.NODE_FAIL and st.ended_at == 1_800_000_000.0 + 600
    # Never started: neither.
    pending = [_alloc("trainer[0]", "pending", fake_api.ZERO_TIME, fake_api.ZERO_TIME)]
    assert job_state({**job, "Status": "pending"}, pending, [], "j").started_at is None


def test_status_run_counts_gpu_hours_from_nomads_task_times(tmp_path):
    """A 2-node, 4-GPU job whose allocations' tasks ran exactly 30 minutes by Nomad's clock (a
    test that takes seconds): ``status`` records Nomad's start and end, and the run's row is
    2 nodes x 0.5 h = 1 node-h, 4 GPU-h, clock "scheduler"."""
    from halo_sched.runs import attempts_of

    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=4, nproc_per_node=4, retry={"attempts": 2, "on": ["node"]})
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        r = cli("submit", str(path), "--backend", "nomad", env=env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        fake.set_running(job_id)
        for group in ("trainer[0]", "trainer[1]"):
            fake.finish(job_id, group, 0)
        t0 = 1_800_000_000 * 10**9
        fake.set_task_times(job_id, started_ns=t0, finished_ns=t0 + 1800 * 10**9)
        st = cli("status", job_id, env=env)
        assert st.returncode == 0 and "COMPLETED" in st.stdout, st.stdout + st.stderr
        assert "attempt 1: " in st.stdout and "2 nodes x 1800s: 1.0000 node-h, 4.0000 GPU-h" in st.stdout, st.stdout
        os.environ["HALO_SCHED_HOME"] = env["HALO_SCHED_HOME"]
        (row,) = attempts_of(job_id, "nomad")
        assert (row.clock, row.wall_s, row.node_hours, row.gpu_hours) == ("scheduler", 1800.0, 1.0, 4.0)
        rec = json.loads(cli("status", job_id, "--json", env=env).stdout)
        assert rec["run"]["attempts"][0]["clock"] == "scheduler", rec


def _gpu_job(tmp_path) -> str:
    """A GPU job whose run a waiting process carries on (``nomad.keeper: false``): these tests
    drive its allocations by hand, and register each next attempt as such a process does."""
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=4, nproc_per_node=4, retry={"attempts": 3, "on": ["node"]})
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None, keeper=False)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _scheduler(fake):
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig

    return NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)),
                          retry_s=5)


def test_status_run_counts_each_versions_gpu_hours_from_its_own_allocations(tmp_path, monkeypatch):
    """Attempt 1 (version 0) ran 10 minutes and failed, attempt 2 (a new version of the same
    job, keeping off g1) 30 minutes by Nomad's clocks: ``status RUN`` shows each attempt's wall
    time and GPU-hours from the allocations of its own version (2 nodes x 4 GPUs: 1.3333 and
    4.0000 GPU-h), not from the job's allocations of every version."""
    import halo_sched
    from halo_sched.runs import attempts_of, next_spec

    path = _gpu_job(tmp_path)
    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        r = cli("submit", path, "--backend", "nomad", env=env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        fake.set_running(job_id)
        fake.finish(job_id, "trainer[1]", 1)
        fake.finish(job_id, "trainer[0]", 0)
        t0 = 1_800_000_000 * 10**9
        fake.set_task_times(job_id, started_ns=t0, finished_ns=t0 + 600 * 10**9)
        assert cli("status", job_id, env=env).returncode == 0  # the record keeps attempt 1's end
        culprit = fake.alloc_for(job_id, "trainer[1]")["NodeName"]
        spec = halo_sched.load(path)
        second = _scheduler(fake).submit_attempt(next_spec(spec, job_id, 1, (culprit,), None), job_id).id
        assert second == f"{job_id}~v1", second  # nothing stopped the job in between: version 1
        assert culprit not in _nodes_of(fake, second).values() and len(_nodes_of(fake, second)) == 2
        # Version 0's allocations, terminal, are left as they ended (filters.go
        # filterOldTerminalAllocs): not stopped, not replaced.
        assert [(a["ClientStatus"], a["DesiredStatus"]) for a in sorted(_allocs(fake, job_id), key=lambda a: a["TaskGroup"])] \
            == [("complete", "run"), ("failed", "run")], _allocs(fake, job_id)
        fake.set_running(job_id)
        for group in ("trainer[0]", "trainer[1]"):
            fake.finish(job_id, group, 0)
        fake.set_task_times(job_id, started_ns=t0 + 900 * 10**9, finished_ns=t0 + 2700 * 10**9, version=1)
        # The attempt's own status (what the waiting process notes as it ends), then the run's.
        mine = cli("status", second, env=env)
        assert mine.returncode == 0 and "COMPLETED" in mine.stdout, mine.stdout + mine.stderr
        st = cli("status", job_id, env=env)
        assert st.returncode == 0, st.stderr
        lines = st.stdout.splitlines()
        a1 = [ln for ln in lines if "attempt 1: " in ln]
        a2 = [ln for ln in lines if "attempt 2: " in ln]
        assert len(a1) == 1 and f"{job_id} FAILED" in a1[0] and "2 nodes x 600s: 0.3333 node-h, 1.3333 GPU-h" in a1[0], lines
        assert len(a2) == 1 and f"{second} COMPLETED;" in a2[0], lines
        assert "2 nodes x 1800s: 1.0000 node-h, 4.0000 GPU-h" in a2[0] and f"excluded {culprit}" in a2[0], lines
        assert any("run: 2 attempts, 1.3333 node-h (0.3333 lost), 5.3333 GPU-h (1.3333 lost" in ln for ln in lines), lines
        rows = attempts_of(job_id, "nomad")
        assert [(a.id, a.clock, a.wall_s) for a in rows] == [(job_id, "scheduler", 600.0), (second, "scheduler", 1800.0)]
        # Each attempt's id reads its own version: the first stays FAILED after the second completed.
        states = _scheduler(fake).query([job_id, second])
        assert (states[job_id].status, states[second].status) == (JobStatus.FAILED, JobStatus.COMPLETED), states


def test_a_later_attempts_secrets_outlive_the_status_of_the_earlier_one(tmp_path, monkeypatch):
    """``secret_env`` on Nomad is a Variable per job ID, deleted once the job is seen ended. The
    next attempt is the same job ID: ``status`` of the ended first attempt (version 0) must not
    delete the Variable the next version's tasks read; that version's own end does."""
    import halo_sched
    from halo_sched.runs import next_spec

    data = yaml.safe_load(open(_gpu_job(tmp_path)).read())
    data["secret_env"] = ["HF_TOKEN"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = {**_env(tmp_path, fake), "HF_TOKEN": "hf-secret-value"}
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        monkeypatch.setenv("HF_TOKEN", "hf-secret-value")
        r = cli("submit", str(tmp_path / "job.yaml"), "--backend", "nomad", env=env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        key = ("default", f"nomad/jobs/{job_id}")
        fake.set_running(job_id)
        fake.finish(job_id, "trainer[1]", 1)
        fake.finish(job_id, "trainer[0]", 0)
        # One process throughout, as ``submit --wait`` is: it saw attempt 1 end (Variable deleted)...
        sched = _scheduler(fake)
        assert sched.query([job_id])[job_id].status is JobStatus.FAILED and key not in fake.variables
        spec = halo_sched.load(str(tmp_path / "job.yaml"))
        second = sched.submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id
        assert fake.variables[key]["Items"] == {"HF_TOKEN": "hf-secret-value", ITEM: runtime(batch=False).base64}
        for which in (job_id, second):  # the ended first attempt, then the running second
            st = cli("status", which, env=env)
            assert st.returncode == 0 and key in fake.variables, (which, st.stdout, st.stderr)
        fake.set_running(job_id)
        for group in ("trainer[0]", "trainer[1]"):
            fake.finish(job_id, group, 0)
        # ... and deletes it again at the end of the attempt it wrote it for.
        assert sched.query([second])[second].status is JobStatus.COMPLETED and key not in fake.variables


def _failed_first_attempt(tmp_path, fake, env):
    r = cli("submit", _gpu_job(tmp_path), "--backend", "nomad", env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[-1]
    fake.set_running(job_id)
    fake.finish(job_id, "trainer[1]", 1)
    fake.finish(job_id, "trainer[0]", 0)
    return job_id


def test_two_processes_registering_the_next_attempt_register_one_version(tmp_path, monkeypatch):
    """Two processes waiting on one run both read the job (JobModifyIndex M) before either
    registers attempt 2: the first registers version 1; the second's register, against M, is
    refused by Nomad (EnforceIndex: "Enforcing job modify index M: job exists with conflicting
    job modify index: N"), and the job read back carries the other's token: it registers
    nothing and says so. A process that reads the job after the first registered finds the
    attempt by the job's Meta and follows it (its id), before any request."""
    import halo_sched
    from halo_sched.errors import SchedulerError
    from halo_sched.runs import next_spec

    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        job_id = _failed_first_attempt(tmp_path, fake, env)
        spec = halo_sched.load(str(tmp_path / "job.yaml"))
        one, two = _scheduler(fake), _scheduler(fake)
        stale = two._client_for().read_job(job_id)  # read before the other registered
        first = one.submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id
        assert first == f"{job_id}~v1"
        monkeypatch.setattr(type(two._client_for()), "read_job", lambda self, name: copy_of(stale))
        with pytest.raises(SchedulerError) as exc:
            two.submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id)
        assert "registered again by another process" in str(exc.value), exc.value
        refused = [q for q in fake.requests_to(f"/v1/job/{job_id}", "POST")]
        assert len(refused) == 2, refused
        assert [v["Version"] for v in fake.registered_versions(job_id)] == [0, 1]
        monkeypatch.undo()
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        assert _scheduler(fake).submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id == first
        assert len(fake.requests_to(f"/v1/job/{job_id}", "POST")) == 2
        assert [v["Version"] for v in fake.registered_versions(job_id)] == [0, 1]


def test_an_attempt_registered_by_a_process_that_died_before_recording_it_is_adopted(tmp_path, monkeypatch):
    """The process that registered attempt 2 died before its record was written (its claim in
    the store is then taken over: runs.py): the next claimant finds the version by the job's
    Meta, records it with the failure key its tasks carry, and registers nothing."""
    import halo_sched
    from halo_sched import db, records
    from halo_sched.runs import next_spec

    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        job_id = _failed_first_attempt(tmp_path, fake, env)
        spec = halo_sched.load(str(tmp_path / "job.yaml"))
        first = _scheduler(fake).submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id
        key = records.failure_key(first, "nomad")
        assert key
        with db.write() as con:  # as if the process had died before recording it
            con.execute("DELETE FROM jobs WHERE id = ?", (first,))
        assert _scheduler(fake).submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id == first
        assert len(fake.requests_to(f"/v1/job/{job_id}", "POST")) == 1
        (rec,) = records.find(first, "nomad")
        assert rec["failure_key"] == key and rec["run"] == {"id": job_id, "attempt": 1, "excluded": ["g1"]}, rec


def test_the_real_enforce_index_refusal_text():
    """The fake's refusal of a register against a stale JobModifyIndex is Nomad's
    (nomad/structs/job.go Job.EnforceIndex v2.0.5, a plain error: HTTP 500 with its text), and
    a register against the current one is the job's next version."""
    import requests

    job = {"ID": "j", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec"}]}]}
    with FakeNomad([FakeNode("n0", gpus=0)], token=TOKEN) as fake:
        def post(path, body):
            return requests.post(f"{fake.address}{path}", json=body, headers={"X-Nomad-Token": TOKEN}, timeout=10)

        assert post("/v1/jobs", {"Job": job}).status_code == 200
        index = fake.job_record("j")["JobModifyIndex"]
        ok = post("/v1/job/j", {"Job": job, "EnforceIndex": True, "JobModifyIndex": index})
        assert ok.status_code == 200 and ok.json()["JobModifyIndex"] == fake.job_record("j")["JobModifyIndex"] > index
        late = post("/v1/job/j", {"Job": job, "EnforceIndex": True, "JobModifyIndex": index})
        now = fake.job_record("j")["JobModifyIndex"]
        assert late.status_code == 500 and late.text.strip() == (
            f"Enforcing job modify index {index}: job exists with conflicting job modify index: {now}"), late.text
        assert fake.job_record("j")["Version"] == 1 and [v["Version"] for v in fake.registered_versions("j")] == [0, 1]


def test_a_register_answered_too_late_is_found_by_its_token_not_registered_twice(tmp_path, monkeypatch):
    """The connection drops after Nomad applied the new version: the read-back finds the job
    with this register's token, so the attempt is that version and no second register is sent."""
    import halo_sched
    from halo_sched.runs import next_spec

    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        job_id = _failed_first_attempt(tmp_path, fake, env)
        spec = halo_sched.load(str(tmp_path / "job.yaml"))
        fake.drop_after_next(1, path_contains=f"/v1/job/{job_id}", method="POST")
        second = _scheduler(fake).submit_attempt(next_spec(spec, job_id, 1, ("g1",), None), job_id).id
        assert second == f"{job_id}~v1"
        assert len(fake.requests_to(f"/v1/job/{job_id}", "POST")) == 1
        assert [v["Version"] for v in fake.registered_versions(job_id)] == [0, 1]


def copy_of(job: dict) -> dict:
    return json.loads(json.dumps(job))


# ---- the preflight gate on Nomad ---------------------------------------------------------------

# Node 1's setup points gloo at an interface this host does not have, on the run's first attempt
# only, as a node whose NIC is missing would (tests/test_preflight_gate.py does the same on local
# and SLURM): the gate, inside the rendered task's entry script, checks the interface its ranks
# will use.
BAD_NODE_1_ONCE = ('if [ "$halo_rank" = 1 ] && [ "${HALO_RESTART_COUNT:-0}" = 0 ]; then '
                   'export GLOO_SOCKET_IFNAME=nosuchif0; fi')


@pytest.mark.torch
def test_the_gate_fails_a_nomad_node_as_a_preflight_node_fault_ledgered_and_retried(tmp_path):
    """The run's keeper retries it (four nodes: the keeper keeps off the trainers'); ``submit
    --wait`` follows and says so."""
    with _cluster(tmp_path, names=("n0", "n1", "n2", "n3")) as (fake, env, sims):
        fake.attach_policy("default", KEEPER_CAPS)
        r = cli("submit", _job(tmp_path, setup=[BAD_NODE_1_ONCE], preflight={"gate": True}, keeper=True,
                               retry={"attempts": 2, "on": ["preflight"]}),
                "--backend", "nomad", "--wait", "--quiet", "--timeout", "180", cwd=tmp_path, env=env, timeout=420)
        assert r.returncode == 0, r.stderr[-4000:]
        run_id = r.stdout.strip().splitlines()[-1]
        assert re.search(r"FAILED \(node fault: host n1, preflight check failed\): preflight gate: interface "
                         r"nosuchif0: no interface nosuchif0", r.stderr), r.stderr[-3000:]
        assert "retrying (preflight fault) as " in r.stderr, r.stderr[-3000:]
        # The gate ran in the simulated task (its entry script, before torchrun) and failed it.
        bad = next(a for a in sims[0].allocations if a.name.endswith(".trainer[1]"))
        text = sims[0].stderr(bad.name)
        assert "node 1: preflight gate: this node failed its checks" in text and "torchrun not started" in text, text
        assert next(a for a in _allocs(fake, run_id) if a["Name"].endswith(".trainer[1]"))["ClientStatus"] == "failed"
        assert _nodes_of(fake, run_id)["trainer[1]"] == "n1"
        first = json.loads(cli("status", run_id, "--json", env=env).stdout)
        assert first["failure_class"] == {"class": "node", "failure": "preflight", "reason": "preflight check failed", "host": "n1",
                                          "by": "preflight"}, first
        ledger = json.loads(cli("nodes", "--json", env=env).stdout)
        assert [(e["host"], e["by"], e["job"]) for e in ledger] == [("n1", "preflight", run_id)], ledger
        second = r.stderr.split("retrying (preflight fault) as ", 1)[1].split()[0]
        trainers = {g: n for g, n in _nodes_of(fake, second).items() if g.startswith("trainer")}
        assert "n1" not in trainers.values() and len(trainers) == 2, trainers
        assert second.startswith(f"{run_id}~v")  # a new version of the same job, run by its own simulator
        later = sims[1].stderr(f"{run_id}.trainer[0]") + sims[1].stderr(f"{run_id}.trainer[1]")
        assert later.count("preflight gate passed") == 2, later[-3000:]


LONG_ON_FIRST_ATTEMPT = '''\
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], f"up-{os.environ['HALO_RESTART_COUNT']}-{os.environ['GROUP_RANK']}").touch()
if os.environ["HALO_RESTART_COUNT"] == "0":
    time.sleep(300)
'''


@pytest.mark.torch
def test_a_node_lost_on_nomad_is_the_culprit_and_the_next_attempt_keeps_off_it(tmp_path):
    """The simulated node running node rank 1 goes down (fake_api.node_down: Nomad 2.0.5's
    heartbeat and reconciler, the allocation ``unknown``): the waiting process reads NODE_FAIL
    naming that Nomad node, and the run's keeper retries off it (four nodes: the keeper keeps off
    the trainers'); the waiting process follows and says so."""
    import subprocess

    (tmp_path / "long.py").write_text(LONG_ON_FIRST_ATTEMPT)
    marks = tmp_path / "marks"
    marks.mkdir()
    with _cluster(tmp_path, names=("n0", "n1", "n2", "n3")) as (fake, env, sims):
        fake.attach_policy("default", KEEPER_CAPS)
        job = _job(tmp_path, retry={"attempts": 2, "on": ["node"]}, keeper=True,
                   trainer_spec={"script": str(tmp_path / "long.py"), "args": [str(marks)]})
        proc = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "submit", job, "--backend", "nomad", "--wait",
                                 "--quiet", "--timeout", "180"], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not (marks / "up-0-1").exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.3)
            assert (marks / "up-0-1").exists(), proc.poll()
            run_id = sims[0].job_id
            victim = fake.alloc_for(run_id, "trainer[1]")["NodeName"]
            fake.node_down(victim)
            out, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err[-4000:]
        assert re.search(rf"NODE_FAIL: node 1 \(Nomad node {victim}\) disconnected at ", err), err[-3000:]
        assert "retrying (node fault) as " in err, err[-3000:]
        second = err.split("retrying (node fault) as ", 1)[1].split()[0]
        assert {"LTarget": "${node.unique.name}", "RTarget": victim, "Operand": "!="} in \
            fake.registered_versions(run_id)[-1]["Constraints"]
        assert victim not in _nodes_of(fake, second).values() and (marks / "up-1-1").exists()
        ledger = json.loads(cli("nodes", "--json", env=env).stdout)
        assert [(e["host"], e["by"]) for e in ledger] == [(victim, "node-lost")], ledger
        # Kept off as the run's culprit, not only as a ledgered host (the ledger can be off).
        a2 = [ln for ln in cli("status", run_id, env=env).stdout.splitlines() if "\tattempt 2: " in ln]
        assert len(a2) == 1 and f"excluded {victim}" in a2[0] and " COMPLETED;" in a2[0], a2


def test_logs_of_each_attempt_are_its_own_versions_output(tmp_path, monkeypatch):
    """The plain id is the run's first attempt (version 0), ``JOB~vN`` version N (docs/nomad.md,
    "Retry"): ``logs`` of each shows the output of its own version's allocations, as ``status``
    reads their states, not the newest allocation of each rank whatever its version."""
    import halo_sched
    from halo_sched.runs import next_spec

    with FakeNomad([FakeNode(n, docker_volumes_enabled=True) for n in ("g0", "g1", "g2")], token=TOKEN) as fake:
        env = _env(tmp_path, fake)
        monkeypatch.setenv("HALO_SCHED_HOME", env["HALO_SCHED_HOME"])
        job_id = _failed_first_attempt(tmp_path, fake, env)
        for a in _allocs(fake, job_id):
            fake.write_log(a["ID"], f"first attempt, {a['Name'].rsplit('.', 1)[1]}\n")
        culprit = fake.alloc_for(job_id, "trainer[1]")["NodeName"]
        second = _scheduler(fake).submit_attempt(
            next_spec(halo_sched.load(_gpu_job(tmp_path)), job_id, 1, (culprit,), None), job_id).id
        fake.set_running(job_id)
        for a in _allocs(fake, second):
            fake.write_log(a["ID"], f"second attempt, {a['Name'].rsplit('.', 1)[1]}\n")
        for which, mine, other in ((job_id, "first", "second"), (second, "second", "first")):
            r = cli("logs", which, env=env)
            assert r.returncode == 0, (which, r.stderr)
            assert f"[node 0] {mine} attempt, trainer[0]" in r.stdout and f"[node 1] {mine} attempt, trainer[1]" in r.stdout, r.stdout
            assert f"{other} attempt" not in r.stdout, (which, r.stdout)
