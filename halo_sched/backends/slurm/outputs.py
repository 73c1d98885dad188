"""The job's output file, read on this host: where sbatch writes it (its ``--output`` pattern),
whether that can be created before submitting, which files a job wrote (its record, else
``scontrol show job``), reading them, and slurmd's own words when the batch script did not
launch (its log, where this host can read it)."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterator

from ...errors import HaloError, SchedulerError
from ..base import missing_output, tail_lines
from .capabilities import ReadsConfig


#: Beside the output file: rank 0's result, ``JOB_ID.json`` (halo_sched/node/result.py).
RESULT_DIR = ".halo-result"


def result_shell(output: str) -> str | None:
    """The batch script's shell text for the directory of rank 0's result file (the job id is
    added there): beside the output file, as the progress mirror (progress.mirror_shell); None
    where the output's directory holds a ``%`` code: then no result is carried."""
    from .progress import mirror_shell

    return mirror_shell(output, RESULT_DIR)


def result_path(outputs: list, job_id: str) -> Path | None:
    """Where the job's rank 0 wrote its result (the batch script's ``HALO_RESULT_FILE``): the
    recorded output file's directory, ``.halo-result/ID.json``; None without an output file or
    with an id that is not SLURM's number."""
    if not outputs or not isinstance(outputs[0], str):
        return None
    local = job_id.rpartition(":")[2]  # sbatch -M: CLUSTER:ID; the batch script sees SLURM_JOB_ID=ID
    if not local or not local.replace("_", "").isdigit():
        return None
    return Path(outputs[0]).parent / RESULT_DIR / f"{local}.json"


def output_problems(output: str, via: str) -> tuple[list[tuple[str, str]], str]:
    """(field, why) when the job's output file (``output``, the plan's sbatch ``--output``
    pattern; relative to the submit directory, as sbatch resolves it; job files cannot move it)
    cannot be created: its directory missing or not writable by this user. SLURM would accept
    the job and fail it at launch (``FAILED exit=181 reason=JobLaunchFailure``; slurmd's log
    holds the cause). Checked on this host, which sees the cluster's filesystem for the cli and
    pyslurm transports (they run on a submit host); the rest transport's slurmrestd may not."""
    if via == "rest":
        return [], "unchecked: slurmrestd may run on a host that does not share this one's filesystem"
    try:
        directory = Path(expand_output(os.path.abspath(output), "x", "1")).parent
    except FileNotFoundError:  # the submit directory itself was removed
        return [("submit directory", "the current directory no longer exists: submit from another one")], "not checked"
    why = "(the job would end FAILED at launch, JobLaunchFailure)"
    if not directory.is_dir():
        return [("submit directory", f"output path {output}: directory {directory} does not exist {why}: create it "
                                     "or submit from another directory")], f"checked {directory}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return [("submit directory", f"output path {output}: directory {directory} is not writable by this user "
                                     f"{why}: submit from a writable directory")], f"checked {directory}"
    return [], f"ok: writable {directory}"


def expand_output(pattern: str, name: str, job_id: str) -> str:
    """sbatch's filename pattern for this job (the %-codes a job file can use), made absolute."""
    codes = {"j": job_id, "x": name, "u": os.environ.get("USER", ""), "%": "%", "A": job_id, "a": ""}
    text = re.sub(r"%(\d*)([jxuAa%])", lambda m: codes[m.group(2)].zfill(int(m.group(1) or 0)), pattern)
    return str(Path(text) if os.path.isabs(text) else Path.cwd() / text)


def output_files(transport, job_id: str, ask: bool = True) -> list[str]:
    """The job's output files: from its record (known after SLURM forgot the job), else, with
    ``ask``, from ``scontrol show job``."""
    from ...records import find

    for rec in find(job_id, "slurm"):
        if rec.get("outputs"):
            return list(rec["outputs"])
    if not ask:
        return []
    info = transport.job_info(job_id)
    return [p for p in dict.fromkeys([info.get("StdOut"), info.get("StdErr")]) if p]


def read_output(path: Path, follow: bool, finished, state_of=None) -> Iterator[str]:
    """The lines of one output file (``follow``: until ``finished()``); a file that does not
    appear (within 30 s when following) is an error naming the job's state."""
    deadline = time.monotonic() + 30
    while not path.exists():
        if not follow or finished() or time.monotonic() > deadline:
            try:
                state = state_of() if state_of is not None else None
            except HaloError:
                state = None
            raise SchedulerError(f"{missing_output(path, state)}; logs are read on the submitting host's filesystem")
        time.sleep(0.5)
    yield from tail_lines(path, follow, finished)


def launch_cause(transport, job_id: str) -> str:
    """slurmd's own words on why a batch script did not launch (``[ID.batch] error: Could
    not open stdout file ...``), from its log (``SlurmdLogFile`` of ``scontrol show config``,
    ``%n``/``%h`` the job's batch host) where this host can read it; else empty."""
    from .transport.base import split_cluster

    try:
        cluster, local = split_cluster(job_id)
        if not isinstance(transport, ReadsConfig):
            return ""
        config = transport.show_config(cluster) or ""
        m = re.search(r"^SlurmdLogFile\s*=\s*(\S+)", config, re.M)
        host = transport.job_info(job_id).get("BatchHost") or ""
    except (HaloError, KeyError, TypeError):
        return ""
    if not m or m.group(1) == "(null)" or (("%n" in m.group(1) or "%h" in m.group(1)) and not host):
        return ""
    path = Path(m.group(1).replace("%n", host).replace("%h", host))
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 4 * 1024 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    mark = f"[{local.split('_')[0]}.batch] error: "
    lines = [ln.split(mark, 1)[1].strip() for ln in text.splitlines() if mark in ln]
    return "; ".join(dict.fromkeys(lines[:3]))[:300]
