"""Many handles, one poll: every Job handle on one scheduler is answered by a shared watcher that
makes one query (one squeue/sacct, or Nomad's few list calls) per poll for all unfinished jobs,
keeps finished states, and backs off while nothing changes."""
from __future__ import annotations

import threading
import time

import pytest

from halo_sched.backends.base import Job, JobState, JobStatus
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.backends.slurm.transport.base import Transport
from halo_sched.backends.watcher import Watcher, wait_shared, watcher_for


class CountingTransport(Transport):
    """A SLURM stand-in: each job runs for ``runs_for`` queries, then completes. Records every
    query's ids (the CLI transport turns one query into one sacct call, chunked per 1,000 ids)."""

    name = "fake"

    def __init__(self, ids, runs_for, before_first=None):
        self.left = {i: runs_for(i) for i in ids}
        self.queries: list[list[str]] = []
        self.lock = threading.Lock()
        self.before_first = before_first  # called once, as the first query begins

    def query(self, ids):
        if self.before_first is not None:
            hook, self.before_first = self.before_first, None
            hook()
        with self.lock:
            self.queries.append(list(ids))
            out = {}
            for i in ids:
                self.left[i] -= 1
                done = self.left[i] <= 0
                out[i] = JobState(i, JobStatus.COMPLETED if done else JobStatus.RUNNING,
                                  raw_state="COMPLETED" if done else "RUNNING")
            return out

    def submit(self, request):  # pragma: no cover - not used
        raise NotImplementedError

    def cancel(self, ids, signal=None):
        pass

    def job_info(self, job_id):  # pragma: no cover - not used
        return {}


def test_200_handles_waited_on_from_200_threads_make_one_query_per_poll():
    ids = [str(1000 + k) for k in range(200)]
    # Jobs end at different polls (1..8 queries in), so the live set shrinks poll by poll.

    def all_asked():
        # The first poll answers once every handle has asked (a loaded machine starts 200 threads
        # over a second or more, 50 polls at 0.02 s: that is start-up, not sharing). Not sharing,
        # each handle would poll for itself: 200 queries or more whatever this waits for.
        live = watcher_for(sched)._live
        deadline = time.monotonic() + 30
        while len(live) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.01)

    fake = CountingTransport(ids, runs_for=lambda i: 1 + int(i) % 8, before_first=all_asked)
    sched = SlurmScheduler(transport=fake)
    results: dict[str, JobState] = {}

    def wait(i):
        results[i] = Job(sched, i).wait(timeout=30, poll=0.02, max_poll=0.04)

    threads = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[i].status is JobStatus.COMPLETED for i in ids)
    # Per-handle polling would make >= 200 queries; sharing makes one per poll: the first (asked
    # by whoever came first), then one for every live job per poll until the last ends (8 in).
    assert len(fake.queries) <= 1 + 8, [len(q) for q in fake.queries]
    assert set(fake.queries[0]) | set(fake.queries[1]) == set(ids)
    # A finished job is never asked about again: each query counts a job's `left` down, and
    # the query that brought it to 0 answered COMPLETED; one more would take it below 0.
    assert all(fake.left[i] == 0 for i in ids), {i: n for i, n in fake.left.items() if n}
    # No id twice in one query.
    assert all(len(q) == len(set(q)) for q in fake.queries)


def test_status_of_many_handles_is_one_query_and_finished_states_are_cached():
    ids = [str(k) for k in range(1, 201)]
    fake = CountingTransport(ids, runs_for=lambda i: 1 if int(i) % 2 else 10**6)  # odd ids finish at once
    sched = SlurmScheduler(transport=fake)
    handles = [Job(sched, i) for i in ids]
    handles[0].status()
    # Registered one by one: the first status() polls only what is known then.
    assert fake.queries == [["1"]]
    for h in handles:
        h.status()
    before = len(fake.queries)
    states = [h.status() for h in handles]  # within status_max_age: the cache answers
    assert len(fake.queries) == before
    time.sleep(sched.status_max_age + 0.05)
    for h in handles:
        h.status()
    # After the cache aged: one query, for the unfinished (even) ids only.
    assert len(fake.queries) == before + 1
    assert fake.queries[-1] == sorted(i for i in ids if int(i) % 2 == 0)
    assert states[0].status is JobStatus.COMPLETED and states[1].status is JobStatus.RUNNING


def test_concurrent_status_calls_share_the_poll_in_flight():
    ids = [str(k) for k in range(50)]
    fake = CountingTransport(ids, runs_for=lambda i: 10**6)
    slow = fake.query

    def query(ids):
        time.sleep(0.2)  # a slow squeue: everyone else arrives while it runs
        return slow(ids)

    fake.query = query
    sched = SlurmScheduler(transport=fake)
    for i in ids:
        watcher_for(sched).register(i)
    barrier = threading.Barrier(len(ids))

    def ask(i):
        barrier.wait()
        Job(sched, i).status()

    threads = [threading.Thread(target=ask, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(fake.queries) == 1 and sorted(fake.queries[0]) == sorted(ids)


def test_interval_backs_off_while_nothing_changes_and_resets_on_a_change():
    calls = []
    # PENDING: a running job's polls are capped (test_running_job_polls_stay_short).
    state = {"s": JobStatus.PENDING}

    def describe(ids):
        calls.append(time.monotonic())
        return {i: JobState(i, state["s"], raw_state=state["s"].value) for i in ids}

    w = Watcher(describe, min_interval=0.02, max_interval=0.16)
    seen = float("-inf")
    intervals, reads = [], []
    for _ in range(6):
        w.next_state("1", seen)
        seen = w._read_at["1"]
        intervals.append(w.interval)
        reads.append(seen)  # when that poll started
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    # 0.02 (first change: PENDING seen), then doubling 0.04, 0.08, capped at 0.16: the schedule
    # the watcher keeps. Each poll waits at least its interval (a loaded machine only adds).
    assert intervals == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.16, 0.16]), intervals
    assert len(calls) == 6 and all(g >= i - 1e-9 for g, i in zip(gaps, intervals)), (gaps, intervals)
    state["s"] = JobStatus.COMPLETED
    st = w.next_state("1", seen)
    assert st.status is JobStatus.COMPLETED and w.interval == pytest.approx(0.02)
    n = len(calls)
    assert w.next_state("1", time.monotonic() + 10).status is JobStatus.COMPLETED
    assert len(calls) == n  # finished: cached, never asked again


def test_running_job_polls_stay_short_then_back_off_to_a_low_cap():
    """The end of a running job is what waiters wait for: polls stay at the shortest interval for
    its first hot_s seconds of running, then back off no further than running_max_interval; a
    pending job still backs off to max_interval."""
    calls = []
    state = {"s": JobStatus.PENDING}

    def describe(ids):
        calls.append(time.monotonic())
        return {i: JobState(i, state["s"], raw_state=state["s"].value) for i in ids}

    w = Watcher(describe, min_interval=0.02, max_interval=1.0, running_max_interval=0.06, hot_s=0.3)
    seen = float("-inf")
    for _ in range(5):
        w.next_state("1", seen)
        seen = w._read_at["1"]
    assert w.interval >= 0.16  # pending: backing off towards max_interval
    state["s"] = JobStatus.RUNNING
    # Each poll's interval and when it was read: hot (the first hot_s of running) it stays at the
    # shortest; then it backs off to the running cap and no further. Judged by the poll's own
    # read time, not by how fast this loop spins (a loaded machine may stall it for a while).
    log = []
    deadline = time.monotonic() + 30
    while not (log and log[-1][1] == pytest.approx(0.06)):
        assert time.monotonic() < deadline, log[-5:]
        w.next_state("1", seen)
        seen = w._read_at["1"]
        log.append((seen, w.interval))
        assert w.interval <= 0.06 + 1e-9, log[-5:]  # a running job's cap
    since = w._running_since["1"]
    assert all(i == pytest.approx(0.02) for t, i in log if t - since < 0.3), log
    assert all(i <= 0.06 + 1e-9 for _, i in log) and log[-1][0] - since >= 0.3, log
    state["s"] = JobStatus.COMPLETED
    n = len(calls)
    assert w.next_state("1", seen).status is JobStatus.COMPLETED and len(calls) == n + 1  # the very next poll
    assert not w._running_since


def test_wait_timeout_returns_the_last_state():
    w_calls = []

    class Sched:
        status_max_age = 1.0

        def watcher_key(self):
            return ("test-timeout", id(self))

        def query(self, ids):
            w_calls.append(ids)
            return {i: JobState(i, JobStatus.RUNNING) for i in ids}

    t = time.monotonic()
    out = []
    waiter = threading.Thread(target=lambda: out.append(wait_shared(Sched(), "x", timeout=0.3, poll=0.05, max_poll=0.1)),
                              daemon=True)
    waiter.start()
    waiter.join(30)  # a wait that ignored its timeout would never return: the job runs forever
    assert out, "wait_shared did not return at its timeout"
    st = out[0]
    assert st.status is JobStatus.RUNNING and time.monotonic() - t >= 0.3 and w_calls


def test_every_wait_loop_counts_the_same_changes():
    """A change is JobState.change_key, in the shared watcher's waits as in the local backend's
    and the Nomad watchdog's: more ranks placed (nothing running yet) is progress to report."""
    from halo_sched.jobstate import NomadDetail
    from halo_sched.backends.local import LocalScheduler

    def states():
        return [JobState("x", JobStatus.PARTIAL, raw_state="pending", nodes_total=4, nodes_running=0,
                         nomad=NomadDetail(nodes_placed=k)) for k in (1, 2, 3)] + [JobState("x", JobStatus.COMPLETED)]

    class Sched:
        status_max_age = 1.0

        def __init__(self):
            self.left = states()

        def watcher_key(self):
            return ("test-changes", id(self))

        def query(self, ids):
            return {i: self.left.pop(0) if len(self.left) > 1 else self.left[0] for i in ids}

    seen = []
    wait_shared(Sched(), "x", timeout=30, poll=0.01, max_poll=0.02, on_change=seen.append)
    assert [s.nomad.nodes_placed if s.nomad else None for s in seen] == [1, 2, 3, None]

    # The local backend's own wait (a pidfd, then its state file) reports the same changes.
    local = LocalScheduler()
    left = states()
    local._state = lambda job_id: left.pop(0) if len(left) > 1 else left[0]
    local._supervisor = lambda d: None
    seen = []
    local.wait("x", timeout=30, poll=0.01, on_change=seen.append)
    assert [s.nomad.nodes_placed if s.nomad else None for s in seen] == [1, 2, 3, None]
