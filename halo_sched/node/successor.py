"""A run's next attempt, started by the attempt that failed, from inside its own allocation (SLURM).

The batch script calls this after its trainer step (srun) has ended non-zero, in the batch
shell on the allocation's first node (halo_sched/templates/slurm/sbatch.sh.j2, the last step):
``python -m halo_sched.node.successor RC JOB_ID SCRIPT ATTEMPTS ON RUN_ID ATTEMPT EXCLUDED KEPT_OFF [RANKS SINCE SWAPPED [LEFT]]``. It reads
the failure lines the nodes wrote into the job's output file (signed with the job's failure key,
``HALO_FAILURE_KEY`` in the batch shell's environment: failures.py), classifies them
(failure_classes.py) and, for a failure ``retry.on`` names with attempts left, submits the
successor with sbatch. A host of the allocation the job started with that SLURM took out of it
since (``--no-kill``: a lost node leaves the job, which runs on; :func:`left_allocation`) is the
culprit before any failure line. Then it submits the new attempt's guardian (guardian.py).
The successor:

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
"why", "by", "job", "guardian"}`` signed with the job's failure key (no rank can read it, so none can forge a
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
import shlex
import stat
import subprocess
import sys
import tempfile
import time

from .spares import ASK_S, ask, expand, hosts as host_list, job_fields, step_failures  # the batch shell's scheduler calls, one bound
from .text import open_regular

#: The comment each attempt's successor carries (``halo-run:RUN.N``).
COMMENT = "halo-run:{run}.{attempt}"
#: A marker with no job id older than this (s) is from a batch script that died mid-way.
STALE_S = 120.0
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,253}[A-Za-z0-9_])?")
_JOB = re.compile(r"(\d+)(?:;\S+)?")


# ---- the guardian of each attempt (its job: guardian.py) ------------------------------------

#: The guardian's job name (``scancel --me --name=...``: the batch script cancels its own).
NAME = "halo-guardian-{job}"
#: Its output file, in the directory of the job's.
LOG = "halo-guardian-{job}.log"
#: Its time limit (minutes): seconds of work once it runs; short, so that backfill starts it.
TIME_MIN = 10

_PY = r'''import base64, hashlib, runpy, sys, zlib
d = sys.argv[1]
with open(d + "/job.sh", "rb") as f:
    text = f.read().decode("latin-1")
head, sep, tail = text.rpartition("\n# halo-sched node runtime ")
meta, _, blob = tail.partition("\n")
sums = meta.rpartition("sha256 ")[2].split()
try:
    data = zlib.decompressobj().decompress(base64.b64decode("".join(blob.split())), 1 << 24) if sep else b""
except ValueError:
    data = b""
if not sep or hashlib.sha256(data).hexdigest() not in sums:
    sys.exit("halo-sched: guardian: the job's script carries no intact node runtime")
with open(d + "/halo-node.zip", "wb") as f:
    f.write(data)
sys.path.insert(0, d + "/halo-node.zip")
sys.argv = ["guardian", sys.argv[2], d + "/job.sh"] + sys.argv[3:]
runpy.run_module("halo_sched.node.guardian", run_name="__main__", alter_sys=True)'''


def guardian_script(script: bytes, job_id: str, args: list[str]) -> bytes:
    """The guardian's batch script: a header that copies the rest of itself (``script``, the
    attempt's own batch script, unchanged) to a file, loads the node runtime that script carries
    (checked by its SHA-256) and runs ``guardian JOB FILE ARGS`` (guardian.py); then ``exit``, so
    that nothing of ``script`` runs here. ``args``: ATTEMPTS ON RUN ATTEMPT EXCLUDED KEPT_OFF."""
    if not _JOB.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    head = [
        "#!/bin/bash",
        f"# halo-sched: the guardian of job {job_id}: it runs once that job ended other than COMPLETED",
        f"# (--dependency=afternotok:{job_id}) and starts the run's next attempt if the job lost its batch host",
        "# (docs/recovery.md, \"A node lost outright\"). The job's own script follows the exit line, unchanged.",
        'halo_g=$(mktemp -d "${TMPDIR:-/tmp}/halo-guardian.XXXXXX") || exit 1',
        "trap 'rm -rf \"$halo_g\"' EXIT",
        "",  # the tail line: filled in below, once the header's length is known
        "command -v python3 > /dev/null || { echo 'halo-sched: guardian: python3 is not on PATH' >&2; exit 1; }",
        "python3 - \"$halo_g\" " + " ".join(shlex.quote(a) for a in [job_id, *args]) + " <<'HALO_GUARDIAN_EOF'",
        *_PY.splitlines(),
        "HALO_GUARDIAN_EOF",
        "exit $?",
    ]
    head[6] = f'tail -n +{len(head) + 1} "$0" > "$halo_g/job.sh" || exit 1'
    return ("\n".join(head) + "\n").encode() + script


def options(job_id: str, output_dir: str, partition: str = "", account: str = "", qos: str = "") -> list[str]:
    """The guardian's sbatch options (``--name=value``): one task on one CPU, pending until the
    attempt ``job_id`` ends other than COMPLETED, cancelled by slurmctld when it completes, its
    output beside the job's, in the attempt's partition, account and QOS."""
    out = os.path.join(output_dir or ".", LOG.format(job=job_id)).replace("%", "%%")
    opts = [f"--job-name={NAME.format(job=job_id)}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
            f"--time={TIME_MIN}", f"--output={out}", "--open-mode=append", f"--dependency=afternotok:{job_id}",
            "--kill-on-invalid-dep=yes"]
    for name, value in (("partition", partition), ("account", account), ("qos", qos)):
        if value and value != "(null)" and re.fullmatch(r"[A-Za-z0-9_.,+-]{1,200}", value):
            opts.append(f"--{name}={value}")
    return opts


def submit_guardian(job_id: str, script: str, args: list[str], output: str, fields: dict, env: dict) -> str | None:
    """Submit the guardian of attempt ``job_id`` (just submitted from the batch script ``script``)
    with sbatch, in ``env`` (the attempt's); its id, or None (said) when sbatch refused."""
    try:
        with open(script, "rb") as f:
            text = guardian_script(f.read(), job_id, args)
        fd, path = tempfile.mkstemp(prefix="halo-guardian.", suffix=".sh")
    except (OSError, ValueError) as err:
        say(f"job {job_id}: its guardian was not submitted: {_short(err)}")
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        argv = ["sbatch", "--parsable", "--export=ALL",
                *options(job_id, os.path.dirname(output), fields.get("Partition", ""), fields.get("Account", ""),
                         fields.get("QOS", "")), path]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=ASK_S, env=env, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        say(f"job {job_id}: its guardian was not submitted (a lost batch host would stop the run there): {_short(err)}")
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    m = _JOB.fullmatch(out.strip().splitlines()[-1] if out.strip() else "")
    return m.group(1) if m else None



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
    guardian = data.get("guardian")  # the new attempt's own guardian job (guardian.py)
    data["guardian"] = guardian if isinstance(guardian, str) and _JOB.fullmatch(guardian) else None
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


#: What a host that SLURM took out of the allocation failed of (spares.decide says the same).
LEFT = "node left the allocation (SLURM marked it down)"


def left_allocation(original: list[str], now: list[str], swapped: list[str] = ()) -> list[str]:
    """The hosts of the allocation the job started with (``SLURM_JOB_NODELIST``) that are no
    longer in it (``scontrol show job``'s NodeList): under ``--no-kill`` slurmctld takes a node
    it lost out of the job and the job runs on (``_foreach_kill_running_job_by_node`` in
    src/slurmctld/job_mgr.c: ``excise_node_from_job``). A host swapped out for a spare before
    (``swapped``) left for that reason, not this failure's."""
    return [h for h in original if h not in now and h not in swapped] if now else []


def lost(host: str):
    """The classification of a failure whose cause is ``host`` leaving the allocation."""
    from .failure_classes import NODE_FAULT, Classification

    return Classification(NODE_FAULT, LEFT, host, "node-fail")


def decide(rc: int, attempts: int, on: list[str], attempt: int, output: str, key: str,
           ranks: list[str] | None = None, since: float | None = None, start: int = 0, gone: list[str] = ()):
    """(why, classification) when this failure starts attempt ``attempt + 1``; (None, reason)
    otherwise. With the batch script's step loop, ``ranks``, ``since`` and ``start``: the last
    step's rank map, start and first byte in the output file, whose failure lines alone decide
    (the steps before it were restarted in place, or failed on hosts swapped out since). A host
    that left the allocation (``gone``: :func:`left_allocation`) decides before any line: the
    ranks' lines name their peers' deaths, and a lost host writes none."""
    from .failures import report_from_files
    from .failure_classes import classify_failure

    if rc == 0:
        return None, "the trainer completed"
    if attempt + 1 >= attempts:
        return None, f"not retried: all {attempts} attempts used"
    if gone:
        cls = lost(gone[0])
        if not cls.failure.retried_by(on):
            return None, f"not retried: {cls.describe()}"
        return cls.failure.retry_on, cls
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


def _short(err: BaseException) -> str:
    detail = getattr(err, "stderr", "") or getattr(err, "strerror", "") or str(err)
    return " ".join(str(detail).split())[:300]


def _count(text: str | None, default: int) -> int:
    """A count the batch shell passed (a few digits), else ``default``."""
    return int(text) if text and text.isdigit() and len(text) < 6 else default


def main(argv: list[str]) -> int:
    """``RC JOB_ID SCRIPT ATTEMPTS ON RUN_ID ATTEMPT EXCLUDED KEPT_OFF [RANKS SINCE SWAPPED [LEFT]]``;
    the last ones with hot spares: the last step's rank map and start (epoch s), every host
    swapped out before it (node faults of this attempt too: the next one keeps off them), and the
    hosts that left for maintenance (released from the job: no culprits, not kept off).
    """
    rc, job_id, script, attempts, on, run_id, attempt, excluded, kept_off = argv[:9]
    ranks_arg, since_arg, swapped_arg, left_arg = (list(argv[9:13]) + ["", "", "", ""])[:4]
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
        fields = job_fields(job_id)
        output = fields.get("StdOut", "")
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} not submitted: scontrol show job {job_id} "
            f"failed ({_short(err)})")
        return 1
    if not output:
        say(f"job {job_id}: attempt {nxt + 1} of run {run_id} not submitted: scontrol show job {job_id} "
            "names no output file (StdOut), where the failure lines are")
        return 1
    gone: list[str] = []
    original: list[str] = []
    if rc_i:  # the hosts the job started on (this shell's SLURM_JOB_NODELIST) that SLURM took out of it since
        try:
            original = expand(os.environ.get("SLURM_JOB_NODELIST", ""))
            gone = left_allocation(original, expand(fields.get("NodeList", "")), swapped + host_list(left_arg))
        except (OSError, subprocess.SubprocessError, ValueError):
            gone = []  # not known: the failure lines decide
    # The attempts the run used so far, restarts in place included (restart.py; the batch shell's
    # HALO_RUN_USED), and its restarts of every kind (HALO_RESTART_COUNT): the next attempt goes on
    # from both. HALO_STEP_FROM: where the last step's lines begin in the output file.
    used_i, restarts_i = (_count(os.environ.get(v), attempt_i) for v in ("HALO_RUN_USED", "HALO_RESTART_COUNT"))
    start = os.environ.get("HALO_STEP_FROM", "")
    kind, cls = decide(rc_i, attempts_i, on_words, used_i, output, key, ranks, since,
                       int(start) if start.isdigit() and len(start) < 19 else 0, [h for h in gone if _HOST.fullmatch(h)])
    if kind is None:
        say(f"job {job_id}: attempt {attempt_i + 1} of run {run_id} ended (exit {rc_i}); {cls}")
        return 0
    culprit = cls.host if cls.host and _HOST.fullmatch(cls.host) else ""
    keep_off = list(dict.fromkeys(excluded_hosts + swapped + [h for h in gone if _HOST.fullmatch(h)]
                                  + ([culprit] if culprit else [])))
    return carry_on(job_id, script, run_id, attempt_i, kind, cls, keep_off, kept_off, output, key, fields,
                    attempts_i, on, "its batch script",
                    _node_rank(culprit, ranks, original) if gone else None, used_i, restarts_i)


def _node_rank(host: str, ranks: list[str] | None, original: list[str]) -> int | None:
    """``host``'s node rank: its place in the last step's rank map, else in the allocation the job
    started with (node rank i on its i-th host); None when in neither."""
    for order in (ranks or [], original):
        if host in order:
            return order.index(host)
    return None


def carry_on(job_id: str, script: str, run_id: str, attempt_i: int, kind: str, cls, keep_off: list[str],
             kept_off: str, output: str, key: str, fields: dict, attempts: int, on: str, by: str,
             node: int | None = None, used: int | None = None, restarted: int | None = None) -> int:
    """Submit attempt ``attempt_i + 2`` (numbered from 1) of run ``run_id`` after job ``job_id``
    failed as ``cls`` says: claimed beside ``output`` first (exactly one per failed attempt), the
    script ``script`` again with sbatch, keeping off ``keep_off`` and the request's own ``kept_off``,
    then the new attempt's own guardian (guardian.py), and the marker written with both. ``by``
    says who did it (the batch script, or the attempt's guardian); ``node``, the culprit's index in
    the allocation the job started with, where known (its node rank: status names its ranks);
    ``used``, ``restarted``: the run's attempts used and restarts so far (restarts in place count),
    which the next attempt goes on from (the attempt's number where not known)."""
    nxt = attempt_i + 1
    culprit = cls.host if cls.host and _HOST.fullmatch(cls.host) else ""
    comment = COMMENT.format(run=run_id, attempt=nxt)
    path = marker_path(os.path.dirname(output) or ".", run_id, nxt)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    data = {"run": run_id, "attempt": nxt, "from_job": job_id,
            "from_run": int(restarts) if restarts.isdigit() and len(restarts) < 6 else 0,
            "excluded": keep_off, "culprit": culprit, "why": cls.describe(), "retry_on": kind,
            "class": cls.to_dict(), "failed_at": time.time(), "by": by, "job": None,
            **({"node": node} if isinstance(node, int) and 0 <= node < 100000 else {})}
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
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("SLURM_", "SBATCH_", "HALO_RUN_")) and k != "SLURM_CONF")
           and k != "HALO_RESTART_COUNT"}
    used = attempt_i if used is None else used
    restarted = attempt_i if restarted is None else restarted
    env.update(HALO_RUN_ID=run_id, HALO_RUN_ATTEMPT=str(nxt), HALO_RUN_EXCLUDED=",".join(keep_off),
               HALO_RUN_USED=str(used + 1), HALO_RUN_RESTARTS=str(restarted + 1))
    found = existing(comment)
    if found is None:
        own = [h for h in kept_off.split(",") if _HOST.fullmatch(h)]  # the request's --exclude: render.py
        hosts = list(dict.fromkeys(own + keep_off))
        # After this job; from a guardian, after the guardian too: its CPU is free when the successor starts.
        me = os.environ.get("SLURM_JOB_ID", "")
        after = f"{job_id}:{me}" if by == "its guardian" and _JOB.fullmatch(me) and me != job_id else job_id
        argv_sbatch = ["sbatch", "--parsable", "--export=ALL", f"--comment={comment}",
                       f"--dependency=afterany:{after}"] + ([f"--exclude={','.join(hosts)}"] if hosts else []) + [script]
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
    guardian = None
    if found is not None:
        guardian = submit_guardian(found, script, [str(attempts), on, run_id, str(nxt), ",".join(keep_off), kept_off],
                                   output, fields, env)
    data.update(job=found, submitted_at=time.time(), guardian=guardian)
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
