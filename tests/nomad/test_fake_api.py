"""The fake Nomad API behaves as the Nomad source says (each test names the file it follows), so
that what halo-sched's status side concludes from it holds on a real cluster."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from helpers import load_nomad_helper

fake_api = load_nomad_helper("fake_api")
sample_job = load_nomad_helper("sample_job")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode


def register(fake, payload) -> dict:
    req = urllib.request.Request(f"{fake.address}/v1/jobs", data=json.dumps(payload).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def get(fake, path: str):
    with urllib.request.urlopen(f"{fake.address}{path}", timeout=10) as r:
        return json.loads(r.read())


def names(fake, job_id="halo-test", **where) -> list[str]:
    return sorted(a["Name"] for a in fake.allocs_of(job_id) if all(a[k] == v for k, v in where.items()))


def test_allocations_take_name_indexes_and_a_later_eval_fills_exactly_the_missing_ones():
    # scheduler/reconciler/allocs.go AllocNameIndex.Next: free indexes of 0..count-1, lowest first.
    with FakeNomad([FakeNode("a"), FakeNode("b"), FakeNode("c", busy_gpus=8)]) as fake:
        register(fake, sample_job.make_job(4))
        assert names(fake) == ["halo-test.trainer[0]", "halo-test.trainer[1]"]
        (blocked,) = [e for e in fake.evals_of("halo-test") if e["Status"] == "blocked"]
        fake.set_busy_gpus("c", 0)  # one more node: trainer[2] places, trainer[3] still waits
        assert names(fake) == ["halo-test.trainer[0]", "halo-test.trainer[1]", "halo-test.trainer[2]"]
        # nomad/blocked_evals.go via generic_sched.go ReblockEval: the same evaluation, re-blocked.
        still = [e for e in fake.evals_of("halo-test") if e["Status"] == "blocked"]
        assert [e["ID"] for e in still] == [blocked["ID"]] and still[0]["ModifyIndex"] > blocked["ModifyIndex"]
        fake.add_node(FakeNode("d"))
        assert names(fake)[-1] == "halo-test.trainer[3]"
        assert fake.evals_of("halo-test") and all(e["Status"] == "complete" for e in fake.evals_of("halo-test"))
        assert get(fake, "/v1/job/halo-test")["Status"] == "running"


def test_node_down_without_replace_false_is_lost_and_replaced_under_the_same_name():
    payload = sample_job.make_job(3)
    for g in payload["Job"]["TaskGroups"]:
        del g["Disconnect"]  # Nomad's default: TaskGroup.Replace() is true
    with FakeNomad([FakeNode("a"), FakeNode("b"), FakeNode("c"), FakeNode("spare")]) as fake:
        register(fake, payload)
        victim = fake.alloc_for("halo-test", "trainer[2]")
        fake.node_down(victim["NodeName"])
        lost = next(a for a in fake.allocs_of("halo-test") if a["ID"] == victim["ID"])
        assert (lost["ClientStatus"], lost["DesiredStatus"]) == ("lost", "stop")
        assert lost["ClientDescription"] == "alloc is lost since its node is down"
        # reconcile_cluster.go "Add replacements for lost allocs": same Name, despite reschedule attempts 0.
        assert names(fake, DesiredStatus="run").count("halo-test.trainer[2]") == 1
        assert fake.alloc_for("halo-test", "trainer[2]")["NodeName"] == "spare"


def test_node_down_with_replace_false_reads_unknown_and_is_not_replaced():
    with FakeNomad([FakeNode("a"), FakeNode("b"), FakeNode("spare")]) as fake:
        register(fake, sample_job.make_job(2))
        victim = fake.alloc_for("halo-test", "trainer[1]")
        fake.node_down(victim["NodeName"])
        after = fake.alloc_for("halo-test", "trainer[1]")
        # filters.go: running on a down node with replace = false -> "disconnecting" -> unknown.
        assert after["ID"] == victim["ID"] and after["ClientStatus"] == "unknown"
        assert after["ClientDescription"] == "alloc is unknown since its node is disconnected"
        assert len(fake.allocs_of("halo-test")) == 2
        assert get(fake, "/v1/job/halo-test")["Status"] == "running"  # unknown is not terminal


def test_docker_plugin_refuses_host_ipc_mode_and_volumes_at_task_start():
    ipc = sample_job.make_job(2, driver="docker")
    ipc["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["ipc_mode"] = "host"
    volumes = sample_job.make_job(2, driver="docker")
    volumes["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["volumes"] = ["/data:/data", "local/x:/x"]
    for payload, why in ((ipc, 'cannot apply "ipc_mode" configuration'),
                         (volumes, 'volumes are not enabled; cannot mount host path: "/data:/data"')):
        with FakeNomad([FakeNode("a"), FakeNode("b")]) as fake:
            register(fake, payload)
            for name in ("trainer[0]", "trainer[1]"):
                alloc = fake.alloc_for("halo-test", name)
                assert alloc["ClientStatus"] == "failed"
                (ev,) = [e for e in alloc["TaskStates"]["torchrun"]["Events"] if e["Type"] == "Driver Failure"]
                assert ev["DriverError"].startswith('Failed to create container configuration for image "halo/train:latest"')
                assert ev["DriverError"].endswith(why)
    allowed = [FakeNode(n, docker_allowed_modes={"ipc": ["host"]}, docker_volumes_enabled=True) for n in "ab"]
    for payload in (ipc, volumes):
        with FakeNomad(allowed) as fake:
            register(fake, payload)
            assert {a["ClientStatus"] for a in fake.allocs_of("halo-test")} == {"running"}


def test_a_stopped_job_reads_running_until_the_stop_is_applied_then_dead_while_tasks_die():
    # nomad/state/state_store.go getJobStatus with Allocation.TerminalStatus (server side counts).
    with FakeNomad([FakeNode("a"), FakeNode("b")]) as fake:
        register(fake, sample_job.make_job(2))
        fake.defer_evals = fake.hold_kills = True
        req = urllib.request.Request(f"{fake.address}/v1/job/halo-test", method="DELETE")
        urllib.request.urlopen(req, timeout=10).read()
        job = get(fake, "/v1/job/halo-test")
        assert job["Stop"] is True and job["Status"] == "running"
        fake.process_evals()
        assert get(fake, "/v1/job/halo-test")["Status"] == "dead"
        assert {(a["DesiredStatus"], a["ClientStatus"]) for a in fake.allocs_of("halo-test")} == {("stop", "running")}
        fake.complete_kills()
        assert {a["ClientStatus"] for a in fake.allocs_of("halo-test")} == {"complete"}


def test_max_run_duration_is_timed_from_allocation_creation_even_when_pending():
    # client/allocrunner/max_run_duration_hook.go: deadline = CreateTime + max_run_duration.
    with FakeNomad([FakeNode("a"), FakeNode("b")], auto_run=False) as fake:
        register(fake, sample_job.make_job(2, max_run_duration_s=1))
        assert {a["ClientStatus"] for a in fake.allocs_of("halo-test")} == {"pending"}
        get(fake, "/v1/job/halo-test")
        assert {a["ClientStatus"] for a in fake.allocs_of("halo-test")} == {"pending"}  # not yet
        time.sleep(1.1)
        get(fake, "/v1/job/halo-test")  # any request enforces expiries up to now
        allocs = fake.allocs_of("halo-test")
        assert {(a["ClientStatus"], a["ClientDescription"]) for a in allocs} == {
            ("complete", "allocation exceeded max_run_duration")}
        assert get(fake, "/v1/job/halo-test")["Status"] == "dead"


# ---- a lost node, by version: Nomad 2.0.5 (PR #27053, also 1.11.2) and 1.11.1 (before it) ----

def _rendered(nodes: int = 3, max_run_duration: str | None = "2h") -> dict:
    from pathlib import Path

    import halo_sched
    from halo_sched.backends.nomad.render import job_payload

    spec = halo_sched.load(Path(__file__).resolve().parents[2] / "examples" / "nomad-gpu.yaml")
    spec = spec.model_copy(update={"nodes": nodes, "nomad": spec.nomad.model_copy(
        update={"max_run_duration": max_run_duration, "namespace": None, "volumes": []})})
    return job_payload(spec, "halo-test")


def _cluster(version: str, **kw) -> "FakeNomad":
    return FakeNomad([FakeNode(n) for n in ("a", "b", "c", "spare")], nomad_version=version, **kw)


def test_rendered_job_on_2_0_5_keeps_a_lost_rank_unknown_until_lost_after_then_replaces_it():
    payload = _rendered(3, "2h")
    lost_after_s = 3 * 3600  # max_run_duration + the hour (asserted at the end)
    with _cluster("2.0.5") as fake:
        register(fake, payload)
        victim = fake.alloc_for("halo-test", "trainer[2]")
        fake.node_down(victim["NodeName"])
        # heartbeat.go:158-173, 207-224: a running allocation with lost_after -> "disconnected".
        assert next(n for n in fake.nodes if n.name == victim["NodeName"]).status == "disconnected"
        fake.advance(lost_after_s - 60)  # the job's whole life (max_run_duration) and then some
        now = fake.alloc_for("halo-test", "trainer[2]")
        assert now["ID"] == victim["ID"] and now["ClientStatus"] == "unknown"
        assert names(fake).count("halo-test.trainer[2]") == 1
        # filters.go:188-193 + reconcile_cluster.go:438-440, 856-875: expired -> lost -> replaced.
        fake.advance(120)
        assert next(a for a in fake.allocs_of("halo-test") if a["ID"] == victim["ID"])["ClientStatus"] == "lost"
        replacement = fake.alloc_for("halo-test", "trainer[2]")
        assert replacement["ID"] != victim["ID"] and replacement["NodeName"] != victim["NodeName"]
        # ... only after every other rank's max_run_duration had ended it: no world to join.
        others = [a for a in fake.allocs_of("halo-test") if a["ID"] not in (victim["ID"], replacement["ID"])]
        assert {(a["ClientStatus"], a["ClientDescription"]) for a in others} == {
            ("complete", "allocation exceeded max_run_duration")}
    assert {g["Disconnect"]["LostAfter"] for g in payload["Job"]["TaskGroups"]} == {lost_after_s * 10**9}


def test_replace_false_alone_is_replaced_at_once_on_2_0_5_and_kept_on_1_11_1():
    payload = _rendered(3)
    for g in payload["Job"]["TaskGroups"]:
        del g["Disconnect"]["LostAfter"]  # what halo-sched rendered before: replace = false only
    with _cluster("2.0.5") as fake:
        register(fake, payload)
        victim = fake.alloc_for("halo-test", "trainer[2]")
        fake.node_down(victim["NodeName"])
        assert next(n for n in fake.nodes if n.name == victim["NodeName"]).status == "down"
        # unknown, follow-up evaluation now, Expired() before replace = false: lost and replaced.
        assert next(a for a in fake.allocs_of("halo-test") if a["ID"] == victim["ID"])["ClientStatus"] == "lost"
        assert fake.alloc_for("halo-test", "trainer[2]")["NodeName"] == "spare"
    with _cluster("1.11.1") as fake:
        register(fake, payload)
        victim = fake.alloc_for("halo-test", "trainer[2]")
        fake.node_down(victim["NodeName"])
        fake.advance(30 * 86400)
        assert fake.alloc_for("halo-test", "trainer[2]")["ID"] == victim["ID"]
        assert fake.alloc_for("halo-test", "trainer[2]")["ClientStatus"] == "unknown"


def test_rendered_job_on_1_11_1_keeps_a_lost_rank_unknown_past_lost_after():
    payload = _rendered(3, None)
    with _cluster("1.11.1") as fake:
        register(fake, payload)
        victim = fake.alloc_for("halo-test", "trainer[1]")
        fake.node_down(victim["NodeName"])
        fake.advance(200 * 3600)  # past the 169 h lost_after: v1.11.1 reconcile_cluster.go:441-447
        assert fake.alloc_for("halo-test", "trainer[1]")["ID"] == victim["ID"]
        assert fake.alloc_for("halo-test", "trainer[1]")["ClientStatus"] == "unknown"
        assert len(fake.allocs_of("halo-test")) == 3


def test_a_pending_allocation_on_a_lost_node_is_replaced_at_once_with_or_without_lost_after():
    # filters.go:214-221 (disconnected node) and :286-291 (down node), v2.0.5.
    for version in ("2.0.5", "1.11.1"):
        with _cluster(version, auto_run=False) as fake:
            register(fake, _rendered(2))
            victim = fake.alloc_for("halo-test", "trainer[1]")
            fake.node_down(victim["NodeName"])
            assert next(a for a in fake.allocs_of("halo-test") if a["ID"] == victim["ID"])["ClientStatus"] == "lost"
            assert fake.alloc_for("halo-test", "trainer[1]")["ID"] != victim["ID"]


def _send(fake, method: str, path: str, body=None) -> tuple[int, object]:
    req = urllib.request.Request(f"{fake.address}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, text.decode()


def test_a_variable_check_and_set_writes_only_over_the_index_it_read():
    """command/agent/variable_endpoint.go parseCAS and nomad/state/state_store_variables.go
    varSetCASTxn (v2.0.5): ``cas=0`` creates only; ``cas=N`` writes only over ModifyIndex N; a
    conflict is 409 with the Variable as it is (a zero one for none); a bad index is 400."""
    with FakeNomad() as fake:
        path = "/v1/var/nomad/jobs/j/trainer"
        status, made = _send(fake, "PUT", path + "?cas=0", {"Items": {"generation": "1"}})
        assert status == 200 and made["ModifyIndex"] > 0
        status, conflict = _send(fake, "PUT", path + "?cas=0", {"Items": {"generation": "2"}})
        assert status == 409 and conflict["ModifyIndex"] == made["ModifyIndex"] and conflict["Items"] == {"generation": "1"}
        status, _ = _send(fake, "PUT", path + f"?cas={made['ModifyIndex'] + 99}", {"Items": {"generation": "2"}})
        assert status == 409
        status, again = _send(fake, "PUT", path + f"?cas={made['ModifyIndex']}", {"Items": {"generation": "2"}})
        assert status == 200 and again["ModifyIndex"] > made["ModifyIndex"]
        status, zero = _send(fake, "PUT", "/v1/var/nomad/jobs/j/other?cas=5", {"Items": {"a": "b"}})
        assert status == 409 and zero["ModifyIndex"] == 0 and "Items" not in zero
        assert _send(fake, "PUT", path + "?cas=x", {"Items": {"a": "b"}})[0] == 400
        assert fake.variables[("default", "nomad/jobs/j/trainer")]["Items"] == {"generation": "2"}


def test_a_jobs_versions_are_kept_stops_included_newest_first():
    """command/agent/job_endpoint.go jobVersions -> state_store.go jobVersionByID (v2.0.5): every
    version the servers keep, highest first; a stop is a version of its own (nomad/fsm.go
    handleJobDeregister); ``GET /v1/allocation/:id`` is the whole allocation."""
    with FakeNomad([FakeNode("a"), FakeNode("b")]) as fake:
        register(fake, sample_job.make_job(2))
        alloc = fake.allocs_of("halo-test")[0]
        assert get(fake, f"/v1/allocation/{alloc['ID']}")["JobVersion"] == 0
        assert _send(fake, "DELETE", "/v1/job/halo-test")[0] == 200
        versions = get(fake, "/v1/job/halo-test/versions")["Versions"]
        assert [(v["Version"], v["Stop"]) for v in versions] == [(1, True), (0, False)]
        assert _send(fake, "GET", "/v1/allocation/nope")[0] == 404
