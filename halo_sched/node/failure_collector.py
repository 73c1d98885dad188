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
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12

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


def _tail(path: str, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines if line.strip()][-n:]


def error_line(lines: list[str]) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line, else the last line."""
    for line in reversed(lines):
        text = _RANK_PREFIX.sub("", line.strip())
        if _ERROR.match(text):
            return text
    return _RANK_PREFIX.sub("", lines[-1].strip()) if lines else ""


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


def _error_file(path: str) -> tuple[str, float] | None:
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
    lines = str(msg or "").strip().splitlines()
    return (lines[-1] if lines else ""), when


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None) -> list[dict]:
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
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        tail = _tail(os.path.join(d, "stderr.log")) if d else []
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json")) if d else None
        if from_file:
            error, when = from_file
        elif tail and info["signal"] is None:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later).
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            if mtime is not None and detected - 5 <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(tail) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
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
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40) if not line.startswith("[rank ")]
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
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def record_line(rec: dict) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's end."""
    rec = {**rec, "tail": list(rec.get("tail") or [])}
    while True:
        text = f"{TAG} {json.dumps(rec, separators=(',', ':'))}\n"  # ASCII: bytes == characters
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
