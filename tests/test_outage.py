"""Waiting through a scheduler outage, with stand-ins and a fake clock: the budget, the one line
per interval, exit 3 when the budget (or --timeout) runs out, a real answer ending the wait at
once, every call bounded by the caller's deadline, status's fallback to the last known state,
and logs --follow reading on while the end cannot be asked. (The real controller outage:
tests/test_slurm_outage.py.)"""
from __future__ import annotations

import subprocess
import threading

import pytest

from halo_sched import outage as outage_mod
from halo_sched import records
from halo_sched.backends.base import EndWatch, JobState, JobStatus, tail_lines
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.backends.slurm.transport.base import Transport
from halo_sched.backends.watcher import wait_loop
from halo_sched.errors import EXIT_OUTCOME_UNKNOWN, OutcomeUnknown, SchedulerError, UsageError
from halo_sched.outage import Outage, is_outage, outage_budget
from halo_sched.retry import RetryPolicy, Transient, time_left, within


def unreachable() -> SchedulerError:
    """What the SLURM transport raises once its retries are spent on a stopped slurmctld."""
    err = SchedulerError("squeue failed 3 times: squeue: error: Unable to contact slurm controller (connect failure)")
    err.__cause__ = Transient("squeue: error: Unable to contact slurm controller (connect failure)")
    return err


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(0.0, s)

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now


def scripted(clock: FakeClock, script, ask_s: float = 10.0):
    """next_state: each ask takes ``ask_s`` fake seconds and answers (or raises) the next item."""
    items = iter(script)

    def next_state(_left):
        clock.now += ask_s
        item = next(items)
        if isinstance(item, BaseException):
            raise item
        return JobState("7", item, raw_state=item.value)

    return next_state


def run(clock: FakeClock, script, budget: float = 600, deadline: float | None = None, ask_s: float = 10.0):
    notes: list[str] = []
    out = Outage("slurm", "7", budget, notes.append, clock=clock, wall=clock.wall)
    state = wait_loop(scripted(clock, script, ask_s), deadline, outage=out, clock=clock, sleep=clock.sleep)
    return state, notes


def test_an_outage_shorter_than_the_budget_is_waited_through_with_one_line_per_minute():
    clock = FakeClock()
    # RUNNING, then 20 failed asks (10 s each + 5 s apart: 300 s), then the real end.
    script = [JobStatus.RUNNING] + [unreachable()] * 20 + [JobStatus.RUNNING, JobStatus.COMPLETED]
    state, notes = run(clock, script)
    assert state.status is JobStatus.COMPLETED
    down = [n for n in notes if "unreachable since" in n]
    # 300 s of outage, a line at once and one per 60 s after: 5 or 6 lines, never 20 (per poll).
    assert 5 <= len(down) <= 6, notes
    assert "SLURM unreachable since" in down[0] and "last known RUNNING" in down[0]
    assert "waiting up to 10 min (HALO_OUTAGE_S)" in down[0]
    assert "answers again" in notes[-1]


def test_the_budget_running_out_is_outcome_unknown_with_what_is_known():
    clock = FakeClock()
    start = clock.now
    with pytest.raises(OutcomeUnknown) as exc:
        run(clock, [JobStatus.RUNNING] + [unreachable()] * 1000, budget=120)
    assert exc.value.exit_code == EXIT_OUTCOME_UNKNOWN == 3
    text = str(exc.value)
    assert "outcome unknown" in text and "past the outage budget of 2 min (HALO_OUTAGE_S)" in text
    assert "last known RUNNING at" in text and "halo-sched status 7" in text
    # Counted from the first failed ask (started at start+10), ended within one ask past it.
    assert start + 10 + 120 <= clock.now <= start + 10 + 120 + 10 + 5


def test_a_real_answer_ends_the_wait_at_once():
    clock = FakeClock()
    real = SchedulerError("squeue failed (exit 1): squeue: error: Invalid user for SlurmUser")
    with pytest.raises(SchedulerError) as exc:
        run(clock, [JobStatus.RUNNING, real])
    assert exc.value is real and not isinstance(exc.value, OutcomeUnknown)


def test_unreachable_when_timeout_ends_is_outcome_unknown_not_still_running():
    clock = FakeClock()
    deadline = clock.now + 60
    with pytest.raises(OutcomeUnknown) as exc:
        run(clock, [JobStatus.RUNNING] + [unreachable()] * 100, deadline=deadline)
    assert "unreachable at the end of --timeout" in str(exc.value)
    assert clock.now <= deadline + 10  # within one ask of --timeout


def test_is_outage_tells_an_unreachable_scheduler_from_its_answer():
    assert is_outage(unreachable())
    assert not is_outage(SchedulerError("sbatch: error: invalid partition specified: nope"))
    assert not is_outage(UsageError("bad id"))
    assert not is_outage(OutcomeUnknown("already unknown"))


def test_the_budget_is_documented_and_configurable(monkeypatch):
    monkeypatch.delenv("HALO_OUTAGE_S", raising=False)
    assert outage_budget() == 600
    monkeypatch.setenv("HALO_OUTAGE_S", "90")
    assert outage_budget() == 90 and outage_budget(5) == 5
    monkeypatch.setenv("HALO_OUTAGE_S", "ten minutes")
    with pytest.raises(UsageError, match="HALO_OUTAGE_S"):
        outage_budget()


def test_every_retry_stops_at_the_callers_deadline():
    tries = []

    def attempt():
        tries.append(1)
        raise Transient("Unable to contact slurm controller")

    policy = RetryPolicy(attempts=3, first_wait_s=0.5)
    with pytest.raises(Transient):
        policy.call(attempt, sleep=lambda s: None)
    assert len(tries) == 3
    tries.clear()
    with within(0), pytest.raises(Transient):  # no time left: one attempt, no retries
        policy.call(attempt, sleep=lambda s: None)
    assert len(tries) == 1
    with within(100):
        with within(5):
            assert time_left() <= 5
        assert 5 < time_left() <= 100


def test_a_slurm_client_command_is_cut_at_the_callers_deadline(monkeypatch):
    from halo_sched.backends.slurm.transport import cli as cli_transport

    seen = []

    def fake_run(argv, **kw):
        seen.append(kw["timeout"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cli_transport.subprocess, "run", fake_run)
    runner = cli_transport.default_runner(60.0)
    runner(["squeue"], None)
    with within(3):
        runner(["squeue"], None)
    assert seen[0] == 60.0 and seen[1] <= 3


class DownTransport(Transport):
    """A SLURM stand-in whose controller does not answer."""

    name = "down"

    def query(self, ids):
        raise unreachable()

    def submit(self, request):  # pragma: no cover - not used
        raise NotImplementedError

    def cancel(self, ids, signal=None):  # pragma: no cover - not used
        raise NotImplementedError

    def job_info(self, job_id):  # pragma: no cover - not used
        raise NotImplementedError


def _record(job_id: str, status: JobStatus) -> None:
    rec = {"id": job_id, "backend": "slurm", "name": "x", "submitted": 1.0, "outputs": []}
    records.write(rec)
    records.update_state(rec, JobState(job_id, status, raw_state=status.value, nodes_total=1,
                                       nodes_running=1 if status is JobStatus.RUNNING else 0))


def test_status_shows_the_last_known_state_labelled_when_slurm_is_unreachable(monkeypatch, capsys):
    from halo_sched import cli

    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=DownTransport()))
    _record("41", JobStatus.RUNNING)
    _record("42", JobStatus.COMPLETED)
    assert cli.main(["status", "41", "42", "--backend", "slurm"]) == 3  # RUNNING may have changed
    out, err = capsys.readouterr()
    assert "41\tlast known RUNNING 1/1 nodes running at " in out and "; SLURM unreachable" in out
    assert "42\tlast known COMPLETED" in out
    assert "SLURM did not answer" in err
    # An end seen before stays the end: exit 0.
    assert cli.main(["status", "42", "--backend", "slurm"]) == 0
    # Nothing to fall back on: the scheduler's error, exit 1.
    assert cli.main(["status", "43", "--backend", "slurm"]) == 1


def test_logs_follow_reads_on_while_the_end_cannot_be_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(outage_mod, "RETRY_EVERY_S", 0.01)
    log = tmp_path / "out.log"
    log.write_text("line 0\n")
    answers = [unreachable()] * 5 + [JobState("7", JobStatus.COMPLETED)]
    calls = []
    release = threading.Event()

    def query():
        calls.append(1)
        if len(calls) > 5:
            release.wait(30)  # the end only once the reader has shown what the file held
        item = answers[min(len(calls) - 1, len(answers) - 1)]
        if isinstance(item, BaseException):
            raise item
        return item

    ended = EndWatch("slurm", "7", query, poll=0.01, outage_s=600)
    lines = tail_lines(log, True, ended, poll=0.01)
    assert next(lines) == "line 0\n"
    with log.open("a") as f:  # written while the controller does not answer
        f.write("line 1\nline 2\n")
    assert next(lines) == "line 1\n" and next(lines) == "line 2\n"
    assert ended.last is None  # shown while no query had answered
    release.set()
    assert list(lines) == []  # the end came: the follow ends
    assert ended.last.status is JobStatus.COMPLETED


def test_logs_follow_ends_outcome_unknown_past_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(outage_mod, "RETRY_EVERY_S", 0.01)
    log = tmp_path / "out.log"
    log.write_text("line 0\n")

    def query():
        raise unreachable()

    ended = EndWatch("slurm", "7", query, poll=0.01, outage_s=0)
    lines = tail_lines(log, True, ended, poll=0.01)
    assert next(lines) == "line 0\n"
    with pytest.raises(OutcomeUnknown):
        list(lines)


# ---- Nomad: its fake API without a leader for a while --------------------------------------------


def _nomad_job(tmp_path):
    import yaml

    from helpers import REPO

    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data["nodes"], data["gpus_per_node"], data["nproc_per_node"] = 2, 8, 8
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None, placement_timeout_s=None)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_nomad_watch_waits_through_a_leaderless_window_and_says_so(tmp_path):
    import os
    import sys
    import time

    from helpers import cli, load_nomad_helper

    fake_api = load_nomad_helper("fake_api")
    nodes = [fake_api.FakeNode(n, docker_volumes_enabled=True) for n in ("gpu-a", "gpu-b")]
    with fake_api.FakeNomad(nodes, token="tok") as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN="tok")
        r = cli("submit", str(_nomad_job(tmp_path)), "--backend", "nomad", env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        # "No cluster leader" for the next 8 reads of the allocations: two asks' worth of retries.
        fake.fail_next(8, status=500, path_contains="/allocations")
        watch = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "watch", job_id, "--backend", "nomad"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while len(fake.requests_to("/allocations")) < 9 and time.monotonic() < deadline:
                time.sleep(0.2)  # the window has passed: Nomad answers again
            for g in ("trainer[0]", "trainer[1]"):
                fake.finish(job_id, g, exit_code=0)
            out, err = watch.communicate(timeout=90)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        assert watch.returncode == 0, err
        assert "Nomad unreachable since" in err and "answers again" in err and "COMPLETED" in err
        assert err.count("unreachable since") == 1, err  # one line for the outage, not one per ask
        assert "Traceback" not in err


def _nomad_unreachable():
    """What the Nomad client raises once its retries are spent on a refused connection."""
    import requests

    from halo_sched.backends.nomad.transport import NomadAPIError

    err = NomadAPIError("cannot reach Nomad at http://127.0.0.1:1 (read stdout, 4 attempts): it refused the connection")
    err.__cause__ = requests.ConnectionError("refused")
    return err


def _stream_broke():
    import requests

    from halo_sched.backends.nomad.transport import NomadAPIError

    err = NomadAPIError("log stream from Nomad at http://127.0.0.1:1 broke (read stdout): reset")
    err.__cause__ = requests.exceptions.ChunkedEncodingError("reset")
    return err


class LogsClient:
    """A Nomad stand-in for ``logs --follow``: stdout is ``TEXT``; the first stream breaks after
    its first two chunks (the server went away), the first reopen is refused, the next one
    serves from the offset asked."""

    TEXT = "line 0\nline 1\nlin" + "e 2\nline 3\n"

    def __init__(self):
        self.opened: list[int] = []

    def logs(self, alloc_id, task, type="stdout", follow=False, origin="start", offset=0):  # noqa: A002
        if type == "stderr":
            return iter(())
        self.opened.append(offset)
        if len(self.opened) == 2:
            raise _nomad_unreachable()

        def gen():
            if len(self.opened) == 1:
                yield "line 0\nline 1\n"
                yield "lin"
                raise _stream_broke()
            yield self.TEXT.encode()[offset:].decode()

        return gen()


def test_nomad_logs_follow_reopens_a_broken_stream_where_it_stopped(monkeypatch):
    from halo_sched.backends.nomad import NomadScheduler

    monkeypatch.setattr(outage_mod, "RETRY_EVERY_S", 0.01)
    notes: list[str] = []
    monkeypatch.setattr(outage_mod, "_sink", notes.append)
    client = LogsClient()
    lines = list(NomadScheduler()._follow_all(client, {"[node 0] ": {"ID": "a1"}}, "job-1"))
    assert lines == [f"[node 0] line {i}\n" for i in range(4)]  # every line once, none cut
    assert client.opened == [0, 17, 17]  # reopened at the bytes shown (the partial "lin" too)
    assert any("Nomad unreachable since" in n for n in notes) and "answers again" in notes[-1]


class FlakyTransport(DownTransport):
    """RUNNING, then ``down`` unreachable polls, then COMPLETED."""

    def __init__(self, down: int):
        self.calls = 0
        self.down = down

    def query(self, ids):
        self.calls += 1
        if 1 < self.calls <= 1 + self.down:
            raise unreachable()
        status = JobStatus.RUNNING if self.calls == 1 else JobStatus.COMPLETED
        return {i: JobState(i, status, raw_state=status.value) for i in ids}


def test_job_wait_waits_through_an_outage_and_raises_outcome_unknown_past_its_budget(monkeypatch):
    from halo_sched.backends import watcher
    from halo_sched.backends.base import Job

    monkeypatch.setattr(watcher, "RETRY_EVERY_S", 0.01)
    notes: list[str] = []
    job = Job(SlurmScheduler(transport=FlakyTransport(down=3)), "9")
    state = job.wait(poll=0.01, outage_s=600, on_outage=notes.append)
    assert state.status is JobStatus.COMPLETED
    assert len(notes) == 2 and "SLURM unreachable since" in notes[0] and "answers again" in notes[1]
    job = Job(SlurmScheduler(transport=FlakyTransport(down=10**6)), "10")
    with pytest.raises(OutcomeUnknown, match="past the outage budget of 0 s"):
        job.wait(poll=0.01, outage_s=0, on_outage=notes.append)


def test_nomad_status_falls_back_to_the_last_known_state_when_the_server_is_gone(tmp_path):
    import os

    from helpers import cli, load_nomad_helper

    fake_api = load_nomad_helper("fake_api")
    nodes = [fake_api.FakeNode(n, docker_volumes_enabled=True) for n in ("gpu-a", "gpu-b")]
    with fake_api.FakeNomad(nodes, token="tok") as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN="tok")
        job_id = cli("submit", str(_nomad_job(tmp_path)), "--backend", "nomad", env=env, timeout=60).stdout.split()[-1]
        assert cli("status", job_id, env=env, timeout=60).returncode == 0  # RUNNING, kept in the record
    # The server is gone (every connection refused).
    r = cli("status", job_id, env=env, timeout=60)
    assert r.returncode == 3, r.stderr
    assert r.stdout.startswith(f"{job_id}\tlast known RUNNING") and "; Nomad unreachable" in r.stdout
    assert "Nomad did not answer" in r.stderr and "Traceback" not in r.stderr


class LeftRecordingTransport(DownTransport):
    """RUNNING twice, then COMPLETED; records the time its caller's deadline leaves each query."""

    def __init__(self):
        self.left: list[float | None] = []

    def query(self, ids):
        self.left.append(time_left())
        status = JobStatus.COMPLETED if len(self.left) >= 3 else JobStatus.RUNNING
        return {i: JobState(i, status, raw_state=status.value) for i in ids}


def test_one_polls_bound_starts_at_the_query_not_at_the_wait_for_its_turn(monkeypatch):
    """The shared watcher spaces polls (3 s here); the bound of one ask (1 s here) must not be
    spent waiting for the poll's turn, or a healthy squeue gets no time (and reads as an outage)."""
    from halo_sched.backends import watcher
    from halo_sched.backends.base import Job

    monkeypatch.setattr(watcher, "ASK_LIMIT_S", 1.0)
    fake = LeftRecordingTransport()
    sched = SlurmScheduler(transport=fake)
    w = watcher.watcher_for(sched)
    w.min_interval = w.running_max_interval = w.interval = 3.0
    assert Job(sched, "11").wait(poll=3.0, outage_s=600).status is JobStatus.COMPLETED
    assert len(fake.left) == 3 and all(x is not None and x > 0 for x in fake.left), fake.left
