"""What a job produced, and what halo-sched's own files hold, reaching the CLI's output: a lone
surrogate, terminal escapes, numbers that are not finite; and a stdout that is closed or full.
Every CLI run here is bounded in memory (ulimit -v) and time."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from halo_sched import ledger, records
from halo_sched.node.failures import parse_line
from halo_sched.node.text import escape_controls, valid_text
from helpers import REPO, legacy_record_path

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
MEMORY = 1024 * 1024 * 1024


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(*args, stdout=subprocess.PIPE, timeout=60, env=None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, under MEMORY and ``timeout``; bytes out (nothing decoded for it)."""
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout, preexec_fn=_limited,
                          env={**os.environ, **(env or {})})


def _record(job_id: str, describe: str, backend: str = "local", **extra) -> dict:
    rec = {"version": 1, "id": job_id, "backend": backend, "name": "t", "submitted": time.time(),
           "submitted_iso": "2026-01-01T00:00:00+0000", "spec": {"slurm": {}}, "outputs": [], "scheduler": {},
           "last_state": {"status": "FAILED", "describe": describe, "at": time.time()}, **extra}
    records.write(rec)
    return rec


def _failure_line(error: str, **fields) -> str:
    return "halo-sched-failure " + json.dumps({"node": 0, "rank": 1, "local_rank": 1, "host": "h1", "exit_code": 1,
                                               "time": 1.8e9, "error": error, **fields})


# ---- lone surrogates (issue 28, item 4) -----------------------------------------------------------


def test_a_lone_surrogate_in_a_failure_line_never_leaves_the_parser():
    f = parse_line(_failure_line("bad \ud800 value", host="h\udfff", tail=["x\ud800"]))
    assert f is not None
    for text in (f.error, f.host, *f.tail, f.describe(), json.dumps(f.to_dict(), ensure_ascii=False)):
        text.encode("utf-8")  # raises on a surrogate
    assert "\ufffd" in f.error


def test_a_record_holding_a_lone_surrogate_costs_no_other_job_and_yields_strict_json():
    # A record an earlier release wrote before the parser replaced them: the escape is in its file
    # (imported into the store by the first command), and one written through the store today.
    _record("good-1", "FAILED: plain words")
    _record("bad-2", "FAILED: bad \udfff value")
    rec = _record("bad-1", "FAILED: bad \ud800 value")
    records.jobs_dir().mkdir(parents=True, exist_ok=True)
    legacy_record_path("bad-1", "local").write_text(json.dumps(dict(rec, submitted=rec["submitted"] + 1)))
    assert "\\ud800" in legacy_record_path("bad-1", "local").read_text()
    for args in (["list"], ["status", "bad-1"], ["status", "good-1"], ["status", "bad-1", "good-1"]):
        r = run(*args)
        assert r.returncode in (0, 3), (args, r.stderr.decode(errors="replace")[-2000:])
        assert b"internal error" not in r.stderr and b"Traceback" not in r.stderr
        r.stdout.decode("utf-8")
    listed = run("list").stdout.decode()
    assert "good-1" in listed and "bad-1" in listed
    for args in (["list", "--json"], ["status", "--json", "bad-1"]):
        for line in run(*args).stdout.decode().splitlines():
            json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")  # strict: no surrogate


def test_one_job_that_cannot_be_shown_costs_only_itself(monkeypatch, capsys):
    """A record no check foresaw (here: the run rows of one job raise) is one row saying so; the
    other jobs are shown, and the command ends normally."""
    from halo_sched import cli, runs

    _record("ok-1", "FAILED: words")
    _record("boom-1", "FAILED: words", run={"id": "boom-1", "attempt": 0, "excluded": []})
    real = runs.attempts_of

    def attempts_of(job_id, backend):
        if job_id == "boom-1":
            raise TypeError("a record no check foresaw")
        return real(job_id, backend)

    monkeypatch.setattr(runs, "attempts_of", attempts_of)
    assert cli.main(["status", "boom-1", "ok-1"]) == 0
    out, err = capsys.readouterr()
    assert "ok-1\t" in out and "boom-1\tlocal\t\tUNREADABLE (cannot be shown: TypeError" in out, out
    assert "internal error" not in err and "boom-1@local cannot be shown" in err


# ---- terminal escapes (item 9) ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_escaped_text_holds_no_control_character(text):
    import unicodedata

    out = escape_controls(text)
    # No control character but tab and new line, no surrogate, nothing that reorders text.
    assert all(c in "\t\n" or (unicodedata.category(c) not in ("Cc", "Cs") and unicodedata.bidirectional(c)
                                 not in ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"))
               for c in out), repr(out)
    out.encode("utf-8")
    valid_text(text).encode("utf-8")


def test_a_ranks_escape_sequences_reach_no_terminal_through_list_status_or_nodes():
    f = parse_line(_failure_line(f"ValueError: boom {ESCAPES}", host=f"h{ESCAPES}"))
    _record("esc-1", f"FAILED: {f.describe()}")
    _record("esc-2", f"FAILED: raw {ESCAPES} in an older record")
    for args in (["list"], ["status", "esc-1", "esc-2"], ["status", "--json", "esc-1"], ["list", "--json"]):
        r = run(*args)
        assert b"\x1b" not in r.stdout + r.stderr and b"\x07" not in r.stdout + r.stderr, (args, r.stdout, r.stderr)
    assert b"\\x1b]0;pwned\\x07" in run("list").stdout  # shown, as an escape a reader can see


def test_the_status_line_of_a_wait_carries_no_escape_sequence(capsys):
    """The progress and last lines of ``submit --wait`` go through the CLI's stderr: a state whose
    words hold a rank's escapes is shown escaped, while the progress line's own control stays."""
    from halo_sched import cli
    from halo_sched.backends.base import JobStatus
    from halo_sched.jobstate import JobState
    from halo_sched.commands import Progress, PipeGuard
    from halo_sched.commands.wait import _report_end

    class Sched:
        def progress(self, state):
            return state.describe()

    class Tty:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s
            return len(s)

        def flush(self):
            pass

        def isatty(self):
            return True

    state = JobState("j1", JobStatus.FAILED, raw_state="FAILED", reason=f"x {ESCAPES} y")
    tty = Tty()
    guard = PipeGuard(tty, escape_controls)
    Progress(Sched(), "j1", stream=guard).change(state)
    assert tty.text.startswith("\r\x1b[K") and tty.text.count("\x1b") == 1, repr(tty.text)
    assert cli.main(["nodes"]) == 0  # main wraps stderr; _report_end writes through it
    saved = sys.stderr
    sys.stderr = PipeGuard(saved, escape_controls)
    try:
        _report_end("j1", state, None)
    finally:
        sys.stderr = saved
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b]0;pwned" in err, err


# ---- the node ledger's numbers (item 8) ---------------------------------------------------------


@pytest.mark.parametrize("expires", ["Infinity", "1e300", "NaN", "-Infinity", "1e20"])
def test_a_ledger_entry_with_an_unbounded_time_is_refused_not_fatal(expires):
    ledger.legacy_path().parent.mkdir(parents=True, exist_ok=True)
    ledger.legacy_path().write_text('{"version": 1, "entries": [{"host": "h1", "reason": "x", "job": "1", '
                                    f'"backend": "slurm", "since": 1700000000, "expires": {expires}}}]}}')
    for i, args in enumerate((["nodes"], ["nodes", "--json"])):
        r = run(*args)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        assert b"internal error" not in r.stderr, r.stderr
        # Said once, by the command that imported the file (an earlier release's) into the store.
        assert (b"since/expires out of range" in r.stderr) == (i == 0), r.stderr
        for line in r.stdout.decode().splitlines():
            json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert ledger.exclusions() == ()  # the host is not fenced off for ever


def test_numbers_that_are_not_finite_in_a_record_are_null_in_json_output():
    rec = _record("nan-1", "FAILED: words")
    rec["last_state"].update(at=float("inf"), started_at=float("nan"))
    records.write(rec)  # Python's json writes Infinity and NaN, and reads them back
    for args in (["status", "--json", "nan-1"], ["list", "--json"]):
        for line in run(*args).stdout.decode().splitlines():
            json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))


# ---- closed or failing stdout (item 5) ----------------------------------------------------------


def _closed(*args) -> subprocess.CompletedProcess:
    """``halo-sched ARGS >&-``."""
    return subprocess.run(["bash", "-c", f'exec "$0" -m halo_sched.cli "$@" >&-', sys.executable, *args],
                          cwd=REPO, stderr=subprocess.PIPE, timeout=60, preexec_fn=_limited)


@pytest.mark.parametrize("args", [["list"], ["status", "j-1"], ["nodes"], ["nodes", "--json"], ["timeline", "j-1"],
                                  ["schema"], ["render", "examples/ddp-cpu.yaml"]])
def test_a_closed_stdout_is_a_warning_and_the_commands_own_exit_code(args):
    _record("j-1", "FAILED: words")
    ledger.add("h1", "x", "1", "slurm")
    r = _closed(*args)
    err = r.stderr.decode()
    assert "Traceback" not in err and "internal error" not in err and "Exception ignored" not in err, err
    assert r.returncode == run(*args).returncode, (args, r.returncode, err)
    assert "stdout is closed: this command's output was not written" in err, err


def test_submit_and_cancel_with_a_closed_stdout_act_and_say_so(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: sleeper\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n"
                   "setup: ['sleep 60']\n")
    (tmp_path / "t.py").touch()
    r = _closed("submit", str(job), "--backend", "local", "-q")
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err and "Exception ignored" not in err, err
    job_id = err.split(" as ", 1)[1].split()[0]  # the id is on stderr as well
    assert records.find(job_id, "local"), "the job was submitted and recorded"
    r = _closed("cancel", job_id)
    err = r.stderr.decode()
    assert r.returncode == 0 and f"cancel requested for {job_id}" in err and "Traceback" not in err, err


def test_a_full_stdout_is_a_warning_not_a_traceback():
    _record("j-2", "FAILED: words")
    with open("/dev/full", "wb") as full:
        r = run("list", stdout=full)
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err and "Exception ignored" not in err, err
    assert "stdout cannot be written (No space left on device)" in err, err


def test_a_reader_that_goes_away_changes_nothing():
    for i in range(300):
        _record(f"p-{i}", "FAILED: words " * 20)
    r = subprocess.run(["bash", "-c", f'set -o pipefail; "$0" -m halo_sched.cli list | head -1', sys.executable],
                       cwd=REPO, capture_output=True, timeout=60, preexec_fn=_limited)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


def test_render_and_dry_run_print_the_job_byte_for_byte(tmp_path):
    """A rendered job is the user's own job file made script: printed as it is (an invisible
    character in an env value is submitted as it is, so ``render > file`` keeps it too)."""
    import halo_sched

    job = tmp_path / "job.yaml"
    job.write_text("name: j\nnodes: 2\nnproc_per_node: 1\ntrainer: {script: t.py}\n"
                   'env: {GREETING: "a\\u200bb\\u202ec"}\n', encoding="utf-8")
    (tmp_path / "t.py").touch()
    want = halo_sched.render(halo_sched.load(job), "slurm")
    assert "a\u200bb\u202ec" in want
    r = run("render", str(job), "--backend", "slurm")
    assert r.returncode == 0 and r.stdout.decode("utf-8") == (want if want.endswith("\n") else want + "\n")
    r = run("submit", "--dry-run", str(job), "--backend", "slurm")
    assert r.returncode == 0 and "a\u200bb\u202ec" in r.stdout.decode("utf-8")
