"""Pure parsing of SLURM's command output into JobState (no I/O, no subprocess).

Everything the CLI transport reads goes through here, so each parser can be tested on recorded
text (tests/fixtures/slurm/<version>/). The command lines that produce that text are built here
as well, next to their parsers, so that format and parser cannot drift apart.

Ids: SLURM shows one job as several records in two cases, and a user holds the id sbatch printed:
  * arrays: ``sbatch --array`` prints ``123``; tasks appear as ``123_4`` (own raw id, e.g. 130),
    tasks not yet started as one record ``123_[5-9%2]``;
  * heterogeneous jobs: ``sbatch`` prints ``123``; components appear as ``123+0``, ``123+1``.
``select_states`` answers a requested id with the matching record, or with the aggregate of all
records of that array/het job.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from dataclasses import replace

from halo_sched.jobstate import JobState, JobStatus, SlurmDetail
from halo_sched.backends.slurm.reasons import pending_reason
from halo_sched.node.spares import parse_words, show_job_records

# ---------------------------------------------------------------------------------------------
# State mapping

# Long names (squeue %T / -O State, scontrol JobState, sacct State) and the compact codes
# (squeue %t, sacct -X --state) for the same states.
_STATE_MAP: dict[str, JobStatus] = {
    # Not started yet. CONFIGURING: nodes are allocated but still booting, no user code runs.
    "PENDING": JobStatus.PENDING,
    "PD": JobStatus.PENDING,
    "CONFIGURING": JobStatus.PENDING,
    "CF": JobStatus.PENDING,
    "POWER_UP_NODE": JobStatus.PENDING,
    "PU": JobStatus.PENDING,
    "REQUEUED": JobStatus.PENDING,
    "RQ": JobStatus.PENDING,
    "REQUEUE_FED": JobStatus.PENDING,
    "RF": JobStatus.PENDING,
    "REQUEUE_HOLD": JobStatus.PENDING,
    "RH": JobStatus.PENDING,
    "RESV_DEL_HOLD": JobStatus.PENDING,
    "RD": JobStatus.PENDING,
    # Requeued and held by an administrator's "special exit" rule: it waits, it has not ended.
    "SPECIAL_EXIT": JobStatus.PENDING,
    "SE": JobStatus.PENDING,
    # Holding nodes. COMPLETING: the job's processes are being killed and the epilog runs; the
    # nodes are not free and squeue/scontrol do not show the final state or exit code yet, so it
    # stays non-terminal until SLURM says how it ended (the next poll).
    "RUNNING": JobStatus.RUNNING,
    "R": JobStatus.RUNNING,
    "COMPLETING": JobStatus.RUNNING,
    "CG": JobStatus.RUNNING,
    "SUSPENDED": JobStatus.RUNNING,
    "S": JobStatus.RUNNING,
    "STOPPED": JobStatus.RUNNING,
    "ST": JobStatus.RUNNING,
    "SIGNALING": JobStatus.RUNNING,
    "SI": JobStatus.RUNNING,
    "STAGE_OUT": JobStatus.RUNNING,
    "SO": JobStatus.RUNNING,
    "RESIZING": JobStatus.RUNNING,
    "RS": JobStatus.RUNNING,
    "UPDATE_DB": JobStatus.RUNNING,
    # Ended.
    "COMPLETED": JobStatus.COMPLETED,
    "CD": JobStatus.COMPLETED,
    "FAILED": JobStatus.FAILED,
    "F": JobStatus.FAILED,
    "BOOT_FAIL": JobStatus.FAILED,
    "BF": JobStatus.FAILED,
    "DEADLINE": JobStatus.FAILED,
    "DL": JobStatus.FAILED,
    "LAUNCH_FAILED": JobStatus.FAILED,
    "CANCELLED": JobStatus.CANCELLED,
    "CA": JobStatus.CANCELLED,
    "TIMEOUT": JobStatus.TIMEOUT,
    "TO": JobStatus.TIMEOUT,
    "NODE_FAIL": JobStatus.NODE_FAIL,
    "NF": JobStatus.NODE_FAIL,
    "PREEMPTED": JobStatus.PREEMPTED,
    "PR": JobStatus.PREEMPTED,
    "OUT_OF_MEMORY": JobStatus.OUT_OF_MEMORY,
    "OOM": JobStatus.OUT_OF_MEMORY,
    # Federation: this sibling was withdrawn because another cluster started the job. Whatever
    # happens to the job happens elsewhere: we cannot tell.
    "REVOKED": JobStatus.UNKNOWN,
    "RV": JobStatus.UNKNOWN,
}


def map_state(raw: str) -> JobStatus:
    """SLURM's state word -> JobStatus. Tolerates ``CANCELLED by 1000``, sacct's truncation
    mark ``CANCELLED+``, lower case and flag lists like ``RUNNING,SIGNALING`` (first wins)."""
    word = (raw or "").strip().split(" ", 1)[0].split(",", 1)[0].rstrip("+*").upper()
    return _STATE_MAP.get(word, JobStatus.UNKNOWN)


# ---------------------------------------------------------------------------------------------
# Small field helpers


def _none_if_na(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value in ("", "N/A", "(null)", "None", "n/a", "None assigned") else value


def _int_or_none(value: str | None) -> int | None:
    """``2``, ``2-2`` or ``2-4`` (a pending job's node range: the minimum) -> int."""
    value = _none_if_na(value)
    if value is None:
        return None
    m = re.match(r"^\s*(\d+)", value)
    return int(m.group(1)) if m else None


def parse_exit_pair(value: str | None) -> tuple[int | None, int | None]:
    """``"2:0"`` (sacct ExitCode, scontrol ExitCode=) -> (return code, signal)."""
    value = _none_if_na(value)
    if value is None:
        return None, None
    m = re.match(r"^(\d+):(\d+)$", value)
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def decode_wait_status(value: str | int | None) -> tuple[int | None, int | None]:
    """squeue ``-O exit_code`` and slurmrestd v0.0.38's ``exit_code`` -> (return code, signal).

    Slurm 22.05 prints the raw wait(2) status (``_print_int(job->exit_code)`` in
    src/squeue/print.c at slurm-22-05-8-1): 768 is exit 3, 15 is killed by signal 15. From 23.02
    on squeue prints ``rc:sig`` (``xstrfmtcat(out, "%u:%u", exit_status, term_sig)``, same file at
    slurm-23-02-0-1 and every later tag): ``3:0``, ``0:15``. Both are read; anything else is
    unknown."""
    if value is None:
        return None, None
    text = str(value).strip()
    if ":" in text:
        return parse_exit_pair(text)
    try:
        status = int(text)
    except ValueError:
        return None, None
    # As scontrol prints it: a killed job has return code 0 and the signal.
    if status & 0x7F:
        return 0, status & 0x7F
    return (status >> 8) & 0xFF, 0


def _exit_code(rc: int | None, sig: int | None) -> int | None:
    """One number like a shell's ``$?``: the return code, or 128+signal for a killed job."""
    if rc is None:
        return None
    if rc == 0 and sig:
        return 128 + sig
    return rc


def split_job_id(display_id: str) -> tuple[str, str | None, str | None]:
    """``123_4`` -> (``123``, ``4``, None); ``123+1`` -> (``123``, None, ``1``); ``123`` ->
    (``123``, None, None). Array brackets ``123_[1-5%2]`` keep the bracket text as the task."""
    m = re.match(r"^(\d+)(?:_(\[[^\]]*\]|\d+))?(?:\+(\d+))?$", display_id.strip())
    if not m:
        return display_id.strip(), None, None
    return m.group(1), m.group(2), m.group(3)


def _array_spec_contains(spec: str, index: int) -> bool:
    """Does ``[1-12%2]`` / ``1,3,5-9:2`` cover ``index``?"""
    spec = spec.strip().strip("[]").split("%", 1)[0]
    for part in spec.split(","):
        m = re.match(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$", part.strip())
        if not m:
            continue
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if lo <= index <= hi and (index - lo) % step == 0:
            return True
    return False


# slurmd's error codes (slurm/slurm_errno.h, ESLURMD_PIPE_ERROR_ON_TASK_SPAWN = 4000 onwards, and
# their words in src/common/slurm_errno.c, slurm-22-05-11-1). When slurmd cannot launch a batch
# script, slurmctld keeps slurmd's error code as the job's exit status (FAILED,
# reason=JobLaunchFailure): squeue -O exit_code prints it (4021), scontrol and sacct read it as a
# wait status (ExitCode=0:53, "signal" 53 = 4021 & 0x7f, shown by a shell as 128+53 = 181). It is
# neither the job's exit code nor a signal.
SLURMD_ERRORS: dict[int, str] = {4000 + i: text for i, text in enumerate((
    "Pipe error on task spawn", "Kill task failed", "Job already complete", "Invalid accounting frequency requested",
    "Invalid job credential", "User not found on host", "Group ID not found on host", "Job credential expired",
    "Job credential revoked", "Job credential replayed", "Slurmd could not create a batch directory or file",
    "Slurmd could not chown or chmod a batch directory", "Slurmd could not create a batch script",
    "Slurmd could not chown or chmod a batch script", "Slurmd could not set up environment for batch job",
    "Slurmd shared memory error", "Slurmd could not set UID or GID", "Slurmd could not set session ID",
    "Slurmd could not spawn I/O thread", "Slurmd could not fork job", "Slurmd could not execve job",
    "Slurmd could not connect IO (the output or error file could not be opened)", "Job prolog failed",
    "Job epilog failed", "Session manager killed", "Too many job steps on node", "Job step already exists",
    "Job step not running", "Job step is suspended", "Job step is not currently suspended",
    "Unix socket name exceeded maximum length", "Container runtime not configured or invalid",
    "Unable to satisfy cpu bind request", "Unable to layout tasks on given cpus"))}


def launch_error(raw_status: int | None, signal: int | None) -> int | None:
    """slurmd's error code behind a JobLaunchFailure: from squeue's raw status (4021), or from
    the "signal" scontrol/sacct derive from it (53: the codes 4000-4033 have distinct low 7 bits)."""
    if raw_status in SLURMD_ERRORS:
        return raw_status
    if signal is not None:
        for code in SLURMD_ERRORS:
            if code & 0x7F == signal:
                return code
    return None


def make_state(
    display_id: str,
    raw_state: str,
    *,
    exit_rc: int | None,
    exit_sig: int | None,
    nodes: int | None,
    reason: str | None,
    source: str,
    detail: Mapping | None = None,
) -> JobState:
    """``detail``: fields of :class:`SlurmDetail` (and ``restarts``) the query read."""
    status = map_state(raw_state)
    reason = _none_if_na(reason) or ""
    launch = None
    if status.terminal and reason.startswith("JobLaunchFailure"):
        launch = launch_error((detail or {}).get("raw_exit"), exit_sig)
        exit_rc = exit_sig = None  # slurmd's error code, not the job's exit code nor a signal
        why = f"slurmd error {launch}: {SLURMD_ERRORS[launch]}" if launch else "slurmd could not start the batch script"
        reason = f"JobLaunchFailure ({why}; the job never ran)"
    if status.terminal and pending_reason(reason):
        # A job cancelled while pending keeps the reason it waited for (CANCELLED
        # reason=PartitionNodeLimit): that explains no end, so it is not shown as if it did.
        reason = ""
    if raw_state.upper().startswith("COMPLETING") and not reason:
        reason = "completing"
    if status is JobStatus.UNKNOWN and raw_state:
        reason = reason or f"unrecognised SLURM state {raw_state!r}"
    nodes_running: int | None
    if status is JobStatus.RUNNING:
        nodes_running = nodes
    elif status is JobStatus.PENDING:
        nodes_running = 0
    else:
        nodes_running = None
    info = {"source": source}
    if exit_sig:
        info["signal"] = exit_sig
    info.update({k: v for k, v in (detail or {}).items() if k != "raw_exit"})
    base, task, het = split_job_id(display_id)
    info.setdefault("base_id", base)
    if task is not None:
        info["array_task"] = task
    if het is not None:
        info["het_offset"] = het
    return JobState(
        id=display_id,
        status=status,
        raw_state=raw_state.strip(),
        # A running job's "0:0" is not an exit code yet.
        exit_code=_exit_code(exit_rc, exit_sig) if status.terminal else None,
        nodes_total=nodes,
        nodes_running=nodes_running,
        reason=reason,
        restarts=info.pop("restarts", None),
        slurm=SlurmDetail(**info),
    )


# ---------------------------------------------------------------------------------------------
# squeue

# A separator no field can contain, so reasons and node lists never split wrongly.
SEP = "\x1f"

# -O (long) field names. JobArrayID is the display id (123_4, 123_[5-9], 123+1, 123); JobID is
# the raw one; exit_code is a raw wait status (squeue has no "2:0" form).
# SubmitTime/StartTime/Dependency: how long a pending job has waited, when SLURM expects it to
# start (what ``squeue --start`` shows: the backfill scheduler's estimate, N/A until it has one)
# and what it depends on (``afterok:12(failed)``).
# EndTime: when a job that ended ended (for one still running, its time limit: not read then).
SQUEUE_FIELDS = ("JobArrayID", "JobID", "State", "exit_code", "NumNodes", "Reason", "NodeList", "Requeue", "RestartCnt",
                 "SubmitTime", "StartTime", "Dependency", "EndTime")
# Rows recorded before Requeue/RestartCnt were asked for still parse.
_SQUEUE_REQUIRED = 7


def squeue_format() -> str:
    # ``name:`` + suffix and no width: squeue prints the whole value followed by SEP.
    return ",".join(f"{name}:{SEP}" for name in SQUEUE_FIELDS)


def cluster_args(cluster: str | None) -> list[str]:
    """``--clusters=NAME`` for a job on another cluster (sbatch -M). One name per call: with
    several, squeue prints a ``CLUSTER: name`` line before each cluster's rows (src/squeue/squeue.c)
    and scontrol refuses."""
    return [f"--clusters={cluster}"] if cluster else []


def squeue_argv(ids: Sequence[str] | None, cluster: str | None = None) -> list[str]:
    """``--states=all`` so that finished jobs still in slurmctld's memory (MinJobAge) show."""
    argv = ["squeue", *cluster_args(cluster), "--noheader", "--states=all", f"--Format={squeue_format()}"]
    if ids is not None:
        argv.append("--jobs=" + ",".join(ids))
    return argv


def parse_squeue(text: str) -> list[JobState]:
    """Rows of ``squeue_argv``'s output -> one JobState per row."""
    out = []
    for line in text.splitlines():
        if SEP not in line:
            continue
        cols = line.split(SEP)
        if len(cols) < _SQUEUE_REQUIRED:
            continue
        row = dict(zip(SQUEUE_FIELDS, (c.strip() for c in cols)))
        rc, sig = decode_wait_status(row["exit_code"])
        # Only 22.05's raw status carries slurmd's launch error whole (4021); ``0:53`` is read
        # through the signal (launch_error).
        raw_exit = _int_or_none(row["exit_code"]) if ":" not in row["exit_code"] else None
        display = row["JobArrayID"] or row["JobID"]
        out.append(with_times(
            make_state(
                display,
                row["State"],
                exit_rc=rc,
                exit_sig=sig,
                nodes=_int_or_none(row["NumNodes"]),
                reason=row["Reason"],
                source="squeue",
                detail={"job_id_raw": row["JobID"], "nodelist": _none_if_na(row["NodeList"]) or "",
                       "raw_exit": raw_exit,
                       **_requeue_info(row.get("Requeue"), row.get("RestartCnt")),
                       **_wait_info(row.get("SubmitTime"), row.get("StartTime"), row.get("Dependency"))},
            ), row.get("StartTime"), row.get("EndTime"))
        )
    return out


def _epoch(text: str | None) -> float | None:
    """SLURM's ``2026-12-01T12:25:13`` (the controller's local time, read as this host's) as epoch
    seconds; None for N/A, Unknown, or anything else."""
    import time as _time

    value = _none_if_na(text)
    if not value:
        return None
    try:
        return _time.mktime(_time.strptime(value.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def with_times(state: JobState, start: str | None, end: str | None) -> JobState:
    """The job's start (once it ran: for a pending job StartTime is an estimate) and end (once it
    ended: before, EndTime is the time limit) by SLURM's clock: ``started_at``/``ended_at``, which
    a run's GPU-hours are counted from (halo_sched/runs.py)."""
    if state.status in (JobStatus.PENDING, JobStatus.UNKNOWN):
        return state
    state.started_at = _epoch(start)
    if state.status.terminal and state.started_at is not None:
        ended = _epoch(end)
        state.ended_at = ended if ended is not None and ended >= state.started_at else None
    return state


def squeue_invalid_id(stderr: str) -> bool:
    """squeue gives up on the whole list when (some versions) any listed id is unknown."""
    return "invalid job id" in (stderr or "").lower()


# ---------------------------------------------------------------------------------------------
# scontrol show job

def parse_scontrol_record(text: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` (one ``--oneliner`` record: a partition, a node) -> dict.

    Values may contain spaces (Reason=, OS=) and ``=`` (TRES=cpu=1,node=1), so a new key starts
    only at whitespace followed by a CamelCase ``Name=`` (halo_sched/node/spares.py parse_words).
    """
    return parse_words(text, {})


def parse_scontrol_jobs(text: str) -> list[dict[str, str]]:
    """``scontrol [-o] show job [ID]`` -> one dict per job record (both layouts: in SLURM's own,
    a path with spaces, quotes or ``=`` is read whole; halo_sched/node/spares.py show_job_records)."""
    return show_job_records(text)


def scontrol_display_id(fields: Mapping[str, str]) -> str:
    job_id = fields.get("JobId", "")
    array_job = _none_if_na(fields.get("ArrayJobId"))
    array_task = _none_if_na(fields.get("ArrayTaskId"))
    if array_job and array_task:
        task = array_task if re.fullmatch(r"\d+", array_task) else f"[{array_task}]"
        return f"{array_job}_{task}"
    het_job = _none_if_na(fields.get("HetJobId"))
    het_off = _none_if_na(fields.get("HetJobOffset"))
    if het_job and het_off is not None:
        return f"{het_job}+{het_off}"
    return job_id


def _requeue_info(requeue: str | None, restarts: str | None) -> dict:
    """``requeue``: the job may run again (sbatch --requeue); ``restarts``: how many times it was
    requeued, so the current run is ``restarts + 1``. Absent when SLURM did not say."""
    info: dict = {}
    if _none_if_na(requeue) in ("0", "1"):
        info["requeue"] = requeue.strip() == "1"
    count = _int_or_none(restarts)
    if count is not None:
        info["restarts"] = count
    return info


def _wait_info(submitted: str | None, start: str | None, dependency: str | None) -> dict:
    """When the job was submitted and is expected to start (ISO local times as SLURM prints them),
    and its dependency; only what SLURM said."""
    info = {}
    for key, value in (("submitted", submitted), ("expected_start", start), ("dependency", dependency)):
        value = _none_if_na(value)
        if value and value != "Unknown":
            info[key] = value
    return info


def scontrol_job_state(fields: Mapping[str, str]) -> JobState:
    rc, sig = parse_exit_pair(fields.get("ExitCode"))
    detail = {
        "job_id_raw": fields.get("JobId", ""),
        "nodelist": _none_if_na(fields.get("NodeList")) or "",
        **_requeue_info(fields.get("Requeue"), fields.get("Restarts")),
        **_wait_info(fields.get("SubmitTime"), fields.get("StartTime"), fields.get("Dependency")),
    }
    derived = parse_exit_pair(fields.get("DerivedExitCode"))
    if derived[0] is not None:
        detail["derived_exit_code"] = _exit_code(*derived)
    return with_times(make_state(
        scontrol_display_id(fields),
        fields.get("JobState", ""),
        exit_rc=rc,
        exit_sig=sig,
        nodes=_int_or_none(fields.get("NumNodes")),
        reason=fields.get("Reason"),
        source="scontrol",
        detail=detail,
    ), fields.get("StartTime"), fields.get("EndTime"))


def parse_scontrol_states(text: str) -> list[JobState]:
    return [scontrol_job_state(f) for f in parse_scontrol_jobs(text)]


def scontrol_argv(job_id: str | None = None, cluster: str | None = None) -> list[str]:
    """One line per job; without an id, every job slurmctld still holds."""
    argv = ["scontrol", *cluster_args(cluster), "--oneliner", "show", "job"]
    if job_id is not None:
        argv.append(job_id)
    return argv


# ---------------------------------------------------------------------------------------------
# sacct

# No free-text field (JobName, Comment) so '|' (--parsable2) can never appear inside one.
SACCT_FIELDS = ("JobID", "JobIDRaw", "State", "ExitCode", "DerivedExitCode", "NNodes", "Reason", "NodeList")


def sacct_argv(ids: Sequence[str], cluster: str | None = None) -> list[str]:
    # With --jobs the default start time is the epoch (not today 00:00), so old jobs are found.
    return [
        "sacct",
        *cluster_args(cluster),
        "--parsable2",
        "--noheader",
        "--format=" + ",".join(SACCT_FIELDS),
        "--jobs=" + ",".join(ids),
    ]


def sacct_disabled(stderr: str, stdout: str = "") -> bool:
    """The cluster has no accounting at all (as opposed to slurmdbd being down for a while)."""
    text = f"{stderr}\n{stdout}".lower()
    return "accounting storage is disabled" in text or "accounting_storage/none" in text


def parse_sacct(text: str) -> list[JobState]:
    """``sacct_argv``'s output -> one JobState per job (array task, het component), with its
    steps (``.batch``, ``.extern``, ``.0`` ...) folded in: a step that ran out of memory makes a
    job that merely "FAILED" (or even "COMPLETED") OUT_OF_MEMORY."""
    jobs: dict[str, dict[str, str]] = {}
    steps: dict[str, list[dict[str, str]]] = {}
    order: list[str] = []
    for line in text.splitlines():
        if "|" not in line:
            continue
        cols = line.split("|")
        if len(cols) < len(SACCT_FIELDS):
            continue
        row = dict(zip(SACCT_FIELDS, (c.strip() for c in cols)))
        job_id = row["JobID"]
        if "." in job_id:
            steps.setdefault(job_id.split(".", 1)[0], []).append(row)
            continue
        if job_id not in jobs:
            order.append(job_id)
        jobs[job_id] = row  # with --duplicates a requeued job repeats; the last line is current

    out = []
    for job_id in order:
        row = jobs[job_id]
        rc, sig = parse_exit_pair(row["ExitCode"])
        raw_state = row["State"]
        job_steps = steps.get(job_id, [])
        detail: dict = {
            "job_id_raw": row["JobIDRaw"],
            "nodelist": _none_if_na(row["NodeList"]) or "",
            "steps": {s["JobID"]: s["State"] for s in job_steps},
        }
        derived = parse_exit_pair(row["DerivedExitCode"])
        if derived[0] is not None:
            detail["derived_exit_code"] = _exit_code(*derived)
        # sacct's Reason is the last reason the job was ever blocked, kept after it ran: only
        # meaningful while it still waits.
        blocked = _none_if_na(row["Reason"])
        if blocked:
            detail["last_block_reason"] = blocked
        state = make_state(
            job_id,
            raw_state,
            exit_rc=rc,
            exit_sig=sig,
            nodes=_int_or_none(row["NNodes"]),
            reason=None if map_state(raw_state).terminal else blocked,
            source="sacct",
            detail=detail,
        )
        oom = [s["JobID"] for s in job_steps if map_state(s["State"]) is JobStatus.OUT_OF_MEMORY]
        if oom and state.status in (JobStatus.FAILED, JobStatus.COMPLETED):
            state.status = JobStatus.OUT_OF_MEMORY
            state.reason = state.reason or f"step {oom[0]} ran out of memory"
        out.append(state)
    return out


# ---------------------------------------------------------------------------------------------
# Answering requested ids

# Which component decides the state of an array/het job once all have ended: the most telling
# failure first (a node failing explains the failures it caused; a cancel is often a reaction).
_SEVERITY = [
    JobStatus.NODE_FAIL,
    JobStatus.OUT_OF_MEMORY,
    JobStatus.FAILED,
    JobStatus.TIMEOUT,
    JobStatus.PREEMPTED,
    JobStatus.CANCELLED,
    JobStatus.UNKNOWN,
    JobStatus.COMPLETED,
]


def aggregate(job_id: str, parts: Sequence[JobState]) -> JobState:
    """One state for an array or heterogeneous job from its tasks/components."""
    if len(parts) == 1 and parts[0].id == job_id:
        return parts[0]
    live = [p for p in parts if not p.status.terminal and p.status is not JobStatus.UNKNOWN]
    if live:
        running = [p for p in live if p.status is JobStatus.RUNNING]
        lead = running[0] if running else live[0]
        status = JobStatus.RUNNING if running else JobStatus.PENDING
    else:
        lead = min(parts, key=lambda p: _SEVERITY.index(p.status) if p.status in _SEVERITY else 0)
        status = lead.status
    totals = [p.nodes_total for p in parts if p.nodes_total is not None]
    running_nodes = [p.nodes_running for p in parts if p.nodes_running is not None]
    return JobState(
        id=job_id,
        status=status,
        raw_state=lead.raw_state,
        exit_code=lead.exit_code if status.terminal else None,
        nodes_total=sum(totals) if totals else None,
        nodes_running=sum(running_nodes) if (running_nodes and not status.terminal) else None,
        reason=lead.reason,
        slurm=SlurmDetail(
            source=lead.slurm.source if lead.slurm is not None else None,
            base_id=job_id,
            components={p.id: p.status.value for p in parts},
        ),
    )


def match_states(job_id: str, states: Iterable[JobState]) -> JobState | None:
    """The state answering ``job_id`` among parsed records, or None if none does.

    In order: the record shown under exactly that id; the aggregate of all records of the
    array/het job ``job_id``; the record whose raw id it is (an array task's own job id);
    the pending array record ``123_[5-9]`` covering a requested ``123_7``.
    """
    states = list(states)
    exact = [s for s in states if s.id == job_id]
    if exact:
        return exact[-1]
    family = [s for s in states if s.slurm is not None and s.slurm.base_id == job_id]
    if family:
        return aggregate(job_id, family)
    raw = [s for s in states if s.slurm is not None and s.slurm.job_id_raw == job_id]
    if raw:
        return raw[-1]
    base, task, _ = split_job_id(job_id)
    if task is not None and task.isdigit():
        for s in states:
            s_base, s_task, _ = split_job_id(s.id)
            if s_base == base and s_task and s_task.startswith("[") and _array_spec_contains(s_task, int(task)):
                return JobState(
                    id=job_id,
                    status=s.status,
                    raw_state=s.raw_state,
                    nodes_total=s.nodes_total,
                    nodes_running=s.nodes_running,
                    reason=s.reason,
                    restarts=s.restarts,
                    slurm=replace(s.slurm or SlurmDetail(), array_task=task, pending_array=s.id),
                )
    return None


def select_states(ids: Sequence[str], states: Iterable[JobState]) -> dict[str, JobState]:
    """Answers for the ``ids`` found among ``states``; absent ids are left out."""
    states = list(states)
    found = {}
    for job_id in ids:
        s = match_states(job_id, states)
        if s is not None:
            found[job_id] = s
    return found


def unknown_state(job_id: str, reason: str) -> JobState:
    return JobState(id=job_id, status=JobStatus.UNKNOWN, reason=reason)
