"""The one process that acts for a local run (``retry:`` on the local backend): it alone decides
and starts the run's next attempts.

``submit`` of a local run starts it detached (its own session, like the local supervisor), so
it outlives the submitting process: ``submit`` without ``--wait``, a closed terminal, a killed
``--wait``. It waits on the run's newest attempt and, after a failure ``retry.on`` lists,
starts the next attempt (:func:`keep`), until an attempt ends otherwise. Exactly one next
attempt per failure: one keeper per run, and the attempt's identity decided and recorded before
it starts (backends/local.py ``submit_attempt``, records.decide), so that a keeper killed at any
step leaves either nothing decided or the attempt the next keeper starts or adopts
(tests/test_one_attempt.py). Everyone else who waits on the run (``submit --wait``, ``watch``,
:meth:`Run.wait`) only reads: it follows what the keeper started (halo_sched/runs.py
``wait_run``); one that finds the keeper gone (killed, the machine rebooted) starts a new keeper
(``LocalScheduler.start_owner``) and submits nothing itself, as Nomad places a run's keeper group
again and SLURM's guardian carries a run on.

One per run: it holds an exclusive ``flock`` on ``$HALO_SCHED_HOME/keepers/local-RUN.lock`` for
its life (backends/local.py starts it and asks whether it is alive); a second one started for
the same run finds it held and exits at once. What it says goes to ``local-RUN.log`` beside the
lock.

    python -m halo_sched.keeper BACKEND RUN_ID
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from typing import Callable

#: How long it waits for the first attempt's record (written by ``submit`` right after it started this).
RECORD_WAIT_S = 30.0


def keep(sched, spec, run_id: str, wait: Callable, say: Callable[[str], None]):
    """Carry run ``run_id`` on from its newest attempt as the store knows it (an attempt a
    dead keeper decided and did not start is found again by its number and started, not
    decided twice): wait on it (``wait(job_id)``, its final state, each state kept on the way as
    an actor keeps it: core.note), and after a failure
    ``retry.on`` lists start the next attempt, keeping off the culprit and every host an
    earlier attempt failed on, until one ends otherwise or the attempts run out. Returns the
    last attempt's (id, final state)."""
    from . import records
    from .backends import base
    from .runs import _notify_retried, _settle_times, culprit, next_attempt, next_spec, number, wants_retry

    first = (records.find(run_id, sched.name) or [{}])[0]
    current, earlier = run_id, []
    while (nxt := next_attempt(sched, run_id, current)) is not None and nxt not in earlier:
        earlier.append(current)
        current = nxt
    run = (records.find(current, sched.name) or [{}])[0].get("run") or {}
    count = number(run.get("attempt"))
    exclude = tuple(h for h in run.get("excluded") or () if isinstance(h, str))
    while True:
        state = wait(current)
        again, why = wants_retry(spec, state, count)
        if not again:
            _settle_times(sched, earlier)
            return current, state
        base.step("seen")  # the failure seen, nothing decided yet
        host = culprit(state)
        exclude = tuple(dict.fromkeys(exclude + ((host,) if host else ())))
        new = sched.submit_attempt(next_spec(spec, run_id, count + 1, exclude, first.get("git")), current).id
        say(f"{current} {state.describe()}; retrying ({why} fault) as {new}")
        for rec in records.find(current, sched.name, on_bad=None)[:1]:
            _notify_retried(rec, why, new, count + 1)
        earlier.append(current)
        current, count = new, count + 1


def main(argv: list[str]) -> int:
    from .backends.local import keeper_lock

    backend, run_id = argv[:2]
    fd = os.open(keeper_lock(backend, run_id), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # the run has its keeper
    from . import backends, records
    from .core import note, noting
    from .runs import recorded_spec

    deadline = time.monotonic() + RECORD_WAIT_S
    while not records.find(run_id, backend, on_bad=None) and time.monotonic() < deadline:
        time.sleep(0.2)
    spec = recorded_spec(backend, run_id)
    if spec is None or spec.retry is None:
        print(f"halo-sched: keeper: {run_id}@{backend} has no record with retry:; nothing to keep", file=sys.stderr)
        return 1
    sched = backends.get(backend)

    def wait(job_id: str):
        st = sched.wait(job_id, on_change=noting(backend, job_id, None, sched))
        note(backend, job_id, st, sched)
        return st

    def say(line: str) -> None:
        print(f"halo-sched: keeper: {line}", file=sys.stderr, flush=True)

    last, state = keep(sched, spec, run_id, wait, say)
    say(f"run {run_id} ended with {last}: {state.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
