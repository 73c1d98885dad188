"""The Nomad backend through the CLI, against the fake Nomad API; and the HCL against the JSON.

No Nomad binary can run here. What these prove: the HCL parses (python-hcl2) and says what the
API payload says; submit/plan/status/cancel/--wait speak the Nomad API correctly (as the fake
models it); the placement watchdog stops a half-placed job within its timeout.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest
import yaml

import halo_sched
from halo_sched.backends.nomad.render import job_payload, render_hcl
from helpers import REPO, cli, hcl_load, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-123"


def _unwrap(blocks):
    """python-hcl2 gives each block as a list of one-key dicts ({"label": body}) or bodies."""
    return blocks[0] if isinstance(blocks, list) and len(blocks) == 1 else blocks


def hcl_job(spec) -> dict:
    (jid, body), = hcl_load(render_hcl(spec))["job"][0].items()
    return {"id": jid, **body}


@pytest.mark.parametrize("example", ["nomad-gpu.yaml", "ddp-cpu.yaml"])
def test_hcl_matches_json_payload(example):
    spec = halo_sched.load(REPO / "examples" / example)
    if example == "ddp-cpu.yaml":
        spec = spec.model_copy(update={"nodes": 3, "nomad": spec.nomad.model_copy(update={"driver": "raw_exec", "max_run_duration": "1h"})})
    job = job_payload(spec)["Job"]
    h = hcl_job(spec)
    assert h["id"] == job["ID"]
    assert h["type"] == job["Type"]
    assert h["datacenters"] == job["Datacenters"]
    assert h.get("namespace") == job.get("Namespace")
    assert [(c["operator"], c["value"]) for c in h["constraint"]] == [(c["Operand"], c["RTarget"]) for c in job["Constraints"]]
    assert _unwrap(h["meta"]) == job["Meta"]
    groups = {name: body for g in h["group"] for name, body in g.items()}
    assert list(groups) == [g["Name"] for g in job["TaskGroups"]]
    for jg in job["TaskGroups"]:
        hg = groups[jg["Name"]]
        assert hg["count"] == jg["Count"] == 1
        r, rs = _unwrap(hg["restart"]), _unwrap(hg["reschedule"])
        assert (r["attempts"], r["mode"]) == (jg["RestartPolicy"]["Attempts"], jg["RestartPolicy"]["Mode"]) == (0, "fail")
        assert (rs["attempts"], rs["unlimited"]) == (jg["ReschedulePolicy"]["Attempts"], jg["ReschedulePolicy"]["Unlimited"]) == (0, False)
        if "MaxRunDuration" in jg:
            from halo_sched.spec import parse_go_duration

            assert parse_go_duration(hg["max_run_duration"]) == jg["MaxRunDuration"]
        net = _unwrap(hg["network"])
        assert net["mode"] == jg["Networks"][0]["Mode"]
        reserved = [(label, p["static"]) for port in net.get("port", []) for label, p in port.items()]
        assert reserved == [(p["Label"], p["Value"]) for p in jg["Networks"][0].get("ReservedPorts", [])]
        services = hg.get("service", [])
        assert [(s["name"], s["provider"], s["port"]) for s in services] == [
            (s["Name"], s["Provider"], s["PortLabel"]) for s in jg.get("Services", [])]
        (tname, task), = _unwrap(hg["task"]).items()
        jt = jg["Tasks"][0]
        assert tname == jt["Name"] and task["driver"] == jt["Driver"]
        assert _unwrap(task["env"]) == jt["Env"]
        cfg = _unwrap(task["config"])
        assert cfg["command"] == jt["Config"]["command"]
        assert cfg["args"] == jt["Config"]["args"]
        templates = task["template"]
        assert len(templates) == len(jt["Templates"])
        for ht, jtpl in zip(templates, jt["Templates"]):
            assert ht["destination"] == jtpl["DestPath"] and ht["change_mode"] == jtpl["ChangeMode"]
            assert ht.get("left_delimiter") == jtpl.get("LeftDelim")
            assert ht["data"] == jtpl["EmbeddedTmpl"]
        res = _unwrap(task["resources"])
        assert (res["cpu"], res["memory"]) == (jt["Resources"]["CPU"], jt["Resources"]["MemoryMB"])
        devices = [(n, d["count"]) for dev in res.get("device", []) for n, d in dev.items()]
        assert devices == [(d["Name"], d["Count"]) for d in jt["Resources"].get("Devices", [])]


def test_leader_and_worker_shape():
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml").model_copy(update={"nodes": 4})
    job = job_payload(spec)["Job"]
    assert [g["Name"] for g in job["TaskGroups"]] == ["node-0", "node-1", "node-2", "node-3"]
    leader, *workers = job["TaskGroups"]
    assert leader["Services"][0]["Provider"] == "nomad"
    assert leader["Networks"][0]["ReservedPorts"] == [{"Label": "rdzv", "Value": 29500}]
    assert leader["Tasks"][0]["Env"] == {"HALO_NODE_RANK": "0", "HALO_MASTER_ADDR": "${NOMAD_IP_rdzv}"}
    for rank, g in enumerate(workers, start=1):
        t = g["Tasks"][0]
        assert "Services" not in g
        assert t["Env"]["HALO_NODE_RANK"] == str(rank)
        master = t["Templates"][1]["EmbeddedTmpl"]
        assert 'nomadService "ddp-nomad-rdzv"' in master and "index . 0" in master
    t = leader["Tasks"][0]
    assert t["Config"]["shm_size"] == 64 * 1024**3 and t["Config"]["network_mode"] == "host"
    assert t["Resources"]["Devices"] == [{"Name": "nvidia/gpu", "Count": 8}]
    assert t["Config"]["devices"] == [{"host_path": "/dev/infiniband", "container_path": "/dev/infiniband"}]


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
    # Two GPU clients, but one is fully busy: node-1 cannot place (no gang scheduling).
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b", busy_gpus=8)], token=TOKEN) as fake:
        f = job_file(nodes=2, placement_timeout_s=3)
        t0 = time.monotonic()
        r = cli("submit", str(f), "--backend", "nomad", "--wait", env=nomad_env(fake))
        elapsed = time.monotonic() - t0
        assert r.returncode == 1, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"ddp-nomad-\d{8}-\d{6}-[0-9a-f]{6}", job_id)
        assert "1 of 2" in r.stderr or "1/2" in r.stderr, r.stderr
        assert "node-1" in r.stderr
        assert elapsed < 3 + 5  # the timeout plus CLI start-up and a few HTTP calls
        assert fake.job_record(job_id)["Stop"] is True
        # Every request carried the token.
        assert fake.requests and all(rq.headers.get("x-nomad-token") == TOKEN for rq in fake.requests)


def test_status_partial_then_plan_explains(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b", busy_gpus=8)], token=TOKEN) as fake:
        f = job_file(nodes=2)
        r = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        state = json.loads(st.stdout)
        assert state["status"] == "PARTIAL" and state["nodes_running"] == 1 and state["nodes_total"] == 2
        assert "node-1" in state["reason"]
        p = cli("plan", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert p.returncode == 1 and "node-1" in p.stdout
        c = cli("cancel", job_id, "--backend", "nomad", env=nomad_env(fake))
        assert c.returncode == 0
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "CANCELLED"


def test_fully_placed_job_runs_and_completes(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2, placement_timeout_s=5, namespace="training")
        r = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake))
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert job_id.startswith("training/ddp-nomad-")
        nomad_id = job_id.split("/", 1)[1]
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "RUNNING"
        for g in ("node-0", "node-1"):
            fake.finish(nomad_id, g, exit_code=0, namespace="training")
        st = cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake))
        assert json.loads(st.stdout)["status"] == "COMPLETED"
        assert all(rq.headers.get("x-nomad-token") == TOKEN for rq in fake.requests)


def test_max_run_duration_is_reported_as_timeout(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        job_id = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        for g in ("node-0", "node-1"):
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
        assert job_id.startswith("ddp-nomad-") and sent["Job"]["Name"] == "ddp-nomad"
        assert sent == job_payload(halo_sched.load(f), job_id)
        assert fake.requests == []


def test_unreachable_nomad_is_a_clear_error(job_file):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env["NOMAD_ADDR"] = f"http://127.0.0.1:{port}"
    r = cli("status", "x", "--backend", "nomad", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"127.0.0.1:{port}" in r.stderr


def test_logs_are_tagged_with_their_node_group(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        job_id = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        for g in ("node-0", "node-1"):
            alloc = fake.alloc_for(job_id, g)["ID"]
            fake.write_log(alloc, f"hello from {g}\nsecond line\n")
            fake.write_log(alloc, f"warning on {g}\n", type="stderr")
        out = cli("logs", job_id, "--backend", "nomad", env=nomad_env(fake)).stdout.splitlines()
    assert out == [
        "[node-0] hello from node-0", "[node-0] second line", "[node-0] warning on node-0",
        "[node-1] hello from node-1", "[node-1] second line", "[node-1] warning on node-1",
    ]


def test_each_submission_is_a_new_job_with_its_own_rendezvous_service(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        f = job_file(nodes=2)
        first = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        second = cli("submit", str(f), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        assert first != second
        services = {fake.job_record(j)["TaskGroups"][0]["Services"][0]["Name"] for j in (first, second)}
        assert len(services) == 2
        # The workers read their own job's service, never the other's.
        for j in (first, second):
            tmpl = fake.job_record(j)["TaskGroups"][1]["Tasks"][0]["Templates"][1]["EmbeddedTmpl"]
            assert fake.job_record(j)["TaskGroups"][0]["Services"][0]["Name"] in tmpl


def test_status_of_an_unknown_id_does_not_hide_the_others(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        job_id = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", env=nomad_env(fake)).stdout.split()[-1]
        out = cli("status", "nope", job_id, "--backend", "nomad", env=nomad_env(fake))
        assert out.returncode == 0
        lines = out.stdout.splitlines()
        assert lines[0].startswith("nope\tUNKNOWN") and lines[1].startswith(f"{job_id}\tRUNNING")
        c = cli("cancel", "nope", job_id, "--backend", "nomad", env=nomad_env(fake))
        assert c.returncode == 1 and "nope" in c.stderr
        assert fake.job_record(job_id)["Stop"] is True  # the known one was still stopped


def test_submit_wait_prints_the_job_id_even_when_watching_fails(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        fake.fail_next(50, status=500, path_contains="/allocations")
        r = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", "--wait", env=nomad_env(fake))
        assert r.returncode == 1 and "Traceback" not in r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        assert fake.job_record(job_id) is not None  # the job was registered: its id is on stdout


def test_id_records_the_namespace_taken_from_the_environment(job_file):
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        r = cli("submit", str(job_file(nodes=2)), "--backend", "nomad", env=nomad_env(fake, NOMAD_NAMESPACE="team"))
        job_id = r.stdout.split()[-1]
        assert job_id.startswith("team/ddp-nomad-"), r.stderr
        # A shell without NOMAD_NAMESPACE still reaches the job from its id alone.
        st = json.loads(cli("status", job_id, "--backend", "nomad", "--json", env=nomad_env(fake)).stdout)
        assert st["status"] == "RUNNING"
