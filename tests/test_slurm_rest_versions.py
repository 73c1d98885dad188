"""The rest transport against slurmrestd v0.0.40-v0.0.45 (Slurm 23.11-26.05) as
tests/slurmrestd_stub has them: it follows those releases' data_parser and slurmctld plugin
sources (each shape there names its file and tag); the real 24.11 and 26.05 are in
tests/test_slurm_transport_cluster.py. The jobs are the examples/*.yaml rendered by
halo-sched's own renderer. v0.0.38 is tested against the real slurmrestd 22.05 in
tests/test_slurm_transport_cluster.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from halo_sched.backends.base import JobStatus
from halo_sched.backends.slurm.render import batch_request
from halo_sched.backends.slurm.request import SbatchRequest
from helpers import request_of
from halo_sched.backends.slurm.transport import RestTransport, rest_job_properties
from halo_sched.errors import SchedulerError, UsageError
from halo_sched.launch import compile_launch
from halo_sched.spec import load, loads
from slurmrestd_stub import MODELLED, RELEASES, Slurmrestd

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ("ddp-cpu", "ddp-gpu", "rl-servers")
# Every (release, version) pair the stand-in models.
PAIRS = [(r, v) for r, (_, vs) in RELEASES.items() for v in vs if v in MODELLED]
NEWEST = {"23.11": "v0.0.40", "24.05": "v0.0.41", "24.11": "v0.0.42", "25.05": "v0.0.43", "25.11": "v0.0.44",
          "26.05": "v0.0.45"}
SUBMITTER_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "SLURM_JWT": "jwt-of-the-submitter",
                 "NOMAD_TOKEN": "nomad-token", "AWS_SECRET_ACCESS_KEY": "aws-secret", "HF_TOKEN": "hf-token",
                 "OMP_PROC_BIND": "close"}


def rendered(name: str) -> SbatchRequest:
    return request(load(REPO / "examples" / f"{name}.yaml"))


def request(spec) -> SbatchRequest:
    return batch_request(compile_launch(spec))


def transport(stub: Slurmrestd, version: str | None = None, env=None) -> RestTransport:
    return RestTransport(url=stub.url, token="t", user="alice", api_version=version, retries=1,
                         environment=SUBMITTER_ENV if env is None else env)


def posted(stub: Slurmrestd) -> dict:
    [(_, _, body)] = [r for r in stub.requests if r[0] == "POST"]
    return body


@pytest.mark.parametrize("release", sorted(NEWEST))
def test_picks_the_newest_version_both_sides_speak(release, monkeypatch):
    monkeypatch.delenv("HALO_SLURMRESTD_API", raising=False)
    with Slurmrestd(release) as stub:
        t = transport(stub)
        t.query(["1"])
        assert t.api_version == NEWEST[release]
        assert [p for _, p, _ in stub.requests] == ["/openapi/v3", f"/slurm/{NEWEST[release]}/jobs/"]


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("release,version", PAIRS)
def test_rendered_examples_are_accepted_as_rendered(release, version, example):
    req = rendered(example)
    text = req.script
    with Slurmrestd(release) as stub:
        job_id = transport(stub, version).submit(req)
        job = stub.jobs[int(job_id)]
        body = posted(stub)
    minor = int(version.rsplit(".", 1)[1])
    # The script: top-level up to v0.0.40, job.script from v0.0.41 (top-level deprecated).
    assert (body.get("script"), body["job"].get("script")) == ((text, None) if minor == 40 else (None, text))
    assert job.script == text
    d = job.desc
    assert d["name"] == load(REPO / "examples" / f"{example}.yaml").name
    assert d["tasks_per_node"] == 1 and d["open_mode"] == ["APPEND"]
    assert d["standard_output"] == "halo-%x-%j.out" and d["current_working_directory"] == os.getcwd()
    if example == "ddp-gpu":
        assert d["nodes"] == "2" and d["partition"] == "gpu" and d["account"] == "ml-research"
        assert d["time_limit"] == {"set": True, "infinite": False, "number": 240}  # "04:00:00"
        assert d["cpus_per_task"] == 64 and d["tres_per_node"] == "gres/gpu:8"
        assert d["shared"] == ["none"] and "exclusive" not in d  # --exclusive
        assert d["requeue"] is False  # --no-requeue
        # --signal=B:USR2@120: the batch script alone.
        assert d["kill_warning_signal"] == 12 and d["kill_warning_flags"] == ["BATCH_JOB"]
        assert d["kill_warning_delay"] == {"set": True, "infinite": False, "number": 120}
    if example == "rl-servers":
        assert d["nodes"] == "3" and d["tres_per_node"] == "gres/gpu:8"


@pytest.mark.parametrize("release,version", PAIRS)
def test_submit_body_has_no_field_the_version_ignores(release, version):
    """A v0.0.40+ slurmrestd ignores a field it does not know, with a warning (parsing.c): none
    of halo-sched's may be one."""
    from slurmrestd_stub import JOB_FIELDS

    req = rendered("ddp-gpu")
    job = rest_job_properties(req.with_options(*["--mail-type=END,FAIL", "--comment=c", "--constraint=a100",
                                                 "--kill-on-invalid-dep=yes", "--mem=16G", "--cores-per-socket=8"]
                                               if version == "v0.0.40" else ["--mail-type=END,FAIL", "--mem=16G"]),
                              environment={}, api_version=version)
    assert set(job) <= JOB_FIELDS[version], set(job) - JOB_FIELDS[version]
    assert job["memory_per_node"] == 16384
    with Slurmrestd(release) as stub:
        transport(stub, version).submit(req.with_options("--mail-type=END,FAIL", "--mem=16G"))
        assert stub.jobs[100].desc["mail_type"] == ["END", "FAIL"]


@pytest.mark.parametrize("release,version", [("24.11", "v0.0.42"), ("25.05", "v0.0.43"), ("26.05", "v0.0.44"),
                                             ("26.05", "v0.0.45")])
def test_a_top_level_script_draws_no_warning(release, version):
    """JOB_SUBMIT_REQ's top-level "script" is deprecated only at v0.0.41/42 of 24.05/24.11, where
    parsing.c does not warn yet, and a plain field again from 25.05 (parsers.c, slurm-24-11-7-1,
    slurm-25-05-8-1, slurm-26-05-3-1); the real 26.05.3 took one at v0.0.44 and v0.0.45 without a
    warning. (The transport puts the script in job.script from v0.0.41.)"""
    with Slurmrestd(release) as stub:
        doc = transport(stub, version)._request("POST", f"/slurm/{version}/job/submit", {
            "script": "#!/bin/bash\ntrue\n", "job": {"environment": ["PATH=/bin"], "current_working_directory": "/"}})
    assert doc["job_id"] == 100 and doc["warnings"] == [], doc["warnings"]


@pytest.mark.parametrize("release,version", [("24.11", "v0.0.42"), ("25.11", "v0.0.44")])
def test_the_stand_in_refuses_what_the_v38_request_sends(release, version):
    """The stand-in's checks are those of the data_parser: v0.0.38's text values ("04:00:00",
    "exclusive") are what made the old transport fail on 23.11 and later."""
    old = rest_job_properties(rendered("ddp-gpu"), environment={"PATH": "/bin"}, api_version="v0.0.38")
    with Slurmrestd(release) as stub:
        t = transport(stub, version)
        with pytest.raises(SchedulerError, match="Expected dictionary but got string"):
            t._request("POST", f"/slurm/{version}/job/submit", {"job": {**old, "script": "#!/bin/bash\n"}})


def test_ignored_field_cancels_the_job(monkeypatch):
    """If slurmrestd ever ignores a field (it warns, and queues the job anyway), that job is not
    the one rendered: it is cancelled and the submit fails."""
    from halo_sched.backends.slurm.transport import rest

    real = rest.rest_job_properties
    monkeypatch.setattr(rest, "rest_job_properties", lambda *a, **k: {**real(*a, **k), "gpus_per_node": 8})
    with Slurmrestd("24.11") as stub:
        with pytest.raises(SchedulerError, match=r'ignored part of job 100 .*unknown field \\?"gpus_per_node'):
            transport(stub, "v0.0.42").submit(rendered("ddp-cpu"))
        assert stub.jobs[100].state == ["CANCELLED"]


@pytest.mark.parametrize("release,version", PAIRS)
def test_query_and_job_info_read_each_versions_shapes(release, version):
    with Slurmrestd(release) as stub:
        t = transport(stub, version)
        a, b, c = (t.submit(rendered("ddp-cpu")) for _ in range(3))
        assert t.query([a])[a].status is JobStatus.PENDING
        stub.start(a)
        s = t.query([a])[a]
        assert s.status is JobStatus.RUNNING and s.nodes_total == 2 and s.slurm.nodelist == "node[1-2]"
        stub.finish(a, rc=3)
        stub.finish(b, rc=0)
        stub.finish(c, sig=15, state="CANCELLED")
        res = t.query([a, b, c, "999"])
        assert (res[a].status, res[a].exit_code) == (JobStatus.FAILED, 3)
        assert (res[b].status, res[b].exit_code) == (JobStatus.COMPLETED, 0)
        assert res[c].status is JobStatus.CANCELLED and res[c].slurm.signal == 15
        assert res["999"].status is JobStatus.UNKNOWN
        info = t.job_info(b)
        assert info["StdOut"] == f"{os.getcwd()}/halo-ddp-cpu-{b}.out" and info["JobName"] == "ddp-cpu"
        with pytest.raises(SchedulerError, match="Invalid job id"):
            t.job_info("999")


@pytest.mark.parametrize("release,version", PAIRS)
def test_warning_reaches_the_batch_script_alone_and_cancel_kills(release, version):
    with Slurmrestd(release) as stub:
        t = transport(stub, version)
        a, b = t.submit(rendered("ddp-cpu")), t.submit(rendered("ddp-cpu"))
        stub.start(a)
        stub.start(b)
        t.cancel([a], signal="USR2")
        assert stub.jobs[int(a)].signals == [(12, ["BATCH_JOB"])]  # as scancel --batch --signal=USR2
        assert t.query([a])[a].status is JobStatus.RUNNING
        t.cancel([b])
        assert stub.jobs[int(b)].signals == [(9, ["FULL_JOB"])]
        assert t.query([b])[b].status is JobStatus.CANCELLED
        t.cancel([b])  # already ended: not an error, as scancel
        if release not in ("23.11", "24.05") and version >= "v0.0.42":
            # 24.11+ at v0.0.42+: each failed job's outcome in "status" at HTTP 200; an unknown
            # job is an error. At v0.0.40/41 24.11.5 answers 200 and nothing else, whatever the
            # id (tests/fixtures/slurmrestd/24.11/v0.0.40/job_unknown_delete.json).
            with pytest.raises(SchedulerError, match="Invalid job id specified"):
                t.cancel(["999"])


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.42", "v0.0.44"])
def test_job_environment_is_what_the_job_needs(version):
    """sbatch --export=ALL would copy the submitter's tokens into the job (and slurmctld's state):
    only secret_env names go, SLURM_JWT never."""
    data = (REPO / "examples" / "ddp-cpu.yaml").read_text() + "secret_env: [HF_TOKEN]\n"
    req = request(loads(data))
    assert req.get("export") == "ALL"  # secret_env: sbatch's --export=ALL, on its command line only
    job = rest_job_properties(req, environment=SUBMITTER_ENV, api_version=version)
    env = job["environment"]
    env = dict(e.split("=", 1) for e in env) if isinstance(env, list) else env
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "OMP_PROC_BIND": "close", "HF_TOKEN": "hf-token"}
    # Not named in secret_env: no token at all.
    env = rest_job_properties(rendered("ddp-cpu"), environment=SUBMITTER_ENV, api_version=version)["environment"]
    assert not any(x in str(env) for x in ("jwt-of", "nomad-token", "aws-secret", "hf-token"))


def test_submit_sends_no_credential_to_slurmrestd_but_its_own_token():
    with Slurmrestd("25.11") as stub:
        transport(stub).submit(rendered("rl-servers"))
        body = str(posted(stub))
    for value in ("jwt-of-the-submitter", "nomad-token", "aws-secret", "hf-token"):
        assert value not in body


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.44"])
def test_unmappable_extra_arg_is_refused_naming_the_field_before_sending(version, tmp_path):
    data = (REPO / "examples" / "ddp-cpu.yaml").read_text() + (
        "slurm:\n  extra_args: ['--container-image=nvcr.io/x', '--comment=ok', '--frobnicate']\n")
    req = request(loads(data))
    with Slurmrestd("25.11") as stub:
        t = transport(stub, "v0.0.44" if version != "v0.0.38" else None)
        with pytest.raises(UsageError) as e:
            rest_job_properties(req, environment={}, api_version=version)
        if version == "v0.0.44":
            with pytest.raises(UsageError):
                t.submit(req)
            assert not [r for r in stub.requests if r[0] == "POST"]
    msg = str(e.value)
    assert msg.startswith("slurm.extra_args") and "--container-image=nvcr.io/x" in msg and "--frobnicate" in msg
    assert "--comment" not in msg and "cli" in msg


def test_v38_warning_goes_to_the_steps_as_the_carrier_and_self_requeue_is_refused():
    """slurmrestd 22.05 refuses "B:" (get_signal_opts runs B: only inside sbatch) and signals the
    steps alone without it: the warning reaches each node's entry as URG."""
    job = rest_job_properties(rendered("ddp-gpu"), environment={}, api_version="v0.0.38")
    assert job["signal"] == "URG@120" and job["no_requeue"] is True and job["time_limit"] == "04:00:00"
    data = (REPO / "examples" / "ddp-cpu.yaml").read_text() + "slurm:\n  signal: USR2@60\n  requeue: true\n"
    with pytest.raises(UsageError, match="slurm.requeue: true"):
        rest_job_properties(request(loads(data)), environment={}, api_version="v0.0.38")
    job = rest_job_properties(request(loads(data)), environment={}, api_version="v0.0.42")
    assert job["requeue"] is True and job["kill_warning_flags"] == ["BATCH_JOB"]


@pytest.mark.parametrize("version,carried", [("v0.0.38", True), ("v0.0.40", True), ("v0.0.41", False),
                                             ("v0.0.44", False), ("v0.0.45", True)])
def test_cores_per_socket_where_the_job_description_has_it(version, carried):
    """JOB_DESC_MSG has cores_per_socket in v0.0.40, none in v0.0.41-44, and has it again in
    v0.0.45 (parsers.c, slurm-24-05-8-1 .. slurm-26-05-3-1): carried where it is, refused naming
    the field where it is not (never sent to be ignored)."""
    req = request_of("#!/bin/bash\n", ["--cores-per-socket=8"])
    if not carried:
        with pytest.raises(UsageError, match=r"slurm.extra_args.*--cores-per-socket=8 \(has no field in " + version):
            rest_job_properties(req, environment={}, api_version=version)
        return
    job = rest_job_properties(req, environment={}, api_version=version)
    assert job["cores_per_socket"] == ("8" if version == "v0.0.38" else 8)
    if version == "v0.0.45":
        with Slurmrestd("26.05") as stub:
            job_id = transport(stub, version).submit(req)
            assert stub.jobs[int(job_id)].desc["cores_per_socket"] == 8
            assert stub.jobs[int(job_id)].state == ["PENDING"]  # not cancelled for an ignored field


@pytest.mark.parametrize("version,topo", [("v0.0.38", False), ("v0.0.40", False), ("v0.0.41", True),
                                          ("v0.0.42", True), ("v0.0.44", True)])
def test_node_lists_are_lists_and_exclusive_topo_from_v41(version, topo):
    """v0.0.40+ take required/excluded nodes as lists (CSV_STRING, parsers.c slurm-24-11-5-1:
    a comma string draws a warning on 24.11); a host range's commas stay inside it.
    --exclusive=topo is a JOB_SHARED flag from v0.0.41 (slurm-24-05-8-1 on), not in v0.0.40."""
    req = request_of("#!/bin/bash\n", ["--nodelist=node[1,3],node5", "--exclude=node2"])
    job = rest_job_properties(req, environment={}, api_version=version)
    if version == "v0.0.38":
        assert job["nodelist"] == "node[1,3],node5" and job["exclude_nodes"] == "node2"
    else:
        assert job["required_nodes"] == ["node[1,3]", "node5"] and job["excluded_nodes"] == ["node2"]
    if topo:
        assert rest_job_properties(request_of("#!/bin/bash\n", ["--exclusive=topo"]), environment={},
                                   api_version=version)["shared"] == ["topo"]
    else:
        with pytest.raises(UsageError, match="topo"):
            rest_job_properties(request_of("#!/bin/bash\n", ["--exclusive=topo"]), environment={},
                                api_version=version)


def test_partition_memory_limit_is_partition_memory_per_node():
    """v0.0.40+: MaxMemPerNode is maximums.partition_memory_per_node; a MaxMemPerCPU is
    partition_memory_per_cpu (and the raw memory_per_cpu), never a per-node limit. The shapes
    are 24.11.5's real answers (tests/fixtures/slurmrestd/24.11)."""
    from halo_sched.backends.slurm.transport.rest import rest_partition_record

    unset = {"set": False, "infinite": False, "number": 0}
    per_node = {"name": "debug", "maximums": {"memory_per_cpu": 1024, "partition_memory_per_cpu": unset,
                                              "partition_memory_per_node": {"set": True, "infinite": False,
                                                                            "number": 1024}}}
    per_cpu = {"name": "debug", "maximums": {"memory_per_cpu": 512, "partition_memory_per_node": unset,
                                             "partition_memory_per_cpu": {"set": True, "infinite": False,
                                                                          "number": 512}}}
    assert rest_partition_record(per_node)["MaxMemPerNode"] == "1024"
    assert rest_partition_record(per_cpu)["MaxMemPerNode"] == "UNLIMITED"
