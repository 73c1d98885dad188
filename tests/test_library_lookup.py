"""The library a submitit or TorchX user expects (issue 41, item 4), without a real job:
``halo_sched.list()`` (the CLI's ``list``: the same rows, filters and checks), ``exception()``,
``as_completed()``, ``describe()``, and the log filters ``logs`` and ``Job.logs()`` share."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

import halo_sched
from halo_sched import records
from halo_sched.backends.base import Job, JobState, JobStatus, Scheduler
from halo_sched.logtags import LogLine, Raw, log_filter, parsed

SPEC = {"name": "look", "nodes": 2, "nproc_per_node": 2, "trainer": {"script": "train.py"}, "slurm": {}}


class Scripted(Scheduler):
    """Jobs whose states go through ``script[id]`` one query at a time (the last one repeated)."""

    name = "slurm"
    log_fields = frozenset({"stream"})

    def __init__(self, script: dict[str, list[JobState]]):
        self.script, self.lock = script, threading.Lock()

    def query(self, ids):
        with self.lock:
            out = {}
            for i in ids:
                seq = self.script.get(i) or [JobState(i, JobStatus.UNKNOWN)]
                out[i] = seq.pop(0) if len(seq) > 1 else seq[0]
            return out

    def read_result(self, job_id, record=None):
        return b'{"job": "%s"}' % job_id.encode()

    def logs(self, job_id, follow=False):
        yield from [Raw("[node 0] [rank 0] step 1\n", stream="stdout"), Raw("[node 1] [rank 3] Error: x\n", stream="stderr"),
                    "[node 1] halo-sched: node 1 of 2\n"]

    def render(self, spec, **opts):  # pragma: no cover - not used
        return ""

    schedule = cancel = render


def _state(i, status):
    return JobState(i, status, raw_state=status.value)


def _record(job_id: str, name: str = "look", when: float | None = None, **extra) -> None:
    records.write({"id": job_id, "backend": "slurm", "name": name, "submitted": when or time.time(), "spec": SPEC,
                   "failure_key": "k" * 32, **extra})


def test_as_completed_yields_each_as_it_ends_and_exception_returns_what_result_raises():
    sched = Scripted({
        "slow": [_state("slow", JobStatus.RUNNING)] * 3 + [_state("slow", JobStatus.COMPLETED)],
        "fast": [_state("fast", JobStatus.FAILED)],
        "never": [_state("never", JobStatus.RUNNING)],
    })
    slow, fast, never = Job(sched, "slow"), Job(sched, "fast"), Job(sched, "never")
    for i in ("slow", "fast", "never"):
        _record(i)
    got = []
    with pytest.raises(halo_sched.StillRunning) as info:
        for h in halo_sched.as_completed([never, slow, fast, slow], timeout=6):
            got.append(h.id)
    assert got == ["fast", "slow"], got  # in the order they ended, each once
    assert info.value.job_id == "never" and "still RUNNING after 6 s" in str(info.value)
    assert isinstance(info.value, TimeoutError) and info.value.exit_code == 1
    assert slow.exception() is None and slow.result().value == {"job": "slow"}
    import asyncio

    fresh = Scripted({"a": [_state("a", JobStatus.COMPLETED)]})  # its own watcher: no state read before
    _record("a")
    assert asyncio.run(Job(fresh, "a").result_async(timeout=30)).value == {"job": "a"}
    err = fast.exception()
    assert isinstance(err, halo_sched.JobFailed) and err.state.status is JobStatus.FAILED
    assert isinstance(never.exception(timeout=1), halo_sched.StillRunning)
    assert isinstance(Job(sched, "nobody").exception(), halo_sched.UnknownJob)
    assert list(halo_sched.as_completed([])) == []


def test_describe_is_the_record_as_export_writes_it_without_the_failure_key(tmp_path):
    _record("41", result={"value": {"loss": 1}, "note": "", "for": "COMPLETED", "at": 1.0})
    rec = halo_sched.describe("41")
    assert rec["id"] == "41" and rec["spec"]["trainer"]["script"] == "train.py" and "failure_key" not in rec
    assert rec["result"]["value"] == {"loss": 1}
    exported = [json.loads(line) for line in _cli("export", cwd=tmp_path).stdout.splitlines()]
    assert [e for e in exported if e.get("id") == "41"] == [{"kind": "job", **rec}]
    with pytest.raises(halo_sched.UnknownJob, match="no job record"):
        halo_sched.describe("42", "slurm")


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_list_is_the_cli_list_as_values_filtered_the_same_way(tmp_path):
    # Local records whose job directories are gone: the scheduler forgot them, the records say.
    now = time.time()
    for n, (name, status) in enumerate([("a", "COMPLETED"), ("b", "FAILED"), ("a", "FAILED"), ("c", "COMPLETED")]):
        records.write({"id": f"job-{n}", "backend": "local", "name": name, "submitted": now - 3600 * n,
                       "submitted_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 3600 * n)),
                       "spec": SPEC, "last_state": {"status": status, "describe": f"{status} exit=0"},
                       **({"result": {"value": [n], "note": "", "for": status}} if n == 2 else {})})
    for args, kw in [((), {}), (("--name", "a"), {"name": "a"}), (("--state", "failed"), {"state": "FAILED"}),
                     (("--state", "FAILED"), {"state": JobStatus.FAILED}), (("--since", "90m"), {"since": "90m"}),
                     (("--limit", "2"), {"limit": 2}), (("--backend", "local", "--limit", "0"), {"backend": "local", "limit": 0})]:
        r = _cli("list", "--json", *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert [json.loads(x) for x in r.stdout.splitlines()] == [row.to_dict() for row in halo_sched.list(**kw)], args
    rows = halo_sched.list(state="failed")
    assert [(r.id, r.status, r.live, r.value) for r in rows] == [("job-1", "FAILED", False, None),
                                                                 ("job-2", "FAILED", False, [2])]
    assert halo_sched.list(since=now + 60) == [] and len(halo_sched.list(since=now - 5400)) == 2  # epoch seconds
    import datetime

    assert len(halo_sched.list(since=datetime.timedelta(minutes=90))) == 2
    for kw, words in [({"state": "nope"}, "state: 'nope' is not a state"), ({"limit": -1}, "limit -1"),
                      ({"limit": True}, "limit True"), ({"since": "yesterday"}, "since: 'yesterday' is not an age"),
                      ({"since": float("nan")}, "since: nan is not a time"), ({"backend": "pbs"}, "backend 'pbs'")]:
        with pytest.raises(halo_sched.UsageError, match=words):
            halo_sched.list(**kw)
    r = _cli("list", "--state", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "'nope' is not a state" in r.stderr  # the same rule, the CLI's words


# ---- the log filters: one for the CLI and the library -----------------------------------------------


def test_log_filters_select_and_refuse_what_the_backend_cannot_answer():
    lines = [Raw("[node 0] [rank 0] loss 1\n", 100.0, "stdout"), Raw("[node 0] [rank 0] Error: boom\n", 200.0, "stderr"),
             "[node 1] plain line\n"]
    assert [x.text for x in parsed(lines, keep=log_filter(stream="stderr", fields={"stream"}))] == ["Error: boom"]
    assert [x.text for x in parsed(lines, keep=log_filter(since=150.0, fields={"time"}))] == ["Error: boom"]
    assert [x.text for x in parsed(lines, keep=log_filter(grep=r"^(loss|plain)", node=None))] == ["loss 1", "plain line"]
    assert [x.text for x in parsed(lines, keep=log_filter(node=1))] == ["plain line"]
    assert LogLine(lines[0]).time == 100.0 and LogLine(lines[2]).stream is None
    with pytest.raises(halo_sched.UsageError, match="--since: the slurm backend's output keeps no time per line"):
        log_filter(since=1.0, backend="slurm", fields=frozenset())
    with pytest.raises(halo_sched.UsageError, match="--stream: the slurm backend keeps a job's stdout and stderr in one"):
        log_filter(stream="stderr", backend="slurm", fields=frozenset())
    with pytest.raises(halo_sched.UsageError, match="--stream 'both': give stdout or stderr"):
        log_filter(stream="both", fields={"stream"})
    with pytest.raises(halo_sched.UsageError, match=r"--grep '\(': not a regular expression"):
        log_filter(grep="(")
    with pytest.raises(halo_sched.UsageError, match="at most 1000 characters"):
        log_filter(grep="x" * 1001)


def test_job_logs_filters_as_the_cli_and_checks_before_the_first_line():
    sched = Scripted({"7": [_state("7", JobStatus.COMPLETED)]})
    _record("7")
    job = Job(sched, "7")
    assert [x.text for x in job.logs(stream="stderr")] == ["Error: x"]
    assert [x.text for x in job.logs(grep="step", rank=0)] == ["step 1"]
    with pytest.raises(halo_sched.UsageError, match="^since: the slurm backend's output keeps no time"):
        job.logs(since="1h")
    with pytest.raises(halo_sched.UsageError, match="since: 'soon' is not an age"):
        job.logs(since="soon")
    with pytest.raises(halo_sched.UsageError, match=r"^grep '\['"):
        job.logs(grep="[")


def test_the_cli_logs_options_reach_the_same_filter(tmp_path):
    r = _cli("logs", "x-1", "--backend", "local", "--stream", "both", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'both'" in r.stderr
    r = _cli("logs", "x-1", "--backend", "local", "--since", "soon", cwd=tmp_path)
    assert r.returncode == 2 and "'soon' is not an age (30m, 12h, 7d) or an ISO date/time" in r.stderr
