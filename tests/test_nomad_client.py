"""The Nomad API client, the status mapping and the placement watch, against a fake Nomad API.

No Nomad binary can run here; ``tests/nomad/fake_api.py`` answers the HTTP calls with Nomad's
field names and shapes (see its docstring for what it models).
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import threading
import time
import warnings

import pytest
import requests

from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad.client import NomadAPIError, NomadClient, NomadConfig
from halo_sched.backends.nomad.plan import format_plan, plan_summary, plan_warnings
from halo_sched.backends.nomad.state import describe_alloc_metric, job_state
from halo_sched.backends.nomad.watchdog import watch_job
from halo_sched.errors import SchedulerError, UsageError
from helpers import free_port, load_nomad_helper


fake_api = load_nomad_helper("fake_api")
sample_job = load_nomad_helper("sample_job")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode

make_job = sample_job.make_job
register, read_job, list_jobs = sample_job.register, sample_job.read_job, sample_job.list_jobs

TOKEN = "s3cr3t-token"
JOB = "halo-test"


# ------------------------------------------------------------------------------------ helpers


def client_for(fake, token: str | None = TOKEN, sleep=None, **overrides) -> NomadClient:
    """A client for the fake with fast retries; the process environment is not consulted."""
    cfg = NomadConfig.from_env(env={}, address=fake.address, token=token, retry_base_s=0.01,
                               retry_max_wait_s=0.05, **overrides)
    return NomadClient(cfg, sleep=sleep) if sleep else NomadClient(cfg)


def state_of(client: NomadClient, job_id: str = JOB):
    """The state from the list endpoints, as ``status`` reads it."""
    jobs = client.job_stubs([job_id])
    return job_state(jobs[0] if jobs else None, client.allocation_stubs([job_id]),
                     client.placement_evaluations([job_id]), job_id)


class FakeClock:
    """``clock``/``sleep`` pair for watch_placement; hooks run after each sleep (time passes)."""

    def __init__(self):
        self.t = 0.0
        self.sleeps: list[float] = []
        self.hooks = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.t += seconds
        for hook in self.hooks:
            hook(self.t)


@pytest.fixture
def fake():
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as f:
        yield f


@pytest.fixture
def one_node_fake():
    """Room for one 8-GPU node group only: a 2-node job half-places."""
    with FakeNomad([FakeNode("gpu-a")], token=TOKEN) as f:
        yield f


# ------------------------------------------------------------------------------------ auth, scope


def test_token_namespace_and_region_go_on_every_request():
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as fake:
        client = client_for(fake, namespace="ml", region="global")
        payload = make_job(2, namespace=None)  # the client fills the configured namespace in
        client.plan(payload)
        register(client, payload)
        assert read_job(client, JOB)["Namespace"] == "ml"
        allocs, _ = client.job_allocations(JOB)
        client.placement_evaluations([JOB])
        client.job_stubs([JOB])
        client.allocation_stubs([JOB])
        list_jobs(client, prefix="halo")
        fake.write_log(allocs[0]["ID"], "hi\n")
        assert "".join(client.logs(allocs[0]["ID"], "torchrun")) == "hi\n"
        client.stop(JOB)

        assert fake.job_record(JOB, namespace="ml") is not None
        assert fake.job_record(JOB) is None  # nothing leaked into "default"
        assert len(fake.requests) == 10
        for req in fake.requests:
            assert req.headers.get("x-nomad-token") == TOKEN, req
            assert req.query.get("namespace") == "ml", req
            assert req.query.get("region") == "global", req


def test_missing_token_gives_403_with_a_hint_and_no_retry(fake):
    client = client_for(fake, token=None)
    with pytest.raises(NomadAPIError) as info:
        register(client, make_job(2))
    err = info.value
    assert isinstance(err, SchedulerError)
    assert err.status == 403
    msg = str(err)
    assert "403" in msg and "no ACL token sent" in msg and "NOMAD_TOKEN" in msg and "submit-job" in msg
    assert len(msg) <= 160 and err.kind == "forbidden"
    assert len(fake.requests) == 1


def test_token_without_write_permission_is_told_apart(fake):
    fake.acl_tokens["read-only"] = "read"
    client = client_for(fake, token="read-only")
    assert read_job(client, JOB) is None  # reads are allowed
    with pytest.raises(NomadAPIError, match="NOMAD_TOKEN lacks the submit-job capability") as info:
        register(client, make_job(2))
    assert info.value.status == 403 and "Permission denied" in str(info.value)


def test_environment_token_does_not_leak_past_the_config(monkeypatch):
    # The config is the only source of the token: NOMAD_TOKEN in the process env is not read behind it.
    monkeypatch.setenv("NOMAD_TOKEN", "leaked")
    with FakeNomad([FakeNode("gpu-a")]) as fake:  # no ACLs
        client = client_for(fake, token=None)
        assert read_job(client, JOB) is None
        assert "x-nomad-token" not in fake.requests[-1].headers


def test_payload_namespace_conflicting_with_config_is_refused(fake):
    client = client_for(fake, namespace="ml")
    with pytest.raises(UsageError, match="Namespace"):
        register(client, make_job(2, namespace="research"))
    client.plan(make_job(2, namespace="default"))  # "default" yields to the configured one, as in Nomad
    assert fake.requests[-1].body["Job"]["Namespace"] == "ml"
    with pytest.raises(UsageError, match='"Job"'):
        register(client, {"ID": JOB})
    assert len(fake.requests) == 1


# ------------------------------------------------------------------------------------ retries


def test_5xx_is_retried_with_backoff_then_succeeds(fake):
    sleeps: list[float] = []
    client = client_for(fake, sleep=sleeps.append)
    fake.fail_next(2, status=500, body="No cluster leader")
    out = register(client, make_job(2))
    assert out["EvalID"]
    assert len(fake.requests_to("/v1/jobs", "POST")) == 3
    assert len(sleeps) == 2 and sleeps[0] < sleeps[1]


def test_5xx_retries_are_bounded(fake):
    sleeps: list[float] = []
    client = client_for(fake, sleep=sleeps.append)
    fake.fail_next(10, status=503, body="rpc error: No cluster leader")
    with pytest.raises(NomadAPIError) as info:
        read_job(client, JOB)
    err = info.value
    assert err.status == 503 and err.attempts == 4
    assert "after 4 attempts" in str(err) and "No cluster leader" in str(err)
    assert len(fake.requests) == 4 and len(sleeps) == 3


def test_dropped_connection_is_retried(fake):
    client = client_for(fake)
    fake.drop_next(2, path_contains="/v1/jobs")
    register(client, make_job(2))
    recorded = fake.requests_to("/v1/jobs", "POST")
    assert [r.status for r in recorded] == [None, None, 200]
    assert fake.job_record(JOB) is not None


def test_unreachable_nomad_fails_after_bounded_attempts():
    port = free_port()  # reserved for this test; nothing listens on it
    cfg = NomadConfig.from_env(env={}, address=f"127.0.0.1:{port}", retry_base_s=0.01, retry_max_wait_s=0.05)
    start = time.monotonic()
    with pytest.raises(NomadAPIError) as info:
        read_job(NomadClient(cfg), JOB)
    assert time.monotonic() - start < 3
    assert info.value.attempts == 4 and info.value.status is None
    assert f"nothing reached Nomad at http://127.0.0.1:{port}: connection refused" in str(info.value)


def test_400_and_404_are_not_retried(fake):
    client = client_for(fake)
    with pytest.raises(NomadAPIError, match="Missing job task groups") as info:
        register(client, {"Job": {"ID": "broken", "TaskGroups": []}})
    assert info.value.status == 400
    assert len(fake.requests) == 1

    assert read_job(client, "nope") is None  # 404 on a read means "no such job"
    assert len(fake.requests) == 2
    client.stop("nope")  # Nomad answers 200 for an unknown job (nomad/job_endpoint.go Deregister)
    assert len(fake.requests) == 3 and fake.requests[-1].status == 200


# ------------------------------------------------------------------------------------ TLS


def test_tls_verification_is_on_by_default_and_reads_nomad_cacert(tmp_path, monkeypatch):
    monkeypatch.setenv("NOMAD_CLIENT_CERT", "/env/cert.pem")  # must not reach a request unasked
    monkeypatch.setenv("NOMAD_CLIENT_KEY", "/env/key.pem")
    sent = []

    class Recorder(requests.Session):
        def request(self, method, url, **kw):  # what each request is sent with
            sent.append(kw)
            raise requests.ConnectionError("recorded, not sent")

    cfg = NomadConfig.from_env(env={"NOMAD_ADDR": "https://nomad.example:4646"}, retry_attempts=1)
    assert cfg.verify is True and cfg.cert is None
    client = NomadClient(cfg, Recorder())
    assert client.session.verify is True
    with pytest.raises(NomadAPIError):
        client.job_stubs([JOB])
    assert sent[-1]["verify"] is True and sent[-1]["cert"] is None  # no client certificate, whatever the env says

    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until a request is made\n")
    cfg = NomadConfig.from_env(env={"NOMAD_ADDR": "https://nomad.example:4646", "NOMAD_CACERT": str(ca)},
                               retry_attempts=1)
    assert cfg.verify == str(ca)
    client = NomadClient(cfg, Recorder())
    with pytest.raises(NomadAPIError):
        client.plan(make_job(1))
    assert client.session.verify == str(ca) and sent[-1]["verify"] == str(ca)

    cfg = NomadConfig.from_env(env={"NOMAD_CACERT": str(ca), "NOMAD_CLIENT_CERT": "c.pem",
                                    "NOMAD_CLIENT_KEY": "k.pem"}, retry_attempts=1)
    assert cfg.cert == ("c.pem", "k.pem")
    with pytest.raises(NomadAPIError):
        NomadClient(cfg, Recorder()).stop(JOB)
    assert sent[-1]["cert"] == ("c.pem", "k.pem") and sent[-1]["allow_redirects"] is False

    assert NomadConfig.from_env(env={"NOMAD_SKIP_VERIFY": "true", "NOMAD_CACERT": str(ca)}).verify is False
    assert NomadConfig.from_env(env={"NOMAD_SKIP_VERIFY": "0"}).verify is True
    with pytest.raises(UsageError, match="NOMAD_SKIP_VERIFY"):
        NomadConfig.from_env(env={"NOMAD_SKIP_VERIFY": "maybe"})
    with pytest.raises(UsageError, match="NOMAD_CACERT"):
        NomadClient(NomadConfig.from_env(env={"NOMAD_CACERT": str(tmp_path / "missing.pem")}))
    with pytest.raises(UsageError, match="together"):
        NomadClient(NomadConfig.from_env(env={"NOMAD_CLIENT_CERT": "c.pem"}))


def test_config_from_env_reads_everything_and_overrides_win():
    env = {"NOMAD_ADDR": "nomad.internal:4646/", "NOMAD_TOKEN": "t", "NOMAD_NAMESPACE": "ml",
           "NOMAD_REGION": "eu"}
    cfg = NomadConfig.from_env(env=env)
    assert (cfg.address, cfg.token, cfg.namespace, cfg.region) == ("http://nomad.internal:4646", "t", "ml", "eu")
    cfg = NomadConfig.from_env(env=env, namespace="other", token=None, region="")
    assert (cfg.namespace, cfg.token, cfg.region) == ("other", "t", None)  # None = not given, "" = clear
    assert cfg.redacted().token == "<redacted>" and cfg.token == "t"
    with pytest.raises(UsageError):
        NomadConfig.from_env(env={"NOMAD_ADDR": "unix:///var/run/nomad.sock"})
    with pytest.raises(TypeError):
        NomadConfig.from_env(env={}, adress="typo")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def test_https_server_is_verified_against_nomad_cacert(self_signed):
    cert, key = self_signed
    with FakeNomad([FakeNode("gpu-a")], tls=(cert, key)) as fake:
        sleeps: list[float] = []
        untrusted = NomadClient(NomadConfig.from_env(env={"NOMAD_ADDR": fake.address}), sleep=sleeps.append)
        with pytest.raises(NomadAPIError, match="is not trusted") as info:
            read_job(untrusted, JOB)
        assert "set NOMAD_CACERT to the CA that signed it" in str(info.value) and len(str(info.value)) <= 160
        assert info.value.attempts == 1 and sleeps == []  # a bad certificate is not retried

        # Trusted, but reached under a name the certificate does not carry (it names 127.0.0.1).
        other_name = NomadClient(NomadConfig.from_env(env={"NOMAD_ADDR": f"https://localhost:{fake.port}",
                                                           "NOMAD_CACERT": cert}), sleep=sleeps.append)
        with pytest.raises(NomadAPIError) as info:
            read_job(other_name, JOB)
        assert str(info.value) == (f"the TLS certificate at localhost:{fake.port} does not name 'localhost': "
                                   "put a host name the certificate names in NOMAD_ADDR"), info.value

        trusted = NomadClient(NomadConfig.from_env(env={"NOMAD_ADDR": fake.address, "NOMAD_CACERT": cert}))
        register(trusted, make_job(1))
        assert read_job(trusted, JOB)["ID"] == JOB

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning
            skip = NomadClient(NomadConfig.from_env(env={"NOMAD_ADDR": fake.address, "NOMAD_SKIP_VERIFY": "1"}))
            assert read_job(skip, JOB)["ID"] == JOB


# ------------------------------------------------------------------------------------ status


def test_fully_placed_job_is_running(fake):
    client = client_for(fake)
    out = register(client, make_job(2))
    assert out["EvalID"] and out["JobModifyIndex"]
    state = state_of(client)
    assert state.status is JobStatus.RUNNING
    assert (state.nodes_running, state.nodes_total) == (2, 2)
    nodes = state.nomad.nodes
    assert [n["node_rank"] for n in nodes] == [0, 1]
    assert nodes[1]["alloc_name"] == f"{JOB}.trainer[1]"
    assert {nodes[0]["node"], nodes[1]["node"]} == {"gpu-a", "gpu-b"}  # distinct hosts


def test_half_placed_job_is_partial_and_says_why():
    nodes = [FakeNode("gpu-a"), FakeNode("gpu-b", busy_gpus=4), FakeNode("gpu-c", gpus=4)]
    with FakeNomad(nodes, token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(2, gpus=8))
        state = state_of(client)
        assert state.status is JobStatus.PARTIAL
        assert (state.nodes_running, state.nodes_total) == (1, 2)
        assert state.nomad.blocked_eval is True
        reason = state.nomad.blocked["trainer"]
        assert reason.startswith("trainer: 1 of 2 unplaced (node rank 1): 0/3 nodes eligible")
        assert "distinct_hosts: 1" in reason  # gpu-a already holds node rank 0
        assert "missing devices: 1" in reason  # gpu-c has only 4 GPUs
        assert "exhausted 1 (devices: no devices match request: 1)" in reason  # gpu-b's are busy
        assert state.reason.startswith("blocked: trainer")
        assert "1/2 nodes running" in state.describe()


def test_many_ranks_partly_placed_count_what_is_missing():
    nodes = [FakeNode(f"gpu-{i}") for i in range(5)]
    with FakeNomad(nodes, token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(8))
        state = state_of(client)
        assert state.status is JobStatus.PARTIAL and (state.nodes_running, state.nodes_total) == (5, 8)
        assert state.nomad.blocked["trainer"].startswith("trainer: 3 of 8 unplaced (node ranks 5-7)")
        assert sorted(n["alloc_name"] for n in state.nomad.nodes if n["alloc_name"]) == sorted(
            f"{JOB}.trainer[{k}]" for k in range(5))


def test_nothing_placed_is_pending_with_reasons():
    with FakeNomad([FakeNode("small", gpus=4)], token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(2, gpus=8))
        state = state_of(client)
        assert state.status is JobStatus.PENDING
        assert state.nodes_running == 0
        assert set(state.nomad.blocked) == {"trainer"}
        assert "trainer: 2 of 2 unplaced (node ranks 0-1)" in state.reason
        assert "missing devices" in state.reason
        assert state.raw_state == "pending"


def test_wrong_datacenter_is_explained(fake):
    client = client_for(fake)
    register(client, make_job(1, datacenters=["dc9"]))
    state = state_of(client)
    assert state.status is JobStatus.PENDING
    assert "no nodes in the job's datacenters" in state.reason and "dc9: 0" in state.reason


def test_completed_job(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[1]", 0)
    assert state_of(client).status is JobStatus.RUNNING  # rank 1 finished first, rank 0 still writing
    fake.finish(JOB, "trainer[0]", 0)
    state = state_of(client)
    assert state.status is JobStatus.COMPLETED and state.exit_code == 0
    assert state.raw_state == "dead"


def test_failed_job_keeps_the_exit_code(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[1]", 3)
    state = state_of(client)
    assert state.status is JobStatus.FAILED and state.exit_code == 3
    assert "node rank 1" in state.reason and "Exit Code: 3" in state.reason
    assert "node rank 0 still running" in state.reason  # rank 0 still holds its GPUs
    fake.finish(JOB, "trainer[0]", 0)
    assert state_of(client).exit_code == 3


def test_driver_failure_is_failed_without_exit_code(fake):
    fake.auto_run = False
    client = client_for(fake)
    register(client, make_job(2))
    fake.fail_driver(JOB, "trainer[0]", "Failed to pull `halo/train:latest`: not found")
    state = state_of(client)
    assert state.status is JobStatus.FAILED and state.exit_code is None
    assert "Failed to pull" in state.reason


def test_stopped_job_is_cancelled(fake):
    client = client_for(fake)
    register(client, make_job(2))
    client.stop(JOB)
    state = state_of(client)
    assert state.status is JobStatus.CANCELLED
    assert state.raw_state == "dead" and state.reason == "job stopped"


def test_stopped_half_placed_job_says_what_never_placed(one_node_fake):
    client = client_for(one_node_fake)
    register(client, make_job(2))
    client.stop(JOB)
    state = state_of(client)
    assert state.status is JobStatus.CANCELLED
    assert "not fully placed" in state.reason and "trainer: 1 of 2 unplaced (node rank 1)" in state.reason
    assert "0/1 nodes eligible" in state.reason
    evals = one_node_fake.evals_of(JOB)
    assert all(e["Status"] != "blocked" for e in evals)  # the stop cancelled the blocked eval


def test_failure_before_a_stop_stays_failed(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[1]", 2)
    client.stop(JOB)
    state = state_of(client)
    assert state.status is JobStatus.FAILED and state.exit_code == 2
    assert "stopped" in state.reason


def test_rank_crashing_because_of_the_stop_is_still_cancelled(fake):
    # On stop, node rank 0 is killed; rank 1's torchrun then dies with exit 1 (NCCL error) before its
    # own kill arrives. That is the user's cancel, not a training failure.
    fake.stop_collateral = {"trainer[1]": 1}
    client = client_for(fake)
    register(client, make_job(2))
    client.stop(JOB)
    assert fake.alloc_for(JOB, "trainer[1]")["ClientStatus"] == "failed"
    assert state_of(client).status is JobStatus.CANCELLED


def test_max_run_duration_is_a_timeout_not_a_success(fake):
    client = client_for(fake)
    register(client, make_job(2, max_run_duration_s=3600))
    killed = fake.time_out(JOB, "trainer[0]", variant="client")
    # What Nomad does: the killed allocation is "complete", like a successful one.
    assert killed["ClientStatus"] == "complete"
    state = state_of(client)
    assert state.status is JobStatus.TIMEOUT
    assert "node rank 0" in state.reason and "max_run_duration" in state.reason
    fake.finish(JOB, "trainer[1]", 0)  # every allocation is now "complete"
    state = state_of(client)
    assert state.status is JobStatus.TIMEOUT and state.raw_state == "dead"


@pytest.mark.parametrize("variant", ["server", "event"])
def test_max_run_duration_text_elsewhere_is_not_a_timeout(fake, variant):
    # Only ClientStatus complete + ClientDescription "allocation exceeded max_run_duration" is
    # Nomad's signal; the words in a desired description or a task event are not.
    client = client_for(fake)
    register(client, make_job(2, max_run_duration_s=3600))
    fake.time_out(JOB, "trainer[0]", variant=variant)
    assert state_of(client).status is not JobStatus.TIMEOUT


def test_timeout_wins_over_the_crash_it_causes(fake):
    client = client_for(fake)
    register(client, make_job(2, max_run_duration_s=60))
    fake.time_out(JOB, "trainer[0]")
    fake.finish(JOB, "trainer[1]", 1)
    state = state_of(client)
    assert state.status is JobStatus.TIMEOUT
    assert state.reason.startswith("node rank 0 died first") and "Exit Code: 1" in state.reason


def test_purged_job_is_unknown(fake):
    client = client_for(fake)
    register(client, make_job(2))
    client.stop(JOB, purge=True)
    assert read_job(client, JOB) is None and client.job_allocations(JOB)[0] == []
    state = state_of(client)
    assert state.status is JobStatus.UNKNOWN and "purge" in state.reason


def test_resubmitted_job_uses_the_latest_allocation_of_each_name(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[1]", 1)
    assert state_of(client).status is JobStatus.FAILED
    register(client, make_job(2))  # a new version replaces the old allocations under the same names
    allocs = client.allocation_stubs([JOB])
    assert len(allocs) == 4
    state = state_of(client)
    assert state.status is JobStatus.RUNNING
    newest = {a["ID"] for a in allocs if a["JobVersion"] == 1}
    assert {n["alloc_id"] for n in state.nomad.nodes} == newest


def _scheduler_for(fake):
    from halo_sched.backends.nomad import NomadScheduler

    return NomadScheduler(client_for(fake))


def test_status_of_many_jobs_costs_three_calls():
    # 20 jobs of 2 nodes on 30 clients, one of them half-placed: job stubs, allocation stubs, and
    # the evaluations of the one that is not fully placed. Never the whole job.
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(39)], token=TOKEN) as fake:
        client = client_for(fake)
        ids = [f"halo-{i:02d}" for i in range(20)]
        for job_id in ids:
            register(client, make_job(2, job_id=job_id))
        sched = _scheduler_for(fake)
        before = len(fake.requests)
        states = sched.query(ids + ["nope"])
        calls = fake.requests[before:]
        assert len(calls) <= 3, [(r.method, r.path) for r in calls]
        assert not [r for r in calls if r.path.startswith("/v1/job/")]
        assert [states[i].status for i in ids[:19]] == [JobStatus.RUNNING] * 19
        assert states[ids[19]].status is JobStatus.PARTIAL and "trainer: 1 of 2 unplaced" in states[ids[19]].reason
        assert states["nope"].status is JobStatus.UNKNOWN


def test_status_json_lists_each_node_rank_and_logs_are_tagged_by_rank(fake, capsys, monkeypatch):
    from halo_sched import cli

    client = client_for(fake)
    register(client, make_job(2))
    monkeypatch.setattr(cli, "_scheduler", lambda name: _scheduler_for(fake))
    assert cli.main(["status", JOB, "--backend", "nomad", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(n["node_rank"], n["client_status"]) for n in out["nodes"]] == [(0, "running"), (1, "running")]
    assert out["nodes"][1]["alloc_id"] == fake.alloc_for(JOB, "trainer[1]")["ID"]
    fake.write_log(fake.alloc_for(JOB, "trainer[1]")["ID"], "hello from rank 1\n")
    fake.write_log(fake.alloc_for(JOB, "trainer[0]")["ID"], "hello from rank 0\n")
    assert list(_scheduler_for(fake).logs(JOB)) == ["[node 0] hello from rank 0\n", "[node 1] hello from rank 1\n"]


def test_server_version_from_members_or_agent_self(fake):
    client = client_for(fake)
    assert client.server_version() == "2.0.6"
    fake.server_version = "2.0.2"
    assert client.server_version() == "2.0.2"
    fake.fail_next(1, status=403, body="Permission denied", path_contains="/v1/agent/members")
    assert client.server_version() == "2.0.2"  # from /v1/agent/self
    fake.fail_next(2, status=403, body="Permission denied", path_contains="/v1/agent/")
    assert client.server_version() is None


def test_config_repr_never_shows_secrets():
    cfg = NomadConfig.from_env(env={"NOMAD_TOKEN": "tok-3f9a", "NOMAD_CLIENT_CERT": "/c.pem",
                                    "NOMAD_CLIENT_KEY": "/secret/key-7b2.pem"})
    for text in (repr(cfg), str(cfg), f"{cfg}", repr([cfg])):
        assert "tok-3f9a" not in text and "key-7b2" not in text
        assert "token='<redacted>'" in text and "client_cert='/c.pem'" in text
    assert cfg.token == "tok-3f9a"  # the value itself is untouched
    assert "token=None" in repr(NomadConfig())


# ------------------------------------------------------------------------------------ plan


def test_plan_summary_for_a_job_that_cannot_place(one_node_fake):
    one_node_fake.plan_warnings = '1 warning:\n\n* Group "trainer" has no update block; using defaults'
    client = client_for(one_node_fake)
    plan = client.plan(make_job(2), diff=True)
    groups = plan_summary(plan)
    assert [g.group for g in groups] == ["trainer"]
    (blocked,) = groups
    assert not blocked.can_place and blocked.place == 2 and blocked.unplaced == 1
    assert (blocked.nodes_evaluated, blocked.nodes_filtered, blocked.nodes_exhausted) == (1, 1, 0)
    assert blocked.constraint_filtered == {"distinct_hosts": 1}
    assert blocked.reason == "trainer: 0/1 nodes eligible; filtered 1 (distinct_hosts: 1)"
    assert plan_warnings(plan) == ['Group "trainer" has no update block; using defaults']
    assert plan["Diff"]["Type"] == "Added"

    text = format_plan(plan, JOB)
    assert "1/2 nodes can be placed now" in text
    assert "trainer: CANNOT place 1 of 2: 0/1 nodes eligible" in text
    assert "no gang scheduling" in text and "has no update block" in text
    assert one_node_fake.job_record(JOB) is None  # a plan registers nothing


def test_plan_summary_all_placeable_and_metric_text(fake):
    plan = client_for(fake).plan(make_job(2))
    assert all(g.can_place for g in plan_summary(plan))
    assert "CANNOT" not in format_plan(plan)
    metric = {"NodesEvaluated": 5, "NodesFiltered": 1, "NodesExhausted": 3,
              "ConstraintFiltered": {"${attr.kernel.name} = linux": 1},
              "DimensionExhausted": {"memory": 2, "devices: no devices match request": 1},
              "ClassExhausted": {"gpu-h100": 3}}
    assert describe_alloc_metric("node-3", metric) == (
        "node-3: 1/5 nodes eligible; filtered 1 (${attr.kernel.name} = linux: 1); "
        "exhausted 3 (memory: 2, devices: no devices match request: 1, class gpu-h100: 3)"
    )


# ------------------------------------------------------------------------------------ logs


def test_logs_plain_and_stderr(fake):
    client = client_for(fake)
    register(client, make_job(2))
    alloc = fake.alloc_for(JOB, "trainer[0]")
    fake.write_log(alloc["ID"], "rank 0 ready\nstep 1 loss=2.3\n")
    fake.write_log(alloc["ID"], "NCCL WARN ✓\n", type="stderr")
    assert "".join(client.logs(alloc["ID"], "torchrun")) == "rank 0 ready\nstep 1 loss=2.3\n"
    assert "".join(client.logs(alloc["ID"], "torchrun", type="stderr")) == "NCCL WARN ✓\n"
    req = fake.requests_to("/v1/client/fs/logs/")[-1]
    assert req.query["plain"] == "true" and req.query["type"] == "stderr" and req.query["follow"] == "false"
    with pytest.raises(UsageError):
        client.logs(alloc["ID"], "torchrun", type="stdlog")
    with pytest.raises(NomadAPIError, match="404"):
        client.logs("no-such-alloc", "torchrun")


def test_logs_follow_streams_until_the_task_ends(fake):
    client = client_for(fake)
    register(client, make_job(2))
    alloc = fake.alloc_for(JOB, "trainer[1]")
    fake.write_log(alloc["ID"], "first\n")
    got_first = threading.Event()
    streamed = []

    def task_keeps_running():
        # The task writes more only once the reader has seen the first chunk: if the client
        # buffered the whole response instead of streaming, this would time out.
        streamed.append(got_first.wait(5))
        fake.write_log(alloc["ID"], "second\n")
        time.sleep(0.05)
        fake.finish(JOB, "trainer[1]", 0)

    writer = threading.Thread(target=task_keeps_running)
    writer.start()
    chunks = []
    for chunk in client.logs(alloc["ID"], "torchrun", follow=True):
        chunks.append(chunk)
        got_first.set()
    writer.join()
    assert streamed == [True]
    assert "".join(chunks) == "first\nsecond\n"  # and the stream ended when the task did


# ------------------------------------------------------------------------------------ watch


def watch(client, timeout=30, clock=None, **kw):
    """watch_job in polling mode (wait_s=0) on a fake clock, until placed."""
    clock = clock or FakeClock()
    return watch_job(client, JOB, placement_timeout_s=timeout, until_placed=True, clock=clock, sleep=clock.sleep,
                     wait_s=0, **kw)


def test_watch_stops_a_half_placed_job_at_its_placement_timeout(one_node_fake):
    client = client_for(one_node_fake)
    register(client, make_job(2))
    clock = FakeClock()
    seen = []
    result = watch(client, 30, clock, on_change=seen.append, poll_s=7)
    assert result.timed_out and result.stopped and not result.placed
    assert clock.sleeps == [7, 7, 7, 7, 2]  # the last sleep is clipped to the deadline
    assert clock.t == 30 and result.elapsed_s == 30
    assert result.state.nodes_running == 1 and "trainer" in result.blocked
    assert "1/2 nodes running" in result.stop_reason and "distinct_hosts" in result.stop_reason
    assert one_node_fake.job_record(JOB)["Stop"] is True
    assert [s.status for s in seen] == [JobStatus.PARTIAL]  # reported once, then unchanged
    assert state_of(client).status is JobStatus.CANCELLED


def test_watch_with_real_time_never_waits_past_the_timeout(one_node_fake):
    client = client_for(one_node_fake)
    register(client, make_job(2))
    start = time.monotonic()
    result = watch_job(client, JOB, placement_timeout_s=1.5, until_placed=True, wait_s=10, poll_s=0.4)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.stopped
    # Never before the timeout; and not held by the blocking query's 10 s wait (generous margin
    # for a loaded 2-core machine, still well short of it).
    assert 1.5 <= elapsed < 1.5 + 6, elapsed
    assert one_node_fake.job_record(JOB)["Stop"] is True


def test_watch_returns_at_once_when_everything_placed(fake):
    client = client_for(fake)
    register(client, make_job(2))
    clock = FakeClock()
    result = watch(client, 30, clock)
    assert result.placed and not result.stopped and not result.timed_out
    assert clock.sleeps == [] and result.state.nodes_running == 2
    assert fake.job_record(JOB)["Stop"] is False


def test_watch_succeeds_when_a_node_joins_later(one_node_fake):
    client = client_for(one_node_fake)
    register(client, make_job(2))
    clock = FakeClock()
    joined = []

    def node_joins(t):
        if t >= 10 and not joined:
            joined.append(t)
            one_node_fake.add_node(FakeNode("gpu-late"))

    clock.hooks.append(node_joins)
    seen = []
    result = watch(client, 60, clock, on_change=seen.append, poll_s=4)
    assert result.placed and not result.stopped
    assert clock.t == 12  # the first poll after the node joined saw it
    assert [s.status for s in seen] == [JobStatus.PARTIAL, JobStatus.RUNNING]
    assert one_node_fake.alloc_for(JOB, "trainer[1]")["NodeName"] == "gpu-late"
    assert one_node_fake.job_record(JOB)["Stop"] is False


def test_a_dead_rank_during_placement_stops_the_job(one_node_fake):
    # Rank 0 crashes while rank 1 still waits for a node: the blocked evaluation would place rank 1
    # later and hold a node for a world that cannot form. The watch stops the job at once.
    client = client_for(one_node_fake)
    register(client, make_job(2))
    clock = FakeClock()

    def rank0_crashes(t):
        if t >= 6 and one_node_fake.alloc_for(JOB, "trainer[0]")["ClientStatus"] == "running":
            one_node_fake.finish(JOB, "trainer[0]", 7)

    clock.hooks.append(rank0_crashes)
    result = watch(client, 60, clock, poll_s=3)
    assert not result.placed and not result.timed_out and result.stopped
    assert result.state.status is JobStatus.FAILED and result.state.exit_code == 7
    assert clock.t == 6
    assert "node rank 0 died first" in result.stop_reason and "node rank 1 (the survivors) was stopped" in result.stop_reason
    assert one_node_fake.job_record(JOB)["Stop"] is True
    assert state_of(client).status is JobStatus.FAILED  # the stop does not turn it into CANCELLED


def test_watch_keeps_polling_through_transient_api_errors(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.fail_next(4, status=500, path_contains="/allocations")  # one whole look fails, retries and all
    clock = FakeClock()
    result = watch(client, 30, clock, poll_s=5)
    assert result.placed and clock.sleeps == [5]


def test_watch_reports_a_stop_that_fails(one_node_fake):
    client = client_for(one_node_fake)
    register(client, make_job(2))

    class StopFails:
        def __getattr__(self, name):
            return getattr(client, name)

        def stop(self, job_id, purge=False):
            raise NomadAPIError("Nomad at x refused to stop job: HTTP 403", status=403)

    clock = FakeClock()
    with pytest.raises(SchedulerError, match=f"nomad job stop {JOB}"):
        watch(StopFails(), 5, clock, poll_s=2)
    assert clock.t == 5


def test_a_dead_rank_is_stopped_within_one_look_of_blocking_queries():
    # A real-time watch with blocking queries: rank 2 of 4 dies; the blocking query answers at
    # once and the survivors are stopped, long before the 30 s wait would have ended.
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(4)], token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(4))
        died = []

        def rank_dies():
            time.sleep(0.5)
            fake.finish(JOB, "trainer[2]", 3)
            died.append(time.monotonic())

        threading.Thread(target=rank_dies, daemon=True).start()
        result = watch_job(client, JOB, wait_s=30)
        stopped_at = time.monotonic()
        assert result.stopped and result.state.status is JobStatus.FAILED and result.state.exit_code == 3
        assert "node rank 2 died first" in result.stop_reason and "node ranks 0-1, 3 (the survivors)" in result.stop_reason
        assert fake.job_record(JOB)["Stop"] is True
        delay = stopped_at - died[0]
        # The blocking query answered on the death, not at the end of its 30 s wait.
        assert delay < 10, delay
        print(f"rank death -> job stopped: {delay * 1000:.0f} ms, {result.calls} calls")


def test_a_node_going_down_reads_node_fail_and_the_watch_stops_the_job():
    # disconnect { replace = false }: the running allocation on the down node becomes "unknown"
    # and is not replaced; the others would hold their GPUs until NCCL's timeout.
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(3)], token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(3))
        victim = fake.alloc_for(JOB, "trainer[1]")
        fake.node_down(victim["NodeName"])
        state = state_of(client)
        assert state.status is JobStatus.NODE_FAIL
        assert f"node rank 1 ({victim['ID'][:8]} on {victim['NodeName']})" in state.reason
        result = watch_job(client, JOB, wait_s=5)
        assert result.stopped and result.state.status is JobStatus.NODE_FAIL
        assert "node rank 1 died first" in result.stop_reason
        assert "node ranks 0, 2 (the survivors) were stopped" in result.stop_reason
        assert fake.job_record(JOB)["Stop"] is True
        assert state_of(client).status is JobStatus.NODE_FAIL  # after the stop, still the node's fault


def test_a_lost_rank_replaced_by_nomad_is_node_fail_not_partial():
    # Without disconnect.replace = false (or on a server older than 1.8) Nomad marks the
    # allocation lost and places a replacement under the same name.
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(3)], token=TOKEN) as fake:
        client = client_for(fake)
        payload = make_job(2)
        for g in payload["Job"]["TaskGroups"]:
            g.pop("Disconnect", None)
        register(client, payload)
        victim = fake.alloc_for(JOB, "trainer[1]")
        fake.node_down(victim["NodeName"])
        replacement = fake.alloc_for(JOB, "trainer[1]")
        assert replacement["ID"] != victim["ID"] and replacement["Name"] == victim["Name"]
        state = state_of(client)
        assert state.status is JobStatus.NODE_FAIL and "starting" not in state.reason
        assert "replacement" in state.reason and victim["NodeName"] in state.reason


def test_cli_watch_stops_the_job_when_a_rank_dies(fake, capsys, monkeypatch):
    from halo_sched import cli

    client = client_for(fake)
    register(client, make_job(2))
    monkeypatch.setattr(cli, "_scheduler", lambda name: _scheduler_for(fake))

    def rank1_dies():
        time.sleep(0.3)
        fake.finish(JOB, "trainer[1]", 5)

    threading.Thread(target=rank1_dies, daemon=True).start()
    t0 = time.monotonic()
    rc = cli.main(["watch", JOB, "--backend", "nomad", "--timeout", "20"])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 1 and elapsed < 5, err
    assert "FAILED" in err and "exit=5" in err and "node rank 1 died first" in err
    assert "node rank 0 (the survivors) was stopped" in err
    assert fake.job_record(JOB)["Stop"] is True


def test_job_wait_stops_the_survivors_of_a_dead_rank(fake):
    from halo_sched.backends.base import Job

    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[0]", 9)
    state = Job(_scheduler_for(fake), JOB).wait(timeout=10)
    assert state.status is JobStatus.FAILED and state.exit_code == 9
    assert "node rank 1 (the survivors) was stopped" in state.reason
    assert fake.job_record(JOB)["Stop"] is True


def test_cli_watch_of_a_completed_job_exits_0(fake, capsys, monkeypatch):
    from halo_sched import cli

    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[1]", 0)
    fake.finish(JOB, "trainer[0]", 0)
    monkeypatch.setattr(cli, "_scheduler", lambda name: _scheduler_for(fake))
    assert cli.main(["watch", JOB, "--backend", "nomad"]) == 0
    assert "COMPLETED" in capsys.readouterr().err


def test_plan_and_submit_warn_about_an_old_server_and_name_client_settings(tmp_path, capsys, monkeypatch):
    import yaml

    from halo_sched import cli

    job = {"name": "ddp", "nodes": 2, "nproc_per_node": 8, "gpus_per_node": 8, "image": "halo/train:1",
           "trainer": {"script": "train.py"},
           "nomad": {"driver": "docker", "volumes": ["/scratch:/scratch"], "max_run_duration": "2h"}}
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    nodes = [FakeNode(n, docker_volumes_enabled=True) for n in ("gpu-a", "gpu-b")]
    with FakeNomad(nodes, token=TOKEN) as fake:
        fake.server_version = "2.0.2"
        monkeypatch.setattr(cli, "_scheduler", lambda name: _scheduler_for(fake))
        assert cli.main(["plan", str(f), "--backend", "nomad"]) == 0
        err = capsys.readouterr().err
        assert "Nomad server 2.0.2 is older than 2.0.3, which max_run_duration needs" in err
        assert "disconnect" not in err  # 2.0.2 has it
        assert "volumes { enabled = true }" in err
        plans = fake.requests_to("/plan")
        assert plans and plans[-1].body["Job"]["ID"].startswith("ddp-2")  # a fresh id, not the name
        assert cli.main(["submit", str(f), "--backend", "nomad"]) == 0
        err = capsys.readouterr().err
        assert "older than 2.0.3" in err and "volumes { enabled = true }" in err


def test_an_idle_watch_costs_two_calls_per_wait():
    # Nothing changes: each blocking query waits out its `wait`, then the job stub is read (a stop
    # of a job without allocations changes none): 2 calls per wait (per minute at wait_s=60).
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(4)], token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(2))
        start = len(fake.requests)
        t0 = time.monotonic()
        result = watch_job(client, JOB, timeout=2.0, wait_s=0.5, poll_s=0.25)
        elapsed = time.monotonic() - t0
        calls = fake.requests[start:]
        assert result.state.status is JobStatus.RUNNING and not result.stopped
        assert not [r for r in calls if r.path == f"/v1/job/{JOB}"]  # never the whole job
        blocking = [r for r in calls if r.path.endswith("/allocations") and r.query.get("index")]
        assert blocking and blocking[0].query["wait"] == "500ms"
        # 1 first look (2 calls) + 2 calls per 0.5 s wait.
        assert len(calls) <= 2 + 2 * (elapsed / 0.5) + 1, [(r.path, r.query) for r in calls]
        print(f"idle watch: {len(calls)} calls in {elapsed:.1f}s with wait=0.5s")


def test_other_jobs_activity_costs_one_call_per_poll():
    # Job.Allocations answers with the allocs *table* index, so a change to another job's
    # allocations between two answers makes the next blocking query answer at once, with nothing
    # new for this job. The watch then waits poll_s before asking again: one call each time.
    with FakeNomad([FakeNode(f"gpu-{i}") for i in range(4)], token=TOKEN) as fake:
        client = client_for(fake)
        register(client, make_job(2))

        class BusyCluster:
            def __getattr__(self, name):
                return getattr(client, name)

            def job_allocations(self, job_id, index=0, wait_s=None):
                out = client.job_allocations(job_id, index=index, wait_s=wait_s)
                with fake._lock:
                    fake._next_index()  # another job's allocation changed meanwhile
                return out

        start = len(fake.requests)
        t0 = time.monotonic()
        result = watch_job(BusyCluster(), JOB, timeout=2.0, wait_s=30, poll_s=0.25)
        elapsed = time.monotonic() - t0
        calls = fake.requests[start:]
        assert result.state.status is JobStatus.RUNNING
        early = [r for r in calls if r.query.get("index")]
        assert len(early) >= elapsed / 0.25 - 2  # the early answers did happen...
        assert len(calls) <= 2 + elapsed / 0.25 + 3, len(calls)  # ...and cost one call per poll_s
        print(f"busy cluster: {len(calls)} calls in {elapsed:.1f}s with poll=0.25s")


def test_job_completed_before_a_stop_stays_completed(fake):
    client = client_for(fake)
    register(client, make_job(2))
    fake.finish(JOB, "trainer[0]", 0)
    fake.finish(JOB, "trainer[1]", 0)
    client.stop(JOB)
    state = state_of(client)
    assert state.status is JobStatus.COMPLETED and state.exit_code == 0


def test_jobs_lists_by_prefix_with_a_summary(fake):
    client = client_for(fake)
    register(client, make_job(1, job_id="halo-a", gpus=1))
    register(client, make_job(1, job_id="other-b", gpus=1))
    jobs = list_jobs(client, prefix="halo-")
    assert [j["ID"] for j in jobs] == ["halo-a"]
    assert jobs[0]["JobSummary"]["Summary"]["trainer"]["Running"] == 1
    assert {j["ID"] for j in list_jobs(client)} == {"halo-a", "other-b"}


def test_fake_frames_logs_when_plain_is_not_asked(fake):
    client = client_for(fake)
    register(client, make_job(1))
    alloc = fake.alloc_for(JOB, "trainer[0]")
    fake.write_log(alloc["ID"], "framed\n")
    resp = requests.get(f"{fake.address}/v1/client/fs/logs/{alloc['ID']}",
                        params={"task": "torchrun", "type": "stdout"}, headers={"X-Nomad-Token": TOKEN}, timeout=5)
    frame = json.loads(resp.text)
    assert base64.b64decode(frame["Data"]).decode() == "framed\n"
    assert frame["File"] == "alloc/logs/torchrun.stdout.0" and frame["Offset"] == 7
