"""Restart in place first: what a SLURM batch script does after its trainer step failed, inside
its own allocation, before anything goes back to the queue. Run by the batch shell (``python -m
halo_sched.node.restart``, templates/slurm/sbatch.sh.j2) for a job with ``retry:`` or
``slurm.spare_nodes``; not by a rank. Standard library only.

:func:`decide` reads the failed step's first failure (its signed ``halo-sched-failure`` lines,
spares.step_failures; a host of the rank map gone from the allocation first) and says one of:

* **swap** (:data:`SWAP`): a node's fault on a host of the rank map, a spare left: the spare
  takes that node rank (spares.py); the job's other nodes keep theirs.
* **in place** (:data:`IN_PLACE`): a failure that is no node's (the job's own, an unknown cause, a
  hang with no culprit node) whose class ``retry.on`` lists, with attempts left: a new step on the
  same nodes, same rank map, same rank 0. One attempt of ``retry.attempts`` is used, as a new
  attempt through the queue would use one (a swap uses none: the spares bound those).
* **stop** (:data:`STOP`): a crash loop. The same failure (its class and reason, and the host for a
  node's) at the same training step (the last step the failing rank reported through the
  progress protocol, in its failure line) as a failure before it in this job; where the rank
  reported no step, the same failure as the one just before (no progress known between). The run
  ends: the batch script submits no next attempt.
* **end** (:data:`END`): anything else (a node's fault with no spare left, a class ``retry.on``
  does not list, the attempts used up): the loop ends and the run's usual path takes it from there
  (successor.py: the next attempt through the queue, or the run's end).

Every restart, in place or a swap, sets ``HALO_RESTART_COUNT`` one higher for the next step. An
in-place restart and a crash loop each write one ``halo-sched-restart {json}`` line into the job's
output file and the small file beside it (spares.SIDE_FILE), signed with the job's failure key as
a swap line is: ``status`` counts the restarts from them (halo_sched/backends/slurm/spares.py).

Which failure lines are the failed step's: those after ``--from``, the byte offset of the job's
output file where the step before it was decided (its lines and the victims' are all written by
then: srun ends after relaying its tasks' output), dated after the step's start, and written by
the host that ran that node rank in this step (spares.step_failures). The offset matters for a
restart in place: the step before ran on the same hosts and may have failed within a second of
this one's start.

The batch shell reads one line on stdout: ``swap|inplace RANKS MASTER SEEN FROM [SWAPPED]`` (SEEN:
the failures of this job so far, as :func:`signature`\\ s, for the next call's ``--seen``; FROM:
the offset for the next call's ``--from``) or ``stop``; exit status 1 (and nothing on stdout)
ends the loop.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from .failure_classes import NODE_FAULT, Classification, classify_failure
from .failure_collector import KEY_VAR
from .failures import FailureReport
from .spares import SIDE_FILE, decide as spare_for, expand, hosts, job_fields, side, step_failures, swap, swap_line
from .text import open_regular

TAG = "halo-sched-restart"
SWAP, IN_PLACE, STOP, END = "swap", "inplace", "stop", "end"
#: The most failures of one job remembered for the crash-loop test (attempts <= 20, spares <= 64).
MAX_SEEN = 100


def signature(cls: Classification, step: int | None) -> str:
    """A failure's identity for the crash-loop test: its class, its reason, the host of a node's
    fault, and the step (None: unknown), as 16 hex digits (a word the batch shell keeps)."""
    body = json.dumps([cls.failure.name, cls.reason, cls.host, step], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Decision:
    action: str  # SWAP, IN_PLACE, STOP or END
    why: str  # in words: what failed, and why this action
    cls: Classification
    step: int | None = None
    sig: str = ""
    swaps: tuple = ()  # SWAP: spares.decide's (rank, bad, spare, reason, by)


def at_step(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def decide(ranks: list[str], allocation: list[str], report: FailureReport | None, *, swapped: list[str] = (),
           spares: int = 0, on: list[str] | None = None, attempts: int = 0, used: int = 0,
           seen: list[str] = ()) -> Decision:
    """What follows a failed step on the rank map ``ranks`` (node rank i on ``ranks[i]``):
    ``allocation`` is the job's hosts now, ``report`` the step's failures, ``swapped`` the hosts
    swapped out before, ``spares`` slurm.spare_nodes; ``on`` retry.on's words (None: no
    ``retry:``), ``attempts`` retry.attempts and ``used`` the attempts the run used so far (the
    first is 0); ``seen`` the signatures of this job's earlier failures, oldest first."""
    first = report.first if report is not None else None
    step = first.step if first is not None else None
    lost = [h for h in ranks if h not in allocation]
    if lost:
        cls = Classification(NODE_FAULT, "node left the allocation (SLURM marked it down)", lost[0], "node-fail")
    else:
        cls = classify_failure(report)
    sig = signature(cls, step)
    what = cls.describe() + at_step(step)
    if cls.node:
        if spares:
            swaps, why = spare_for(ranks, allocation, report, list(swapped))
            if swaps:
                return Decision(SWAP, what, cls, step, sig, tuple(swaps))
            return Decision(END, f"no spare swap: {why}", cls, step, sig)
        return Decision(END, f"{what}: a node's fault, and no spare (slurm.spare_nodes) to take its rank", cls, step, sig)
    if on is None:
        return Decision(END, f"{what}: no retry: in the job file", cls, step, sig)
    if not cls.failure.retried_by(on):
        return Decision(END, f"{what}: {cls.failure.retry_on} is not in retry.on", cls, step, sig)
    if sig in seen and (step is not None or seen[-1] == sig):
        twice = " twice" if step is not None else " twice in a row with no progress between"
        return Decision(STOP, f"crash loop: {what}{twice}; not restarting", cls, step, sig)
    if used + 1 >= attempts:
        return Decision(END, f"{what}: all {attempts} attempts of retry.attempts used", cls, step, sig)
    return Decision(IN_PLACE, what, cls, step, sig)


def failure_lines(path: str, start: int = 0) -> tuple[list[str], int]:
    """The ``halo-sched-failure`` lines of the output file ``path`` from byte ``start`` on (from
    its top where the file is shorter: it was replaced), and the offset of its end as read."""
    with open_regular(path) as f:
        raw = f.buffer
        raw.seek(start if 0 <= start <= os.fstat(raw.fileno()).st_size else 0)
        lines = [b.decode("utf-8", "replace") for b in raw if b"halo-sched-failure" in b]
        return lines, raw.tell()


def restart_line(rec: dict, key: str) -> str:
    """``halo-sched-restart {json}``, signed with ``key`` as a swap line is."""
    return TAG + swap_line(rec, key)[len("halo-sched-swap"):]


def earlier(job: str, paths: list[str], key: str) -> tuple[int, int]:
    """(restarts in place, restarts of every kind: in place and swaps) this job made before a
    requeue ran its batch script again: its signed restart and swap lines in ``paths`` (the side
    file, and the output file, which a requeued job appends to), each counted once."""
    from .failures import verified

    seen: set[str] = set()
    in_place = swaps = 0
    for path in paths:
        try:
            with open_regular(path) as f:
                lines = [ln for ln in f if TAG in ln or "halo-sched-swap" in ln]
        except OSError:
            continue
        for line in lines:
            for tag in (TAG, "halo-sched-swap"):
                i = line.find(tag + " {")
                raw = line[i + len(tag) + 1:].strip() if i >= 0 else ""
                if not raw or raw in seen or not verified(raw, key):
                    continue
                seen.add(raw)
                try:
                    data = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(data, dict) or data.get("job") != job:
                    continue
                if tag == TAG:
                    in_place += data.get("action") == IN_PLACE
                else:
                    swaps += 1
    return in_place, in_place + swaps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m halo_sched.node.restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True)
    p.add_argument("--earlier", action="store_true",
                   help="print this job's restarts before a requeue (in place, of every kind) and stop")
    p.add_argument("--ranks", default="", help="the step's rank map: HOST,HOST,...")
    p.add_argument("--since", type=float, default=0.0, help="when the step began (epoch seconds)")
    p.add_argument("--swapped", default="", help="hosts swapped out before: HOST,HOST,...")
    p.add_argument("--spares", type=int, default=0, help="slurm.spare_nodes")
    p.add_argument("--restart", type=int, default=0, help="the restart count the next step gets")
    p.add_argument("--interface", default="", help="network.interface (rank 0's address is read there)")
    p.add_argument("--master", default="", help="rank 0's address in the step that failed (kept while rank 0 stays)")
    p.add_argument("--seen", default="", help="this job's earlier failures (signatures): SIG,SIG,...")
    p.add_argument("--from", dest="start", type=int, default=0,
                   help="the output file's offset where the step before was decided (its lines end there)")
    p.add_argument("--on", default=None, help="retry.on: WORD,WORD (absent: no retry:)")
    p.add_argument("--attempts", type=int, default=0, help="retry.attempts")
    p.add_argument("--used", type=int, default=0, help="the attempts of the run used so far (0: the first)")
    a = p.parse_args(argv)
    say = lambda msg: print(f"halo-sched: job {a.job}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    ranks, swapped = hosts(a.ranks), hosts(a.swapped)
    seen = [s for s in a.seen.split(",") if len(s) == 16 and all(c in "0123456789abcdef" for c in s)][-MAX_SEEN:]
    key = os.environ.get(KEY_VAR, "")
    if a.earlier:
        try:
            out = job_fields(a.job).get("StdOut", "")
        except (OSError, subprocess.SubprocessError, ValueError):
            out = ""
        print(*earlier(a.job, [out + SIDE_FILE, out] if out else [], key))
        return 0
    try:
        fields = job_fields(a.job)
        allocation = expand(fields.get("NodeList", ""))
        lines, end = [], a.start
        out = fields.get("StdOut", "")
        if out:
            lines, end = failure_lines(out, a.start)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        say(f"not restarting in the allocation: cannot read the job's state ({' '.join(str(err).split())[:200]})")
        return 1
    on = [w for w in a.on.split(",") if w] if a.on is not None else None
    d = decide(ranks, allocation, step_failures(lines, key, a.since, ranks), swapped=swapped, spares=a.spares,
               on=on, attempts=a.attempts, used=a.used, seen=seen)
    seen_next = ",".join((seen + [d.sig])[-MAX_SEEN:])
    rec = {"job": a.job, "class": d.cls.failure.name, "fault": d.cls.kind, "reason": d.cls.describe(), "step": d.step,
           "time": time.time()}
    if d.action == SWAP:
        done = swap(a.job, ranks, list(d.swaps), swapped, a.spares, a.restart, a.master, a.interface, out, key, say)
        if done is None:
            return 1
        new, master = done
        print(SWAP, ",".join(new), master, seen_next, end, ",".join(swapped + [bad for _, bad, _, _, _ in d.swaps]))
        return 0
    if d.action == IN_PLACE:
        if not a.master:
            say("not restarting in the allocation: rank 0's address is not known")
            return 1
        line = restart_line({**rec, "action": IN_PLACE, "restart": a.restart, "attempt": a.used + 1}, key)
        side(out, [line], say)
        print(line, file=sys.stderr, flush=True)
        say(f"{d.why}; restarting in place on {','.join(ranks)}: restart {a.restart}, attempt {a.used + 2} of "
            f"{a.attempts} (retry.attempts)")
        print(IN_PLACE, ",".join(ranks), a.master, seen_next, end, ",".join(swapped))
        return 0
    if d.action == STOP:
        line = restart_line({**rec, "action": STOP}, key)
        side(out, [line], say)
        print(line, file=sys.stderr, flush=True)
        say(d.why)
        print(STOP)
        return 0
    say(f"not restarting in the allocation: {d.why}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
