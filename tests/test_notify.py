"""notify: a webhook receiver on loopback gets exactly one JSON POST per event of a job, from the
process that saw the state change, and no POST, record, rendered file or log carries the webhook
URL or a secret_env value. Bad notify fields are exit 2 naming the field."""
from __future__ import annotations

import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest

from helpers import cli, example_job, free_port

SECRET = "tok-9f8e7d6c5b4a"
FAILS = ("import os, sys\nprint('using token', os.environ['MY_TOKEN'], flush=True)\n"
         "raise SystemExit('rank fails, token ' + os.environ['MY_TOKEN'])\n")


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread: keeps every POST; answers ``code``."""

    def __init__(self, code: int = 200):
        self.posts: list[tuple[str, dict]] = []
        self.code = code
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                owner.posts.append((self.path, json.loads(self.rfile.read(n) or b"null")))
                self.send_response(owner.code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/s3cr3t-path-7a1b"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _env(url: str) -> dict:
    return {**os.environ, "HOOK_URL": url, "MY_TOKEN": SECRET}


def _job(tmp_path, on, script=None):
    trainer = {"script": "examples/train_ddp.py", "args": ["--steps", "2"]}
    if script:
        (tmp_path / "fails.py").write_text(script)
        trainer = {"script": str(tmp_path / "fails.py")}
    return example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, trainer=trainer, secret_env=["MY_TOKEN"],
                       notify={"webhook_env": "HOOK_URL", "on": on})


def _nothing_written_holds(url: str, *texts: str, secret: bool = True):
    """Neither the URL (nor its path) nor, with ``secret``, the secret_env value in any file of
    the store or in ``texts``. (A trainer that prints its own token puts it in its logs: that
    failure's test checks the URL only.)"""
    home = Path(os.environ["HALO_SCHED_HOME"])
    for p in home.rglob("*"):
        # A record's .diff is the trainer tree's own uncommitted change (git diff), not anything
        # halo-sched wrote: in a checkout where this test file is itself changed it holds these
        # literals.
        if p.is_file() and p.suffix != ".diff":
            data = p.read_bytes()
            assert url.encode() not in data and b"s3cr3t-path" not in data, p
            assert not secret or SECRET.encode() not in data, p
    for t in texts:
        assert url not in t and "s3cr3t-path" not in t and (not secret or SECRET not in t)


@pytest.mark.torch
def test_one_post_per_event_and_no_secret_anywhere(tmp_path, receiver):
    env = _env(receiver.url)
    job = _job(tmp_path, ["completed", "failed"])
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    # Later observers with the variable set: the event was sent already.
    st = cli("status", job_id, env=env)
    ls = cli("list", env=env)
    assert st.returncode == 0 and ls.returncode == 0
    assert len(receiver.posts) == 1, receiver.posts
    path, body = receiver.posts[0]
    assert path == "/hooks/s3cr3t-path-7a1b"
    assert body["job"] == job_id and body["run"] == job_id and body["state"] == "completed" and body["attempt"] == 1
    assert body["backend"] == "local" and "COMPLETED" in body["line"]
    assert "s3cr3t-path" not in json.dumps(body) and SECRET not in json.dumps(body)
    rendered = cli("render", str(job), "--backend", "local", env=env)
    logs = cli("logs", job_id, env=env)
    _nothing_written_holds(receiver.url, r.stdout, r.stderr, st.stdout, st.stderr, ls.stdout, ls.stderr,
                           rendered.stdout, rendered.stderr, logs.stderr)


@pytest.mark.torch
def test_a_failure_is_one_post_with_its_line_and_the_secret_scrubbed(tmp_path, receiver):
    env = _env(receiver.url)
    job = _job(tmp_path, ["failed"], script=FAILS)
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    cli("status", job_id, env=env)
    assert [b["state"] for _, b in receiver.posts] == ["failed"], receiver.posts
    line = receiver.posts[0][1]["line"]
    assert "rank fails, token ***" in line and SECRET not in line, line
    _nothing_written_holds(receiver.url, r.stderr, secret=False)


@pytest.mark.torch
def test_an_unreachable_webhook_is_bounded_never_fails_the_command_and_a_later_observer_sends(tmp_path):
    bad = Receiver(code=500)
    try:
        env = _env(bad.url)
        job = _job(tmp_path, ["completed"])
        start = time.monotonic()
        r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "was not delivered" in r.stderr and "HTTP 500" in r.stderr, r.stderr[-2000:]
        assert len(bad.posts) == 3  # the bound: 3 tries
        job_id = r.stdout.strip().splitlines()[-1]
        # Without the variable: nothing sent, nothing marked.
        quiet = {k: v for k, v in env.items() if k != "HOOK_URL"}
        assert cli("status", job_id, env=quiet).returncode == 0 and len(bad.posts) == 3
        bad.code = 200
        st = cli("status", job_id, env=env)
        assert st.returncode == 0 and "not delivered" not in st.stderr
        cli("status", job_id, env=env)
        assert len(bad.posts) == 4 and [b["state"] for _, b in bad.posts] == ["completed"] * 4
        assert time.monotonic() - start < 150
        _nothing_written_holds(bad.url, r.stderr, st.stderr)
    finally:
        bad.close()


@pytest.mark.parametrize("notify, env, says", [
    ({"webhook_env": "HOOK_URL"}, {}, "HOOK_URL is not set"),
    ({"webhook_env": "HOOK_URL"}, {"HOOK_URL": "ftp://127.0.0.1/x"}, "not an http:// or https:// URL"),
    ({"webhook_env": "HOOK_URL"}, {"HOOK_URL": "127.0.0.1:9/x"}, "not an http:// or https:// URL"),
])
def test_a_bad_webhook_at_submit_is_exit_2_naming_the_field(tmp_path, notify, env, says):
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, notify=notify)
    e = {k: v for k, v in os.environ.items() if k != "HOOK_URL"} | env
    r = cli("submit", str(job), "--backend", "local", env=e, timeout=60)
    assert r.returncode == 2 and "notify.webhook_env" in r.stderr and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "127.0.0.1" not in r.stderr
    assert not list(Path(os.environ["HALO_SCHED_HOME"]).rglob("*.json"))  # nothing submitted


@pytest.mark.parametrize("notify", [{"webhook_env": "HOOK_URL", "on": ["exploded"]}, {"webhook_env": "9x"},
                                    {"webhook_env": "HOOK_URL", "on": []}, {"on": ["failed"]}, "HOOK_URL"])
def test_bad_notify_fields_are_exit_2_at_validate(tmp_path, notify):
    job = example_job(tmp_path, free_port(), notify=notify)
    r = cli("validate", str(job), timeout=60)
    assert r.returncode == 2 and "notify" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_on_key_is_written_quoted(tmp_path):
    job = tmp_path / "j.yaml"
    head = example_job(tmp_path, free_port()).read_text()
    job.write_text(head + 'notify:\n  webhook_env: HOOK_URL\n  "on": [failed]\n')
    assert cli("validate", str(job), timeout=60).returncode == 0
    job.write_text(head + "notify:\n  webhook_env: HOOK_URL\n  on: [failed]\n")
    r = cli("validate", str(job), timeout=60)
    assert r.returncode == 2 and "key 'on' is read by YAML as a boolean" in r.stderr, r.stderr


def _rec(job_id: str) -> dict:
    return {"id": job_id, "backend": "local", "name": "n",
            "spec": {"secret_env": ["MY_TOKEN"], "notify": {"webhook_env": "HOOK_URL", "on": ["completed", "retried"]}}}


def test_concurrent_observers_send_once(monkeypatch):
    from halo_sched import notify

    slow = Receiver()
    orig = slow.server.RequestHandlerClass.do_POST

    def do_post(self):
        time.sleep(1)  # a slow webhook: every observer arrives while the first is sending
        orig(self)

    slow.server.RequestHandlerClass.do_POST = do_post
    try:
        monkeypatch.setenv("HOOK_URL", slow.url)
        monkeypatch.setenv("MY_TOKEN", SECRET)
        rec = _rec("j-concurrent")
        sent = []
        threads = [threading.Thread(target=lambda: sent.append(notify.send(rec, "completed", "COMPLETED")))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sent.count(True) == 1 and len(slow.posts) == 1, (sent, slow.posts)
        assert notify.send(rec, "completed", "COMPLETED") is False and len(slow.posts) == 1
        # Another event of the same job is its own.
        assert notify.send(rec, "retried", f"attempt 1 failed; token {SECRET}") is True
        assert [b["state"] for _, b in slow.posts] == ["completed", "retried"]
        assert SECRET not in slow.posts[1][1]["line"]
    finally:
        slow.close()


def test_a_dead_webhook_is_waited_on_once_per_process(monkeypatch):
    from halo_sched import notify

    monkeypatch.setattr(notify, "_given_up", set())
    monkeypatch.setattr(notify, "_dead", set())
    dead = Receiver(code=503)
    try:
        monkeypatch.setenv("HOOK_URL", dead.url)
        start = time.monotonic()
        assert not any(notify.send(_rec(f"j{i}"), "completed", "COMPLETED") for i in range(5))
        assert len(dead.posts) == 3 and time.monotonic() - start < 15
    finally:
        dead.close()


def test_the_observers_scrub_leaves_text_alone_for_a_value_too_short_to_scrub(monkeypatch):
    # Issue 28: a secret_env value "x" turned "exit" into "e***it" in the webhook's line.
    from halo_sched import notify

    monkeypatch.setenv("MY_TOKEN", "x")
    body = json.loads(notify._payload(_rec("j1"), "failed", "exit 3: rank x said x", None, "http://127.0.0.1:9/h"))
    assert body["line"] == "exit 3: rank x said x"
    monkeypatch.setenv("MY_TOKEN", "a-long-enough-secret")
    body = json.loads(notify._payload(_rec("j1"), "failed", "auth a-long-enough-secret failed", None, "http://h/"))
    assert body["line"] == "auth *** failed"
