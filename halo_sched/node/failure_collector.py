"""Run on each node by the entry script after torchrun exits non-zero: one failure line per rank.

Standard library only: it runs under the node's Python (the one torchrun runs under), where
halo-sched itself need not be installed. The entry script passes it, as text, to that Python.

Inputs, from torchrun's own files (``torch/distributed/elastic/multiprocessing/api.py``,
``DefaultLogsSpecs.reify``): with ``--log-dir=DIR --tee=3``, each worker's stdout/stderr land in
``DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and its
``TORCHELASTIC_ERROR_FILE`` is ``error.json`` beside them (written only by a trainer decorated
with ``@record``). Exit codes and signals come from torchrun's failure summary on its stderr
(``ChildFailedError.format_msg``: ``rank : 3 (local_rank: 1)``, ``exitcode : -9 (pid: 12)
(SIGKILL)``), which the entry script tees into ``DIR/torchrun.err``.

Output: ``halo-sched-failure {json}`` on stderr, one per failed rank, or one for the node when
torchrun itself failed (rendezvous timeout, killed) and no rank is named. The keys are those of
:class:`halo_sched.node.failures.RankFailure`.

``error`` and ``tail`` are a rank's words (a label, never a node fault); ``signal`` and ``evidence``
(:func:`node_evidence`) are the node's side (failure_classes.py). ``step``: the rank's last
reported step (progress.py), where known (restart.py's crash loop).

Two things make a line fit to leave the node (issue 28). Secrets: every ``secret_env`` value (the
names in ``HALO_SECRET_NAMES``, the values in this node's environment) is replaced by ``***`` in
all the text a line carries, on the whole text before anything is cut (a cut secret is a fragment
no later scrub can find). Trust: the line ends with ``"mac"``, an HMAC-SHA256 of the rest under the
job's failure key (``HALO_FAILURE_KEY``, made at submit; the entry script takes it out of the
environment before torchrun starts, so a rank cannot read it from its own): the submitter takes a
line as a verdict (the first failure, the culprit, a ledger entry) only when it verifies.
"""
from __future__ import annotations

import datetime
import functools
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12
#: The characters a tail line keeps (after the secrets are scrubbed from the whole line).
LINE_CHARS = 400
#: The names of the secret_env variables on this node (space-separated); their values are in the environment.
SECRET_NAMES_VAR = "HALO_SECRET_NAMES"
#: The job's failure key (halo_sched/node/contract.py ``failure_key``).
KEY_VAR = "HALO_FAILURE_KEY"
SCRUBBED = "***"
#: A secret value shorter than this is not scrubbed: as a substring it would mangle ordinary text
#: (a value "x" turned "exit" into "e***it"); submit warns about it.
MIN_SECRET_CHARS = 6
#: A run of this many characters of a secret is scrubbed wherever it is found, whole value or not:
#: what is left of a secret cut at a line's edge (output wrapped inside it, a tail that begins in
#: it) is shorter than this.
FRAGMENT_CHARS = 8
#: A line of a secret, or a run of FRAGMENT_CHARS of it, is scrubbed on its own only when it holds
#: this many different characters other than blanks (not ``--------``, not indentation).
MEANINGFUL_DISTINCT = 4

_BLOCK = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S*)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*"
    r"\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<exit>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?[ \t]*\n"
)
# The line that names an error in a traceback or a torchrun log: "ValueError: ...", "torch.x.Y: ...".
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b.*")
# torch prefixes a worker's uncaught exception lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# How torchrun stops a node's other workers once one has failed (api.py ``_close``).
_STOP_SIGNALS = ("SIGTERM",)


def secret_values(environ=None) -> list[str]:
    """The values to scrub: each secret_env variable's value in this environment, longest first
    (one value inside another is replaced whole), those too short to scrub left out."""
    environ = os.environ if environ is None else environ
    values = {environ.get(n, "") for n in environ.get(SECRET_NAMES_VAR, "").split()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def _meaningful(text: str) -> bool:
    """A piece of a secret worth scrubbing on its own: not a run of a few repeated characters
    (a secret's ``--------`` or indentation would otherwise blank every such run in the logs)."""
    return len(set(text) - set(" \t\r\n\f\v")) >= MEANINGFUL_DISTINCT


@functools.lru_cache(maxsize=16)
def _pieces(secrets: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """What :func:`scrub` looks for: each value whole and each of its lines of meaningful length
    on its own, longest first; and every run of FRAGMENT_CHARS characters of them."""
    pieces = set(secrets)
    for value in secrets:
        pieces.update(line.strip() for line in value.splitlines())
    whole = set(secrets)
    kept = sorted((p for p in pieces if len(p) >= MIN_SECRET_CHARS and (p in whole or _meaningful(p))),
                  key=len, reverse=True)
    grams = frozenset(g for p in kept for i in range(len(p) - FRAGMENT_CHARS + 1)
                      if _meaningful(g := p[i:i + FRAGMENT_CHARS]))
    return tuple(kept), grams


def _fragments(text: str, grams: frozenset[str]) -> list[tuple[int, int]]:
    """The spans of ``text`` covered by runs of FRAGMENT_CHARS characters of a secret, merged."""
    spans: list[tuple[int, int]] = []
    for i in range(len(text) - FRAGMENT_CHARS + 1):
        if text[i:i + FRAGMENT_CHARS] in grams:
            if spans and i <= spans[-1][1]:
                spans[-1] = (spans[-1][0], i + FRAGMENT_CHARS)
            else:
                spans.append((i, i + FRAGMENT_CHARS))
    return spans


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``; and, so that a secret on several
    lines stays one when its lines come apart (a tail's lines, one at a time; output wrapped or
    cut inside it), each of its lines on its own (when of meaningful length, as a whole value
    must be) and every run of FRAGMENT_CHARS or more of its characters, wherever they are."""
    if not secrets or not text:
        return text
    pieces, grams = _pieces(tuple(secrets))
    for piece in pieces:
        if piece in text:
            text = text.replace(piece, SCRUBBED)
    # Each pass shortens the text (a run of 8 or more becomes 3 characters): it ends.
    while grams and (spans := _fragments(text, grams)):
        out, at = [], 0
        for start, end in spans:
            out += [text[at:start], SCRUBBED]
            at = end
        text = "".join(out) + text[at:]
    return text


def _tail(path: str, n: int = TAIL_LINES, secrets: list[str] | None = None) -> list[str]:
    """The last ``n`` non-empty lines of the file's last 16 KiB, each scrubbed whole and then cut
    to LINE_CHARS. The first line is dropped when the read began inside it: it may begin inside a
    secret, whose fragment no scrub would find."""
    secrets = secret_values() if secrets is None else secrets
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 16384)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start and lines:
        lines = lines[1:]
    return [scrub(line, secrets)[:LINE_CHARS] for line in lines if line.strip()][-n:]


# faulthandler's dump (a rank aborted by the hang monitor, a segfault): its first line, the
# current thread's header, a frame, and what follows it (Python 3.12: "Extension modules: ...").
_FATAL = re.compile(r"^Fatal Python error: .+")
_CURRENT = re.compile(r"^Current thread 0x[0-9a-fA-F]+")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _dump_line(texts: list[str]) -> str:
    """``Fatal Python error: Aborted, in train.py:57 (main)`` from the last faulthandler dump in
    ``texts`` (the current thread's innermost frame), or '' when there is none."""
    fatal = max((i for i, t in enumerate(texts) if _FATAL.match(t)), default=-1)
    current = max((i for i, t in enumerate(texts) if _CURRENT.match(t)), default=-1)
    if fatal < 0 and current < 0:
        return ""
    frame = None
    if current >= 0:
        frame = next((m for t in texts[current + 1:] if (m := _DUMP_FRAME.match(t))), None)
    where = f"in {os.path.basename(frame['file'])}:{frame['line']} ({frame['func']})" if frame else ""
    head = texts[fatal] if fatal >= 0 else "Fatal Python error"
    return f"{head}, {where}" if where else head


def error_line(lines: list[str], recent: int = TAIL_LINES) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the last
    ``recent``; but when a faulthandler dump came after it (or there is none), the dump's fatal
    error and the frame it was in, never its last line (Python 3.12's "Extension modules: ...");
    else the last line."""
    texts = [_RANK_PREFIX.sub("", line.strip()) for line in lines]
    last_error = max((i for i, t in enumerate(texts) if i >= len(texts) - recent and _ERROR.match(t)), default=-1)
    last_dump = max((i for i, t in enumerate(texts) if _FATAL.match(t) or _CURRENT.match(t)), default=-1)
    if last_dump > last_error:
        return _dump_line(texts)
    if last_error >= 0:
        return texts[last_error]
    return texts[-1] if texts else ""


def summary_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary, per global rank: time (epoch), host, local rank, exit, signal."""
    out = {}
    for m in _BLOCK.finditer(text):
        try:
            # ProcessFailure.timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS", whole seconds.
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = None
        code = int(m["exit"])
        out[int(m["rank"])] = {
            "time": when, "host": m["host"], "local_rank": int(m["local_rank"]),
            # A negative exit code is torch's way to say "killed by signal -code".
            "exit_code": 128 - code if code < 0 else code,
            "signal": m["sig"] or (_SIGNALS.get(-code, f"SIG{-code}") if code < 0 else None),
        }
    return out


def _rank_dirs(log_dir: str) -> dict[int, str]:
    """local rank -> its directory in the latest attempt torchrun made under ``log_dir``."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return {}
    out = {}
    for d in glob.glob(os.path.join(attempts[-1], "*")):
        if os.path.basename(d).isdigit():
            out[int(os.path.basename(d))] = d
    return out


def _error_file(path: str, secrets: list[str]) -> tuple[str, float] | None:
    """(message, time) from a worker's error.json (``@record``); the file's mtime is the precise time."""
    try:
        with open(path) as f:
            data = json.load(f)
        when = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    lines = scrub(str(msg or ""), secrets).strip().splitlines()
    return (lines[-1] if lines else ""), when


MAX_EVIDENCE, EVIDENCE_CHARS = 4, 300
#: Signals nothing in the job sends (torchrun stops with SIGTERM, the hang monitor with SIGABRT).
NODE_SIGNALS = ("SIGKILL", "SIGBUS")
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*NVRM: Xid \(.*)$")


def kernel_xids(since: float, path: str = "/dev/kmsg", boot: float | None = None) -> list[str]:
    """The kernel's ``NVRM: Xid`` lines since ``since`` (epoch s), where this user may read the log."""
    boot = time.time() - time.monotonic() if boot is None else boot
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    out, buf = [], b""
    try:
        for _ in range(20000):  # /dev/kmsg: one record per read
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == 32:  # EPIPE: records overwritten under us
                    continue
                break
            if not chunk or len(buf) > 1 << 20:
                break
            *lines, buf = (buf + chunk).split(b"\n")
            for m in filter(None, (_KMSG.match(x.decode("utf-8", "replace")) for x in lines)):
                if boot + int(m[1]) / 1e6 >= since:
                    out.append(m[2].strip())
    finally:
        os.close(fd)
    return out[-MAX_EVIDENCE:]


def gpu_health(environ=None, timeout: float = 10.0) -> list[str]:
    """What NVML (``nvidia-smi``, where on PATH) says of the job's GPUs: lost, or uncorrectable ECC errors."""
    import shutil
    import subprocess

    env = os.environ if environ is None else environ
    ids = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if not exe or ids in ("-1", "NoDevFiles") or ("CUDA_VISIBLE_DEVICES" in env and not ids):
        return []
    cmd = [exe, "--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"]
    try:
        r = subprocess.run(cmd + ([f"--id={ids}"] if re.fullmatch(r"[\w,:.-]+", ids) else []), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        bus, _, ecc = line.strip().partition(",")
        if re.search(r"GPU is lost|fallen off the bus", line):
            out.append(f"nvidia-smi: {line.strip()}")
        elif r.returncode == 0 and ecc.strip().isdigit() and int(ecc) > 0:
            out.append(f"nvidia-smi: GPU {bus}: uncorrectable ECC error encountered ({int(ecc)} since the driver loaded)")
    return out[:MAX_EVIDENCE]


def oom_kills(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """``oom_kill`` of this process's cgroup (v2 memory.events, v1 memory.oom_control), as entry.sh's
    ``halo_oom_kills`` reads it before torchrun starts; None where unreadable."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = [f"{root}{x[3:]}/memory.events" for x in lines if x.startswith("0::")]
    paths += [f"{root}/memory{x.split(':', 2)[2]}/memory.oom_control" for x in lines
              if x.count(":") >= 2 and "memory" in x.split(":")[1].split(",")]
    for path in paths:
        try:
            with open(path) as f:
                return next(int(x.split()[1]) for x in f if x.startswith("oom_kill "))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return None


def node_evidence(log_dir: str, killed: bool, oom_before: int | None, environ=None) -> list[str]:
    """The node's own lines, each naming its source: kernel Xids since torchrun started, nvidia-smi,
    and (``killed``) the cgroup's OOM kills since ``oom_before``."""
    try:
        since = os.stat(log_dir).st_mtime - 60
    except OSError:
        since = time.time() - 3600
    out = [f"kernel: {x}" for x in kernel_xids(since)] + gpu_health(environ)
    now = oom_kills() if killed and oom_before is not None else None
    if now is not None and now > oom_before:
        out.append(f"cgroup: oom-kill: the kernel's out-of-memory killer ended {now - oom_before} process(es) "
                   f"of this node's cgroup while torchrun ran")
    return [x[:EVIDENCE_CHARS] for x in out][:MAX_EVIDENCE]


def reported_step(rank: int, progress_dir: str | None = None) -> int | None:
    """The last step rank ``rank`` reported (progress.py), or None."""
    progress_dir = os.environ.get("HALO_PROGRESS_DIR", "") if progress_dir is None else progress_dir
    if not progress_dir:
        return None
    from .progress import last_report

    got = last_report(os.path.join(progress_dir, f"rank-{rank}"))
    return got[0] if got is not None and -2 ** 53 < got[0] < 2 ** 53 else None


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None, oom_before: int | None = None) -> list[dict]:
    """Failure records for one node whose torchrun exited with ``rc`` (non-zero)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with open(os.path.join(log_dir, "torchrun.err"), errors="replace") as f:
            agent_text = f.read()
    except OSError:
        agent_text = ""
    summary = summary_failures(agent_text)
    dirs = _rank_dirs(log_dir)
    secrets = secret_values()
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        # The error may be a faulthandler dump's, longer than the tail: read further for it.
        lines = _tail(os.path.join(d, "stderr.log"), 400, secrets) if d else []
        tail = lines[-TAIL_LINES:]
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json"), secrets) if d else None
        if from_file:
            error, when = from_file
        elif tail:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later); a signal's
            # victim's last line, within 2 s, beats the later second a peer's death may share.
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            window = 5 if info["signal"] is None else 2
            if mtime is not None and detected - window <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(lines) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
            **({} if (step := reported_step(rank)) is None else {"step": step}),
        })
    # When one worker fails, torchrun stops the node's other workers with SIGTERM: those are
    # victims (not SIGKILL: the kernel's OOM killer ends a rank that way). A victim's summary time
    # is the whole second of detection and can read earlier than the real failure's precise one.
    own = [r for r in out if r["signal"] not in _STOP_SIGNALS]
    if own:
        for r in out:
            if r["signal"] in _STOP_SIGNALS:
                r["stopped"] = True
    if not out:
        # torchrun failed before or without a worker failure (rendezvous, store timeout, a
        # signal that stopped it): the node is what failed.
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40, secrets) if not line.startswith("[rank ")]
        code = rc
        sig = _SIGNALS.get(code - 128) if code > 128 else None
        out.append({
            "node": node, "rank": None, "local_rank": None, "host": host, "exit_code": code, "signal": sig,
            "time": stopped_at if stopped_at is not None else now,
            "error": error_line(tail[-TAIL_LINES:]), "tail": tail[-TAIL_LINES:], "stopped": stopped_at is not None,
        })
    # The scheduler's name for this node (SLURM sets SLURMD_NODENAME in every task): what sbatch's
    # node options take. torchrun's host is the machine's FQDN and may differ from it.
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_name:
        for r in out:
            r["node_name"] = node_name
    killed = any(r["signal"] in NODE_SIGNALS and not r["stopped"] for r in out)
    evidence = node_evidence(log_dir, killed, oom_before)
    if evidence:
        for r in out:
            r["evidence"] = evidence
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def sign(body: str, key: str) -> str:
    """The line's ``mac``: HMAC-SHA256 of its JSON text without it, under the job's failure key."""
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def record_line(rec: dict, key: str | None = None, secrets: list[str] | None = None) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's
    end. Every secret_env value is scrubbed from its text first (``secrets``: this environment's),
    and the line is signed with ``key`` (this environment's ``HALO_FAILURE_KEY``; none: unsigned,
    a line no submitter takes as a verdict)."""
    secrets = secret_values() if secrets is None else secrets
    key = os.environ.get(KEY_VAR, "") if key is None else key
    rec = {k: _scrubbed(v, secrets) for k, v in rec.items() if k != "mac"}
    rec["tail"] = list(rec.get("tail") or [])
    while True:
        body = json.dumps(rec, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
        text = f"{TAG} {body}\n"
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        elif rec.get("evidence"):  # the node's own lines go last
            rec["evidence"] = list(rec["evidence"])[:-1]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    oom_before = int(argv[5]) if len(argv) > 5 and argv[5].isdigit() else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at, oom_before=oom_before):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
