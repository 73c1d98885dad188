"""Server roles on Nomad: the rendered job's server groups, parsed back from HCL by HashiCorp's
parser (tests/hclparse), and run in the client simulator (tests/nomad/client_sim.py) with the
trainer's groups: placement of each role's group, its tagged nomadService registrations, the
trainer reading them through templates (empty until registered), servers ending themselves once
rank 0's registration is gone."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

import halo_sched.errors
import halo_sched.spec  # the modules themselves: `import halo_sched` loads them lazily, on first use
from halo_sched.backends.nomad.render import job_payload, render_hcl, variable_path
from halo_sched.launch import submission_id
from halo_sched.backends.nomad.servers import service_name
from helpers import REPO, free_port, job_variable, load_nomad_helper, loopback_hosts
from hclparse import hcl2json, jobspec

client_sim = load_nomad_helper("client_sim")
SECRET = "+k3y it's $(x) ${y} {{ .z }}\nline2"
SERVER = str(REPO / "tests" / "servers" / "rollout_server.py")
TRAINER = str(REPO / "tests" / "servers" / "server_trainer.py")


def spec_for(tmp_path, server_nodes=2, timeout_s=60, delay=1.0, secret_env=()):
    port = free_port()
    return halo_sched.spec.JobSpec.model_validate({
        "name": "rl-sim", "nodes": 2, "nproc_per_node": 1,
        "trainer": {"script": TRAINER, "args": ["--report-dir", str(tmp_path / "reports")]},
        "env": {"OMP_NUM_THREADS": "1"},
        "network": {"fabric": "efa"},
        "rendezvous": {"port": free_port(), "timeout_s": timeout_s},
        "nomad": {"driver": "raw_exec"},
        "servers": [{"name": "rollout-a", "nodes": server_nodes, "port": port, "group_port": free_port(),
                     "command": [sys.executable, SERVER, "--port", str(port), "--delay", str(delay),
                                 "--record-dir", str(tmp_path / "rec"), "--echo", "${x} %{y} it's",
                                 *[a for n in secret_env for a in ("--env-hex", n)]],
                     "secret_env": list(secret_env)}],
    })


def test_server_groups_are_constant_size_and_decode_from_hcl(tmp_path):
    spec = spec_for(tmp_path, server_nodes=7)
    job_id = submission_id(spec)
    job = job_payload(spec, job_id)["Job"]
    assert [(g["Name"], g["Count"]) for g in job["TaskGroups"]] == [("trainer", 2), ("server-rollout-a", 7)]
    (srv,) = job["TaskGroups"][1]["Services"]
    assert srv["Name"] == service_name(job_id, "rollout-a") and srv["Tags"] == ["halo-index-${NOMAD_ALLOC_INDEX}"]
    # Every trainer allocation reserves the weight-sync port rank 0 binds.
    assert {p["Label"] for p in job["TaskGroups"][0]["Networks"][0]["ReservedPorts"]} == {"rdzv", "group-rollout-a"}
    parsed = jobspec.api_job(hcl2json.load(render_hcl(spec, job_id)))
    assert jobspec.comparable(parsed) == jobspec.comparable(job)


def test_docker_server_without_any_image_is_refused(tmp_path):
    spec = spec_for(tmp_path)
    spec = spec.model_copy(update={"nomad": spec.nomad.model_copy(update={"driver": "docker"}), "image": None})
    with pytest.raises(halo_sched.errors.SpecError, match="image"):
        job_payload(spec)


def _host_env():
    env = dict(os.environ)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    return env


@pytest.mark.torch
def test_sim_trainer_reads_server_registrations_and_servers_end_after_rank_0(tmp_path):
    # One server: the simulator is one host, where a second static port 'http' cannot be
    # reserved (it refuses, as Nomad would need another node). Node order: the local tests.
    # The role's secret (servers[].secret_env) comes from the job's Variable, never the client's env.
    spec = spec_for(tmp_path, server_nodes=1, delay=1.0, secret_env=["ROLLOUT_KEY"])
    job = job_payload(spec)["Job"]
    host = _host_env()
    host.pop("ROLLOUT_KEY", None)
    with client_sim.SimCluster(job, tmp_path / "nomad", host_env=host, variables=job_variable(job, ROLLOUT_KEY=SECRET),
                               hosts=loopback_hosts(3)) as cluster:
        # Trainer first: its address files are blank until the server registers; it waits.
        cluster.place(["trainer"])
        cluster.start()
        time.sleep(2)
        assert cluster.services(service_name("rl-sim", "rollout-a")) == []
        cluster.place(["server-rollout-a"])
        cluster.start()
        codes = cluster.wait(timeout=120)
        logs = {n: cluster.stdout(n) + cluster.stderr(n) for n in codes}
    assert set(codes.values()) == {0}, logs
    ranks = [json.loads((tmp_path / "reports" / f"rank{i}.json").read_text()) for i in range(2)]
    port = spec.servers[0].port
    for rep in ranks:
        urls = rep["urls"]["HALO_SERVER_ROLLOUT_A_URLS"]
        assert [u["url"].rsplit(":", 1)[1] for u in urls] == [str(port)]
        assert [u["body"]["server"] for u in urls] == ["rollout-a-0"]
        assert bytes.fromhex(urls[0]["body"]["echo_hex"]).decode() == "${x} %{y} it's"
        assert urls[0]["body"]["nccl_net"] == "Libfabric"
        assert bytes.fromhex(urls[0]["body"]["env_hex"]["ROLLOUT_KEY"]).decode() == SECRET
    # The servers stopped themselves after rank 0's registration went away.
    assert any("the trainer's rank 0 is gone" in text for name, text in logs.items() if "server-rollout-a" in name), logs


@pytest.mark.torch
def test_sim_unregistered_server_fails_the_trainer_naming_it(tmp_path):
    spec = spec_for(tmp_path, server_nodes=1, timeout_s=4)
    job = job_payload(spec)["Job"]
    with client_sim.SimCluster(job, tmp_path / "nomad", host_env=_host_env(), hosts=loopback_hosts(3)) as cluster:
        cluster.place(["trainer"])  # the server group never places
        t0 = time.monotonic()
        cluster.start()
        codes = cluster.wait(timeout=60)
        elapsed = time.monotonic() - t0
        errs = {n: cluster.stderr(n) for n in codes}
    assert all(c != 0 for c in codes.values())
    assert any("server(s) rollout-a[0] not registered within rendezvous.timeout_s=4s" in e for e in errs.values()), errs
    assert elapsed < 40


def test_golden_rl_servers_hcl_decodes_to_the_golden_json():
    golden = REPO / "tests" / "golden"
    (doc,) = hcl2json.load_many([(golden / "rl-servers.nomad.hcl").read_text()])
    want = json.loads((golden / "rl-servers.nomad.json").read_text())["Job"]
    assert jobspec.comparable(jobspec.api_job(doc)) == jobspec.comparable(want)


def _alloc(group, name, status, code=None, idx=1):
    a = {"ID": f"{name}-id", "TaskGroup": group, "Name": name, "ClientStatus": status, "DesiredStatus": "run",
         "CreateIndex": idx, "NodeName": "n1", "TaskStates": {}}
    if status == "failed":
        a["TaskStates"] = {"server": {"Failed": True, "Events": [{"Type": "Terminated", "ExitCode": code, "Time": 5}]}}
    return a


def test_state_dead_server_is_a_dead_rank_and_completed_trainer_leaves_servers_to_stop():
    from halo_sched.backends.base import JobStatus
    from halo_sched.backends.nomad.state import job_state

    job = {"ID": "j", "Status": "running", "Meta": {"halo_sched_nodes": "2"}}
    trainer_running = [_alloc("trainer", "j.trainer[0]", "running"), _alloc("trainer", "j.trainer[1]", "running")]
    st = job_state(job, trainer_running + [_alloc("server-vllm", "j.server-vllm[0]", "failed", 3)], [], "j")
    assert st.status is JobStatus.FAILED and "server vllm[0]" in st.reason, st.reason
    assert st.nomad.dead[0]["server"] == "vllm[0]"
    done = [_alloc("trainer", "j.trainer[0]", "complete"), _alloc("trainer", "j.trainer[1]", "complete")]
    st = job_state(job, done + [_alloc("server-vllm", "j.server-vllm[0]", "running")], [], "j")
    assert st.status is JobStatus.COMPLETED and st.nomad.servers_running == 1


def test_a_retry_attempt_never_reads_an_earlier_attempts_server_registration(tmp_path):
    """A retry is a new version of the same Nomad job. A server whose node went down leaves its
    allocation ``unknown`` and its registration in place after the stop (Nomad deletes one only
    for a client-terminal or collected allocation: tests/nomad/client_sim.py node_died), and
    ``nomadService`` lists registrations in ID order: under the role's one name, the next
    attempt's trainer would read the dead server first. Each attempt's services have a name of
    their own, and its trainer's template asks for that name."""
    from halo_sched.runs import next_spec

    spec = spec_for(tmp_path, server_nodes=1)
    job_id = submission_id(spec)
    first = job_payload(spec, job_id)["Job"]
    second = job_payload(next_spec(spec, job_id, 1, (), None), job_id)["Job"]
    assert first["ID"] == second["ID"]  # one job, two versions

    def server_service(job):
        (g,) = [g for g in job["TaskGroups"] if g["Name"] == "server-rollout-a"]
        (svc,) = g["Services"]
        return svc["Name"]

    def trainer_template(job):
        (t,) = [t for t in job["TaskGroups"][0]["Tasks"][0]["Templates"]
                if t["DestPath"] == "local/halo-server-rollout-a-addrs"]
        return t["EmbeddedTmpl"]

    old, new = server_service(first), server_service(second)
    assert old != new
    registry = client_sim.ServiceRegistry()
    for reg_id, name, addr in (("_nomad-task-0000-dead", old, "10.9.9.9"), ("_nomad-task-ffff-live", new, "10.0.0.2")):
        registry.register({"ID": reg_id, "ServiceName": name, "Namespace": "default", "Tags": ["halo-index-0"],
                           "Address": addr, "Port": 8000})
    funcs = {"nomadService": lambda q: [client_sim._NomadService(r) for r in registry.get(q)]}
    text = client_sim.GoTemplate(trainer_template(second)).render(funcs)
    assert text.split() == ["halo-index-0", "10.0.0.2"], text
    # The first attempt's trainer read its own name (the plain one: rendered jobs unchanged).
    assert client_sim.GoTemplate(trainer_template(first)).render(funcs).split() == ["halo-index-0", "10.9.9.9"]


def _scheduler(fake, token):
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient
    from halo_sched.backends.nomad.transport import NomadConfig

    cfg = NomadConfig.from_env(env={}, address=fake.address, token=token, retry_base_s=0.01, retry_max_wait_s=0.05)
    return NomadScheduler(client=NomadClient(cfg, sleep=lambda s: None), retry_s=5)


def test_a_token_that_may_not_write_the_variable_stops_a_job_with_servers(tmp_path):
    """The servers' shell comes from the job's Variable and a server node has no python to fall
    back on: without the Variable nothing is submitted (a job without servers or secrets goes on)."""
    from halo_sched.backends.nomad.transport import NomadAPIError

    fake_api = load_nomad_helper("fake_api")
    token = "jobs-only-token-0123456789"
    with fake_api.FakeNomad([fake_api.FakeNode("a"), fake_api.FakeNode("b"), fake_api.FakeNode("c")],
                            acl_tokens={token: "jobs"}) as fake:
        with pytest.raises(NomadAPIError) as info:
            _scheduler(fake, token).submit(spec_for(tmp_path, server_nodes=1))
        assert info.value.status == 403 and fake._jobs == {}
        assert "servers' shell" in str(info.value) and "halo_server_shell=" in str(info.value)
        plain = spec_for(tmp_path, server_nodes=1).model_copy(update={"servers": []})
        _scheduler(fake, token).submit(plain)
        assert len(fake._jobs) == 1


def test_a_job_id_that_cannot_have_a_variable_carries_the_servers_shell_in_its_template(tmp_path):
    """A '.' in the id: no Variable (its path cannot hold one), so the server task's template holds
    the servers' shell itself, rendered byte-exact (delimiters absent from it)."""
    from halo_sched.backends.nomad.render import variable_items
    from halo_sched.node_runtime import SERVER_ITEM, server_shell

    spec = spec_for(tmp_path, server_nodes=1)
    for job_id, inline in (("rl.sim", True), ("rl-sim", False)):
        job = job_payload(spec, job_id)["Job"]
        (task,) = [g for g in job["TaskGroups"] if g["Name"] == "server-rollout-a"][0]["Tasks"]
        (tpl,) = [t for t in task["Templates"] if t["DestPath"] == "local/halo-server-shell.sh"]
        assert task["Env"]["HALO_SERVER_SHELL_FILE"] == "${NOMAD_TASK_DIR}/halo-server-shell.sh"
        if inline:
            assert client_sim.GoTemplate(tpl["EmbeddedTmpl"], tpl["LeftDelim"], tpl["RightDelim"]).render({}) == server_shell()
        else:  # the Variable's item (rendered by the simulator in the runs above)
            assert f'eq $k "{SERVER_ITEM}"' in tpl["EmbeddedTmpl"] and "halo_server_run" not in tpl["EmbeddedTmpl"]
        assert (SERVER_ITEM in variable_items(spec, job_id)) is not inline


def test_submit_writes_the_servers_shell_into_the_jobs_variable_once(tmp_path):
    """One item for the whole job, beside the node runtime, however many roles and servers."""
    from halo_sched.node_runtime import ITEM, SERVER_ITEM, runtime, server_shell

    fake_api = load_nomad_helper("fake_api")
    token = "write-token-0123456789abcdef"
    with fake_api.FakeNomad([fake_api.FakeNode(n) for n in "abcd"], token=token) as fake:
        job = _scheduler(fake, token).submit(spec_for(tmp_path, server_nodes=2))
        ((path, var),) = fake.variables.items()
    assert path == ("default", variable_path(job.id.rsplit("/", 1)[-1]))
    assert var["Items"] == {ITEM: runtime(batch=False).base64, SERVER_ITEM: server_shell()}
