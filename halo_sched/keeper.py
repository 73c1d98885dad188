"""The one process that owns a local run's retries (``retry:`` on the local backend).

``submit`` of a local run starts it detached (its own session, like the local supervisor), so
it outlives the submitting process: ``submit`` without ``--wait``, a closed terminal, a killed
``--wait``. It waits on the run's newest attempt and, after a failure ``retry.on`` lists,
submits the next attempt (halo_sched/runs.py ``wait_run`` with ``owner``: the store's claim
keeps that to one per failed attempt, and the attempt's record, kept before it starts, to one
even when this process dies half-way: backends/local.py ``submit_attempt``), until an attempt
ends otherwise. Everyone else who waits on the run (``submit --wait``, ``watch``,
:meth:`Run.wait`) follows what it submits; should it be gone (killed, the machine rebooted), a
waiter takes its place (``LocalScheduler.owner_gone``) and starts the attempt it decided, if any.

One per run: it holds an exclusive ``flock`` on ``$HALO_SCHED_HOME/keepers/local-RUN.lock`` for
its life (backends/local.py starts it and asks whether it is alive); a second one started for the same run finds it held and exits at once. What it says
goes to ``local-RUN.log`` beside the lock.

    python -m halo_sched.keeper BACKEND RUN_ID
"""
from __future__ import annotations

import fcntl
import os
import sys
import time

#: How long it waits for the first attempt's record (written by ``submit`` right after it started this).
RECORD_WAIT_S = 30.0


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
    from .runs import recorded_spec, wait_run

    deadline = time.monotonic() + RECORD_WAIT_S
    while not records.find(run_id, backend, on_bad=None) and time.monotonic() < deadline:
        time.sleep(0.2)
    spec = recorded_spec(backend, run_id)
    if spec is None or spec.retry is None:
        print(f"halo-sched: keeper: {run_id}@{backend} has no record with retry:; nothing to keep", file=sys.stderr)
        return 1
    sched = backends.get(backend)

    def one(job_id: str, observe):
        st = sched.wait(job_id, on_change=noting(backend, job_id, observe, sched))
        note(backend, job_id, st, sched)
        return st

    def retried(old: str, state, why: str, new: str) -> None:
        print(f"halo-sched: keeper: {old} {state.describe()}; retrying ({why} fault) as {new}", file=sys.stderr,
              flush=True)

    last, state = wait_run(sched, spec, run_id, one, retried, owner=True)
    print(f"halo-sched: keeper: run {run_id} ended with {last}: {state.describe()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
