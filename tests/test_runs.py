"""retry: in the job file (validation, exit 2 naming the field), what a retry attempt renders
(HALO_RESTART_COUNT carried on, the culprit host excluded), and which failures start another
attempt (halo_sched/runs.py), with stand-in states: no scheduler, no torch."""
from __future__ import annotations

import pytest

import halo_sched.errors  # the module itself: `import halo_sched` loads it lazily
from halo_sched.jobstate import JobState, JobStatus
from halo_sched.node import failure_classes as fc
from halo_sched.node.failure_classes import Classification
from halo_sched.runs import next_spec, wants_retry
from helpers import cli, example_job


@pytest.mark.parametrize("retry, field", [
    ({"attempts": 0}, "retry.attempts"),
    ({"attempts": 21}, "retry.attempts"),
    ({"attempts": 2, "on": ["node", "oom"]}, "retry.on"),
    ({"attempts": 2, "on": ["jobs"]}, "retry.on"),
    ({"attempts": 2, "on": "node"}, "retry.on"),
    ({"attempts": 2, "bogus": 1}, "retry.bogus"),
])
def test_a_bad_retry_is_exit_2_naming_the_field(tmp_path, retry, field):
    job = example_job(tmp_path, 29500, retry=retry)
    r = cli("validate", str(job), timeout=60)
    assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, r.stderr


def _spec(tmp_path, **retry):
    return halo_sched.load(example_job(tmp_path, 29500, retry=retry or {"attempts": 3, "on": ["node"]}))


def test_a_retry_attempt_carries_the_count_on_and_excludes_the_culprit(tmp_path):
    spec = _spec(tmp_path)
    first = halo_sched.render(spec, "slurm")
    # SLURM: the attempt number comes from the failed attempt's sbatch (HALO_RUN_ATTEMPT), else the rendered one.
    assert "halo_attempt=${HALO_RUN_ATTEMPT:-0} " in first and "--exclude" not in first
    # The count goes on from the failed attempt's restarts of every kind (HALO_RUN_RESTARTS), else the attempt number.
    assert "halo_restarts=${HALO_RUN_RESTARTS:-$halo_attempt}" in first
    assert 'export HALO_RESTART_COUNT="$((10#$halo_restarts + ${SLURM_RESTART_COUNT:-0}))"' in first
    again = halo_sched.render(next_spec(spec, "42", 2, ("n2", "n1"), None), "slurm")
    assert "halo_run_id=${HALO_RUN_ID:-42} halo_attempt=${HALO_RUN_ATTEMPT:-2} halo_run_excluded=${HALO_RUN_EXCLUDED-n1,n2}" in again
    assert "#SBATCH --exclude=n1,n2\n" in again
    spec = spec.model_copy(update={"image": "python:3.11"})
    nomad = halo_sched.render(next_spec(spec, "42", 1, ("n2",), None), "nomad", format="json")
    assert '"n2"' in nomad and "node.unique.name" in nomad
    assert '"HALO_RESTART_COUNT": "1"' in nomad
    assert '"HALO_RESTART_COUNT": "' not in halo_sched.render(spec, "nomad", format="json")


def _failed(cls: Classification | None, status=JobStatus.FAILED) -> JobState:
    st = JobState("1", status)
    st.failure_class = lambda: cls  # the classification under test, as the failure report gives it
    return st


NODE = Classification(fc.NODE_FAULT, "NCCL network error", "n1", "nccl-ib")
PREFLIGHT = Classification(fc.PREFLIGHT_FAILED, "preflight check failed", "n1", "preflight")
JOB = Classification(fc.JOB_FAULT, "Python exception", "", "python-exception")
UNKNOWN = Classification(fc.UNKNOWN_CAUSE)
HUNG_ON_NODE = Classification(fc.HUNG_ON_NODE, "no progress", "n1", "hung")
HUNG_NO_CULPRIT = Classification(fc.HUNG_NO_CULPRIT, "no progress", "", "hung")


@pytest.mark.parametrize("on, cls, attempt, retried", [
    (["node"], NODE, 0, True),
    (["node"], NODE, 2, False),  # the third of 3 attempts: none left
    (["node"], JOB, 0, False),
    (["node", "hang", "preflight"], UNKNOWN, 0, False),
    (["preflight"], NODE, 0, False),
    (["preflight"], PREFLIGHT, 0, True),
    (["node"], PREFLIGHT, 0, True),  # a preflight failure is a node fault
    (["hang"], HUNG_ON_NODE, 0, True),
    (["node"], HUNG_ON_NODE, 0, True),  # a hang with a culprit node is a node fault
    (["hang"], HUNG_NO_CULPRIT, 0, True),
    (["node", "preflight"], HUNG_NO_CULPRIT, 0, False),  # no node to blame: only `hang` retries it
    # job and unknown, opt-in (issue 39): each retries its own class only.
    (["job"], JOB, 0, True),
    (["job"], JOB, 2, False),
    (["job"], UNKNOWN, 0, False),
    (["job"], NODE, 0, False),
    (["unknown"], UNKNOWN, 0, True),
    (["unknown"], JOB, 0, False),
    (["unknown"], HUNG_NO_CULPRIT, 0, False),
])
def test_which_failures_start_another_attempt(tmp_path, on, cls, attempt, retried):
    spec = _spec(tmp_path, attempts=3, on=on)
    assert wants_retry(spec, _failed(cls), attempt)[0] is retried


def test_no_retry_without_the_field_or_after_success(tmp_path):
    spec = halo_sched.load(example_job(tmp_path, 29500))
    assert spec.retry is None and not wants_retry(spec, _failed(NODE), 0)[0]
    assert not wants_retry(_spec(tmp_path), _failed(None, JobStatus.COMPLETED), 0)[0]


def test_a_records_failure_class_reads_back_as_the_typed_value():
    for cls in (NODE, PREFLIGHT, JOB, UNKNOWN, HUNG_ON_NODE, HUNG_NO_CULPRIT):
        assert Classification.from_dict(cls.to_dict()) == cls
    # A record kept before the class was named: its fault's class; anything else is no class.
    assert Classification.from_dict({"class": "node", "reason": "x", "host": "h", "by": "xid"}).failure is fc.NODE_FAULT
    assert Classification.from_dict({"class": ["node"]}) is None and Classification.from_dict("node") is None


def test_slurm_start_and_end_times_count_only_once_they_happened():
    """squeue's StartTime is an estimate while a job waits and EndTime its time limit while it
    runs: started_at/ended_at are taken only once they are facts."""
    import time

    from halo_sched.backends.slurm.status import SEP, parse_squeue

    def row(state: str) -> str:
        return SEP.join(["7", "7", state, "0", "2", "None", "n[1-2]", "0", "0", "2026-12-01T10:00:00",
                         "2026-12-01T10:00:05", "(null)", "2026-12-01T10:30:05"]) + SEP

    start = time.mktime(time.strptime("2026-12-01T10:00:05", "%Y-%m-%dT%H:%M:%S"))
    done, running, pending = (parse_squeue(row(s))[0] for s in ("COMPLETED", "RUNNING", "PENDING"))
    assert (done.started_at, done.ended_at) == (start, start + 1800)
    assert (running.started_at, running.ended_at) == (start, None)
    assert (pending.started_at, pending.ended_at) == (None, None)



def test_retry_on_is_written_bare_or_quoted_in_yaml():
    """YAML 1.1 reads a plain ``on`` as true; as a key, the loader keeps the name written, so
    ``on:`` works as it does in CI workflows, and so does ``"on":``."""
    head = "name: j\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n"
    spec = halo_sched.loads(head + 'retry:\n  attempts: 2\n  "on": [node, preflight]\n')
    assert spec.retry.on == ["node", "preflight"]
    assert halo_sched.loads(head + "retry: {attempts: 2, on: [node]}\n").retry.on == ["node"]
    assert halo_sched.loads(head + "retry:\n  attempts: 2\n  on: [hang]\n").retry.on == ["hang"]
    assert halo_sched.loads(head + "retry: {attempts: 2, on: [job, unknown]}\n").retry.on == ["job", "unknown"]
    assert halo_sched.loads(head + "retry: {attempts: 2}\n").retry.on == ["node"]  # job and unknown: opt-in


def test_retry_on_nothing_is_refused():
    """``on: []`` would validate a retry that can never happen (as ``notify.on: []`` is refused)."""
    head = "name: j\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n"
    with pytest.raises(halo_sched.errors.SpecError) as ei:
        halo_sched.loads(head + "retry: {attempts: 2, on: []}\n")
    assert [f for f, _ in ei.value.problems] == ["retry.on (line 5)"], ei.value.problems


def test_a_hand_edited_run_record_never_breaks_status_or_list(tmp_path):
    """Counts in a run record that are not counts read as 0: no traceback from the hours."""
    from halo_sched.runs import row_of, totals

    rec = {"id": "9", "backend": "slurm", "nodes": "two", "spec": {"gpus_per_node": None, "servers": "x"},
           "run": {"id": "9", "attempt": "first", "excluded": "node2"},
           "last_state": {"status": "FAILED", "started_at": 10, "ended_at": 3610, "failure_class": "node"}}
    row = row_of(rec)
    assert (row.number, row.nodes, row.gpus_per_node, row.wall_s, row.hosts_excluded) == (1, 0, 0, 3600.0, [])
    assert totals([row])["gpu_hours"] == 0


@pytest.mark.parametrize("nodes, started, ended", [(10 ** 400, 10, 3610), (2, 0, float("inf")), (2, -1e308, 1e308)])
def test_counts_and_times_beyond_bounds_in_a_run_record_are_not_hours(nodes, started, ended):
    """A record is a file: 10**400 nodes (OverflowError turning the hours into a float) or an
    Infinity time (infinite GPU-hours) is no count and no clock."""
    import math

    from halo_sched.runs import row_of, totals

    rec = {"id": "9", "backend": "slurm", "nodes": nodes, "spec": {"gpus_per_node": 8},
           "run": {"id": "9", "attempt": 0, "excluded": []},
           "last_state": {"status": "FAILED", "started_at": started, "ended_at": ended}}
    row = row_of(rec)
    t = totals([row])
    assert all(math.isfinite(v) for v in (row.node_hours, row.gpu_hours, t["gpu_hours"], t["node_hours"])), (row, t)


def test_a_reader_queues_the_retried_notification_once_per_next_attempt(tmp_path, monkeypatch):
    # Each failed attempt's actor started the next (SLURM: its marker); the reader that first
    # records the next attempt queues `retried` for the failed one (notify.send dedupes per job
    # and event; here its calls are recorded).
    from halo_sched import notify, records, runs
    from halo_sched.backends.base import Scheduler

    spec = _spec(tmp_path, attempts=3, on=["node"])
    sent = []
    monkeypatch.setattr(notify, "send", lambda rec, event, line, attempt=None, start=True:
                        sent.append((rec["id"], event, line)))
    records.write({"id": "j1", "backend": "slurm", "submitted": 1.0, "run": {"id": "j1", "attempt": 0, "excluded": []},
                   "last_state": {"status": "FAILED", "describe": "FAILED: node 1 exit 1"}})
    ended: set = set()

    class Sched(Scheduler):
        name = "slurm"
        starts_successor = True
        cancel = logs = render = schedule = None

        def query(self, ids):
            return {i: ends[i] for i in ids}

        def successor_of(self, record):  # started as the attempt ended
            nxt = {"j1": "j2", "j2": "j3"}.get(record["id"])
            return {"job": nxt, "excluded": ["n1"], "submitted_at": 2.0, "retry_on": "node"} \
                if nxt and record["id"] in ended else None

    ends = {"j1": _failed(NODE), "j2": _failed(NODE), "j3": JobState("j3", JobStatus.COMPLETED)}

    def wait(job_id: str) -> JobState:
        ended.add(job_id)
        return ends[job_id]

    last, state = runs.wait_run(Sched(), spec, "j1", wait, poll_s=0.01)
    assert (last, state.status) == ("j3", JobStatus.COMPLETED)
    assert [(job, event) for job, event, _ in sent] == [("j1", "retried"), ("j2", "retried")]
    assert sent[0][2] == "attempt 2 (j2) after node: FAILED: node 1 exit 1", sent
    runs.follow_run(Sched(), "j1")  # read again: already recorded, nothing queued twice
    assert len(sent) == 2


def test_ctrl_c_during_a_retried_runs_wait_names_the_attempt_that_keeps_running(tmp_path, monkeypatch, capsys):
    """After a retry, the attempt running when the wait is interrupted is the new one (the first
    attempt had already failed): the message names it, and the id line still names the run."""
    from halo_sched import cli, records
    from halo_sched.backends.base import Scheduler

    job = example_job(tmp_path, 29500, retry={"attempts": 3, "on": ["node"]})

    class Fake(Scheduler):  # j1's batch script started j2 (its marker), as a failed SLURM attempt does
        name = "slurm"
        ids = iter(["j1"])
        starts_successor = True
        cancel = logs = render = schedule = None

        ended: set = set()

        def successor_of(self, record):
            if record.get("id") == "j1" and "j1" in self.ended:
                return {"job": "j2", "excluded": ["n1"], "submitted_at": 2.0}
            return None

        def _submit(self, spec):
            job_id = next(self.ids)
            a = getattr(spec, "_attempt", None)
            records.write({"id": job_id, "backend": "slurm", "submitted": 1.0, "name": "t",
                           "run": {"id": "j1", "attempt": a.number if a else 0, "excluded": []}})
            return type("J", (), {"id": job_id})()

        def submit(self, spec):
            return self._submit(spec)

        def query(self, ids):
            self.ended.update(i for i in ids if i == "j1")  # seen ended: its successor follows
            return {i: _failed(NODE) if i == "j1" else JobState(i, JobStatus.RUNNING) for i in ids}

        def wait(self, job_id, timeout=None, on_change=None, on_tick=None, outage_s=None, **kw):
            if job_id == "j2":
                raise KeyboardInterrupt
            return self.query([job_id])[job_id]

    monkeypatch.setattr(cli, "_scheduler", lambda name: Fake())
    rc = cli.main(["submit", str(job), "--backend", "slurm", "--wait", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 130 and "stopped waiting; j2 keeps running (halo-sched cancel j2" in err, err
    assert out.strip().splitlines()[-1] == "j1"


@pytest.mark.parametrize("ended", [JobStatus.NODE_FAIL, JobStatus.CANCELLED, JobStatus.FAILED])
@pytest.mark.parametrize("guardian_acts", [True, False])
def test_no_client_submits_an_slurm_attempt_a_reader_follows_what_the_guardian_started(tmp_path, monkeypatch, ended,
                                                                                       guardian_acts):
    """No client ever submits an SLURM attempt, whatever the attempt ended of (NODE_FAIL kills the
    batch script with the allocation; a lost batch host ends CANCELLED by its watcher): the
    attempt's guardian job does (node/guardian.py). A reader waits while the guardian pends or
    runs and follows the attempt it started; when the guardian ends without one, the run ended
    there. Nothing is submitted either way."""
    from halo_sched import records, runs

    spec = _spec(tmp_path, attempts=2, on=["node"])
    monkeypatch.setattr(runs, "SUCCESSOR_WAIT_S", 0.2)
    monkeypatch.setattr(runs, "GUARDIAN_POLL_S", 0.0)
    monkeypatch.setattr(records, "find", lambda job_id, backend=None, **kw: [{"id": job_id, "backend": "slurm"}])
    monkeypatch.setattr(records, "adopt", lambda *a, **kw: None)
    made, asked = [], []

    class Sched:
        name = "slurm"
        starts_successor = True

        def successor_of(self, record):  # the guardian's marker, once it ran (its third round)
            if record["id"] == "j1" and guardian_acts and len(asked) >= 3:
                return {"job": "j2", "excluded": ["n1"], "submitted_at": 1.0, "retry_on": "node"}
            return None

        def guardian_alive(self, job_id):
            asked.append(job_id)
            return len(asked) < 3

        def attempt_fields(self, record, job_id):
            return {}

        def owner_gone(self, run_id):
            return False

        def submit(self, spec):
            made.append(spec._attempt.number)
            return type("J", (), {"id": "jX"})()

    ends = {"j1": _failed(NODE, status=ended), "j2": JobState("j2", JobStatus.COMPLETED)}
    last, state = runs.wait_run(Sched(), spec, "j1", lambda job_id: ends[job_id], poll_s=0.01)
    assert made == []
    assert (last, state.status) == (("j2", JobStatus.COMPLETED) if guardian_acts else ("j1", ended))
    assert len(asked) >= 3  # waited while the guardian was alive, for any end but COMPLETED


def test_a_waiter_whose_local_keeper_is_gone_starts_a_keeper_and_submits_nothing(tmp_path, monkeypatch):
    """A local run's keeper was killed while its attempt ran; the attempt then failed as
    ``retry.on`` lists. The waiter starts a new keeper (``start_owner``), which starts the next
    attempt and names it in the store; the waiter follows it and submits nothing itself. A run
    whose failure is not retried gets no keeper started."""
    from halo_sched import records, runs
    from halo_sched.backends.base import Scheduler

    spec = _spec(tmp_path, attempts=2, on=["node"])
    for run_id in ("j1", "k1"):
        records.write({"id": run_id, "backend": "local", "submitted": 1.0, "name": "t",
                       "run": {"id": run_id, "attempt": 0, "excluded": []}})

    class Sched(Scheduler):
        name = "local"
        starts_successor = True
        cancel = logs = render = schedule = query = None

        def __init__(self):
            self.keepers = 0

        def owner_gone(self, run_id):
            return self.keepers == 0

        def start_owner(self, run_id):  # the new keeper carries the run on: it starts and names attempt 2
            self.keepers += 1
            records.write({"id": "j2", "backend": "local", "submitted": 2.0, "name": "t",
                           "run": {"id": "j1", "attempt": 1, "excluded": ["n1"]}})
            records.link("j1", "local", "j1", "j2")
            return True

        def submit(self, spec, **opts):
            raise AssertionError("a waiter submitted an attempt")

        def submit_attempt(self, spec, previous_id):
            raise AssertionError("a waiter submitted an attempt")

    sched = Sched()
    retried = []
    ends = {"j1": _failed(NODE), "j2": JobState("j2", JobStatus.COMPLETED)}
    last, state = runs.wait_run(sched, spec, "j1", lambda job_id: ends[job_id],
                                on_retry=lambda old, st, why, new: retried.append((old, why, new)), poll_s=0.01)
    assert (last, state.status, sched.keepers, retried) == ("j2", JobStatus.COMPLETED, 1, [("j1", "node", "j2")])

    job_fault = _spec(tmp_path, attempts=2, on=["job"])  # a node's fault is not retried here
    idle = Sched()
    last, state = runs.wait_run(idle, job_fault, "k1", lambda job_id: _failed(NODE), poll_s=0.01)
    assert (last, state.status, idle.keepers) == ("k1", JobStatus.FAILED, 0)
