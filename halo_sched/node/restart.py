"""Restart in place first (docs/recovery.md): run by a SLURM batch script after its trainer step
failed. :func:`decide`: SWAP (a node's fault, a spare left), IN_PLACE (a failure retry.on lists
that is no node's: a new step on the same nodes), STOP (a crash loop: the run ends) or END (the
loop ends). The step's lines start at ``--from``, the output's offset at the decision before.
Stdout: ``swap|inplace RANKS MASTER SEEN FROM [SWAPPED]`` or ``stop``; exit 1 ends the loop.
With ``--planned FILE`` (maintenance.py's lines, after the warning it caused: the step ended 0),
:func:`planned`: ``planned RANKS MASTER FROM [LEFT]``. Standard library only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from .failure_classes import NODE_FAULT, Classification, classify_failure
from .failure_collector import KEY_VAR
from .failures import FailureReport
from .spares import SIDE_FILE, ask, decide as spare_for, expand, hosts, job_fields, side, step_failures, swap, swap_line
from .text import open_regular

TAG = "halo-sched-restart"
SWAP, IN_PLACE, STOP, END = "swap", "inplace", "stop", "end"
MAX_SEEN = 100  # failures of one job remembered (attempts <= 20, spares <= 64)


def signature(cls: Classification, step: int | None) -> str:
    """A failure's identity for the crash-loop test (class, reason, a node's host, step): 16 hex digits."""
    body = json.dumps([cls.failure.name, cls.reason, cls.host, step], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Decision:
    action: str
    why: str
    cls: Classification
    step: int | None = None
    sig: str = ""
    swaps: tuple = ()  # SWAP: spares.decide's (rank, bad, spare, reason, by)


def at_step(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def decide(ranks: list[str], allocation: list[str], report: FailureReport | None, *, swapped: list[str] = (),
           spares: int = 0, on: list[str] | None = None, attempts: int = 0, used: int = 0,
           seen: list[str] = ()) -> Decision:
    """What follows a failed step on the rank map ``ranks``: ``allocation`` the job's hosts now,
    ``swapped`` hosts swapped out before, ``on`` retry.on (None: no retry:), ``used`` the run's
    attempts used (the first is 0), ``seen`` this job's earlier failures' signatures, oldest first."""
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
    """The failure lines of ``path`` from byte ``start`` on (its top if shorter), and its end's offset."""
    with open_regular(path) as f:
        raw = f.buffer
        raw.seek(start if 0 <= start <= os.fstat(raw.fileno()).st_size else 0)
        lines = [b.decode("utf-8", "replace") for b in raw if b"halo-sched-failure" in b]
        return lines, raw.tell()


def restart_line(rec: dict, key: str) -> str:
    """``halo-sched-restart {json}``, signed with ``key`` as a swap line is."""
    return TAG + swap_line(rec, key)[len("halo-sched-swap"):]


def earlier(job: str, paths: list[str], key: str) -> tuple[int, int]:
    """(restarts in place, all restarts) of this job before a requeue, from its signed lines."""
    from .failures import verified

    got: dict[str, str] = {}
    for path in paths:
        try:
            with open_regular(path) as f:
                for m in filter(None, (re.search(r"halo-sched-(restart|swap) (\{.*\})", ln) for ln in f)):
                    d = json.loads(m[2]) if verified(m[2], key) else None
                    if isinstance(d, dict) and d.get("job") == job and (m[1] == "swap" or d.get("action") == IN_PLACE):
                        got[m[2]] = m[1]
        except (OSError, ValueError):
            continue
    kinds = list(got.values())
    return kinds.count("restart"), len(kinds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m halo_sched.node.restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True)
    p.add_argument("--earlier", action="store_true", help="print this job's restarts before a requeue")
    for name in ("ranks", "swapped", "left", "interface", "master", "seen", "planned"):  # HOST,HOST / address / SIG,SIG
        p.add_argument("--" + name, default="")
    for name in ("spares", "restart", "from", "attempts", "used"):  # "from": the offset of the step's lines
        p.add_argument("--" + name, type=int, default=0)
    p.add_argument("--since", type=float, default=0.0, help="when the step began (epoch seconds)")
    p.add_argument("--on", default=None, help="retry.on: WORD,WORD (absent: no retry:)")
    a = p.parse_args(argv)
    say = lambda msg: print(f"halo-sched: job {a.job}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    ranks, swapped, left = hosts(a.ranks), hosts(a.swapped), hosts(a.left)
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
        lines, end = [], getattr(a, 'from')
        out = fields.get("StdOut", "")
        if out:
            lines, end = failure_lines(out, getattr(a, 'from'))
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        say(f"not restarting in the allocation: cannot read the job's state ({' '.join(str(err).split())[:200]})")
        return 1
    if a.planned:
        return planned(a.job, a.planned, ranks, allocation, swapped, left, a, out, end, fields.get("BatchHost", ""), key, say)
    on = [w for w in a.on.split(",") if w] if a.on is not None else None
    d = decide(ranks, allocation, step_failures(lines, key, a.since, ranks), swapped=swapped + left, spares=a.spares,
               on=on, attempts=a.attempts, used=a.used, seen=seen)
    seen_next = ",".join((seen + [d.sig])[-MAX_SEEN:])
    rec = {"job": a.job, "class": d.cls.failure.name, "fault": d.cls.kind, "reason": d.cls.describe(), "step": d.step,
           "time": time.time()}
    if d.action == SWAP:
        done = swap(a.job, ranks, list(d.swaps), swapped + left, a.spares, a.restart, a.master, a.interface, out, key, say)
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


def planned(job: str, path: str, ranks: list[str], allocation: list[str], swapped: list[str], left: list[str], a,
            out: str, end: int, batch: str, key: str, say) -> int:
    """After the warning maintenance.py caused (its ``HOST SPARE WHY`` lines in ``path``): each
    host's rank to its spare (a free one if that one is taken), a signed swap line marked planned
    (never ledgered), and the hosts released from the job (``scontrol update NodeList=``: their
    maintenance may begin; never the batch host: src/slurmctld/job_mgr.c ``_update_job``). With no
    spare, the ranks start again where they were. ``left``: the hosts earlier planned swaps took out."""
    try:
        with open_regular(path) as f:
            rows = [ln.split(None, 2) for ln in f.read(65536).splitlines()[:64]]
        warned = os.stat(path).st_mtime
    except OSError:
        rows, warned = [], time.time()
    used = swapped + left
    free = [h for h in allocation if h not in ranks and h not in used]
    swaps = []
    for host, spare, why in (r for r in rows if len(r) == 3):
        if host in ranks and host not in (s[1] for s in swaps):
            spare = spare if spare in free else next(iter(free), "")
            if spare:
                free.remove(spare)
                swaps.append((ranks.index(host), host, spare, why, "maintenance"))
            else:
                say(f"{host} is to leave for maintenance ({why}) and no spare is left: it keeps its rank")
    new, master = ranks, a.master
    if swaps:
        done = swap(job, ranks, swaps, used, a.spares, a.restart, a.master, a.interface, out, key, say, warned)
        if done is not None:
            new, master = done
            gone = [h for _, h, _, _, _ in swaps if h != batch]
            left = left + [h for _, h, _, _, _ in swaps]
            keep = [h for h in allocation if h not in gone]
            try:
                if gone:
                    ask(["scontrol", "update", f"JobId={job}", f"NodeList={','.join(keep)}"])
                    say(f"{','.join(gone)} released from the job: its maintenance can begin")
            except (OSError, subprocess.SubprocessError) as err:
                say(f"{','.join(gone)} kept in the job, idle (scontrol update NodeList= failed: "
                    f"{' '.join(str(getattr(err, 'stderr', '') or err).split())[:200]})")
            if batch in [h for _, h, _, _, _ in swaps]:
                say(f"{batch} runs the batch script: it stays in the job until the job ends")
    print("planned", ",".join(new), master, end, ",".join(left))
    return 0


if __name__ == "__main__":
    sys.exit(main())
