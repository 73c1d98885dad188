"""The Nomad backend through the CLI, against the fake Nomad API; and the HCL against the JSON.

No Nomad binary can run here. What these prove: the HCL parses with HashiCorp's own HCL library
(``tests/hclparse``: hcl2json, WebAssembly) and decodes to the same job as the API payload; the
job has a constant size whatever the node count; submit/plan/status/cancel/--wait speak the Nomad
API correctly (as the fake models it); the placement watchdog stops a half-placed job within its
timeout.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest
import yaml

import halo_sched
from halo_sched.backends.nomad.render import (
    client_requirements, job_payload, node_rank_of, render_hcl,
)
from halo_sched.errors import SpecError
from halo_sched.launch import submission_id
from helpers import REPO, cli, free_port, load_nomad_helper
from hclparse import hcl2json, jobspec

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-123"


def Client(name, **kw):  # noqa: N802 - reads like the FakeNode it makes
    """A GPU client whose docker plugin allows host bind mounts (the example mounts /scratch)."""
    return FakeNode(name, docker_volumes_enabled=True, **kw)
GOLDEN = REPO / "tests" / "golden"


def _variants():
    gpu = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    cpu = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    raw = cpu.nomad.model_copy(update={"driver": "raw_exec", "max_run_duration": "1h"})
    yield "gpu-2", gpu
    yield "gpu-1", gpu.model_copy(update={"nodes": 1})
    yield "gpu-5-ep", gpu.model_copy(update={"nodes": 5, "network": gpu.network.model_copy(update={"cross_node_expert_parallel": True})})
    yield "raw-3", cpu.model_copy(update={"nodes": 3, "nomad": raw})
    yield "region-priority", cpu.model_copy(update={"nomad": raw.model_copy(update={"region": "eu", "priority": 70})})
    # Secrets rendered for the task's own user: the task's user, the templates' uid/gid.
    yield "gpu-secrets-user", gpu.model_copy(update={"secret_env": ["HF_TOKEN"],
                                                      "nomad": gpu.nomad.model_copy(update={"user": "1000:1000"})})
    # The run's keeper (its group, restart and reschedule blocks, identity { env = true }) and hot
    # spares (the trainer's count, the world's templates).
    from halo_sched.models import Retry

    yield "gpu-keeper", gpu.model_copy(update={"retry": Retry(attempts=3, on=["node"])})
    yield "raw-spares", cpu.model_copy(update={"retry": Retry(attempts=2, on=["node"]),
                                               "nomad": raw.model_copy(update={"spare_nodes": 2})})


@pytest.mark.parametrize("name, spec", list(_variants()), ids=[n for n, _ in _variants()])
def test_hcl_decodes_to_the_json_payload(name, spec):
    job_id = submission_id(spec)
    parsed = jobspec.api_job(hcl2json.load(render_hcl(spec, job_id)))
    assert jobspec.comparable(parsed) == jobspec.comparable(job_payload(spec, job_id)["Job"])


def test_golden_hcl_decodes_to_the_golden_json():
    (hcl_doc,) = hcl2json.load_many([(GOLDEN / "nomad-gpu.nomad.hcl").read_text()])
    golden = json.loads((GOLDEN / "nomad-gpu.nomad.json").read_text())["Job"]
    assert jobspec.comparable(jobspec.api_job(hcl_doc)) == jobspec.comparable(golden)


def test_hcl_parser_refuses_what_it_should():
    # The parser is real: a broken document and an unescaped interpolation are both caught.
    with pytest.raises(hcl2json.HclSyntaxError):
        hcl2json.parse('job "x" {\n  type = "batch\n}\n')
    with pytest.raises(ValueError, match="interpolation"):
        hcl2json.load('x = "${NOMAD_ALLOC_INDEX}"\n')
    assert hcl2json.load('x = "$${NOMAD_ALLOC_INDEX} %%{ if }"\n') == {"x": "${NOMAD_ALLOC_INDEX} %{ if }"}


def test_one_trainer_group_shape():
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml").model_copy(update={"nodes": 4})
    job = job_payload(spec, "ddp-nomad-1")["Job"]
    assert [(g["Name"], g["Count"]) for g in job["TaskGroups"]] == [("trainer", 4)]
    assert job["Meta"]["halo_sched_nodes"] == "4"
    (trainer,) = job["TaskGroups"]
    # Every allocation registers the rendezvous service, tagged with its index; every node, rank 0
    # too, reads index 0's registration (address, then port).
    assert trainer["Services"] == [{"Name": "ddp-nomad-1-rdzv", "Provider": "nomad", "PortLabel": "rdzv",
                                    "Tags": ["halo-index-${NOMAD_ALLOC_INDEX}"]}]
    # rendezvous.port unset: a dynamic port, one per allocation.
    assert trainer["Networks"][0] == {"Mode": "host", "DynamicPorts": [{"Label": "rdzv"}]}
    set_port = job_payload(spec.model_copy(update={"rendezvous": spec.rendezvous.model_copy(update={"port": 29500})}),
                           "ddp-nomad-1")["Job"]["TaskGroups"][0]
    assert set_port["Networks"][0] == {"Mode": "host", "ReservedPorts": [{"Label": "rdzv", "Value": 29500}]}
    assert set_port["Tasks"][0]["Env"] == trainer["Tasks"][0]["Env"]
    t = trainer["Tasks"][0]
    assert t["Env"] == {"HALO_NODE_RANK": "${NOMAD_ALLOC_INDEX}",
                        "HALO_MASTER_ADDR_FILE": "${NOMAD_TASK_DIR}/halo-master-addr",
                        "HALO_LOG_DIR": "${NOMAD_TASK_DIR}/halo-logs",
                        "HALO_RESULT_FILE": "${NOMAD_TASK_DIR}/halo-result.json",
                        "HALO_NODE_RUNTIME_FILE": "${NOMAD_TASK_DIR}/halo-node.b64"}
    master = t["Templates"][1]["EmbeddedTmpl"]
    assert 'nomadService "halo-index-0.ddp-nomad-1-rdzv"' in master and "index . 0" in master
    assert "{{ .Address }}\n{{ .Port }}" in master
    for g in job["TaskGroups"]:
        # Lost means failed: no restart, no reschedule, no replacement of a node that went down.
        # lost_after: the example's max_run_duration (12h) plus an hour, so Nomad 1.11.2+ keeps a
        # lost rank unknown for the job's life; replace = false for servers before 1.11.2.
        assert g["Disconnect"] == {"LostAfter": 13 * 3600 * 10**9, "Replace": False}
        # The image's own entrypoint never runs: the shell is the entrypoint, no command.
        assert g["Tasks"][0]["Config"]["entrypoint"] == ["/bin/bash"] and "command" not in g["Tasks"][0]["Config"]
        assert g["RestartPolicy"]["Attempts"] == 0 and g["ReschedulePolicy"]["Attempts"] == 0
        cfg = g["Tasks"][0]["Config"]
        # Nothing a default 2.0.4+ docker client refuses: no host namespace modes.
        assert not {"ipc_mode", "pid_mode", "uts_mode", "userns_mode", "privileged"} & set(cfg)
        assert cfg["shm_size"] == 64 * 1024**3 and cfg["network_mode"] == "host"
        assert g["Tasks"][0]["Resources"]["Devices"] == [{"Name": "nvidia/gpu", "Count": 8}]
        assert cfg["devices"] == [{"host_path": "/dev/infiniband", "container_path": "/dev/infiniband"}]
    unbounded = spec.model_copy(update={"nomad": spec.nomad.model_copy(update={"max_run_duration": None})})
    # No max_run_duration: a week (the longest wait any rank may be given) plus the hour.
    assert {g["Disconnect"]["LostAfter"] for g in job_payload(unbounded)["Job"]["TaskGroups"]} == {169 * 3600 * 10**9}
    one = job_payload(spec.model_copy(update={"nodes": 1}))["Job"]["TaskGroups"]
    assert [(g["Name"], g["Count"]) for g in one] == [("trainer", 1)]


def test_node_rank_of_allocation_names():
    assert node_rank_of("trainer", "j.trainer[0]") == 0
    assert node_rank_of("trainer", "j.trainer[1]") == 1
    assert node_rank_of("trainer", "my.job[2].trainer[41]") == 41
    assert node_rank_of("server-vllm", "j.server-vllm[0]") is None and node_rank_of("trainer", "j.trainer") is None


def test_job_size_does_not_grow_with_nodes():
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    sizes = {}
    for n in (2, 256, 1024):
        s = spec.model_copy(update={"nodes": n})
        sizes[n] = (len(json.dumps(job_payload(s, "ddp-nomad-x"))), len(render_hcl(s, "ddp-nomad-x")))
    # Only the digits of N differ (meta, the entry's range check, the group's count).
    for n in (256, 1024):
        assert abs(sizes[n][0] - sizes[2][0]) < 64 and abs(sizes[n][1] - sizes[2][1]) < 64, sizes
    payload = job_payload(spec.model_copy(update={"nodes": 1024}))["Job"]
    entry = payload["TaskGroups"][0]["Tasks"][0]["Templates"][0]["EmbeddedTmpl"]
    assert json.dumps(payload).count(json.dumps(entry)) == 1  # once, for every node


def test_volumes_cannot_interpolate_on_the_client():
    client_sim = load_nomad_helper("client_sim")
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    vols = ["/data/${NOMAD_JOB_ID}:/in:ro", "/x/%{ if true }y%{ endif }:/out", "/a$${b}:/c"]
    spec = spec.model_copy(update={"nomad": spec.nomad.model_copy(update={"volumes": vols})})
    sent = job_payload(spec)["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["volumes"]
    # The client evaluates driver config strings as HCL templates (client_sim.eval_hcl_string
    # follows it); an unknown variable would fail the task, a known one would change the path.
    assert [client_sim.eval_hcl_string(v, {"NOMAD_JOB_ID": "j"}) for v in sent] == vols


def test_client_requirements_name_the_plugin_settings():
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    volumes, plugin, runtime = client_requirements(spec)
    assert "nomad.volumes" in volumes and "volumes { enabled = true }" in volumes
    # A GPU docker task needs the device plugin and Docker's nvidia runtime (driver.go:1065-1068@v2.0.5).
    assert "nvidia device plugin" in plugin and "Docker's nvidia runtime" in runtime
    bare = spec.model_copy(update={"nomad": spec.nomad.model_copy(update={"volumes": []}), "gpus_per_node": 0,
                                   "nproc_per_node": 1})
    assert client_requirements(bare) == []
    cpu = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    raw = cpu.model_copy(update={"nomad": cpu.nomad.model_copy(update={"driver": "raw_exec"})})
    assert any("raw_exec" in line for line in client_requirements(raw))


def test_docker_without_image_is_a_field_error():
    cpu = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    with pytest.raises(SpecError, match="image"):
        job_payload(cpu.model_copy(update={"image": None}))


# ---- the CLI against the fake API -------------------------------------------------------------


@pytest.fixture
def job_file(tmp_path):
    def make(nodes=2, gpus=8, placement_timeout_s=None, namespace=None):
        data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
        data["nodes"], data["gpus_per_node"], data["nproc_per_node"] = nodes, gpus, gpus
        data["nomad"]["placement_timeout_s"] = placement_timeout_s
        data["nomad"]["namespace"] = namespace
        data["nomad"]["memory"] = 65536
        data["nomad"]["shm_size"] = "8GiB"
        p = tmp_path / "job.yaml"
        p.write_text(yaml.safe_dump(data))
        return p
    return make


def nomad_env(fake, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, **extra)
    return env


def test_half_placed_job_is_stopped_within_placement_timeout(job_file):
    # Two GPU clients, but one is fully busy: node rank 1 cannot place (no gang scheduling).
    with FakeNomad([Client("gpu-a"), Client("gpu-b", busy_gpus=8)], token=TOKEN) as fake:
        f = job_file(nodes=2, placement_timeout_s=3)
        t0 = time.monotonic()
        r = cli("submit", str(f), "--backend", "nomad", "--wait", env=nomad_env(fake))
        elapsed = time.monotonic() - t0
        assert r.returncode == 1, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"ddp-nomad-\d{8}-\d{6}-[0-9a-f]{6}", job_id)
        assert "1 of 2" in r.stderr or "1/2" in r.stderr, r.stderr
        assert "trainer: 1 of 2 unplaced (node rank 1)" in r.stderr
        assert fake.job_record(job_id)["Stop"] is True
        # Stopped once placement_timeout_s had passed since it was registered, give or take a few
        # polls on a loaded machine; the CLI's own start-up is not the job's time.
        (registered,) = [rq.at for rq in fake.requests if rq.method in ("PUT", "POST") and rq.path == "/v1/jobs"]
        (stopped,) = [rq.at for rq in fake.requests if rq.method == "DELETE" and rq.path == f"/v1/job/{job_id}"]
        assert 3 <= stopped - registered < 3 + 3, (registered, stopped)
        assert elapsed < 60, elapsed
        # Every request carried the token.
        assert fake.requests and all(rq.headers.get("x-nomad-token") == TOKEN for rq in fake.requests)


def test_status_partial_then_plan_explains(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b", busy_gpus=8)], token=TOKEN) as fake:
        f = job_file(nodes=2)
        r = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        state = json.loads(st.stdout)
        assert state["status"] == "PARTIAL" and state["nodes_running"] == 1 and state["nodes_total"] == 2
        assert "trainer: 1 of 2 unplaced (node rank 1)" in state["reason"]
        p = cli("plan", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert p.returncode == 1 and "trainer: CANNOT place 2 of 2" in p.stdout  # the first job holds gpu-a
        c = cli("cancel", job_id, "--backend", "nomad", env=nomad_env(fake))
        assert c.returncode == 0
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "CANCELLED"


def test_fully_placed_job_runs_and_completes(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2, placement_timeout_s=5, namespace="training")
        r = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert job_id.startswith("training/ddp-nomad-")
        nomad_id = job_id.split("/", 1)[1]
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "RUNNING"
        for g in ("trainer[0]", "trainer[1]"):
            fake.finish(nomad_id, g, exit_code=0, namespace="training")
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "COMPLETED"
        assert all(rq.headers.get("x-nomad-token") == TOKEN for rq in fake.requests)


def test_max_run_duration_is_reported_as_timeout(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        job_id = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        for g in ("trainer[0]", "trainer[1]"):
            fake.time_out(job_id, g)
        st = json.loads(cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake)).stdout)
        assert st["status"] == "TIMEOUT"


def test_dry_run_prints_the_payload_and_sends_nothing(job_file):
    with FakeNomad(token=TOKEN) as fake:
        f = job_file(nodes=2)
        r = cli("submit", str(f), "--backend", "nomad", "--dry-run", env=nomad_env(fake))
        assert r.returncode == 0
        sent = json.loads(r.stdout)
        job_id = sent["Job"]["ID"]
        assert re.fullmatch(r"ddp-nomad-\d{8}-\d{6}-[0-9a-f]{6}", job_id) and sent["Job"]["Name"] == "ddp-nomad"
        # The submission token (exactly-once register) is the only addition to the rendered job.
        assert re.fullmatch(r"[0-9a-f]{24}", sent["Job"]["Meta"].pop("halo_sched_token"))
        # Expected: the reviewed golden payload of examples/nomad-gpu.yaml with, by hand, what
        # job_file changed (no namespace, 64 GiB of memory, an 8 GiB /dev/shm) and the fresh job
        # id in the places a job id goes (the rendezvous service and the nodes' lookup of it).
        want = json.loads((GOLDEN / "nomad-gpu.nomad.json").read_text())
        job = want["Job"]
        job["ID"] = job_id
        del job["Namespace"]
        (trainer,) = job["TaskGroups"]
        trainer["Services"][0]["Name"] = f"{job_id}-rdzv"
        trainer["Tasks"][0]["Resources"]["MemoryMB"] = 65536
        trainer["Tasks"][0]["Config"]["shm_size"] = 8 * 1024**3
        lookup = trainer["Tasks"][0]["Templates"][1]
        assert '{{ with nomadService "halo-index-0.ddp-nomad-rdzv" }}' in lookup["EmbeddedTmpl"]
        lookup["EmbeddedTmpl"] = lookup["EmbeddedTmpl"].replace('.ddp-nomad-rdzv"', f'.{job_id}-rdzv"')
        # ... and the job's Variable (the node runtime's template, and the job's Meta naming it).
        job["Meta"]["halo_sched_secrets"] = f"nomad/jobs/{job_id}"
        for group in (trainer,):
            for t in group["Tasks"][0]["Templates"]:
                t["EmbeddedTmpl"] = t["EmbeddedTmpl"].replace('"nomad/jobs/ddp-nomad"', f'"nomad/jobs/{job_id}"')
        assert sent == want
        assert fake.requests == []


def test_unreachable_nomad_is_a_clear_error(job_file):
    port = free_port()  # reserved for this test; nothing listens on it
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env["NOMAD_ADDR"] = f"http://127.0.0.1:{port}"
    r = cli("status", "x", "--backend", "nomad", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"127.0.0.1:{port}" in r.stderr


def test_logs_are_tagged_with_their_node_rank(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        job_id = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        # node rank K is the allocation trainer[K]
        for g, tag in (("trainer[0]", "node-0"), ("trainer[1]", "node-1")):
            alloc = fake.alloc_for(job_id, g)["ID"]
            fake.write_log(alloc, f"hello from {tag}\nsecond line\n")
            fake.write_log(alloc, f"warning on {tag}\n", type="stderr")
        out = cli("logs", job_id, "--backend", "nomad", env=nomad_env(fake)).stdout.splitlines()
    assert out == [
        "[node 0] hello from node-0", "[node 0] second line", "[node 0] warning on node-0",
        "[node 1] hello from node-1", "[node 1] second line", "[node 1] warning on node-1",
    ]


def test_two_jobs_rank0_share_a_client_each_on_a_port_of_its_own(job_file):
    """rendezvous.port unset: each node asks for a dynamic port, so the rank 0 of two jobs can share
    a client (Nomad picks a port free there). One static port for every job (29500, the old
    default) is a reserved-port collision on that client: the second job cannot place."""
    def run_two(path, fake):
        ids = []
        for _ in range(2):
            r = cli("submit", str(path), "--backend", "nomad", env=nomad_env(fake))
            assert r.returncode == 0, r.stderr
            ids.append(r.stdout.split()[-1])
        return [json.loads(cli("status", j, "--backend", "nomad", "--json", env=nomad_env(fake)).stdout) for j in ids]

    f = job_file(nodes=1, gpus=4)
    with FakeNomad([Client("gpu-a")], token=TOKEN) as fake:
        states = run_two(f, fake)
        assert [s["status"] for s in states] == ["RUNNING", "RUNNING"], states
    data = yaml.safe_load(f.read_text())
    data["rendezvous"]["port"] = 29500
    f.write_text(yaml.safe_dump(data))
    with FakeNomad([Client("gpu-a")], token=TOKEN) as fake:
        states = run_two(f, fake)
        assert states[0]["status"] == "RUNNING" and states[1]["status"] == "PENDING", states
        assert "port" in states[1]["reason"], states[1]


def test_each_submission_is_a_new_job_with_its_own_rendezvous_service(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        first = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        second = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        assert first != second
        services = {fake.job_record(j)["TaskGroups"][0]["Services"][0]["Name"] for j in (first, second)}
        assert len(services) == 2
        # The nodes read their own job's service, never the other's.
        for j in (first, second):
            tmpl = fake.job_record(j)["TaskGroups"][0]["Tasks"][0]["Templates"][1]["EmbeddedTmpl"]
            assert f'"halo-index-0.{fake.job_record(j)["TaskGroups"][0]["Services"][0]["Name"]}"' in tmpl


def test_status_of_an_unknown_id_does_not_hide_the_others(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        job_id = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        out = cli("status", "nope", job_id, "--backend", "nomad", env=nomad_env(fake))
        # An id nobody knows is bad input (exit 2, named on stderr); the known one is still shown.
        assert out.returncode == 2 and "no job 'nope' on nomad" in out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{job_id}\tRUNNING")
        c = cli("cancel", "nope", job_id, "--backend", "nomad", env=nomad_env(fake))
        assert c.returncode == 2 and "no job 'nope'" in c.stderr and "the others were cancelled" in c.stderr
        assert fake.job_record(job_id)["Stop"] is True  # the known one was still stopped


def test_submit_wait_prints_the_job_id_even_when_watching_fails(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        fake.fail_next(50, status=500, path_contains="/allocations")
        # Nomad answering 5xx is an outage: waited through for the budget, then exit 3 (unknown).
        r = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", "--wait",
                env=nomad_env(fake, HALO_OUTAGE_S="3"), timeout=120)
        assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
        assert "outcome unknown" in r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert fake.job_record(job_id) is not None  # the job was registered: its id is on stdout


def test_id_records_the_namespace_taken_from_the_environment(job_file):
    with FakeNomad([Client("gpu-a"), Client("gpu-b")], token=TOKEN) as fake:
        r = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", env=nomad_env(fake, NOMAD_NAMESPACE="team"))
        job_id = r.stdout.split()[-1]
        assert job_id.startswith("team/ddp-nomad-"), r.stderr
        # A shell without NOMAD_NAMESPACE still reaches the job from its id alone.
        st = json.loads(cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake)).stdout)
        assert st["status"] == "RUNNING"


def test_default_docker_client_refuses_host_volumes_at_task_start(job_file):
    # plan cannot see it (Nomad's neither); the task fails at start, and submit names the setting.
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        r = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", env=nomad_env(fake))
        assert r.returncode == 0, r.stderr
        assert "volumes { enabled = true }" in r.stderr
        job_id = r.stdout.split()[-1]
        alloc = fake.alloc_for(job_id, "trainer[0]")
        assert alloc["ClientStatus"] == "failed"
        (event,) = [e for e in alloc["TaskStates"]["torchrun"]["Events"] if e["Type"] == "Driver Failure"]
        assert 'volumes are not enabled; cannot mount host path: "/scratch:/scratch"' in event["DriverError"]


def test_plan_lists_the_nvidia_runtime_and_flags_a_node_without_it(job_file):
    f = job_file(nodes=2)
    with_rt: dict = {}  # Client(): volumes enabled; FakeNode's runtimes include nvidia
    no_rt = dict(docker_runtimes=("io.containerd.runc.v2", "runc"))
    with FakeNomad([Client("gpu-a", **with_rt), Client("gpu-b", **no_rt)], token=TOKEN) as fake:
        p = cli("plan", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert p.returncode == 1, p.stdout + p.stderr
        lines = p.stdout.splitlines()
        (bad,) = [line for line in lines if "MISSING" in line]
        assert "1 of 2 nodes (gpu-b)" in bad and "Docker's nvidia runtime" in bad and "driver.docker.runtimes" in bad
        assert any(line.startswith("  ok on all 2 nodes: nomad.volumes") for line in lines), p.stdout
        assert any(line.startswith("  ok on all 2 nodes: gpus_per_node (docker): the nvidia device plugin") for line in lines)
        assert any(line.startswith("  unverifiable: gpus_per_node (docker): the runtime allowed") for line in lines)
        assert fake.requests_to("/v1/nodes", method="GET")
        # Submitted anyway, the rank on gpu-b fails at start as the docker driver says.
        r = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake))
        job_id = r.stdout.split()[-1]
        failed = [a for a in fake.allocs_of(job_id) if a["ClientStatus"] == "failed"]
        assert len(failed) == 1, failed
        errors = [e.get("DriverError", "") for ts in failed[0]["TaskStates"].values() for e in ts["Events"]]
        assert any('requested docker runtime "nvidia" was not found' in e for e in errors), errors
    with FakeNomad([Client("gpu-a", **with_rt), Client("gpu-b", **with_rt)], token=TOKEN) as fake:
        p = cli("plan", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert p.returncode == 0 and "MISSING" not in p.stdout, p.stdout + p.stderr
        assert "ok on all 2 nodes: gpus_per_node (docker): Docker's nvidia runtime" in p.stdout
        # Where the nodes cannot be listed, each need says it could not be checked; the plan stands.
        fake.fail_next(5, status=403, body="Permission denied", path_contains="/v1/nodes")
        p = cli("plan", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert p.returncode == 0, p.stdout + p.stderr
        assert "unverifiable: gpus_per_node (docker): Docker's nvidia runtime" in p.stdout
        assert "could not list the nodes" in p.stdout and "403" in p.stdout


def test_hcl_mapping_comes_from_nomads_api_struct_tags():
    # tests/hclparse/nomad_api_fields.json: api's struct tags at a named tag (extract_api_fields.py).
    assert jobspec.SOURCE["tag"] == "v2.0.5" and len(jobspec.SOURCE["commit"]) == 40
    # Whatever api's structs have is mapped, rendered by halo-sched or not ...
    doc = {"job": {"j": [{"type": "batch", "group": {"g": [{
        "count": 2, "disconnect": [{"lost_after": "1h", "stop_on_client_after": "2m", "reconcile": "best_score"}],
        "network": [{"mode": "bridge", "port": {"a": [{"static": 8080, "to": 80}], "b": [{}]}}]}]}}]}}
    (g,) = jobspec.api_job(doc)["TaskGroups"]
    assert g["Disconnect"] == {"LostAfter": 3600 * 10**9, "StopOnClientAfter": 120 * 10**9, "Reconcile": "best_score"}
    # ... ports split as jobspec2's normalizeNetworkPorts does, ID and Name from the label.
    assert g["Networks"] == [{"Mode": "bridge", "DynamicPorts": [{"Label": "b"}],
                              "ReservedPorts": [{"Label": "a", "Value": 8080, "To": 80}]}]
    assert {k: jobspec.api_job(doc)[k] for k in ("ID", "Name")} == {"ID": "j", "Name": "j"}
    # ... and what they do not have is refused.
    bogus = {"job": {"j": [{"group": {"g": [{"count": 1, "lost_after": "1h"}]}}]}}
    with pytest.raises(AssertionError, match="lost_after"):
        jobspec.api_job(bogus)
    source = os.environ.get("NOMAD_SOURCE_GIT")  # a hashicorp/nomad git dir: the data is reproducible
    if source:
        from hclparse import extract_api_fields

        assert extract_api_fields.extract(source, jobspec.SOURCE["tag"]) == json.loads(
            (REPO / "tests" / "hclparse" / "nomad_api_fields.json").read_text())
