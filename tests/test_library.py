"""The library surface (docs/library.md), without a real job: what ``import halo_sched`` offers,
specs from dicts and YAML with SpecError naming the field, the default-backend rule shared with
the CLI, how each end of a job maps onto ``result()``, unknown ids, ``cancel(wait=True)``,
``wait_async`` holding no thread per job, and log lines as data. A SLURM scheduler over a fake
scheduler that answers from a script stands in where a scheduler must answer."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import halo_sched
from halo_sched import records
from halo_sched.backends.base import JobState, JobStatus
from halo_sched.backends.base import Scheduler
from halo_sched.node.failures import FailureReport, RankFailure

from helpers import REPO

SPEC = {"name": "lib", "nodes": 2, "nproc_per_node": 2, "trainer": {"script": "train.py", "args": ["--lr", "0.1"]}}


class Scripted(Scheduler):
    """A scheduler whose jobs go through ``script[id]`` (one state per query, the last one
    repeated); cancel moves a job to CANCELLED after ``cancel_lag`` more queries."""

    name = "slurm"  # the records it is looked up in

    def __init__(self, script: dict[str, list[JobState]], cancel_lag: int = 2):
        self.script, self.cancel_lag = script, cancel_lag
        self.queries: list[list[str]] = []
        self.cancelled: dict[str, int] = {}
        self.lock = threading.Lock()

    def query(self, ids):
        with self.lock:
            self.queries.append(list(ids))
            out = {}
            for i in ids:
                if i in self.cancelled:
                    self.cancelled[i] -= 1
                    if self.cancelled[i] <= 0:
                        out[i] = JobState(i, JobStatus.CANCELLED, raw_state="CANCELLED")
                        continue
                seq = self.script.get(i)
                if not seq:
                    out[i] = JobState(i, JobStatus.UNKNOWN, reason="Invalid job id specified")
                    continue
                out[i] = seq.pop(0) if len(seq) > 1 else seq[0]
            return out

    def render(self, spec, **opts):  # pragma: no cover - not used
        return ""

    def schedule(self, dryrun):  # pragma: no cover - not used
        raise NotImplementedError

    def cancel(self, ids, **opts):
        with self.lock:
            for i in ids:
                self.cancelled[i] = self.cancel_lag

    def logs(self, job_id, follow=False):
        yield from ["[node 0] hello\n", "[node 1] [rank 3] bye\n"]


def _sched(script, **kw) -> Scripted:
    return Scripted(script, **kw)


def _running(i):
    return JobState(i, JobStatus.RUNNING, raw_state="RUNNING")


# ---- what import halo_sched offers ------------------------------------------------------------


def test_every_public_type_is_importable_from_halo_sched_and_py_typed_ships():
    from halo_sched import (HaloError, Job, JobCancelled, JobFailed, JobSpec, JobState as S, JobStatus as St,
                            LogLine, OutcomeUnknown, Run, SpecError, StillRunning, UnknownJob, spec_from_dict,
                            spec_from_yaml, with_changes)

    assert S is JobState and St is JobStatus and issubclass(Run, Job) and JobSpec.__name__ == "JobSpec"
    for err in (JobFailed, JobCancelled, OutcomeUnknown, StillRunning, SpecError, UnknownJob):
        assert issubclass(err, HaloError)
    assert (JobFailed.exit_code, JobCancelled.exit_code, OutcomeUnknown.exit_code, UnknownJob.exit_code,
            SpecError.exit_code, StillRunning.exit_code) == (1, 1, 3, 2, 2, 1)
    assert issubclass(StillRunning, TimeoutError) and callable(spec_from_dict) and callable(spec_from_yaml)
    assert callable(with_changes) and LogLine.__name__ == "LogLine"
    missing = [n for n in halo_sched.__all__ if not hasattr(halo_sched, n)]
    assert not missing, missing
    assert (REPO / "halo_sched" / "py.typed").is_file()
    # The wheel holds the whole package directory (hatch: packages = ["halo_sched"]), py.typed too.
    assert 'packages = ["halo_sched"]' in (REPO / "pyproject.toml").read_text()


def test_import_halo_sched_loads_no_backend_and_no_model():
    import subprocess
    import sys

    code = ("import sys, halo_sched; print(sorted(m for m in sys.modules if m.startswith('halo_sched.') "
            "or m in ('torch', 'pydantic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert json.loads(out.stdout.replace("'", '"')) == [], out.stdout + out.stderr


# ---- specs from dicts and YAML, and changing nested fields ---------------------------------


def test_a_spec_from_a_dict_and_from_yaml_and_nested_changes():
    spec = halo_sched.spec_from_dict(SPEC)
    assert spec.world_size == 4
    again = halo_sched.spec_from_yaml("name: lib\nnodes: 2\nnproc_per_node: 2\ntrainer: {script: train.py}\n")
    assert again.nodes == 2
    changed = halo_sched.with_changes(spec, {"trainer.args": ["--lr", "0.3"], "slurm.partition": "gpu",
                                             "nodes": 3})
    assert changed.trainer.args == ["--lr", "0.3"] and changed.slurm.partition == "gpu" and changed.nodes == 3
    assert spec.trainer.args == ["--lr", "0.1"] and spec.slurm.partition is None  # the original stays


def test_from_yaml_reads_a_path(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: fromfile\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n")
    assert halo_sched.spec_from_yaml(p).name == "fromfile" and halo_sched.spec_from_yaml(str(p)).name == "fromfile"


@pytest.mark.parametrize("call, field", [
    (lambda: halo_sched.spec_from_dict({**SPEC, "nodes": "two"}), "nodes"),
    (lambda: halo_sched.spec_from_dict({**SPEC, "trainer": {"script": "t.py", "args": "x"}}), "trainer.args"),
    (lambda: halo_sched.spec_from_dict([1, 2]), "<root>"),
    (lambda: halo_sched.spec_from_yaml("name: [unclosed\n"), "YAML syntax error"),
    (lambda: halo_sched.with_changes(halo_sched.spec_from_dict(SPEC), {"slurm.partitoin": "gpu"}), "slurm.partitoin"),
    (lambda: halo_sched.with_changes(halo_sched.spec_from_dict(SPEC), {"nodes.count": 2}), "nodes.count"),
    (lambda: halo_sched.with_changes(halo_sched.spec_from_dict(SPEC), {"trainer.args": 7}), "trainer.args"),
    (lambda: halo_sched.with_changes(halo_sched.spec_from_dict(SPEC), {"": 1}), "<root>"),
    (lambda: halo_sched.submit({**SPEC, "nproc_per_node": 0}), "nproc_per_node"),
])
def test_bad_specs_raise_spec_error_naming_the_field_never_pydantics(call, field):
    from pydantic import ValidationError

    with pytest.raises(halo_sched.SpecError) as info:
        try:
            call()
        except ValidationError as err:  # pragma: no cover - the bug this test is for
            pytest.fail(f"pydantic's ValidationError escaped: {err}")
    assert field in str(info.value) and info.value.exit_code == 2, str(info.value)


# ---- the default backend: one rule for the CLI and the library ------------------------------


def test_render_and_submit_honour_halo_sched_backend(monkeypatch):
    monkeypatch.setenv("HALO_SCHED_BACKEND", "slurm")
    assert halo_sched.render(SPEC).startswith("#!/bin/bash") and "#SBATCH" in halo_sched.render(SPEC)
    assert halo_sched.default_backend() == "slurm" and halo_sched.default_backend("nomad") == "nomad"
    monkeypatch.delenv("HALO_SCHED_BACKEND")
    assert "#SBATCH" not in halo_sched.render(SPEC) and halo_sched.default_backend() == "local"


def test_job_and_run_find_the_backend_from_the_record(monkeypatch):
    monkeypatch.setenv("HALO_SCHED_BACKEND", "local")
    records.write({"id": "far:77", "backend": "slurm", "name": "lib", "submitted": time.time(), "spec": SPEC,
                   "run": {"id": "far:70", "attempt": 1, "excluded": []}})
    assert halo_sched.job("far:77").backend == "slurm"      # the record: not $HALO_SCHED_BACKEND
    assert halo_sched.job("far:99").backend == "local"      # no record: $HALO_SCHED_BACKEND
    assert halo_sched.job("far:77", "nomad").backend == "nomad"  # explicit wins
    run = halo_sched.run("far:77")
    assert (run.backend, run.id, run.current.id, run.spec.name) == ("slurm", "far:70", "far:77", "lib")
    with pytest.raises(halo_sched.UsageError):
        halo_sched.job("bad id")


# ---- a job's end as result() says it ---------------------------------------------------------


def _failed(i):
    first = RankFailure(node=1, rank=3, local_rank=1, host="h2", exit_code=1, signal=None, time=1.0,
                        error="RuntimeError: loss is nan")
    return JobState(i, JobStatus.FAILED, raw_state="FAILED", exit_code=1, failure=FailureReport([first]))


def test_result_returns_a_completed_state_and_raises_for_every_other_end():
    sched = _sched({
        "1": [_running("1"), JobState("1", JobStatus.COMPLETED, raw_state="COMPLETED", exit_code=0)],
        "2": [_running("2"), _failed("2")],
        "3": [JobState("3", JobStatus.CANCELLED, raw_state="CANCELLED")],
        "4": [JobState("4", JobStatus.NODE_FAIL, raw_state="NODE_FAIL")],
        "5": [_running("5")],
    })
    from halo_sched.backends.base import Job

    assert Job(sched, "1").result(timeout=30).status is JobStatus.COMPLETED
    with pytest.raises(halo_sched.JobFailed) as failed:
        Job(sched, "2").result(timeout=30)
    rep = failed.value.report
    assert (rep.rank, rep.node, rep.host, rep.hostname, rep.fault, rep.error) == (3, 1, "h2", "h2", "job", "RuntimeError: loss is nan")
    assert json.loads(json.dumps(rep.to_dict()))["rank"] == 3 and failed.value.exit_code == 1
    assert "rank 3" in str(failed.value)
    with pytest.raises(halo_sched.JobCancelled):
        Job(sched, "3").result(timeout=30)
    with pytest.raises(halo_sched.JobFailed) as node_fail:
        Job(sched, "4").result(timeout=30)
    assert node_fail.value.report is not None and node_fail.value.report.fault == "node"
    began = time.monotonic()
    with pytest.raises(halo_sched.StillRunning) as still:
        Job(sched, "5").result(timeout=1.5)
    assert time.monotonic() - began < 10 and still.value.state.status is JobStatus.RUNNING
    assert Job(sched, "1").done() and not Job(sched, "5").done()


def test_a_job_the_scheduler_forgot_is_outcome_unknown_when_it_has_a_record():
    records.write({"id": "6", "backend": "slurm", "name": "lib", "submitted": time.time(), "spec": SPEC})
    sched = _sched({"6": []})
    from halo_sched.backends.base import Job

    with pytest.raises(halo_sched.OutcomeUnknown) as info:
        Job(sched, "6").result(timeout=30)
    assert info.value.exit_code == 3


# ---- unknown ids: every call says so, as the CLI's exit 2 ----------------------------------------


@pytest.mark.parametrize("call", ["status", "wait", "result", "done", "logs", "cancel", "wait_async"])
def test_an_unknown_id_raises_unknown_job_from_every_call(call):
    from halo_sched.backends.base import Job

    handle = Job(_sched({}), "424242")
    with pytest.raises(halo_sched.UnknownJob) as info:
        if call == "wait_async":
            asyncio.run(handle.wait_async(timeout=10))
        else:
            getattr(handle, call)()
    assert info.value.exit_code == 2 and "424242" in str(info.value)


def test_an_unknown_local_id_raises_unknown_job_from_status_wait_logs_and_cancel():
    handle = halo_sched.job("nope-20260101-000000-abcdef", "local")
    for call in (handle.status, handle.wait, handle.logs, handle.cancel):
        with pytest.raises(halo_sched.UnknownJob):
            call()


# ---- cancel(wait=True) ---------------------------------------------------------------------------


def test_cancel_waits_until_the_scheduler_says_the_job_ended():
    sched = _sched({"7": [_running("7")]}, cancel_lag=3)
    from halo_sched.backends.base import Job

    handle = Job(sched, "7")
    assert handle.status().status is JobStatus.RUNNING
    state = handle.cancel(timeout=30)
    assert state.status is JobStatus.CANCELLED and handle.status().status is JobStatus.CANCELLED
    # Without waiting it returns at once, the job possibly still running.
    sched2 = _sched({"8": [_running("8")]}, cancel_lag=3)
    assert Job(sched2, "8").cancel(wait=False) is None and Job(sched2, "8").status().status is JobStatus.RUNNING


# ---- wait_async: one poll for all, no thread per job ---------------------------------------------


def test_wait_async_on_many_jobs_holds_no_thread_per_job_and_shares_each_poll():
    ids = [str(2000 + k) for k in range(60)]
    script = {i: [_running(i)] * (2 + k % 4) + [JobState(i, JobStatus.COMPLETED, raw_state="COMPLETED")]
              for k, i in enumerate(ids)}
    sched = _sched(script)
    from halo_sched.backends.base import Job

    peak = [threading.active_count()]
    before = threading.active_count()

    async def main():
        async def sample():
            while True:
                peak[0] = max(peak[0], threading.active_count())
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        try:
            return await asyncio.wait_for(asyncio.gather(*(Job(sched, i).wait_async() for i in ids)), 60)
        finally:
            sampler.cancel()

    states = asyncio.run(main())
    assert [s.status for s in states] == [JobStatus.COMPLETED] * len(ids)
    # One executor thread polls for all of them (asyncio's default executor may keep one more).
    assert peak[0] - before <= 2, (before, peak[0])
    queries = sched.queries
    assert len(queries) <= 12 and max(len(q) for q in queries) == len(ids), [len(q) for q in queries]


# ---- logs as data ------------------------------------------------------------------------------------


def test_log_lines_carry_node_rank_and_text_and_print_as_the_cli_does():
    from halo_sched.logtags import LogLine, parsed, select

    raw = ["[node 0] halo-sched: node 0 of 2\n", "[node 1] [rank 3] step 1 loss=2.3\n", "0: [rank 1] hi\n"]
    got = list(parsed(raw))
    assert [(x.node, x.rank, x.text) for x in got] == [(0, None, "halo-sched: node 0 of 2"), (1, 3, "step 1 loss=2.3"),
                                                       (0, 1, "hi")]
    assert got[1] == "[node 1 rank 3] step 1 loss=2.3\n" and isinstance(got[1], str)
    assert [x.text for x in parsed(raw, node=0)] == ["halo-sched: node 0 of 2", "hi"]
    assert [x.text for x in parsed(raw, rank=3)] == ["step 1 loss=2.3"]
    assert list(select(raw, node=1)) == ["[node 1 rank 3] step 1 loss=2.3\n"]
    assert repr(LogLine("[node 2] x\n")) == "LogLine(node=2, rank=None, text='x')"


# ---- attempts as the CLI numbers them ---------------------------------------------------------------


def test_run_attempts_count_from_one_and_status_json_keeps_the_records_index():
    from halo_sched.runs import Run, attempts_of

    for n, jid in enumerate(["r1", "r2"]):
        records.write({"id": jid, "backend": "slurm", "name": "lib", "submitted": time.time() + n, "spec": SPEC,
                       "run": {"id": "r1", "attempt": n, "excluded": []},
                       "last_state": {"status": "FAILED" if n == 0 else "COMPLETED"}})
    run = Run(_sched({}), "r1")
    assert [(a.number, a.index, a.id) for a in run.attempts()] == [(1, 0, "r1"), (2, 1, "r2")]
    assert [a.to_dict()["attempt"] for a in attempts_of("r1", "slurm")] == [0, 1]


def test_wait_async_waits_through_an_outage_and_gives_up_past_its_budget(monkeypatch):
    """As Job.wait: a scheduler that cannot be reached for a while is waited through; one that
    stays away past the outage budget is OutcomeUnknown (exit 3), never a hang."""
    from halo_sched import outage
    from halo_sched.errors import SchedulerError
    from halo_sched.retry import Transient

    monkeypatch.setattr(outage, "RETRY_EVERY_S", 0.2)

    class Flaky(Scripted):
        def __init__(self, script, down_for: int):
            super().__init__(script)
            self.down_for = down_for

        def query(self, ids):
            if self.down_for != 0:
                self.down_for -= 1
                try:
                    raise Transient("connection refused")
                except Transient as cause:
                    raise SchedulerError("slurmctld unreachable") from cause
            return super().query(ids)

    from halo_sched.backends.base import Job

    done = JobState("9", JobStatus.COMPLETED, raw_state="COMPLETED")
    state = asyncio.run(Job(Flaky({"9": [_running("9"), done]}, down_for=3), "9").wait_async(timeout=60))
    assert state.status is JobStatus.COMPLETED
    from halo_sched.backends import watcher

    began = time.monotonic()
    with pytest.raises(halo_sched.OutcomeUnknown):
        asyncio.run(watcher.wait_async(Flaky({"10": [_running("10")]}, down_for=-1), "10", timeout=60, outage_s=1.0))
    assert time.monotonic() - began < 20


def test_wait_async_does_what_the_backends_wait_does():
    """SLURM's wait ends a job that can never start (PartitionNodeLimit): so does wait_async.
    Nomad's wait is its watchdog: wait_async runs it rather than polling past it."""
    from halo_sched.backends.slurm import SlurmScheduler
    from halo_sched.backends.slurm.transport.base import Transport

    class Stuck(Transport):
        name = "fake"

        def __init__(self):
            self.cancelled = []

        def query(self, ids):
            return {i: JobState(i, JobStatus.CANCELLED if i in self.cancelled else JobStatus.PENDING,
                                raw_state="PENDING", reason="PartitionNodeLimit") for i in ids}

        def submit(self, request):  # pragma: no cover - not used
            raise NotImplementedError

        def cancel(self, ids, signal=None):
            self.cancelled += list(ids)

        def job_info(self, job_id):
            return {}

    fake = Stuck()
    from halo_sched.backends.base import Job

    state = asyncio.run(Job(SlurmScheduler(transport=fake), "31").wait_async(timeout=30))
    assert state.status is JobStatus.CANCELLED and "can never start" in state.verdict and fake.cancelled == ["31"]

    from halo_sched.backends.nomad import NomadScheduler

    seen = []

    class Watched(NomadScheduler):
        def wait(self, job_id, timeout=None, **kw):
            seen.append(job_id)
            return JobState(job_id, JobStatus.FAILED, raw_state="dead", reason="rank 1 died; the watchdog stopped it")

    assert asyncio.run(Job(Watched(), "train-1").wait_async(timeout=5)).status is JobStatus.FAILED and seen == ["train-1"]
