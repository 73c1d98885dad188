"""A run's next attempt, started by the attempt that failed, from inside its own allocation (SLURM).

The batch script calls this after its trainer step (srun) has ended non-zero, in the batch
shell on the allocation's first node (halo_sched/templates/slurm/sbatch.sh.j2, the last step):
``python -m halo_sched.node.successor RC JOB_ID SCRIPT ATTEMPTS ON RUN_ID ATTEMPT EXCLUDED KEPT_OFF [RANKS SINCE SWAPPED]``. It reads
the failure lines the nodes wrote into the job's output file (signed with the job's failure key,
``HALO_FAILURE_KEY`` in the batch shell's environment: failures.py), classifies them
(failure_classes.py) and, for a failure ``retry.on`` names with attempts left, submits the
successor with sbatch:

- the same script (the batch step's own copy, ``$0``) as attempt N+1 of the same run, told so by
  ``HALO_RUN_ID``/``HALO_RUN_ATTEMPT``/``HALO_RUN_EXCLUDED`` in its environment (read and unset by
  the script first thing);
- ``--exclude=`` the job's own exclusions (``KEPT_OFF``, from its typed request: never read back
  out of the script), every earlier attempt's culprits and this one's;
- ``--dependency=afterany:JOB_ID``: it starts only once this job has released its nodes;
- ``--comment=halo-run:RUN.N``, naming the run and the attempt for anyone who asks the scheduler.

Exactly one successor per failed attempt: a requeued job runs its batch script again, and two
runs of it must not submit two. The right to submit is a file created with O_EXCL beside the
output file (:func:`marker_path`), holding ``{"run", "attempt", "from_job", "excluded", "culprit",
"why", "job"}`` signed with the job's failure key (no rank can read it, so none can forge a
successor); the run that created it submits and writes the new id into it. A marker without
an id whose writer died (older than :data:`STALE_S`, or made by an earlier run of this same job:
``scontrol requeue`` killed that batch script, perhaps inside its sbatch) is taken over after
asking squeue whether a job with the attempt's comment exists. Anything at the marker's path that
is not a regular file (a FIFO) is never opened for a wait, by the batch shell or a reader. The marker is also how any host that sees the output
directory follows the run (halo_sched/runs.py ``follow``). Nothing here waits on a client.

Standard library only (it is carried to nodes with the node runtime: halo_sched/node/__init__.py).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import subprocess
import sys
import time

from .spares import ASK_S, ask, hosts as host_list, job_fields, step_failures  # the batch shell's scheduler calls, one bound
from .text import open_regular

#: The comment each attempt's successor carries (``halo-run:RUN.N``).
COMMENT = "halo-run:{run}.{attempt}"
#: A marker with no job id older than this (s) is from a batch script that died mid-way.
STALE_S = 120.0
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,253}[A-Za-z0-9_])?")
_JOB = re.compile(r"(\d+)(?:;\S+)?")


def say(text: str) -> None:
    print(f"halo-sched: {text}", file=sys.stderr, flush=True)


def marker_path(output_dir: str, run_id: str, attempt: int) -> str:
    """Where attempt ``attempt`` of run ``run_id`` is claimed and recorded, beside the output file."""
    return os.path.join(output_dir, f".halo-run-{run_id}.attempt-{attempt}.json")


def _mac(data: dict, key: str) -> str:
    body = json.dumps({k: v for k, v in data.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


#: The most a marker holds (a few hundred bytes); a bigger file there is not one.
MARKER_BYTES = 65536


def read_marker(path: str, key: str) -> dict | None:
    """A marker's contents, when signed with the job's failure ``key`` (the batch shell holds it;
    no rank can read it: a rank writing into the output directory cannot forge a successor). None:
    absent, unsigned, not a regular file (a FIFO there is never waited on: text.open_regular), or
    not one."""
    try:
        with open_regular(path) as f:
            data = json.loads(f.read(MARKER_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("run"), str):
        return None
    if not key or not isinstance(data.get("mac"), str) or not hmac.compare_digest(data["mac"], _mac(data, key)):
        return None
    job = data.get("job")
    data["job"] = job if isinstance(job, str) and _JOB.fullmatch(job) else None
    data["excluded"] = [h for h in data.get("excluded") or [] if isinstance(h, str) and _HOST.fullmatch(h)] \
        if isinstance(data.get("excluded"), list) else []
    return data


def _signed(data: dict, key: str) -> str:
    return json.dumps({**data, "mac": _mac(data, key)})


def _write(path: str, data: dict, key: str) -> None:
    """The marker replaced whole: written to a file of its own first (created O_EXCL, so that
    nothing put at its name, a FIFO, is ever opened), then renamed over ``path``."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_signed(data, key))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _regular(path: str) -> bool:
    """Whether ``path`` is a regular file (not followed: a link, a FIFO, a directory is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return True  # gone meanwhile: the claim is tried again


def _earlier_run(held: dict, data: dict) -> bool:
    """Whether the claim ``held`` was made by an earlier run of this same job (same SLURM job id,
    fewer requeues: ``scontrol requeue`` killed that batch script, perhaps inside its sbatch).
    SLURM runs one batch script of a job at a time, so that run is over: what it claimed is this
    run's to finish."""
    run = held.get("from_run", 0)
    return (held.get("from_job") == data["from_job"] and isinstance(run, int) and not isinstance(run, bool)
            and run < data["from_run"])


def claim(path: str, data: dict, key: str) -> dict | None:
    """Take the right to submit (None), or the marker that holds it already. A file there that
    is not a marker signed with ``key`` (a rank's forgery) is removed and the claim made again."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            try:
                age = time.time() - os.lstat(path).st_mtime
            except OSError:
                age = 0.0
            held = read_marker(path, key)
            # Not ours: a claim being written is younger than a second, and always a regular file.
            if held is None and (age >= 1.0 or not _regular(path)):
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
            held = held or {}
            if held.get("job"):
                return held
            if not _earlier_run(held, data) and age < STALE_S:
                return held
            # A writer that died before the id (an earlier run of this job, or one STALE_S
            # silent): taken over, the claim made this run's (squeue is asked before sbatch).
            _write(path, data, key)
            return None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_signed(data, key))
        return None
    return {}


def existing(comment: str) -> str | None:
    """A live job carrying ``comment`` (squeue ``%k``), should a marker have lost its id."""
    try:
        out = ask(["squeue", "-h", "-a", "-o", "%i|%k"])
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        job, _, text = line.strip().partition("|")
        if text.strip() == comment and _JOB.fullmatch(job):
            return job
    return None


def decide(rc: int, attempts: int, on: list[str], attempt: int, output: str, key: str,
           ranks: list[str] | None = None, since: float | None = None, start: int = 0):
    """(why, classification) when this failure starts attempt ``attempt + 1``; (None, reason)
    otherwise. With the batch script's step loop, ``ranks``, ``since`` and ``start``: the last
    step's rank map, start and first byte in the output file, whose failure lines alone decide
    (the steps before it were restarted in place, or failed on hosts swapped out since)."""
    from .failures import report_from_files
    from .failure_classes import classify_failure

    if rc == 0:
        return None, "the trainer completed"
    if attempt + 1 >= attempts:
        return None, f"not retried: all {attempts} attempts used"
    if ranks:
        from .restart import failure_lines

        try:
            report = step_failures(failure_lines(output, start)[0], key, since or 0.0, ranks)
        except OSError:
            report = None
    else:
        report = report_from_files([output], key)
    cls = classify_failure(report, None)
    if not cls.failure.retried_by(on):
        return None, f"not retried: {cls.describe()}"
    return cls.failure.retry_on, cls


def _count(text: str | None, default: int) -> int:
    """A count the batch shell passed (a few digits), else ``default``."""
    return int(text) if text and text.isdigit() and len(text) < 6 else default


def _short(err: BaseException) -> str:
    detail = getattr(err, "stderr", "") or getattr(err, "strerror", "") or str(err)
    return " ".join(str(detail).split())[:300]


def main(argv: list[str]) -> int:
    """``RC JOB_ID SCRIPT ATTEMPTS ON RUN_ID ATTEMPT EXCLUDED KEPT_OFF [RANKS SINCE SWAPPED]``; the
    last three with hot spares: the last step's rank map and start (epoch s), and every host
    swapped out before it (node faults of this attempt too: the next one keeps off them)."""
    rc, job_id, script, attempts, on, run_id, attempt, excluded, kept_off = argv[:9]
    ranks_arg, since_arg, swapped_arg = (list(argv[9:12]) + ["", "", ""])[:3]
    rc_i, attempts_i, attempt_i = int(rc), int(attempts), int(attempt)
    on_words = [w for w in on.split(",") if w]
    excluded_hosts = [h for h in excluded.split(",") if _HOST.fullmatch(h)]
    ranks = host_list(ranks_arg) or None
    try:
        since = float(since_arg) if since_arg else None
    except ValueError:
        since = None
    swapped = [h for h in host_list(swapped_arg) if _HOST.fullmatch(h)]
    key = os.environ.get("HALO_FAILURE_KEY", "")
    nxt = attempt_i + 1
    try:
        output = job_fields(job_id).get("StdOut", "")
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} not submitted: scontrol show job {job_id} "
            f"failed ({_short(err)})")
        return 1
    if not output:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} not submitted: scontrol show job {job_id} "
            "names no output file (StdOut), where the failure lines are")
        return 1
    # The run's attempts used (restarts in place too) and restarts: the next attempt goes on from
    # both. HALO_STEP_FROM: the last step's lines' offset in the output (restart.py).
    used_i, restarts_i = (_count(os.environ.get(v), attempt_i) for v in ("HALO_RUN_USED", "HALO_RESTART_COUNT"))
    start = os.environ.get("HALO_STEP_FROM", "")
    kind, cls = decide(rc_i, attempts_i, on_words, used_i, output, key, ranks, since,
                       int(start) if start.isdigit() and len(start) < 19 else 0)
    if kind is None:
        say(f"job {job_id}: attempt {attempt_i + 1} of run {run_id} ended (exit {rc_i}); {cls}")
        return 0
    culprit = cls.host if cls.host and _HOST.fullmatch(cls.host) else ""
    keep_off = list(dict.fromkeys(excluded_hosts + swapped + ([culprit] if culprit else [])))
    comment = COMMENT.format(run=run_id, attempt=nxt)
    path = marker_path(os.path.dirname(output) or ".", run_id, nxt)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    data = {"run": run_id, "attempt": nxt, "from_job": job_id,
            "from_run": int(restarts) if restarts.isdigit() and len(restarts) < 6 else 0,
            "excluded": keep_off, "culprit": culprit, "why": cls.describe(), "retry_on": kind,
            "class": cls.to_dict(), "failed_at": time.time(), "job": None}
    try:
        held = claim(path, data, key)
    except OSError as err:  # a read-only output directory, one removed, a full disk
        say(f"job {job_id}: {data['why']}; attempt {nxt + 1} of run {run_id} not submitted: cannot write its "
            f"claim beside the output file ({path}: {_short(err)}); the output directory must stay writable "
            "for a run to go on (docs/recovery.md)")
        return 1
    if held is not None:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} is already "
            + (f"submitted as {held['job']}" if held.get("job") else
               f"being submitted by another run of this script (job {held.get('from_job') or '?'}, "
               f"requeue {held.get('from_run', 0)})"))
        return 0
    found = existing(comment)
    if found is None:
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith(("SLURM_", "SBATCH_", "HALO_RUN_")) and k != "SLURM_CONF")
               and k != "HALO_RESTART_COUNT"}
        env.update(HALO_RUN_ID=run_id, HALO_RUN_ATTEMPT=str(nxt), HALO_RUN_EXCLUDED=",".join(keep_off),
                   HALO_RUN_USED=str(used_i + 1), HALO_RUN_RESTARTS=str(restarts_i + 1))
        own = [h for h in kept_off.split(",") if _HOST.fullmatch(h)]  # the request's --exclude: render.py
        hosts = list(dict.fromkeys(own + keep_off))
        argv_sbatch = ["sbatch", "--parsable", "--export=ALL", f"--comment={comment}",
                       f"--dependency=afterany:{job_id}"] + ([f"--exclude={','.join(hosts)}"] if hosts else []) + [script]
        try:
            out = subprocess.run(argv_sbatch, capture_output=True, text=True, timeout=ASK_S, env=env, check=True).stdout
        except (OSError, subprocess.SubprocessError) as err:
            try:
                os.unlink(path)
            except OSError:
                pass
            say(f"job {job_id}: could not submit attempt {nxt + 1} of run {run_id}: {_short(err)}")
            return 1
        m = _JOB.fullmatch(out.strip().splitlines()[-1] if out.strip() else "")
        found = m.group(1) if m else None
        if found is None:
            found = existing(comment)
    data.update(job=found, submitted_at=time.time())
    try:
        _write(path, data, key)
    except OSError as err:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} submitted as {found}, but its marker could not be "
            f"written ({path}: {_short(err)}): `halo-sched status {run_id}` will not find it; it is job {found}")
        return 1
    say(f"job {job_id}: {data['why']}; attempt {nxt + 1} of run {run_id} submitted as {found}"
        + (f", keeping off {','.join(keep_off)}" if keep_off else "") + f" (starts once job {job_id} ends)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
