"""A Nomad that cannot be reached: short honest lines, and an end that says what is known.

A mistyped NOMAD_ADDR (a closed loopback port: every connection refused) sends nothing, so the
end is "nothing reached Nomad; the job was not submitted" (exit 1), never "unknown". Only a
request that may have been sent (the connection dropped after it) leaves the outcome unknown
(exit 3, with the token to look for).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import TOKEN_META, NomadAPIError, NomadClient, NomadConfig
from halo_sched.errors import OutcomeUnknown
from halo_sched.retry import Ambiguous, Transient
from helpers import REPO, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
sample_job = load_nomad_helper("sample_job")
TOKEN = "tok-unreachable"


def closed_port() -> int:
    """A loopback port nobody listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_text() -> str:
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=8, nproc_per_node=8)
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None)
    return yaml.safe_dump(data)


def _spec():
    from halo_sched.spec import loads

    return loads(_job_text())


@pytest.fixture
def job_file(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(_job_text())
    return f


def submit(job_file, *extra, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(NOMAD_ADDR=f"http://127.0.0.1:{port}", HALO_SUBMIT_RETRY_S="4")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", str(job_file), "--backend", "nomad", *extra],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return r, time.monotonic() - t0


def test_a_refused_connection_says_nothing_reached_nomad(job_file):
    port = closed_port()
    r, took = submit(job_file, port=port)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert all(len(line) < 200 for line in lines), [line for line in lines if len(line) >= 200]
    retries = [line for line in lines if "(attempt " in line]
    assert len(retries) >= 2, r.stderr
    for line in retries:
        assert f"Nomad at http://127.0.0.1:{port}: connection refused (attempt " in line and "retrying in" in line
    assert "nothing reached Nomad" in lines[-1] and "the job was not submitted" in lines[-1], lines[-1]
    assert len(lines[-1]) <= 160 and "retry once Nomad answers" in lines[-1], lines[-1]
    assert "unknown" not in r.stderr and "may have reached" not in r.stderr
    # urllib3's whole story only with --debug.
    assert "HTTPConnection" not in r.stderr and "Max retries" not in r.stderr and "Errno" not in r.stderr
    assert r.stdout == "" and took < 60
    r, _ = submit(job_file, "--debug", port=port)
    assert r.returncode == 1 and "Connection refused" in r.stderr and "nothing reached Nomad" in r.stderr


def test_a_request_that_may_have_been_applied_leaves_the_outcome_unknown():
    # The register is applied and its answer lost; then Nomad goes away (every later connection
    # refused): the lookup can never tell, so the outcome is unknown (exit 3), never "not submitted".
    fake = fake_api.FakeNomad([fake_api.FakeNode("gpu-a")], token=TOKEN).start()
    try:
        cfg = NomadConfig.from_env(env={}, address=fake.address, token=TOKEN, retry_base_s=0.01, retry_max_wait_s=0.05)
        client = NomadClient(cfg, sleep=lambda s: None)
        payload = NomadScheduler(client=client).dryrun(_spec()).payload
        payload["Job"]["Meta"][TOKEN_META] = "tok-1"
        fake.drop_after_next(1, path_contains="/v1/jobs", method="POST")
        lines = []

        def on_retry(line):
            lines.append(line)
            fake.close()

        with pytest.raises(OutcomeUnknown, match=r"outcome unknown \(may have reached Nomad\): look for token tok-1$") as info:
            client.submit_job(payload, "tok-1", retry_s=2, on_retry=on_retry)
        assert info.value.exit_code == 3
        assert lines and all(len(line) < 200 and "\n" not in line for line in lines), lines
        assert "closed the connection before answering" in lines[0] or "reset the connection" in lines[0], lines
    finally:
        fake.close()


def test_one_attempt_tells_refused_from_dropped():
    cfg = NomadConfig.from_env(env={}, address=f"127.0.0.1:{closed_port()}")
    client = NomadClient(cfg, sleep=lambda s: None)
    with pytest.raises(Transient, match=": connection refused$"):
        client._call_once("read job", client._read_job, "x")
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")], token=TOKEN) as fake:
        cfg = NomadConfig.from_env(env={}, address=fake.address, token=TOKEN)
        client = NomadClient(cfg, sleep=lambda s: None)
        fake.drop_next(1, path_contains="/v1/job/")
        with pytest.raises(Ambiguous) as info:
            client._call_once("read job", client._read_job, "x")
        assert len(str(info.value)) < 120, info.value
        fake.fail_next(1, status=503, body="No cluster leader\n" + "x" * 2000, path_contains="/v1/job/")
        with pytest.raises(Ambiguous, match="answered HTTP 503 'No cluster leader'$"):
            client._call_once("read job", client._read_job, "x")


def test_a_status_call_to_a_closed_port_is_one_short_line():
    cfg = NomadConfig.from_env(env={}, address=f"127.0.0.1:{closed_port()}", retry_base_s=0.01, retry_max_wait_s=0.05)
    with pytest.raises(NomadAPIError) as info:
        sample_job.read_job(NomadClient(cfg), "x")
    text = str(info.value)
    assert "connection refused" in text and "NOMAD_ADDR" in text and len(text) < 160, text
    assert info.value.kind == "unreachable" and "HTTPConnection" not in text


# ---- each condition in one short line, true about what happened, naming what to do ----------

LIMIT = 160


def run_cli(*args, env_extra: dict, timeout: float = 60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(HALO_SUBMIT_RETRY_S="2", **env_extra)
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def short_lines(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and all(len(line) <= LIMIT for line in lines), [(len(line), line) for line in lines]
    for noise in ("HTTPConnection", "HTTPSConnection", "Max retries", "Caused by", "urllib3", "Traceback"):
        assert noise not in text, text
    return lines


def test_nothing_listening_says_connection_refused_in_one_line(job_file):
    addr = f"http://127.0.0.1:{closed_port()}"
    r = run_cli("status", "some-job", "--backend", "nomad", env_extra={"NOMAD_ADDR": addr})
    assert r.returncode == 1
    (line,) = short_lines(r.stderr)
    assert f"nothing reached Nomad at {addr}: connection refused" in line and "check NOMAD_ADDR" in line, line
    # plan stops at the first request that nothing answered: no word about ACL permissions.
    r = run_cli("plan", str(job_file), "--backend", "nomad", env_extra={"NOMAD_ADDR": addr})
    assert r.returncode == 1
    lines = short_lines(r.stderr)
    assert len(lines) == 1 and f"nothing reached Nomad at {addr}: connection refused" in lines[0], lines
    assert "agent:read" not in r.stderr and "node:read" not in r.stderr and "server version" not in r.stderr
    # --debug adds the exception behind the line.
    r = run_cli("status", "some-job", "--backend", "nomad", "--debug", env_extra={"NOMAD_ADDR": addr})
    assert r.returncode == 1 and "nothing reached Nomad" in r.stderr and "Connection refused" in r.stderr


def test_a_misspelt_host_name_says_it_does_not_resolve(monkeypatch, capsys):
    # No lookup leaves this machine: the resolver is replaced for the misspelt name alone.
    import socket

    from halo_sched.cli import main

    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kw):
        if host == "nomda.example.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("NOMAD_ADDR", "http://nomda.example.invalid:4646")
    assert main(["status", "some-job", "--backend", "nomad"]) == 1
    (line,) = short_lines(capsys.readouterr().err)
    assert "nothing reached Nomad at http://nomda.example.invalid:4646: its host name does not resolve" in line, line
    assert "check NOMAD_ADDR" in line


def test_watch_ends_at_once_when_nomad_addr_never_resolved(monkeypatch, capsys):
    # A job with a record, NOMAD_ADDR misspelt: a name that never resolved since the command
    # started is a typo, not an outage: exit 3 in seconds with the DNS line, not the whole budget.
    import socket

    from halo_sched import records
    from halo_sched.cli import main

    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kw):
        if host == "nomda.example.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("NOMAD_ADDR", "http://nomda.example.invalid:4646")
    records.write({"id": "train-1", "backend": "nomad", "submitted": 1.0, "name": "train",
                   "last_state": {"status": "RUNNING", "describe": "RUNNING 2/2 nodes running"}})
    monkeypatch.setenv("HALO_OUTAGE_S", "30")
    t0 = time.monotonic()
    assert main(["watch", "train-1", "--backend", "nomad"]) == 3
    took = time.monotonic() - t0
    lines = short_lines(capsys.readouterr().err)
    assert lines[-1] == ("halo-sched: train-1: outcome unknown: nothing reached Nomad at "
                         "http://nomda.example.invalid:4646: its host name does not resolve; check NOMAD_ADDR"), lines
    assert not any("waiting up to" in line for line in lines), lines  # no outage announced
    assert took < 20, took  # before: the whole budget


def test_a_name_that_resolved_before_is_an_outage_to_wait_through():
    # DNS can fail for a while during a failover: once the address answered in this process,
    # "does not resolve" is waited through like any outage.
    from halo_sched.backends.nomad import transport

    addr = "http://nomad.cluster.example.invalid:4646"
    err = NomadAPIError(f"nothing reached Nomad at {addr}: its host name does not resolve; check NOMAD_ADDR",
                        address=addr, kind="unreachable",
                        short=f"nothing reached Nomad at {addr}: its host name does not resolve")
    assert transport.never_resolved(err)
    transport._ANSWERED.add(addr)
    try:
        assert not transport.never_resolved(err)
    finally:
        transport._ANSWERED.discard(addr)
    refused = NomadAPIError("x", address="http://127.0.0.1:1", kind="unreachable",
                            short="nothing reached Nomad at http://127.0.0.1:1: connection refused")
    assert not transport.never_resolved(refused)  # a refused connection: an outage (or a stopped agent)


def test_https_at_a_plain_http_server_says_it_does_not_speak_tls(job_file):
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")]) as fake:  # plain HTTP
        addr = f"https://127.0.0.1:{fake.port}"
        for args in (("status", "some-job", "--backend", "nomad"), ("plan", str(job_file), "--backend", "nomad"),
                     ("cancel", "some-job", "--backend", "nomad")):
            r = run_cli(*args, env_extra={"NOMAD_ADDR": addr})
            assert r.returncode == 1, (args, r.stderr)
            (line,) = short_lines(r.stderr)
            assert f"the server at 127.0.0.1:{fake.port} does not speak TLS: use NOMAD_ADDR=http://127.0.0.1:" \
                   f"{fake.port}" in line, line
            assert "NOMAD_CACERT" not in line and "WRONG_VERSION_NUMBER" not in line
        r = run_cli("status", "some-job", "--backend", "nomad", "--debug", env_extra={"NOMAD_ADDR": addr})
        assert "WRONG_VERSION_NUMBER" in r.stderr  # the exception behind it, on request


def test_forbidden_names_the_capability_the_token_lacks(job_file):
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")], acl_tokens={"reader": "read"}) as fake:
        r = run_cli("status", "some-job", "--backend", "nomad", env_extra={"NOMAD_ADDR": fake.address})
        assert r.returncode == 1
        (line,) = short_lines(r.stderr)
        assert "Nomad refused to list jobs (HTTP 403, no ACL token sent): set NOMAD_TOKEN to a token with the " \
               "list-jobs capability" in line, line
        r = run_cli("submit", str(job_file), "--backend", "nomad",
                    env_extra={"NOMAD_ADDR": fake.address, "NOMAD_TOKEN": "reader"})
        assert r.returncode == 1
        last = r.stderr.splitlines()[-1]  # (the lines before list the client settings the job needs)
        assert len(last) <= LIMIT, last
        assert "HTTP 403 'Permission denied'" in last and "NOMAD_TOKEN lacks the submit-job capability" in last, last
        assert "reader" not in r.stderr  # never the token itself
        r = run_cli("status", "some-job", "--backend", "nomad",
                    env_extra={"NOMAD_ADDR": fake.address, "NOMAD_TOKEN": "not-a-token"})
        (line,) = short_lines(r.stderr)
        assert "does not know the ACL token in NOMAD_TOKEN" in line and "not-a-token" not in line, line


@pytest.fixture
def web_server():
    """A loopback web server that is not Nomad: every path is an HTML 404 (and POST a 501)."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_server_that_is_not_nomad_is_not_taken_for_one(web_server, job_file):
    for args in (("status", "some-job"), ("cancel", "some-job"), ("plan", str(job_file)), ("submit", str(job_file)),
                 ("logs", "some-job")):
        r = run_cli(*args, "--backend", "nomad", env_extra={"NOMAD_ADDR": web_server})
        assert r.returncode == 1, (args, r.stderr)
        # (submit first lists the client settings the job needs, and that the script inside the
        # image is not checked; it then stops at once: a server that is not Nomad does not become
        # one by retrying)
        (line,) = short_lines("\n".join(x for x in r.stderr.splitlines()
                                        if "every Nomad client" not in x and "trainer.script" not in x))
        assert f"{web_server} is not a Nomad agent's API" in line and "check NOMAD_ADDR" in line, line
        # Its 404 is not Nomad saying "no such job", nor a permission problem.
        assert "no Nomad job" not in line and "no job" not in line and "agent:read" not in r.stderr


@pytest.fixture
def nobody_accepts():
    """A loopback port whose listen backlog is full: a connect there hangs (its SYNs are dropped),
    as with a host that is down or a firewall that drops packets."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(c)
        yield port
    finally:
        for c in fillers:
            c.close()
        srv.close()


def test_a_connection_nobody_accepts_is_bounded_and_named(nobody_accepts):
    port = nobody_accepts
    cfg = NomadConfig.from_env(env={}, address=f"127.0.0.1:{port}", retry_attempts=1, connect_timeout_s=0.3)
    with pytest.raises(NomadAPIError) as info:
        sample_job.read_job(NomadClient(cfg), "x")
    text = str(info.value)
    assert f"nothing reached Nomad at http://127.0.0.1:{port}: no connection within 0.3s" in text, text
    assert len(text) <= LIMIT and info.value.kind == "unreachable"


# ---- list never waits on a Nomad that is down ---------------------------------------------------


def test_list_shows_last_known_states_at_once_when_nomad_is_down(nobody_accepts):
    from halo_sched import records

    records.write({"id": "train-1", "backend": "nomad", "submitted": 1.0, "name": "train",
                   "last_state": {"status": "RUNNING", "describe": "RUNNING 2/2 nodes running"}})
    from halo_sched.backends.nomad import LIST_CONNECT_S
    from helpers import free_port

    # The baseline, in the same test on the same machine: a port that refuses at once.
    t0 = time.monotonic()
    run_cli("list", env_extra={"NOMAD_ADDR": f"http://127.0.0.1:{free_port()}"})
    base = time.monotonic() - t0
    addr = f"http://127.0.0.1:{nobody_accepts}"
    t0 = time.monotonic()
    r = run_cli("list", env_extra={"NOMAD_ADDR": addr})
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    (note,) = short_lines(r.stderr)
    assert note.startswith("halo-sched: nomad: nothing reached Nomad at") and "no connection within" in note, note
    assert note.endswith("states below: last known"), note
    assert "train-1" in r.stdout and "RUNNING 2/2 nodes running (last known)" in r.stdout
    # One short connect past the baseline, with a loaded machine's margin; before: 4 attempts of a
    # 10 s connect within a 15 s budget (about 20 s past it).
    assert took < base + LIST_CONNECT_S + 4, (took, base)
    r = run_cli("list", "--debug", env_extra={"NOMAD_ADDR": addr})
    assert r.returncode == 0 and "ConnectTimeout" in r.stderr  # the exception behind the note, on request


def test_list_asks_nomad_once_with_a_short_connect_timeout(monkeypatch):
    from halo_sched.backends.nomad import LIST_CONNECT_S, NomadScheduler

    monkeypatch.setenv("NOMAD_ADDR", "http://127.0.0.1:4646")
    quick = NomadScheduler().for_listing()
    cfg = quick._client_for().config
    assert cfg.retry_attempts == 1 and cfg.connect_timeout_s == LIST_CONNECT_S <= 0.5
    assert NomadScheduler()._client_for().config.retry_attempts > 1  # other commands keep their retries
