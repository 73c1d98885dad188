"""A Nomad run's keeper (halo_sched/node/nomad_keeper.py), against the fake Nomad API
(tests/nomad/fake_api.py): its Task API socket, its workload identity and the policies attached
to it, EnforceIndex, the job's versions. The keeper runs in a thread of the test here (its
allocations are the fake's, nothing runs in a simulator): what it reads and what it sends are the
fake's HTTP semantics, fast. End to end, with the client simulator running the keeper task and
real torchrun: tests/test_nomad_runs.py."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import pytest
import yaml

import halo_sched
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from halo_sched.backends.nomad.render import job_payload
from halo_sched.node import failure_collector
from halo_sched.node.nomad_keeper import APIError, Keeper, Settings, TaskAPI, next_job
from halo_sched.runs import next_spec
from helpers import REPO, cli, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-keeper"
KEY = "k" * 64
#: What the keeper's identity needs (docs/nomad.md, "The run's keeper").
CAPS = ("read-job", "submit-job", "read-logs")


def _spec(tmp_path, **extra):
    data = {"name": "kept", "nodes": 2, "nproc_per_node": 1,
            "trainer": {"script": str(REPO / "examples" / "train_ddp.py")},
            "nomad": {"driver": "raw_exec"}, "retry": {"attempts": 3, "on": ["node"]}, **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return halo_sched.load(path)


def _sock() -> str:
    """A short path for a Task API socket (the fake binds long ones through /proc too)."""
    d = tempfile.mkdtemp(prefix="halo-k-", dir="/tmp")
    return os.path.join(d, "api.sock")


def _submit(fake, spec) -> str:
    from halo_sched.backends.base import failure_key_in_env
    from halo_sched.backends.nomad import with_failure_key

    sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)))
    dry = sched.dryrun(spec)
    dry.payload.update(with_failure_key(dry.payload, KEY))
    with failure_key_in_env(KEY):
        return sched.schedule(dry)


def _alloc(fake, job_id: str, name: str, version: int = 0) -> dict:
    return next(a for a in fake.allocs_of(job_id) if a["Name"] == f"{job_id}.{name}" and a["JobVersion"] == version)


def _key(fake, job_id: str) -> str:
    """The failure key the job's trainer tasks carry (as submit registered it)."""
    job = fake.registered_versions(job_id)[0]
    return next(t["Env"]["HALO_FAILURE_KEY"] for g in job["TaskGroups"] for t in g["Tasks"] if t["Name"] == "torchrun")


def _keeper(fake, job_id: str, version: int = 0, **kw) -> Keeper:
    path = _sock()
    fake.serve_task_api(path)
    alloc = _alloc(fake, job_id, "keeper[0]", version)
    api = TaskAPI(path, fake.workload_token(alloc["ID"], "keeper"), "default")
    settings = Settings(job_id=job_id, alloc_id=alloc["ID"], nodes=2, attempts=3,
                        retry_on=kw.pop("retry_on", ("node",)), key=_key(fake, job_id))
    lines: list[str] = []
    k = Keeper(api, settings, say=lines.append, settle_s=kw.pop("settle_s", 0.5), wait_s=2.0, **kw)
    k.lines = lines
    return k


def _node_fault(fake, job_id: str, rank: int, version: int = 0) -> dict:
    """Rank ``rank``'s node fails as a bad node does: its signed failure line (killed by a SIGKILL
    nothing in the job sent), then its allocation fails."""
    alloc = _alloc(fake, job_id, f"trainer[{rank}]", version)
    rec = {"node": rank, "rank": rank, "local_rank": 0, "host": alloc["NodeName"], "exit_code": -9,
           "signal": "SIGKILL", "time": time.time(), "error": "", "tail": []}
    fake.write_log(alloc["ID"], failure_collector.record_line(rec, _key(fake, job_id), secrets=[]) + "\n",
                   type="stderr")
    fake.finish(job_id, f"trainer[{rank}]", 137)
    return alloc


def _run(keeper: Keeper) -> dict:
    out: dict = {}

    def go():
        try:
            out["rc"] = keeper.run()
        except Exception as err:  # noqa: BLE001 - the test reads it
            out["error"] = err

    t = threading.Thread(target=go, daemon=True)
    t.start()
    out["thread"] = t
    return out


def _done(out: dict, timeout: float = 60.0) -> int:
    out["thread"].join(timeout)
    assert not out["thread"].is_alive(), "the keeper did not end"
    assert "error" not in out, out.get("error")
    return out["rc"]


def _wait_for(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_the_keepers_next_attempt_is_what_the_submitter_renders_for_it(tmp_path):
    """next_job (the keeper's, from the job as Nomad holds it) and the submitter's renderer agree on
    attempt 2 of the run: the culprit kept off, HALO_RESTART_COUNT, the attempt's service names
    (and the nodes' lookup of rank 0's), the rest the same job."""
    spec = _spec(tmp_path)
    job_id = "kept-20260101-000000-abcdef"
    first = job_payload(spec, job_id)["Job"]
    first["Meta"]["halo_sched_token"] = "t0"
    first.update({"Version": 0, "JobModifyIndex": 11, "Status": "running", "Stop": False, "SubmitTime": 1})
    got = next_job(first, "n1", 1, "t1")
    want = job_payload(next_spec(spec, job_id, 1, ("n1",), None), job_id)["Job"]
    assert got["Meta"].pop("halo_sched_attempt") == "1" and got["Meta"].pop("halo_sched_token") == "t1"
    assert got["Meta"].pop("halo_sched_excluded") == "n1"
    want["Meta"].pop("halo_sched_token", None)
    assert not {"Version", "JobModifyIndex", "Status", "SubmitTime"} & set(got) and got.pop("Stop") is False
    key = json.dumps
    assert sorted(map(key, got.pop("Constraints"))) == sorted(map(key, want.pop("Constraints")))
    assert got == want
    trainer = next(g for g in got["TaskGroups"] if g["Name"] == "trainer")
    assert trainer["Services"][0]["Name"] == f"{job_id}-attempt1-rdzv"
    assert trainer["Tasks"][0]["Env"]["HALO_RESTART_COUNT"] == "1"


def test_the_task_api_wants_a_token_and_the_keepers_identity_its_policy(tmp_path):
    """command/agent/http.go authMiddleware: no token 401, an unknown one 403, ACLs on or off; a
    workload identity with ACLs on may read its job only with a policy attached (read-job), and
    its own Variables without one."""
    with FakeNomad([FakeNode("n0", gpus=0), FakeNode("n1", gpus=0), FakeNode("n2", gpus=0)], token=TOKEN) as fake:
        job_id = _submit(fake, _spec(tmp_path))
        path = _sock()
        fake.serve_task_api(path)
        alloc = _alloc(fake, job_id, "keeper[0]")
        wid = fake.workload_token(alloc["ID"], "keeper")
        for token, status in (("", 401), ("not-a-token", 403), (wid, 403)):
            with pytest.raises(APIError) as err:
                TaskAPI(path, token, "default").call("GET", f"/v1/job/{job_id}")
            assert err.value.status == status, err.value
        # Its own group's Variable (the keeper's copy of the runtime) it reads with no policy.
        var, _ = TaskAPI(path, wid, "default").call("GET", f"/v1/var/nomad/jobs/{job_id}/keeper")
        assert set(var["Items"]) == {"halo_keeper_runtime"}
        fake.attach_policy("default", CAPS, job=job_id, group="keeper", task="keeper")
        job, _ = TaskAPI(path, wid, "default").call("GET", f"/v1/job/{job_id}")
        assert job["ID"] == job_id
        # Every request went through the socket, as the identity.
        via = [r for r in fake.requests if r.via == "task-api"]
        assert len(via) == 5 and via[-1].headers.get("x-nomad-token") == wid


def test_the_keeper_registers_the_next_attempt_off_the_culprit(tmp_path):
    """Node rank 1 fails as a bad node (signed line: a SIGKILL nothing in the job sent): the keeper
    registers attempt 2 as version 1, with EnforceIndex against the index it read, through its Task
    API socket with its identity, keeping off the rank's Nomad node; its policy attached after the
    keeper started (it said why it waited, and went on)."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        job_id = _submit(fake, _spec(tmp_path))
        keeper = _keeper(fake, job_id)
        out = _run(keeper)
        _wait_for(lambda: keeper.lines, what="the keeper's first line")  # it read its allocation: no policy needed
        culprit = _node_fault(fake, job_id, 1)["NodeName"]
        _wait_for(lambda: any("HTTP 403" in ln for ln in keeper.lines), what="the 403 said")
        fake.attach_policy("default", CAPS, job=job_id)
        assert _done(out) == 0
        job = fake.job_record(job_id)
        assert job["Version"] == 1 and job["Meta"]["halo_sched_attempt"] == "1", job["Meta"]
        assert {"LTarget": "${node.unique.name}", "RTarget": culprit, "Operand": "!="} in job["Constraints"]
        puts = [r for r in fake.requests if r.method == "PUT" and r.path == f"/v1/job/{job_id}"]
        assert len(puts) == 1 and puts[0].via == "task-api" and puts[0].body["EnforceIndex"] is True
        assert puts[0].body["JobModifyIndex"] == fake.registered_versions(job_id)[0]["JobModifyIndex"]
        assert any("attach the keeper's ACL policy" in ln for ln in keeper.lines), keeper.lines
        assert any(f"attempt 2 registered as version 1, keeping off {culprit}" in ln for ln in keeper.lines), keeper.lines
        # The new version's allocations keep off the culprit; the old version's survivor was stopped.
        assert culprit not in {a["NodeName"] for a in fake.allocs_of(job_id) if a["JobVersion"] == 1}
        assert _alloc(fake, job_id, "trainer[0]")["DesiredStatus"] == "stop"


def test_two_keepers_of_one_version_register_one_attempt(tmp_path):
    """A keeper placed again while the first still runs (cut off, then back): both read the same
    JobModifyIndex and register; Nomad applies one (EnforceIndex), refuses the other, and the loser,
    reading the job again, registers nothing."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS)
        job_id = _submit(fake, _spec(tmp_path))
        keepers = [_keeper(fake, job_id), _keeper(fake, job_id)]
        both = threading.Barrier(2, timeout=30)
        for k in keepers:  # both at the register at once, each with the index it read
            real = k.api.call

            def call(method, path, *a, _real=real, **kw):
                if method == "PUT":
                    both.wait()
                return _real(method, path, *a, **kw)

            k.api.call = call
        outs = [_run(k) for k in keepers]
        _node_fault(fake, job_id, 1)
        assert [_done(o) for o in outs] == [0, 0]
        answers = [r.status for r in fake.requests if r.method == "PUT" and r.path == f"/v1/job/{job_id}"]
        assert sorted(answers) == [200, 500], answers
        assert fake.job_record(job_id)["Version"] == 1 and len(fake.registered_versions(job_id)) == 2
        said = [ln for k in keepers for ln in k.lines if "registered by another keeper" in ln]
        assert len(said) == 1, [k.lines for k in keepers]


@pytest.mark.parametrize("on", [("node",), ("node", "job")])
def test_a_failure_not_retried_ends_the_run_with_the_jobs_stop(tmp_path, on):
    """A Python exception (the job's own fault) is retried only where retry.on lists job (opt-in,
    node/failure_classes.py): otherwise the keeper stops the job, so that its survivor releases its
    node, and registers nothing; with job listed it registers attempt 2, keeping off no host."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS)
        job_id = _submit(fake, _spec(tmp_path, retry={"attempts": 3, "on": list(on)}))
        keeper = _keeper(fake, job_id, retry_on=on)
        out = _run(keeper)
        alloc = _alloc(fake, job_id, "trainer[1]")
        rec = {"node": 1, "rank": 1, "local_rank": 0, "host": "h", "exit_code": 1, "signal": None,
               "time": time.time(), "error": "ValueError: bad learning rate", "tail": ["ValueError: bad learning rate"]}
        fake.write_log(alloc["ID"], failure_collector.record_line(rec, KEY, secrets=[]) + "\n", type="stderr")
        fake.finish(job_id, "trainer[1]", 1)
        assert _done(out) == 0
        job = fake.job_record(job_id)
        if "job" in on:
            assert not job["Stop"] and job["Meta"]["halo_sched_attempt"] == "1", job["Meta"]
            assert not any(c.get("LTarget") == "${node.unique.name}" for c in job.get("Constraints") or []), job
            assert any("retrying (job)" in ln for ln in keeper.lines), keeper.lines
            return
        assert job["Stop"] and len(fake.registered_versions(job_id)) == 1, job
        assert any("job fault" in ln and "stopping the job" in ln for ln in keeper.lines), keeper.lines


def test_a_lost_node_is_the_culprit_whatever_its_peers_said(tmp_path):
    """Rank 0's node goes down (Nomad 2.0.5: unknown, kept by lost_after): the keeper waits out its
    settle for the survivor, then registers the next attempt keeping off the lost node."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS)
        job_id = _submit(fake, _spec(tmp_path))
        keeper = _keeper(fake, job_id, settle_s=1.0)
        out = _run(keeper)
        lost = _alloc(fake, job_id, "trainer[0]")["NodeName"]
        assert lost != _alloc(fake, job_id, "keeper[0]")["NodeName"]  # distinct_hosts: not the keeper's
        fake.node_down(lost)
        assert _done(out) == 0
        job = fake.job_record(job_id)
        assert job["Meta"]["halo_sched_attempt"] == "1" and job["Meta"]["halo_sched_excluded"] == lost


def test_a_waiting_client_follows_the_keeper_and_registers_nothing(tmp_path):
    """``watch RUN`` while the keeper acts: the watcher does not stop the job when a rank dies (the
    keeper is alive: its to decide), registers no attempt (the keeper does), follows the version the
    keeper registered and records it; the run ends COMPLETED when that version's ranks complete."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(tmp_path / "home"))
        job_file = tmp_path / "job.yaml"
        _spec(tmp_path)  # writes job_file
        r = cli("submit", str(job_file), "--backend", "nomad", "--quiet", env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        import subprocess
        import sys

        watch = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "watch", job_id, "--backend", "nomad",
                                  "--timeout", "120"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: any(r.path.endswith("/allocations") and r.via == "http" for r in fake.requests),
                      what="the watcher's first look")
            keeper = _keeper(fake, job_id)
            out = _run(keeper)
            _node_fault(fake, job_id, 1)
            assert _done(out) == 0
            _wait_for(lambda: fake.job_record(job_id)["Version"] == 1, what="version 1")
            for rank in (0, 1):
                fake.finish(job_id, f"trainer[{rank}]", 0)
            stdout, stderr = watch.communicate(timeout=120)
        finally:
            if watch.poll() is None:
                watch.kill()
        assert watch.returncode == 0, stderr[-3000:]
        assert f"retrying (node fault) as {job_id}~v1" in stderr, stderr[-3000:]
        http = [(r.method, r.path) for r in fake.requests if r.via == "http" and r.method in ("PUT", "POST", "DELETE")]
        # The submit's Variables and register; nothing from the watcher: no stop, no register.
        assert http == [("PUT", f"/v1/var/nomad/jobs/{job_id}"), ("PUT", f"/v1/var/nomad/jobs/{job_id}/keeper"),
                        ("POST", "/v1/jobs")], http
        st = cli("status", job_id, "--backend", "nomad", env=env, cwd=tmp_path)
        assert "\tattempt 2: " in st.stdout and f"{job_id}~v1 COMPLETED" in st.stdout, st.stdout + st.stderr


# ---- hot spares (nomad.spare_nodes) -----------------------------------------------------------------


def _spares_keeper(fake, job_id: str, **kw) -> Keeper:
    k = _keeper(fake, job_id, **kw)
    k.s.spares = 1
    k.spare_settle_s = 0.5
    return k


def _world(fake, job_id: str) -> dict:
    var = fake.variables.get(("default", f"nomad/jobs/{job_id}/trainer"))
    return (var or {}).get("Items") or {}


def test_a_spare_takes_a_bad_nodes_rank_in_the_next_world(tmp_path):
    """``nomad.spare_nodes: 1``: the trainer's group holds 3 allocations, slot 2 idle. Slot 1's node
    fails as a bad node (its signed line, streamed from its task's stderr while its allocation
    runs on, waiting): the keeper writes generation 1 of the run's world, check-and-set on the
    Variable, node rank 1 on slot 2; ``status`` folds the ranks by that world (RUNNING, the swap
    and no spare left), and the swap's host is in the node ledger. A second node fault, with no
    spare left, ends the world and the run (no retry:): the job is stopped."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS, variables={"nomad/jobs/*": ("read", "write")})
        spec = _spec(tmp_path, retry=None, nomad={"driver": "raw_exec", "spare_nodes": 1})
        job_id = _submit(fake, spec)
        assert fake.job_record(job_id)["TaskGroups"][0]["Count"] == 3
        keeper = _spares_keeper(fake, job_id)
        out = _run(keeper)
        _wait_for(lambda: len(keeper._streams) == 3, what="a log stream per slot")
        slot1 = _alloc(fake, job_id, "trainer[1]")
        rec = {"node": 1, "rank": 1, "local_rank": 0, "host": slot1["NodeName"], "exit_code": -9, "signal": "SIGKILL",
               "time": time.time(), "error": "", "tail": []}
        fake.write_log(slot1["ID"], failure_collector.record_line(rec, _key(fake, job_id), secrets=[]) + "\n",
                       type="stderr")
        _wait_for(lambda: _world(fake, job_id).get("generation") == "1", what="generation 1")
        world = _world(fake, job_id)
        spare = _alloc(fake, job_id, "trainer[2]")["NodeName"]
        assert (world["ranks"], world["master"], world["state"], world["attempt"]) == ("0:0,2:1", "0", "running", "0")
        (swap,) = json.loads(world["swaps"])
        assert (swap["rank"], swap["bad"], swap["spare"], swap["slot"], swap["to"]) == (1, slot1["NodeName"], spare, 1, 2)
        put = [r for r in fake.requests if r.path.endswith("/trainer") and r.method == "PUT"]
        assert len(put) == 1 and put[0].query.get("cas") == "0" and put[0].via == "task-api", put
        # The submitter's view: node rank 1 is slot 2 now; the job runs on, its spare used.
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)))
        st = sched.query([job_id])[job_id]
        assert st.status.name == "RUNNING" and st.spares["left"] == 0, st.describe()
        assert [n["alloc_id"] for n in st.nomad.nodes] == [_alloc(fake, job_id, "trainer[0]")["ID"],
                                                            _alloc(fake, job_id, "trainer[2]")["ID"]]
        assert f"0 of 1 spare left ({slot1['NodeName']} -> {spare}: killed by SIGKILL" in st.describe(), st.describe()
        # A second fault, on the spare itself: none left, no retry: the world ends, the job stops.
        rec = {**rec, "node": 1, "host": spare, "time": time.time() + 1}
        fake.write_log(_alloc(fake, job_id, "trainer[2]")["ID"],
                       failure_collector.record_line(rec, _key(fake, job_id), secrets=[]) + "\n", type="stderr")
        assert _done(out) == 0
        assert _world(fake, job_id)["state"] == "done" and fake.job_record(job_id)["Stop"]
        assert any("no spare left to take node rank 1" in ln for ln in keeper.lines), keeper.lines


def test_a_spare_takes_rank_0_of_a_lost_node_and_becomes_the_worlds_master(tmp_path):
    """Rank 0's node goes down (unknown): its rank, and the rendezvous with it, goes to the spare;
    the world names the spare's slot as rank 0's."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2", "n3")], token=TOKEN) as fake:
        fake.attach_policy("default", CAPS, variables={"nomad/jobs/*": ("read", "write")})
        job_id = _submit(fake, _spec(tmp_path, nomad={"driver": "raw_exec", "spare_nodes": 1}))
        keeper = _spares_keeper(fake, job_id)
        out = _run(keeper)
        _wait_for(lambda: len(keeper._streams) == 3, what="a log stream per slot")
        fake.node_down(_alloc(fake, job_id, "trainer[0]")["NodeName"])
        _wait_for(lambda: _world(fake, job_id).get("generation") == "1", what="generation 1")
        assert (_world(fake, job_id)["ranks"], _world(fake, job_id)["master"]) == ("2:0,1:1", "2")
        # The job cancelled: the keeper sees the stop and ends.
        NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1))).cancel([job_id])
        assert _done(out) == 0 and any("the job was stopped" in ln for ln in keeper.lines), keeper.lines


@pytest.mark.parametrize("extra, backend, field, says", [
    ({"nomad": {"driver": "raw_exec", "spare_nodes": 1, "keeper": False}}, "nomad", "nomad.spare_nodes",
     "hot spares need keeper: true"),
    ({"nomad": {"driver": "raw_exec", "spare_nodes": 65}}, "nomad", "nomad.spare_nodes", "less than or equal to 64"),
    ({"nomad": {"driver": "raw_exec", "spare_nodes": 1}}, "local", "nomad.spare_nodes", "the local backend cannot hold them"),
])
def test_a_bad_spares_field_is_refused_naming_it(tmp_path, extra, backend, field, says):
    data = {"name": "kept", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": str(REPO / "examples" / "train_ddp.py")},
            **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    r = cli("render", str(path), "--backend", backend, cwd=tmp_path)
    assert r.returncode == 2 and field in r.stderr and says in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("keeper", [True, False])
def test_a_waiter_never_registers_an_attempt(tmp_path, keeper):
    """A client only reads (issue 40 item 3). With its keeper: the keeper's allocation ended
    without a next attempt (it failed; no policy, a bug): the job is dead, and ``watch RUN``
    reports the failed attempt and registers nothing itself. Without one (``nomad.keeper:
    false``): ``submit`` says the run is not retried on Nomad, and ``watch RUN`` registers nothing
    either (an earlier release's waiter registered the next version here)."""
    with FakeNomad([FakeNode(n, gpus=0) for n in ("n0", "n1", "n2")], token=TOKEN) as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(tmp_path / "home"))
        _spec(tmp_path, nomad={"driver": "raw_exec", "keeper": keeper})  # writes job.yaml
        r = cli("submit", str(tmp_path / "job.yaml"), "--backend", "nomad", "--quiet", env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert ("a failed attempt is not retried on Nomad" in r.stderr) is not keeper, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        _node_fault(fake, job_id, 1)
        fake.finish(job_id, "trainer[0]", 0)
        if keeper:
            fake.finish(job_id, "keeper[0]", 1)
        assert fake.job_record(job_id)["Status"] == "dead"
        w = cli("watch", job_id, "--backend", "nomad", "--timeout", "60", env=env, cwd=tmp_path, timeout=120)
        assert w.returncode == 1 and "FAILED (node fault" in w.stderr, w.stderr[-2000:]
        writes = [(r.method, r.path) for r in fake.requests if r.method in ("PUT", "POST", "DELETE")
                  and "/v1/var/" not in r.path]
        assert writes == [("POST", "/v1/jobs")] and len(fake.registered_versions(job_id)) == 1, writes
