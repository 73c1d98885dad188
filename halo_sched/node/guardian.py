"""A SLURM attempt's guardian: a one-CPU job, ``--dependency=afternotok:ATTEMPT``, that starts
the run's next attempt when the attempt lost the host its batch script ran on (docs/recovery.md,
"A node lost outright": who submits it, when it runs, when it is cancelled). Acts on a batch host
no longer in the job's node list (``--no-kill``: slurmctld excised it, src/slurmctld/job_mgr.c
``_foreach_kill_running_job_by_node``; the watcher step, batch.sh, cancelled the headless job)
or on NODE_FAIL; on anything else the batch script decided. The next attempt is claimed and
submitted as successor.py ``carry_on`` does (one per failed attempt). Its script is the
attempt's own after a header ending in ``exit`` (successor.guardian_script). Standard library only.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

from .spares import ask, expand, job_fields
from .successor import _HOST, _count, _short, carry_on, lost, say

#: scontrol's node states (and flags after '+') that mean slurmctld lost the node.
DOWN_STATES = ("DOWN", "FAIL", "FAILING", "NOT_RESPONDING")


def down_hosts(hosts: list[str]) -> list[str]:
    """Those of ``hosts`` that slurmctld has marked down or not responding."""
    if not hosts:
        return []
    try:
        text = ask(["scontrol", "-o", "show", "node", ",".join(hosts)])
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if name and state and name[1] in hosts and set(re.split(r"[+*]", state[1].upper())) & set(DOWN_STATES):
            out.append(name[1])
    return [h for h in hosts if h in out]


def judge(fields: dict) -> tuple[list[str] | None, str, int | None]:
    """What attempt ``fields`` (its ``scontrol show job``) ended of: (the lost hosts, the batch
    host first; how it was lost; the first one's node rank, where known) when its guardian must
    carry the run on, else (None, why not, None)."""
    state = (fields.get("JobState") or "").split()[0] if fields.get("JobState") else ""
    batch = fields.get("BatchHost", "")
    nodes = expand(fields.get("NodeList", ""))
    if batch and _HOST.fullmatch(batch) and nodes and batch not in nodes:  # the batch host is node 0
        return [batch], f"ended {state} after its batch host {batch} left the allocation (SLURM marked it down)", 0
    if state == "NODE_FAIL":
        down = down_hosts(nodes + ([batch] if batch and _HOST.fullmatch(batch) and batch not in nodes else []))
        return down, "ended NODE_FAIL (SLURM ended the job, its batch script with it)", \
            nodes.index(down[0]) if down and down[0] in nodes else None
    return None, (f"ended {state or 'in a state SLURM did not say'} with its batch host in place: its batch script "
                  "decided what came next (or the job was cancelled); nothing to do"), None


def main(argv: list[str]) -> int:
    """``JOB SCRIPT ATTEMPTS ON RUN_ID ATTEMPT EXCLUDED KEPT_OFF``: the guardian of attempt
    ``ATTEMPT`` (from 0) of run ``RUN_ID``, job JOB, whose batch script is SCRIPT."""
    job_id, script, attempts, on, run_id, attempt, excluded, kept_off = argv[:8]
    attempts_i, attempt_i = int(attempts), int(attempt)
    on_words = [w for w in on.split(",") if w]
    key = os.environ.get("HALO_FAILURE_KEY", "")
    me = os.environ.get("SLURM_JOB_ID", "?")
    try:
        fields = job_fields(job_id)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        say(f"job {job_id}: its guardian (job {me}) cannot tell how it ended: scontrol show job {job_id} failed "
            f"({_short(err)}); nothing done")
        return 1
    if fields.get("JobId") != job_id:
        say(f"job {job_id}: its guardian (job {me}): slurmctld no longer knows job {job_id}; nothing done")
        return 1
    hosts, how, node = judge(fields)
    if hosts is None:
        say(f"job {job_id} {how} (its guardian, job {me})")
        return 0
    hosts = [h for h in hosts if _HOST.fullmatch(h)]
    if hosts:
        cls = lost(hosts[0])
    else:
        from .failure_classes import NODE_FAULT, Classification

        cls = Classification(NODE_FAULT, "node failed (NODE_FAIL)", "", "node-fail")
    output = fields.get("StdOut", "")
    say(f"job {job_id} {how}: its guardian (job {me}) carries run {run_id} on")
    if not output:
        say(f"job {job_id}: attempt {attempt_i + 2} of run {run_id} not submitted: scontrol show job {job_id} "
            "names no output file (StdOut), beside which the run's markers are")
        return 1
    if not cls.failure.retried_by(on_words):
        say(f"job {job_id}: attempt {attempt_i + 1} of run {run_id} ended; not retried: {cls.describe()}")
        return 0
    # The run's attempts used and restarts so far, as the attempt started with them (restarts in
    # place during it are not known here: its batch shell is gone).
    used, restarts = (_count(os.environ.get(v), attempt_i) for v in ("HALO_RUN_USED", "HALO_RUN_RESTARTS"))
    if used + 1 >= attempts_i:
        say(f"job {job_id}: attempt {attempt_i + 1} of run {run_id} ended; not retried: all {attempts_i} attempts used")
        return 0
    keep_off = list(dict.fromkeys([h for h in excluded.split(",") if _HOST.fullmatch(h)] + hosts))
    return carry_on(job_id, script, run_id, attempt_i, cls.failure.retry_on, cls, keep_off, kept_off, output, key,
                    fields, attempts_i, on, "its guardian", node if hosts else None, used, restarts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
