"""A secret on several lines is still a secret (issue 43, item 3).

A PEM-like ``secret_env`` value raised in an exception by a rank reached the CLI's line, the
webhook's payload and ``export`` with its first line, and ``failure.tail`` with all of them: the
nodes scrubbed each tail line on its own with the whole value, which no single line holds. Now
each line of a value (of meaningful length) is scrubbed on its own too, and every run of
``FRAGMENT_CHARS`` characters of a value wherever it is (output wrapped inside a secret, a tail
cut inside one). The units here are fast; the last test runs it all with real torchrun on the
local backend and looks at every sink.

``HALO_HYPOTHESIS_EXAMPLES`` sets the property tests' example count (default 100).
"""
from __future__ import annotations

import http.server
import json
import os
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halo_sched.node.failure_collector import (FRAGMENT_CHARS, MEANINGFUL_DISTINCT, _tail, collect, record_line,
                                               scrub)
from halo_sched.node.failures import parse_line
from helpers import cli, example_job, free_port, store_text, stored_record

EXAMPLES = int(os.environ.get("HALO_HYPOTHESIS_EXAMPLES", "100"))
KEY = "5e" * 32
BODY = ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7", "q2Fh8w1LkP0Zr7Tn5YbVxWcE3uJmA9dR6sKgHf4"]
PEM = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(BODY) + "\n-----END PRIVATE KEY-----"

SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
[0]:
  time      : 2026-01-02_03:04:05
  host      : gpu-07
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 11359)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _meaningful_runs(value: str) -> set[str]:
    """Every run of FRAGMENT_CHARS characters of ``value`` that scrub must not leave anywhere."""
    runs = (value[i:i + FRAGMENT_CHARS] for i in range(len(value) - FRAGMENT_CHARS + 1))
    return {r for r in runs if len(set(r) - set(" \t\r\n\f\v")) >= MEANINGFUL_DISTINCT}


def _leaks(text: str, value: str) -> list[str]:
    lines = [ln.strip() for ln in value.splitlines() if len(ln.strip()) >= 6]
    return [r for r in _meaningful_runs(value) | set(lines) if r in text]


def test_each_line_of_a_secret_is_scrubbed_on_its_own_and_in_every_form():
    secrets = [PEM]
    # The value whole, one line at a time (a tail), escaped on one line (a repr, a JSON text).
    assert scrub(f"ValueError: {PEM}", secrets) == "ValueError: ***"
    for line in PEM.splitlines():
        assert scrub(f"[rank0]: {line}", secrets) == "[rank0]: ***", line
    for form in (repr(PEM), json.dumps(PEM), PEM.replace("\n", "\r\n")):
        out = scrub(f"KeyError: {form}", secrets)
        assert not _leaks(out, PEM), out
    # Text that shares no run of a secret is left as it is.
    assert scrub("ValueError: nothing secret here -------- x", secrets) == "ValueError: nothing secret here -------- x"


def test_a_wrapped_or_cut_secret_line_leaves_fewer_than_8_of_its_characters():
    text = "token: " + PEM.replace("\n", " ") + " rejected"
    for width in (12, 20, 33, 80):
        wrapped = textwrap.wrap(text, width, break_long_words=True)
        out = [scrub(line, [PEM]) for line in wrapped]
        assert not _leaks("\n".join(out), PEM), (width, out)
    # A single-line token too: the end of a line that wrapped inside it.
    token = "tok_" + "Zq9Yw8Xv7U" * 4 + "end"
    for cut in (8, 17, 30):
        assert token[cut:] not in scrub(token[cut:] + " next", [token]) and scrub("x " + token[:cut], [token]) == "x ***"


def test_the_collector_scrubs_every_line_of_a_secret_from_the_error_the_tail_and_error_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", PEM)
    monkeypatch.setenv("HALO_SECRET_NAMES", "MY_KEY")
    (tmp_path / "torchrun.err").write_text(SUMMARY)
    d = tmp_path / "none_ab12" / "attempt_0" / "1"
    d.mkdir(parents=True)
    wrapped = "\n".join(textwrap.wrap(BODY[0] + BODY[1], 25))  # the trainer logged it wrapped, too
    (d / "stderr.log").write_text(f"loaded:\n{wrapped}\nTraceback (most recent call last):\n"
                                  f'  File "train.py", line 4, in <module>\nValueError: {PEM}\n')
    rec = next(r for r in collect(1, 2, str(tmp_path), 1, host="h") if r["rank"] == 3)
    assert rec["error"] == "ValueError: ***"
    assert "***" in rec["tail"] and not _leaks("\n".join(rec["tail"]), PEM), rec["tail"]
    line = record_line(rec, KEY)
    parsed = parse_line(line, KEY)
    assert parsed.trusted and not _leaks(parsed.error + "\n".join(parsed.tail), PEM)
    # error.json (a trainer with @record): the message's last line is the error.
    (d / "error.json").write_text(json.dumps({"message": {"message": f"RuntimeError: auth refused\n{PEM}"}}))
    rec = next(r for r in collect(1, 2, str(tmp_path), 1, host="h") if r["rank"] == 3)
    assert rec["error"] == "***"


def test_a_tail_read_that_begins_inside_a_secret_keeps_no_line_of_it(tmp_path):
    # _tail reads the last 16 KiB; a long secret whose start lies before that is cut inside.
    lines = [f"l{i:03d}-" + "abcdefghij" * 8 for i in range(200)]
    big = "\n".join(lines)
    p = tmp_path / "stderr.log"
    p.write_text("x\n" * 10 + big + "\nValueError: bad\n")
    assert os.path.getsize(p) > 16384
    kept = _tail(str(p), 400, [big])
    assert kept and kept[-1] == "ValueError: bad" and set(kept[:-1]) == {"***"}, kept[:3]


def test_the_webhook_payload_scrubs_a_secret_line_that_arrives_alone(monkeypatch):
    from halo_sched import notify

    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/h")
    monkeypatch.setenv("MY_TOKEN", PEM)
    rec = {"id": "j1", "backend": "local", "name": "n",
           "spec": {"secret_env": ["MY_TOKEN"], "notify": {"webhook_env": "HOOK_URL", "on": ["failed"]}}}
    for line in PEM.splitlines():
        body = json.loads(notify._payload(rec, "failed", f"FAILED: ValueError: {line} [rank 0]", None))
        assert body["line"] == "FAILED: ValueError: *** [rank 0]", body


def test_a_secrets_blank_or_repeated_lines_blank_nothing_else():
    secret = "[auth]\n--------\n    user = svc-builder-7\n    pass = Hq7!vV0p#k2W\n        \n"
    text = "-------- step 3 --------\n    indented     text\nsvc-builder-7 logged in"
    out = scrub(text, [secret])
    assert out.splitlines()[:2] == text.splitlines()[:2]
    assert "svc-builder-7" not in out


_ALPHABET = st.characters(codec="utf-8", exclude_characters="\x00", exclude_categories=("Cs",))
# A line of a secret holds no line break (str.splitlines' boundaries): the secret is its lines joined.
_LINE_ALPHABET = st.characters(codec="utf-8", exclude_characters="\x00\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                               exclude_categories=("Cs",))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(secret_lines=st.lists(st.text(_ALPHABET, min_size=6, max_size=60), min_size=1, max_size=5),
       before=st.text(_ALPHABET, max_size=80), after=st.text(_ALPHABET, max_size=80),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
       escape=st.sampled_from([None, repr, json.dumps]))
def test_property_no_run_of_a_secret_survives_however_its_text_is_split(secret_lines, before, after, cuts, escape):
    secret = "\n".join(secret_lines)
    shown = escape(secret) if escape else secret
    text = before + shown + after
    # The text reaches the scrub whole, line by line, or in pieces cut anywhere (wrapped, cut off).
    at = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *at], [*at, len(text)])]
    for parts in ([text], text.splitlines(), pieces):
        for part in parts:
            out = scrub(part, [secret])
            assert not [r for r in _meaningful_runs(secret) if r in out], (part, out)
            if not escape:
                assert secret not in out
    # Text without a run of the secret in it, and none of its lines, is left as it is.
    if not _leaks(before, secret) and secret not in before:
        assert scrub(before, [secret]) == before


@settings(max_examples=max(10, EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(secret_lines=st.lists(st.text(_LINE_ALPHABET, min_size=6, max_size=60), min_size=2, max_size=4),
       width=st.integers(min_value=10, max_value=120))
def test_property_the_collectors_line_holds_no_run_of_a_wrapped_secret(tmp_path_factory, monkeypatch, secret_lines,
                                                                       width):
    secret = "\n".join(secret_lines)
    monkeypatch.setenv("MY_KEY", secret)
    monkeypatch.setenv("HALO_SECRET_NAMES", "MY_KEY")
    tmp = tmp_path_factory.mktemp("c")
    (tmp / "torchrun.err").write_text(SUMMARY)
    d = tmp / "none_ab12" / "attempt_0" / "1"
    d.mkdir(parents=True)
    wrapped = "\n".join(textwrap.wrap(secret.replace("\n", " "), width) or [""])
    (d / "stderr.log").write_text(f"{wrapped}\nValueError: {secret}\n", encoding="utf-8")
    rec = next(r for r in collect(1, 2, str(tmp), 1, host="h") if r["rank"] == 3)
    parsed = parse_line(record_line(rec, KEY), KEY)
    said = parsed.error + "\n" + "\n".join(parsed.tail)
    # Wrapping put a blank where a line break was: the runs of the secret's lines are what must go.
    runs = {r for ln in secret_lines for r in _meaningful_runs(ln.strip())}
    assert not [r for r in runs if r in said], said


# ---- with real torchrun: every sink ---------------------------------------------------------------

TRAINER = """
import os, sys, textwrap, time
if int(os.environ["RANK"]) == 0:
    key = os.environ["MY_KEY"]
    print("\\n".join(textwrap.wrap(key.replace("\\n", " "), 30)), file=sys.stderr, flush=True)
    raise ValueError(key)
time.sleep(60)
"""


class _Receiver(http.server.ThreadingHTTPServer):
    posts: list


def _receiver() -> _Receiver:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            n = int(self.headers.get("Content-Length") or 0)
            self.server.posts.append(json.loads(self.rfile.read(n) or b"null"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    r = _Receiver(("127.0.0.1", 0), Handler)
    r.posts = []
    threading.Thread(target=r.serve_forever, daemon=True).start()
    return r


@pytest.mark.torch
def test_a_multi_line_secret_raised_by_a_rank_reaches_no_sink(tmp_path):
    trainer = tmp_path / "pem.py"
    trainer.write_text(TRAINER)
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=2, trainer={"script": str(trainer)},
                      secret_env=["MY_KEY"], notify={"webhook_env": "HOOK_URL", "on": ["failed"]})
    hook = _receiver()
    try:
        env = {**os.environ, "MY_KEY": PEM, "HOOK_URL": f"http://127.0.0.1:{hook.server_address[1]}/h"}
        r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120", env=env, timeout=240)
        assert r.returncode == 1, r.stderr[-3000:]
        job_id = r.stdout.strip().splitlines()[-1]
        assert "FAILED: ValueError: *** [rank 0" in r.stderr, r.stderr
        deadline = time.monotonic() + 60
        while not hook.posts and time.monotonic() < deadline:
            time.sleep(0.2)
        assert hook.posts and hook.posts[0]["line"].startswith("FAILED: ValueError: *** [rank 0"), hook.posts
    finally:
        hook.shutdown()
        hook.server_close()
    quiet = {k: v for k, v in env.items() if k not in ("MY_KEY", "HOOK_URL")}  # a later shell: no values
    status = cli("status", job_id, "--json", env=quiet)
    tail = json.loads(status.stdout)["failure"]["first"]["tail"]
    assert "ValueError: ***" in tail and not _leaks("\n".join(tail), PEM), tail
    export = cli("export", env=quiet)
    assert export.returncode == 0 and job_id in export.stdout
    home = os.environ["HALO_SCHED_HOME"]
    assert stored_record(home, job_id)["last_state"]["failure"]["first"]["error"] == "ValueError: ***"
    for name, text in [("submit", r.stdout + r.stderr), ("webhook", json.dumps(hook.posts)),
                       ("status", status.stdout + status.stderr), ("export", export.stdout),
                       ("records", store_text(home)), ("list", cli("list", env=quiet).stdout)]:
        for form in (text, text.replace("\\n", "\n")):
            assert not _leaks(form, PEM), (name, _leaks(form, PEM))
