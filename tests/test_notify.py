"""notify: a webhook receiver on loopback gets exactly one JSON POST per event of a job, from a
process that waits on it (or `halo-sched notify`; a read only queues it: test_reads_do_not_act.py), and no POST, record, rendered file or log carries the webhook
URL or a secret_env value. Bad notify fields are exit 2 naming the field."""
from __future__ import annotations

import halo_sched

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

    def __init__(self, code: int = 200, delay: float = 0.0):
        self.posts: list[tuple[str, dict]] = []
        self.seen: list[dict] = []  # each POST's headers
        self.code = code
        self.delay = delay  # seconds before it answers (a slow receiver: it has the POST already)
        self.lock = threading.Lock()  # a POST's headers and body land together, at the same index
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                with owner.lock:
                    owner.seen.append(dict(self.headers))
                    owner.posts.append((self.path, body))
                if owner.delay:
                    time.sleep(owner.delay)
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


def _posts(receiver: "Receiver", n: int, seconds: float = 60) -> list:
    """The receiver's posts once it has ``n`` (delivery runs in the background), or what it has
    after ``seconds``; then a moment more, so that an extra post would show."""
    deadline = time.monotonic() + seconds
    while len(receiver.posts) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    return list(receiver.posts)


def _settled(job_id: str, until=lambda rows: True, seconds: float = 60) -> list:
    """The job's notifications (event, state, tries, claimed_until) once no delivery holds one and
    ``until(rows)`` holds (in the test's store), or as they are after ``seconds``."""
    from halo_sched import db

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = db.read("SELECT event, state, tries, claimed_until FROM outbox WHERE job = ?", (job_id,))
        if rows and all(r[3] < time.time() for r in rows) and until(rows):
            return rows
        time.sleep(0.2)
    return rows


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
    assert len(_posts(receiver, 1)) == 1, receiver.posts
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
    assert [b["state"] for _, b in _posts(receiver, 1)] == ["failed"], receiver.posts
    line = receiver.posts[0][1]["line"]
    assert "rank fails, token ***" in line and SECRET not in line, line
    _nothing_written_holds(receiver.url, r.stderr, secret=False)


@pytest.mark.torch
def test_an_unreachable_webhook_is_bounded_never_fails_the_command_and_halo_sched_notify_sends_later(tmp_path):
    bad = Receiver(code=500)
    try:
        env = _env(bad.url)
        job = _job(tmp_path, ["completed"])
        r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        job_id = r.stdout.strip().splitlines()[-1]
        assert [(e, st, n) for e, st, n, _ in _settled(job_id, lambda rows: rows[0][2] == 3)] == [
            ("completed", "pending", 3)]
        assert len(bad.posts) == 3  # the bound: 3 tries
        # Never lost silently: status says it was not delivered, and why.
        quiet = {k: v for k, v in env.items() if k != "HOOK_URL"}
        st = cli("status", job_id, env=quiet)
        assert st.returncode == 0 and "notification is not delivered yet (3 tries: HTTP 500)" in st.stderr, st.stderr
        assert "`halo-sched notify`" in st.stderr, st.stderr  # and how it gets delivered
        st = cli("status", job_id, env=env)  # a read sends nothing, variable or not
        time.sleep(2)
        assert len(bad.posts) == 3
        assert "the next try is due in" in st.stderr, st.stderr  # the backoff: a cron line waits for it
        bad.code = 200
        st = cli("notify", env=env)
        assert st.returncode == 0 and "0 delivered" in st.stderr and "1 waiting for a next try" in st.stderr, st.stderr
        assert len(bad.posts) == 3
        st = cli("notify", "--now", env=env)
        assert st.returncode == 0 and "1 delivered" in st.stderr, st.stderr
        assert [(e, s_) for e, s_, _, _ in _settled(job_id, lambda rows: rows[0][1] != "pending")] == [
            ("completed", "delivered")]
        cli("status", job_id, env=env)
        assert len(_posts(bad, 4)) == 4 and [b["state"] for _, b in bad.posts] == ["completed"] * 4
        assert len({b["delivery_id"] for _, b in bad.posts}) == 1  # one event, one id to de-duplicate on
        st = cli("status", job_id, env=env)
        assert "not delivered" not in st.stderr
        _nothing_written_holds(bad.url, r.stderr, st.stderr)
    finally:
        bad.close()


@pytest.mark.torch
def test_a_slow_webhook_never_holds_submit_wait(tmp_path):
    """The issue's webhook: it takes the POST and answers one byte every 2 s. submit --wait of a
    job that fails at once returns while the webhook is still answering; the delivery gives the
    try up at its deadline and does not repeat it in the same run (the receiver has the POST)."""
    gate = threading.Event()
    finished: list[float] = []  # one per try the webhook saw end (the sender gave up on it)
    slow = Receiver()

    def do_post(self):
        n = int(self.headers.get("Content-Length") or 0)
        slow.posts.append((self.path, json.loads(self.rfile.read(n) or b"null")))
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(40):  # one byte every 2 s, until the test ends
            if gate.wait(2):
                break
            try:
                self.wfile.write(b"X")
                self.wfile.flush()
            except OSError:
                break
        finished.append(time.monotonic())

    slow.server.RequestHandlerClass.do_POST = do_post
    try:
        env = _env(slow.url)
        job = _job(tmp_path, ["failed"], script=FAILS)
        r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
        assert r.returncode == 1, r.stderr[-3000:]
        # The command ended before the delivery's try did (its deadline is 15 s after the job's end).
        assert finished == [], finished
        job_id = r.stdout.strip().splitlines()[-1]
        rows = _settled(job_id, lambda rows: rows[0][2] >= 1)
        assert rows[0][1] == "pending" and rows[0][2] == 1 and len(slow.posts) == 1, (rows, slow.posts)
        st = cli("status", job_id, env={k: v for k, v in env.items() if k != "HOOK_URL"})
        assert "(1 try: no answer within 15 s); the next try is due in " in st.stderr, st.stderr
    finally:
        gate.set()
        slow.close()


@pytest.mark.torch
def test_submit_wait_delivers_a_webhook_that_answers_200_after_5_s_once(tmp_path):
    """Issue 43: such a webhook got each event 6 times in one submit --wait, and status still said
    "not delivered yet"; each cron `notify` added 3 more."""
    slow = Receiver(delay=5.0)
    try:
        env = _env(slow.url)
        job = _job(tmp_path, ["completed"])
        r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        job_id = r.stdout.strip().splitlines()[-1]
        rows = _settled(job_id, lambda rows: rows[0][1] != "pending")
        assert [(e, st, n) for e, st, n, _ in rows] == [("completed", "delivered", 1)], rows
        st = cli("status", job_id, env=env)
        assert "notify:" not in st.stderr, st.stderr
        cron = cli("notify", env=env)
        assert cron.returncode == 0 and "0 delivered" in cron.stderr, cron.stderr
        assert len(_posts(slow, 1)) == 1, slow.posts
        assert slow.seen[0]["X-Halo-Delivery"] == slow.posts[0][1]["delivery_id"]
    finally:
        slow.close()


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


def test_the_on_key_is_written_bare_or_quoted(tmp_path):
    """YAML 1.1 reads a plain ``on`` as true; as a key, the loader keeps it the name written."""
    job = tmp_path / "j.yaml"
    head = example_job(tmp_path, free_port()).read_text()
    for key in ('"on"', "on"):
        job.write_text(head + f"notify:\n  webhook_env: HOOK_URL\n  {key}: [failed]\n")
        r = cli("validate", str(job), timeout=60)
        assert r.returncode == 0, (key, r.stderr)
        assert halo_sched.load(job).notify.on == ["failed"]


def _rec(job_id: str) -> dict:
    return {"id": job_id, "backend": "local", "name": "n",
            "spec": {"secret_env": ["MY_TOKEN"], "notify": {"webhook_env": "HOOK_URL", "on": ["completed", "retried"]}}}


def test_concurrent_observers_queue_once_and_one_delivery_sends_it(monkeypatch):
    from halo_sched import notify

    r = Receiver()
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        monkeypatch.setenv("MY_TOKEN", SECRET)
        rec = _rec("j-concurrent")
        queued = []
        threads = [threading.Thread(target=lambda: queued.append(notify.send(rec, "completed", "COMPLETED", start=False)))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert queued.count(True) == 1, queued
        assert notify.deliver_pending() == 1 and notify.deliver_pending() == 0 and len(r.posts) == 1
        assert notify.send(rec, "completed", "COMPLETED", start=False) is False
        # Another event of the same job is its own; a secret it quotes is scrubbed before it is queued.
        assert notify.send(rec, "retried", f"attempt 1 failed; token {SECRET}", start=False) is True
        assert notify.deliver_pending() == 1
        assert [b["state"] for _, b in r.posts] == ["completed", "retried"]
        assert SECRET not in r.posts[1][1]["line"]
        from halo_sched import db

        assert SECRET not in json.dumps(db.read("SELECT * FROM outbox"))
    finally:
        r.close()


class Redirecting(Receiver):
    """Answers every POST on /from with ``code`` and Location ``to``; keeps every request."""

    def __init__(self, code: int, to: str):
        super().__init__()
        owner = self
        self.gets: list[str] = []
        self.headers: list[dict] = []
        base = self.server.RequestHandlerClass

        class Handler(base):
            def do_POST(self):  # noqa: N802
                owner.headers.append(dict(self.headers))
                if self.path == "/from":
                    n = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(n)
                    self.send_response(code)
                    self.send_header("Location", to.replace("PORT", str(owner.server.server_address[1])))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                base.do_POST(self)

            def do_GET(self):  # noqa: N802
                owner.gets.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server.RequestHandlerClass = Handler
        self.port = self.server.server_address[1]


@pytest.mark.parametrize("code, to, delivered, why", [
    (302, "http://127.0.0.1:PORT/to", False, "HTTP 302 redirect not followed"),
    (303, "http://127.0.0.1:PORT/to", False, "HTTP 303 redirect not followed"),
    (307, "http://127.0.0.1:PORT/to", True, ""),
    (308, "/to", True, ""),
    (307, "ftp://127.0.0.1:PORT/to", False, "not an http:// or https:// URL"),
])
def test_redirects_keep_the_post_or_are_not_followed(monkeypatch, code, to, delivered, why):
    from halo_sched import notify

    r = Redirecting(code, to)
    try:
        monkeypatch.setenv("HOOK_URL", f"http://127.0.0.1:{r.port}/from")
        notify.send(_rec("j-redirect"), "completed", "COMPLETED", start=False)
        assert notify.deliver_pending() == int(delivered)
        assert r.gets == []  # a POST never became a bodiless GET
        if delivered:
            assert [(p, b["state"]) for p, b in r.posts] == [("/to", "completed")]
        else:
            assert r.posts == [] and len(r.headers) == 1  # refused at once: no retry can fix it
            assert notify.outcomes("j-redirect", "local")[0][3].startswith(why)
    finally:
        r.close()


def test_an_upper_case_scheme_is_sent_and_user_info_becomes_an_authorization_header(monkeypatch):
    from halo_sched import notify

    r = Redirecting(200, "")
    try:
        monkeypatch.setenv("HOOK_URL", f"HTTP://hook-user:p%40ss@127.0.0.1:{r.port}/x")
        notify.send(_rec("j-auth"), "completed", "COMPLETED", start=False)
        assert notify.deliver_pending() == 1 and [p for p, _ in r.posts] == ["/x"]
        import base64

        assert r.headers[0]["Authorization"] == "Basic " + base64.b64encode(b"hook-user:p@ss").decode()
    finally:
        r.close()


def test_one_deadline_bounds_a_try_even_a_name_lookup_that_never_returns(monkeypatch):
    from halo_sched import notify

    def stuck(*a, **k):
        time.sleep(60)

    monkeypatch.setattr(notify, "TRY_S", 1.0)
    monkeypatch.setattr(notify, "BUDGET_S", 4.0)
    monkeypatch.setattr("socket.getaddrinfo", stuck)
    start = time.monotonic()
    why, tries = notify._deliver("http://hooks.example.invalid/x", b"{}")
    # No answer in time: not repeated in this run (a receiver may still be at work on it); the
    # next run tries again after the backoff.
    assert why.startswith("no answer within") and tries == 1
    assert time.monotonic() - start < 10


def test_the_observers_scrub_leaves_text_alone_for_a_value_too_short_to_scrub(monkeypatch):
    # Issue 28: a secret_env value "x" turned "exit" into "e***it" in the webhook's line.
    from halo_sched import notify

    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/h")
    monkeypatch.setenv("MY_TOKEN", "x")
    body = json.loads(notify._payload(_rec("j1"), "failed", "exit 3: rank x said x", None))
    assert body["line"] == "exit 3: rank x said x"
    monkeypatch.setenv("MY_TOKEN", "a-long-enough-secret")
    body = json.loads(notify._payload(_rec("j1"), "failed", "auth a-long-enough-secret failed", None))
    assert body["line"] == "auth *** failed"


# ---- at least once: one delivery id, a slow success delivered, backoff across runs, leases --------


def _hook_env(url: str) -> dict:
    return {**os.environ, "HOOK_URL": url}


def _row(job_id: str) -> tuple:
    from halo_sched import db

    return db.read("SELECT state, tries, next_try, claimed_until, claimed_by FROM outbox WHERE job = ?", (job_id,))[0]


def _ids(receiver: "Receiver") -> set[str]:
    """Every delivery id the receiver was given: in the body and in both headers, one per POST."""
    ids = set()
    for (_, body), headers in zip(receiver.posts, receiver.seen):
        assert headers["Idempotency-Key"] == headers["X-Halo-Delivery"] == body["delivery_id"], (headers, body)
        ids.add(body["delivery_id"])
    return ids


def test_a_webhook_that_answers_200_after_5_s_is_delivered_once(monkeypatch):
    """The issue's webhook: it answers 200 after 5 s. One `notify` run delivers it, once, and
    records it delivered; another run sends nothing."""
    from halo_sched import notify

    r = Receiver(delay=5.0)
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        assert notify.send(_rec("j-slow"), "completed", "COMPLETED", start=False)
        run = cli("notify", env=_hook_env(r.url), timeout=120)
        assert run.returncode == 0 and "1 delivered" in run.stderr, run.stderr
        assert len(r.posts) == 1 and _row("j-slow")[:2] == ("delivered", 1)
        assert len(_ids(r)) == 1
        assert notify.undelivered_lines("j-slow", "local") == []  # what status says of it: nothing
        again = cli("notify", env=_hook_env(r.url), timeout=120)
        assert again.returncode == 0 and "0 delivered" in again.stderr and len(r.posts) == 1, again.stderr
    finally:
        r.close()


def test_retries_back_off_across_runs_and_every_try_carries_one_delivery_id(monkeypatch):
    from halo_sched import notify

    r = Receiver(code=500)
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        notify.send(_rec("j-backoff"), "completed", "COMPLETED", start=False)
        before = time.time()
        first = cli("notify", env=_hook_env(r.url), timeout=120)
        assert first.returncode == 1 and len(r.posts) == notify.TRIES, (first.stderr, r.posts)
        assert "not delivered yet (3 tries: HTTP 500); the next try is due in 2 min" in first.stderr, first.stderr
        state, tries, next_try, claimed_until, claimed_by = _row("j-backoff")
        assert (state, tries, claimed_until, claimed_by) == ("pending", 3, 0, "")
        assert before + notify.backoff_s(3) <= next_try <= time.time() + notify.backoff_s(3)
        # The outbox remembers: a run before the next try is due (a cron line, an actor) sends
        # nothing and is no failure; status says when the next try is due.
        second = cli("notify", env=_hook_env(r.url), timeout=120)
        assert second.returncode == 0 and len(r.posts) == 3, second.stderr
        assert "1 waiting for a next try (the next try is due in 2 min" in second.stderr, second.stderr
        assert notify.start_delivery() is False  # nothing due: no background delivery either
        (line,) = notify.undelivered_lines("j-backoff", "local")  # what status says of it
        assert "(3 tries: HTTP 500); the next try is due in 2 min" in line, line
        r.code = 200
        third = cli("notify", "--now", env=_hook_env(r.url), timeout=120)
        assert third.returncode == 0 and "1 delivered" in third.stderr and len(r.posts) == 4, third.stderr
        assert len(_ids(r)) == 1  # the same id in every try of both runs: the receiver's key to de-duplicate
        assert _row("j-backoff")[:2] == ("delivered", 4)
    finally:
        r.close()


def test_the_backoff_doubles_per_try_up_to_its_ceiling():
    from halo_sched import notify

    assert [notify.backoff_s(n) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert notify.backoff_s(30) == notify.backoff_s(10 ** 6) == notify.BACKOFF_MAX_S == 3600


def test_eight_concurrent_notify_runs_deliver_each_event_once_and_none_fails(monkeypatch):
    """The adversary's test: 8 `halo-sched notify` at once against a healthy receiver (one that
    takes a second to answer, so that the runs overlap): each event is delivered once, and a row
    another run is delivering is no failure (6 of 8 exited 1)."""
    import subprocess
    import sys

    from halo_sched import notify

    r = Receiver(delay=1.0)
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        jobs = [f"j-many-{i}" for i in range(6)]
        for j in jobs:
            notify.send(_rec(j), "completed", "COMPLETED", start=False)
        procs = [subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "notify"], env=_hook_env(r.url),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
        results = []
        try:
            for p in procs:
                _, err = p.communicate(timeout=180)
                results.append((p.returncode, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert [rc for rc, _ in results] == [0] * 8, results
        assert sorted(b["job"] for _, b in r.posts) == jobs and len(_ids(r)) == 6
        assert sum(int(err.split("notify: ")[-1].split(" delivered")[0]) for _, err in results) == 6, results
        from halo_sched import db

        assert db.read("SELECT DISTINCT state FROM outbox") == [("delivered",)]
    finally:
        r.close()


def test_a_row_a_live_run_holds_is_in_flight_and_a_dead_runs_lease_is_taken_over(monkeypatch):
    import socket
    import subprocess
    import sys

    from halo_sched import db, notify

    r = Receiver()
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        notify.send(_rec("j-leased"), "completed", "COMPLETED", start=False)
        with db.write() as c:  # held by a live process of this host (this test) for a minute
            c.execute("UPDATE outbox SET claimed_until = ?, claimed_by = ?",
                      (time.time() + 60, f"{socket.gethostname()}:{os.getpid()}:elsewhere"))
        run = cli("notify", env=_hook_env(r.url), timeout=120)
        assert run.returncode == 0 and "1 being delivered by another halo-sched process" in run.stderr, run.stderr
        assert "not delivered" not in run.stderr and r.posts == []
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(30)
        with db.write() as c:  # its run died: the lease is taken over at once, not in a minute
            c.execute("UPDATE outbox SET claimed_by = ?", (f"{socket.gethostname()}:{gone.pid}:dead",))
        run = cli("notify", env=_hook_env(r.url), timeout=120)
        assert run.returncode == 0 and "1 delivered" in run.stderr and len(r.posts) == 1, run.stderr
        with db.write() as c:  # another host's lease stands until it expires
            c.execute("UPDATE outbox SET state = 'pending', claimed_until = ?, claimed_by = ?",
                      (time.time() + 60, "another-host.example:1:x"))
        assert notify.deliver_pending() == 0 and len(r.posts) == 1
    finally:
        r.close()


def test_a_store_of_the_first_schema_migrates_and_its_queued_row_gets_a_delivery_id(monkeypatch):
    import sqlite3

    from halo_sched import db, notify

    home = Path(os.environ["HALO_SCHED_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(home / "halo-sched.db")
    for stmt in db._statements(db.MIGRATIONS[1]):
        con.execute(stmt)
    con.execute("PRAGMA user_version = 1")
    con.execute("INSERT INTO outbox (job, backend, event, webhook_env, payload, created, tries) VALUES "
                "('j-old', 'local', 'completed', 'HOOK_URL', ?, 1.0, 2)", (json.dumps({"job": "j-old"}),))
    con.commit()
    con.close()
    r = Receiver()
    try:
        monkeypatch.setenv("HOOK_URL", r.url)
        assert notify.deliver_pending() == 1
        (delivery_id,) = _ids(r)
        assert len(delivery_id) == 32 and _row("j-old")[:2] == ("delivered", 3)
        assert json.loads(db.read("SELECT payload FROM outbox")[0][0])["delivery_id"] == delivery_id
    finally:
        r.close()
