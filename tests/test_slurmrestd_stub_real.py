"""The stand-in slurmrestd (tests/slurmrestd_stub) against what real servers answered.

tests/fixtures/slurmrestd/<release>/ holds a real slurmrestd's answers (written by its
record.py against the test cluster of that release: 24.11.5 built from Debian's slurm-wlm source
package, tests/cluster/slurm-cluster.sh with HALO_SLURM_VERSION=24.11). Each recorded request is
replayed against the stand-in of the same release and version; the status code, the errors and
the per-job DELETE outcomes must be the real server's, and what the stand-in puts in an answer
must be fields the real one has. The transport reads the real partition answers too."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from halo_sched.backends.slurm.transport.rest import rest_node_record, rest_partition_record
from slurmrestd_stub import MODELLED, RECORDED, RELEASES, Slurmrestd

CASES = sorted((rel.name, v.name) for rel in RECORDED.iterdir() if rel.is_dir() and rel.name in RELEASES
               for v in rel.iterdir() if v.is_dir() and v.name in MODELLED)


def real(release: str, version: str, name: str) -> dict:
    return json.loads((RECORDED / release / version / f"{name}.json").read_text())


def ask(stub: Slurmrestd, method: str, path: str, body=None) -> tuple[int, object]:
    url = urlsplit(stub.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": stub.token}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw.decode()


def errors(doc) -> list:
    return [(e.get("error_number"), e.get("error"), e.get("source")) for e in doc.get("errors") or []]


def outcomes(doc, job_id) -> list | None:
    """DELETE's per-job "status" with the job id made comparable."""
    if "status" not in doc:
        return None
    text = json.dumps(doc["status"], sort_keys=True)
    return json.loads(text.replace(f'"{job_id}"', '"<id>"').replace(f'"number": {job_id}', '"number": "<id>"'))


def test_cases_were_recorded():
    assert ("24.11", "v0.0.42") in CASES, CASES


@pytest.mark.parametrize("release", sorted({r for r, _ in CASES}))
def test_the_stand_in_serves_the_versions_the_real_release_serves(release):
    paths = json.loads((RECORDED / release / "openapi_v3_paths.json").read_text())["paths"]
    offered = {p.split("/")[2] for p in paths if p.startswith("/slurm/")}
    assert set(RELEASES[release][1]) == offered


@pytest.mark.parametrize("release,version", CASES)
def test_unknown_job_is_answered_as_the_real_server_does(release, version):
    with Slurmrestd(release) as stub:
        for name in ("job_unknown_get", "job_unknown_delete"):
            want = real(release, version, name)
            code, doc = ask(stub, want["request"]["method"], want["request"]["path"])
            assert code == want["status"], (name, doc)
            assert errors(doc) == errors(want["body"]), name
            assert outcomes(doc, 999999) == outcomes(want["body"], 999999), name


@pytest.mark.parametrize("release,version", CASES)
def test_submit_get_and_delete_of_a_held_job_as_the_real_server(release, version):
    with Slurmrestd(release) as stub:
        submitted = real(release, version, "job_submit_held")
        code, doc = ask(stub, "POST", submitted["request"]["path"], submitted["request"]["body"])
        assert code == submitted["status"] and errors(doc) == errors(submitted["body"])
        job_id = doc["job_id"]
        # Fields of the submit answer: the same (the deprecated "result" only where it is).
        assert set(doc) == set(submitted["body"])
        got = real(release, version, "job_held_get")
        code, doc = ask(stub, "GET", got["request"]["path"].replace(str(got["job_id"]), str(job_id)))
        assert code == got["status"]
        stub_job, real_job = doc["jobs"][0], got["body"]["jobs"][0]
        assert set(stub_job) <= set(real_job), set(stub_job) - set(real_job)
        assert type(stub_job["exit_code"]) is type(real_job["exit_code"])
        assert type(stub_job["job_state"]) is type(real_job["job_state"])
        for name in ("job_held_delete", "job_ended_delete"):
            want = real(release, version, name)
            code, doc = ask(stub, "DELETE", want["request"]["path"].replace(str(want["job_id"]), str(job_id)))
            assert code == want["status"], name
            assert errors(doc) == errors(want["body"]), name
            assert outcomes(doc, job_id) == outcomes(want["body"], want["job_id"]), name


@pytest.mark.parametrize("release,version", CASES)
def test_partitions_and_nodes_read_as_scontrol_shows_them(release, version):
    """v0.0.40-44's partitions carry no flags (so no default marker; v0.0.45 has them again:
    26.05.3 answers ["DEFAULT"]) and answer an unset MaxMemPerNode as {set: true, number: 0}: read
    as UNLIMITED, as scontrol prints it, not as 0 MiB."""
    (part,) = real(release, version, "partitions")["body"]["partitions"]
    record = rest_partition_record(part)
    default = "YES" if version >= "v0.0.45" else "NO"
    assert record == {"PartitionName": "debug", "Default": default, "MaxNodes": "UNLIMITED", "TotalNodes": "3",
                      "MaxTime": "UNLIMITED", "MaxCPUsPerNode": "UNLIMITED", "MaxMemPerNode": "UNLIMITED"}
    nodes = [rest_node_record(n) for n in real(release, version, "nodes")["body"]["nodes"]]
    assert nodes[0] == {"NodeName": "node1", "CPUTot": "2", "RealMemory": "2048", "Partitions": "debug"}
    with Slurmrestd(release) as stub:
        code, doc = ask(stub, "GET", f"/slurm/{version}/partitions/")
        assert code == 200 and doc["partitions"] == [part]


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.42"])
def test_a_real_max_mem_per_node_is_read(version):
    """24.11.5 after `scontrol update PartitionName=debug MaxMemPerNode=1024`: the limit is in
    maximums.partition_memory_per_node (the old reader looked for maximums.memory_per_node, which
    no version has, and checked nothing); slurm.mem 1500M is then refused as the cli transport
    refuses it."""
    from halo_sched.backends.slurm.reasons import limit_problems, partition_limits

    part = json.loads((RECORDED / "24.11" / version / "partition_maxmem1024.json").read_text())["partition"]
    record = rest_partition_record(part)
    assert record["MaxMemPerNode"] == "1024"
    nodes = [rest_node_record(n) for n in real("24.11", version, "nodes")["body"]["nodes"]]
    problems = limit_problems(partition_limits(record, nodes), nodes=1, time_s=None, time_text=None,
                              cpus_per_task=1, mem_mb=1500, cpus_field="slurm.cpus_per_task", nodes_field="nodes")
    assert [f for f, _ in problems] == ["slurm.mem"], problems


def test_v45_names_the_default_partition_itself(monkeypatch):
    """26.05.3 at v0.0.45 dumps PARTITION_FLAGS again (parsers.c slurm-26-05-3-1; recorded:
    ["DEFAULT"]): the partition check gets the default from slurmrestd, without this host's
    sinfo. At v0.0.44 (no flags) the default comes only from sinfo."""
    from halo_sched.backends.slurm.transport import RestTransport, rest

    asked = []
    monkeypatch.setattr(rest, "sinfo_default_partition", lambda names, **k: asked.append(names))
    with Slurmrestd("26.05") as stub:
        for version, default in (("v0.0.45", "YES"), ("v0.0.44", "NO")):
            records, nodes = RestTransport(url=stub.url, token=stub.token, api_version=version,
                                           retries=1).partitions()
            assert [(r["PartitionName"], r["Default"]) for r in records] == [("debug", default)]
            assert len(nodes) == 3
    assert asked == [{"debug"}]  # v0.0.44 only
