"""Hot spares (``slurm.spare_nodes``): after a step fails, swap the node at fault for a spare of
the same allocation. Run by the SLURM batch script (through restart.py), not
by a rank; standard library only.

The job holds ``nodes + spare_nodes`` nodes with ``sbatch --no-kill``: slurmctld then keeps the
allocation when one of its nodes fails (``_foreach_kill_running_job_by_node`` in
src/slurmctld/job_mgr.c: with ``kill_on_node_fail == 0`` it kills the step's tasks on that node,
``excise_node_from_job`` takes the node out of the job, and the job runs on). The trainer runs on
``nodes`` of them, in the order of the rank map (``HOST,HOST,...``: node rank i on the i-th host).

When the step ends non-zero, the batch script's decision (restart.py, which also restarts the
ranks in place for a failure that is no node's) asks :func:`decide` which ranks move:

* a host of the rank map that is no longer in the allocation (SLURM marked it down and excised
  it): the node stopped answering;
* else the first failure of the step's signed failure lines (``halo-sched-failure``, written
  after ``since``), classified by failure_classes.py: a node's fault that names a host of the
  rank map (GPU Xid/ECC, NCCL/network, a hang whose culprit is that node, preflight).

Each bad host's rank goes to the first free spare (allocation order); the others keep theirs.
Anything else (the job's own fault, unknown cause, no spare left, the warning) is no swap. A swap
(:func:`swap`) writes one ``halo-sched-swap {json}`` line per swapped host on stderr (the job's
output file), signed with the job's failure key like a failure line: the submitter ledgers the
bad host from it (halo_sched/backends/slurm/spares.py) and counts the spares left. A host that
leaves for maintenance (maintenance.py, restart.py ``planned``) is swapped out the same way after
its trainers saved at the warning; its line says ``"planned": true``, and it is never ledgered.

What it cannot do: a fault of the batch host (the allocation's first node, where this runs) ends
the batch script with it; slurmctld takes that node out of the job too, and the batch script's
watcher step cancels the job (batch.sh ``halo_watch_batch_host``); with ``retry:`` the attempt's
guardian job carries the run on (guardian.py).
"""
from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import time
from dataclasses import replace

from .failure_classes import classify_failure, match
from .failure_collector import sign
from .failures import FailureReport, parse_lines
from .text import open_regular

TAG = "halo-sched-swap"
#: A host name as SLURM prints it (the ledger's rule, halo_sched/ledger.py HOST_RE).
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}))*")
#: Seconds each scontrol/srun call may take (slurmctld answers in well under a second; a stopped
#: one makes scontrol wait MessageTimeout, 10 s by default).
ASK_S = 30.0
#: The swap lines go into the output file and, beside it, into OUTPUT + SIDE_FILE: a few hundred
#: bytes ``status`` reads while the job runs instead of the whole output (which may be gigabytes).
SIDE_FILE = ".swaps"
#: Failure lines are dated by their node's clock; a line up to this much before the step began
#: is still the step's (clocks of one cluster agree to well within it).
CLOCK_SLACK_S = 2.0


def hosts(text: str) -> list[str]:
    """``HOST,HOST`` (or whitespace-separated) as a list; a word that is no host name is dropped."""
    return [h for h in re.split(r"[,\s]+", text or "") if h and HOST_RE.fullmatch(h)]


def step_failures(lines, key: str, since: float, ranks: list[str] | None = None) -> FailureReport | None:
    """The signed failure lines of the step that began at ``since`` (epoch seconds) on the rank
    map ``ranks`` (node rank i on ``ranks[i]``), as a report. A line counts only where the host
    that wrote it ran that node rank in this step: the lines of the step before (dated within
    CLOCK_SLACK_S of this one's start, as they often are: the swap takes a second) name the host
    swapped out, which this step never ran; a line without a host name gets the map's."""
    failures = []
    for f in parse_lines(lines, key):
        if not f.trusted or f.time < since - CLOCK_SLACK_S:
            continue
        if ranks is not None:
            if f.node is None or not 0 <= f.node < len(ranks) or (f.node_name and f.node_name != ranks[f.node]):
                continue
            if not f.node_name:
                f = replace(f, node_name=ranks[f.node])
        failures.append(f)
    return with_cause(FailureReport(failures)) if failures else None


#: A rank saying a peer went away is a victim: another failure up to this much later is the cause
#: (a crash is dated by its exit, late under load; its victim by the socket's close). docs/failures.md
VICTIM_S = 3.0


def with_cause(report: FailureReport) -> FailureReport:
    first = report.first
    said = lambda f: getattr(match([f.error, *f.tail]), "name", "")  # noqa: E731
    if first is None or report.cause is not None or report.kind == "HUNG" or said(first) != "peer-reset":
        return report
    later = [f for f in report.trusted if not f.stopped and first.time <= f.time <= first.time + VICTIM_S
             and said(f) != "peer-reset"]
    return FailureReport(report.failures, min(later, key=lambda f: f.time)) if later else report


def decide(ranks: list[str], allocation: list[str], report: FailureReport | None,
           used: list[str] = ()) -> tuple[list[tuple[int, str, str, str, str]], str]:
    """Which ranks move to which spares: ``([(rank, bad, spare, reason, by), ...], why)``; an empty
    list (and why not, in words) when the failure is not one a spare cures. ``allocation``: the
    job's hosts now, in SLURM's order; ``used``: hosts already swapped out (never taken again)."""
    lost = [(i, h) for i, h in enumerate(ranks) if h not in allocation]
    if lost:
        bad = [(i, h, "node left the allocation (SLURM marked it down)", "node-fail") for i, h in lost]
    else:
        if report is None or report.first is None:
            return [], "no signed failure line from the step: cause unknown"
        cls = classify_failure(report)
        if not cls.node:
            return [], f"not a node's fault ({cls.describe()})"
        if cls.host not in ranks:
            return [], f"a node's fault on {cls.host or 'an unnamed host'}, which runs no rank"
        bad = [(ranks.index(cls.host), cls.host, cls.reason, cls.by)]
    free = [h for h in allocation if h not in ranks and h not in used]
    if len(free) < len(bad):
        return [], (f"{', '.join(h for _, h, _, _ in bad)} failed ({bad[0][2]}) and "
                    f"{len(free) or 'no'} spare{'s' if len(free) != 1 else ''} left")
    return [(i, h, spare, reason, by) for (i, h, reason, by), spare in zip(bad, free)], ""


def swap_line(rec: dict, key: str) -> str:
    """``halo-sched-swap {json}``, signed with ``key`` (as failure_collector.record_line signs)."""
    body = json.dumps(rec, separators=(",", ":"))
    if key:
        body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
    return f"{TAG} {body}"


# ---- what SLURM says (the batch script's own job) ---------------------------------------------


def ask(argv: list[str]) -> str:
    """A scheduler command's output, cut after ASK_S (the batch shell's own calls: spares, successor).
    Bytes that are no UTF-8 (a path's) come back as they were (surrogateescape): ``open`` takes them."""
    return subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape", timeout=ASK_S,
                          check=True).stdout


#: What ``scontrol show job`` prints alone on a line of its own (src/scontrol/info_job.c, from
#: 22.05 to 25.11: each is followed by the layout's line end, "\n   "): the value is the rest of
#: that line, spaces, quotes and ``=`` included (a submit directory ``/data/my runs/a=b`` is in
#: WorkDir, StdOut and StdErr). ``JobName`` is the rest of the record's first line.
WHOLE_LINE = frozenset({"Command", "SubmitLine", "WorkDir", "AdminComment", "SystemComment", "Comment", "Extra",
                        "StdErr", "StdIn", "StdOut"})
#: A key as SLURM prints one: CamelCase, its first letter upper case (``NodeList``, ``CPUs/Task``,
#: ``AllocNode:Sid``, ``MCS_label``, ``JOB_GRES``). A value's own ``a=b`` (``TRES=cpu=1,node=2``)
#: starts no key.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_]*(?:[/:][A-Za-z0-9_]+)*)=")


def parse_words(text: str, fields: dict[str, str]) -> dict[str, str]:
    """``Key=value Key=value`` into ``fields``: a value runs up to the next key; a key seen
    before keeps its first value."""
    found = list(_KEY.finditer(text))
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        fields.setdefault(m.group(1), text[m.end():end].strip())
    return fields


def _record(rows: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    if len(rows) == 1:  # --oneliner: words only (a value with " Key=" in it cannot be told apart)
        parse_words(rows[0], fields)
        return fields
    head, named, name = rows[0].partition("JobName=")
    parse_words(head, fields)
    if named:
        fields["JobName"] = name
    for row in rows[1:]:
        key, eq, value = row.partition("=")
        if eq and key in WHOLE_LINE:
            fields[key] = value
        else:
            parse_words(row, fields)
    return fields


def show_job_records(text: str) -> list[dict[str, str]]:
    """``scontrol show job``'s records, each as a dict, from either layout: SLURM's own (every
    line after a record's first indented, the fields of WHOLE_LINE alone on theirs: exact, with
    spaces, quotes and ``=``), or ``--oneliner``'s (one line per record: a value runs up to the
    next `` Key=``). A line that is not indented continues the value before it (a path with a
    new line in it)."""
    records: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith("JobId="):
            records.append([line])
        elif not records or not line.strip():
            continue
        elif line[0] in " \t":
            records[-1].append(line.lstrip(" \t"))
        else:
            records[-1][-1] += "\n" + line
    return [_record(rows) for rows in records]


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job JOB``'s fields (NodeList, StdOut, ...), in SLURM's own layout: a path
    with spaces, quotes or ``=`` in it is read whole (show_job_records)."""
    records = show_job_records(ask(["scontrol", "show", "job", job_id]))
    return next((r for r in records if r.get("JobId") == job_id), records[0] if records else {})


def expand(nodelist: str) -> list[str]:
    return hosts(ask(["scontrol", "show", "hostnames", nodelist])) if nodelist and nodelist != "(null)" else []


def node_addr(host: str) -> str:
    m = re.search(r"\bNodeAddr=(\S+)", ask(["scontrol", "-o", "show", "node", host]))
    return m.group(1) if m else ""


def interface_addr(host: str, iface: str) -> str:
    """``iface``'s IPv4 address on ``host``, asked of that node (a step of one task)."""
    out = ask(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "ip", "-4", "-o", "addr", "show", "dev", iface])
    m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    return m.group(1) if m else ""


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def swap(job: str, ranks: list[str], swaps: list[tuple[int, str, str, str, str]], used: list[str], spares: int,
         restart: int, master: str, interface: str, out: str, key: str, say,
         warned: float | None = None) -> tuple[list[str], str] | None:
    """Carry out ``swaps`` (:func:`decide`'s): the new rank map and rank 0's address, a signed
    swap line per host (output and side file); None where rank 0's address cannot be read.
    ``warned``: a planned swap (maintenance, restart.planned), the warning's time: its lines say
    ``"planned": true`` (the host is no bad node: never ledgered)."""
    new = list(ranks)
    for i, _, spare, _, _ in swaps:
        new[i] = spare
    try:
        if new[0] == ranks[0] and master:
            pass  # rank 0 stays where it was: so does its address
        else:
            master = interface_addr(new[0], interface) if interface else node_addr(new[0])
        addrs = {node_addr(h) for h in new} if master and _loopback(master) else {master}
    except (OSError, subprocess.SubprocessError) as err:
        say(f"no spare swap: cannot read rank 0's address on {new[0]} ({' '.join(str(err).split())[:200]})")
        return None
    if not master or (len(addrs) > 1 and _loopback(master)):
        say(f"no spare swap: no usable address for rank 0 on {new[0]} ({master or 'none'})")
        return None
    left = spares - len(used) - len(swaps)
    now = time.time()
    plan = {} if warned is None else {"planned": True, "warned": warned}
    lines = [swap_line({"job": job, "rank": i, "bad": bad, "spare": spare, "reason": reason, "by": by,
                        "time": now, "restart": restart, "spares_left": left, **plan}, key)
             for i, bad, spare, reason, by in swaps]
    side(out, lines, say)
    for line, (i, bad, spare, reason, _) in zip(lines, swaps):
        print(line, file=sys.stderr, flush=True)
        say(f"node rank {i}: {bad} {'leaves for maintenance' if plan else 'failed'} ({reason}); {spare} takes its "
            f"rank, restart {restart}, {left} spare{'s' if left != 1 else ''} left")
    return new, master


def side(out: str, lines: list[str], say) -> None:
    """``lines`` appended to the side file of ``out``, which ``status`` reads while the job runs."""
    try:
        if out:
            with open_regular(out + SIDE_FILE, append=True) as f:
                f.write("".join(line + "\n" for line in lines))
    except OSError as err:  # status then reads the output file itself, once the job has ended
        say(f"could not write {out + SIDE_FILE} ({err.strerror or err})")
