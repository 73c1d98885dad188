"""The SLURM transports without a cluster: jobs on another cluster (sbatch --clusters) and the
slurmrestd API versions the rest transport speaks. The live tests are in
tests/test_slurm_transport_cluster.py."""
from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import request_of
from halo_sched.backends.base import JobStatus
from halo_sched.backends.slurm import status as st
from halo_sched.backends.slurm.transport import API_VERSIONS, CliTransport, RestTransport, split_cluster
from halo_sched.errors import MissingDependency, UsageError

# ---------------------------------------------------------------------------------------------
# Job ids that name a cluster


def test_split_cluster_reads_both_spellings_and_refuses_option_like_ids():
    assert split_cluster("halo:123") == ("halo", "123")
    assert split_cluster("123;halo") == ("halo", "123")  # as sbatch --parsable -M prints it
    assert split_cluster("123_[1-5%2]") == (None, "123_[1-5%2]")
    assert split_cluster("other:7+1") == ("other", "7+1")
    for bad in ("--signal=KILL", "halo:", "halo:abc", "a b:1", "-M:1"):
        with pytest.raises(UsageError, match="job id"):
            split_cluster(bad)


ROW = st.SEP.join(["{id}", "{id}", "{state}", "0", "2", "None", "node[1-2]"]) + st.SEP + "\n"


class TwoClusters:
    """squeue/sacct/scontrol/scancel for a local cluster and a cluster named ``far``, as
    SLURM 22.05's clients answer them: a client run with --clusters=NAME asks NAME's slurmctld
    (src/common/slurmdb_defs.c slurmdb_get_info_cluster), squeue prints a ``CLUSTER: NAME`` line
    unless --noheader (src/squeue/squeue.c _multi_cluster), and job ids are per cluster: job 5
    exists on both, RUNNING here and COMPLETED on ``far``. No accounting on either."""

    jobs = {None: {"5": "RUNNING", "6": "PENDING"}, "far": {"5": "COMPLETED", "9": "FAILED"}}

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, argv, input=None):
        self.calls.append(list(argv))
        cluster = next((a.split("=", 1)[1] for a in argv if a.startswith("--clusters=")), None)
        jobs = self.jobs[cluster]
        done = lambda rc, out="", err="": subprocess.CompletedProcess(argv, rc, out, err)  # noqa: E731
        if argv[0] == "sacct":
            return done(1, "", "Slurm accounting storage is disabled\n")
        if argv[0] == "squeue":
            want = next((a[len("--jobs="):].split(",") for a in argv if a.startswith("--jobs=")), None)
            header = "" if "--noheader" in argv else f"CLUSTER: {cluster or 'here'}\n"
            rows = [ROW.format(id=i, state=s) for i, s in jobs.items() if want is None or i in want]
            if want and len(want) == 1 and not rows:
                return done(1, "", "slurm_load_jobs error: Invalid job id specified\n")
            return done(0, header + "".join(rows))
        if argv[0] == "scontrol":
            return done(0, "".join(f"JobId={i} JobState={s} NumNodes=1 ExitCode=0:0\n" for i, s in jobs.items()))
        if argv[0] == "scancel":
            return done(0)
        raise AssertionError(argv)


def test_query_asks_each_cluster_once_and_keys_answers_by_the_ids_given():
    fake = TwoClusters()
    t = CliTransport(runner=fake, accounting=False)
    res = t.query(["5", "far:5", "9;far", "far:404"])
    assert list(res) == ["5", "far:5", "9;far", "far:404"]
    # The same number on two clusters is two jobs: without --clusters, far:5 would read RUNNING.
    assert res["5"].status is JobStatus.RUNNING
    assert res["far:5"].status is JobStatus.COMPLETED and res["far:5"].id == "far:5"
    assert res["far:5"].slurm.cluster == "far"
    assert res["9;far"].status is JobStatus.FAILED
    assert res["far:404"].status is JobStatus.UNKNOWN
    local = [c for c in fake.calls if not any(a.startswith("--clusters") for a in c)]
    far = [c for c in fake.calls if "--clusters=far" in c]
    assert len(local) == 1 and 1 <= len(far) <= 3 and len(local) + len(far) == len(fake.calls)


def test_cancel_and_job_info_carry_the_cluster():
    fake = TwoClusters()
    t = CliTransport(runner=fake)
    t.cancel(["far:5", "5", "far:9"], signal="USR2")
    scancels = sorted(fake.calls, key=len)
    assert [c for c in scancels if "--clusters=far" in c][0][-2:] == ["5", "9"]
    assert [c for c in scancels if "--clusters=far" not in c][0][-1] == "5"
    fake.calls.clear()
    assert t.job_info("far:9")["JobState"] == "FAILED"
    assert fake.calls[0][:2] == ["scontrol", "--clusters=far"]


def test_parsers_skip_the_cluster_header():
    text = "CLUSTER: far\n" + ROW.format(id="5", state="RUNNING") + "\nCLUSTER: near\n" + ROW.format(id="6", state="PENDING")
    assert [s.id for s in st.parse_squeue(text)] == ["5", "6"]
    assert [r["JobId"] for r in st.parse_scontrol_jobs("CLUSTER: far\nJobId=5 JobState=RUNNING\n")] == ["5"]


def test_submit_to_another_cluster_returns_cluster_and_id():
    run = lambda argv, input=None: subprocess.CompletedProcess(argv, 0, "77;far\n", "")  # noqa: E731
    assert CliTransport(runner=run).submit(request_of("#!/bin/bash\ntrue\n", ["--clusters=far"])) == "far:77"


def test_python_api_takes_cluster_ids(monkeypatch):
    import halo_sched
    from halo_sched.backends.slurm.transport import cli

    fake = TwoClusters()
    monkeypatch.setattr(cli, "default_runner", lambda timeout=60.0: fake)
    monkeypatch.delenv("HALO_SLURM_TRANSPORT", raising=False)
    job = halo_sched.job("far:9", "slurm")
    assert job.status().status is JobStatus.FAILED
    assert any("--clusters=far" in c for c in fake.calls)


# ---------------------------------------------------------------------------------------------
# slurmrestd API versions


class FakeRestd:
    """The parts of slurmrestd 22.05 the version check reads: ``GET /openapi/v3`` lists a path
    per operation of every loaded plugin (src/slurmrestd/slurmrestd.c binds /openapi/v3; the
    plugins are chosen with ``-s openapi/vX``), and a path no plugin serves is a plain-text 404
    (src/slurmrestd/operations.c). ``/slurm/V/jobs`` answers with no jobs."""

    def __init__(self, versions):
        self.versions = versions
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                fake.requests.append(self.path)
                if self.path == "/openapi/v3":
                    paths = {f"/slurm/{v}/{op}": {} for v in fake.versions for op in ("jobs", "ping", "job/submit")}
                    paths.update({f"/slurmdb/{v}/jobs": {} for v in fake.versions})
                    return self._send(200, json.dumps({"openapi": "3.0.2", "paths": paths}))
                version = self.path.split("/")[2] if self.path.startswith("/slurm/") else ""
                if version in fake.versions and self.path.endswith("/jobs"):
                    return self._send(200, json.dumps({"meta": {}, "errors": [], "jobs": []}))
                self._send(404, "Unable find requested URL. Please view /openapi/v3 for API reference.")

            def _send(self, code, text):
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def restd(request):
    fake = FakeRestd(request.param)
    yield fake
    fake.close()


@pytest.mark.parametrize("restd", [["v0.0.36", "v0.0.37", "v0.0.38"]], indirect=True)
def test_rest_detects_the_version_it_speaks_once(restd, monkeypatch):
    monkeypatch.delenv("HALO_SLURMRESTD_API", raising=False)
    t = RestTransport(url=restd.url, token="t", retries=1)
    assert t.query(["1"])["1"].status is JobStatus.UNKNOWN
    t.query(["2"])
    assert restd.requests == ["/openapi/v3", "/slurm/v0.0.38/jobs", "/slurm/v0.0.38/jobs"]


@pytest.mark.parametrize("restd", [["v0.0.37", "v0.0.39"]], indirect=True)
def test_rest_refuses_a_slurmrestd_without_a_version_it_speaks(restd, monkeypatch):
    # A slurmrestd 23.02 started with only -s openapi/v0.0.37,openapi/v0.0.39.
    monkeypatch.delenv("HALO_SLURMRESTD_API", raising=False)
    t = RestTransport(url=restd.url, token="t", retries=1)
    with pytest.raises(MissingDependency) as e:
        t.query(["1"])
    msg = str(e.value)
    assert "offers API v0.0.37, v0.0.39" in msg and "v0.0.38" in msg and "v0.0.45" in msg
    assert "HALO_SLURMRESTD_API" in msg
    assert restd.requests == ["/openapi/v3"]  # nothing was sent in a format it does not speak


@pytest.mark.parametrize("restd", [["v0.0.39"]], indirect=True)
def test_rest_pinned_version_the_server_lacks_is_named(restd, monkeypatch):
    monkeypatch.setenv("HALO_SLURMRESTD_API", "v0.0.38")
    t = RestTransport(url=restd.url, token="t", retries=1)
    with pytest.raises(MissingDependency, match=r"does not offer API v0\.0\.38 \(HALO_SLURMRESTD_API\)"):
        t.query(["1"])
    assert restd.requests == ["/slurm/v0.0.38/jobs"]  # pinned: no detection request


def test_rest_pinned_version_it_does_not_speak_is_refused_before_any_request(monkeypatch):
    monkeypatch.setenv("HALO_SLURMRESTD_API", "v0.0.39")
    with pytest.raises(UsageError, match=r"v0\.0\.39 \(HALO_SLURMRESTD_API\) is not one halo-sched speaks"):
        RestTransport(url="http://127.0.0.1:9", token="t")
    assert API_VERSIONS == ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")


def test_rest_refuses_clusters_on_submit():
    from halo_sched.backends.slurm.transport import rest_job_properties

    for version in ("v0.0.38", "v0.0.42"):
        with pytest.raises(UsageError, match="--clusters=far .a slurmrestd submits to its own cluster only"):
            rest_job_properties(request_of("#!/bin/bash\ntrue\n", ["--clusters=far"]), environment={},
                                api_version=version)


@pytest.mark.parametrize("restd", [["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"]], indirect=True)
def test_rest_pinned_v40_on_a_newer_release_names_the_parser_not_a_plugin(restd, monkeypatch):
    """26.05.3's slurmrestd serves v0.0.42-45 (tests/fixtures/slurmrestd/26.05): a pinned v0.0.40
    is advised as a data_parser with openapi/slurmctld and the releases that have it; there is no
    openapi/v0.0.40 plugin to load (25.11+ die at start when asked for openapi/v0.0.38)."""
    monkeypatch.setenv("HALO_SLURMRESTD_API", "v0.0.40")
    t = RestTransport(url=restd.url, token="t", retries=1)
    with pytest.raises(MissingDependency) as e:
        t.query(["1"])
    msg = str(e.value)
    assert "-s openapi/slurmctld -d data_parser/v0.0.40 (Slurm 23.11-25.05" in msg, msg
    assert "openapi/v0.0.40" not in msg
