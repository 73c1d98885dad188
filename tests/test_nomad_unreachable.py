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
        assert f"Nomad at http://127.0.0.1:{port} refused the connection (attempt " in line and "retrying in" in line
    assert "nothing reached Nomad" in lines[-1] and "the job was not submitted" in lines[-1], lines[-1]
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

        with pytest.raises(OutcomeUnknown, match="whether it took effect is unknown: look for token tok-1") as info:
            client.submit_job(payload, "tok-1", retry_s=2, on_retry=on_retry)
        assert info.value.exit_code == 3
        assert lines and all(len(line) < 200 and "\n" not in line for line in lines), lines
        assert "closed the connection before answering" in lines[0] or "reset the connection" in lines[0], lines
    finally:
        fake.close()


def test_one_attempt_tells_refused_from_dropped():
    cfg = NomadConfig.from_env(env={}, address=f"127.0.0.1:{closed_port()}")
    client = NomadClient(cfg, sleep=lambda s: None)
    with pytest.raises(Transient, match="refused the connection$"):
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
    assert "refused the connection" in text and "NOMAD_ADDR" in text and len(text) < 160, text
    assert "HTTPConnection" not in text
