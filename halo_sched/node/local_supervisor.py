"""The local backend's supervisor: the detached process that runs one local job's nodes.

``LocalScheduler.schedule`` (halo_sched/backends/local.py) renders everything first and writes the
launch plan into the job directory's ``job.json``; then it starts ``python -m
halo_sched.node.local_supervisor DIR``. This module imports only the standard library (no pydantic,
jinja2 or yaml: see issue 13), so the first node starts as soon as Python is up. It runs every
server and trainer node, prefixes their output with the node, stops the others when one fails, stops
what the nodes leave behind, and records the job's state. Its public names (``CANCEL_MARK``,
:func:`failure_report`) and those of ``processes`` are what the local backend uses of it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .contract import NAMES
from .processes import (
    GRACE_S, become_subreaper, children, start_time, stop_tagged, wait_any, write_json,
)

CANCEL_MARK = "cancel-requested"  # written by cancel; read by the supervisor and by status
#: Each line of ``job.log`` starts with when the supervisor read it (epoch seconds, to the
#: millisecond) and which stream it came from (``out``, ``err``; ``halo`` for the supervisor's
#: own lines), then the node's tag and the line: ``1796551044.083 err [node 0] text``. ``halo-sched
#: logs`` reads these two off (``--since``, ``--stream``: backends/local.py) and shows the rest.
#: ``node-K.log`` holds a node's lines as it wrote them, both streams.
HEAD_RE = re.compile(r"(\d{1,11}\.\d{3}) (out|err|halo) ")
STREAM_OF = {"out": "stdout", "err": "stderr"}


def failure_report(d: Path, key: str | None = None):
    """Which rank failed first: from the failure lines the nodes wrote into their output, trusted
    when signed with the job's failure key (``key``; None: this process's ``HALO_FAILURE_KEY``,
    which the supervisor was started with)."""
    from .failure_collector import KEY_VAR
    from .failures import report_from_files  # loaded on failure only

    key = os.environ.get(KEY_VAR, "") if key is None else key
    return report_from_files(sorted(d.glob("node-*.log")) or [d / "job.log"], key)


# ---- the supervisor (runs detached) ---------------------------------------------------------


class _Supervisor:
    def __init__(self, d: Path):
        self.d = d
        self.meta = json.loads((d / "job.json").read_text())
        self.n = self.meta["nodes"]
        self.procs: list[subprocess.Popen] = []
        self.servers: list[tuple[str, subprocess.Popen]] = []  # (label, process): stopped with the trainer
        self.lock = threading.Lock()
        self.cancelled = False
        self.log = open(d / "job.log", "ab", buffering=0)
        self.state = json.loads((d / "state.json").read_text())

    def _save(self, **kw) -> None:
        self.state.update(kw)
        write_json(self.d / "state.json", self.state)

    def _say(self, text: str) -> None:
        """One line of the supervisor's own into ``job.log`` (under the lock, as every line)."""
        with self.lock:
            self.log.write(b"%.3f halo " % time.time() + text.encode())

    def _start_pumps(self, rank: int | str, proc: subprocess.Popen) -> list[threading.Thread]:
        """Read a node's stdout and stderr (two pipes), each line into ``job.log`` with its time
        and stream (:data:`HEAD_RE`) and into the node's own file."""
        # A trainer node is "node K"; a server node "server ROLE K" (its own log file too).
        own_name = f"node-{rank}.log" if isinstance(rank, int) else rank.replace(" ", "-") + ".log"
        # Each node's output also in a file of its own (what a node of a cluster would keep).
        own = open(self.d / own_name, "ab", buffering=0)
        left = [2]
        threads = [threading.Thread(target=self._pump, args=(rank, pipe, kind, own, left), daemon=True)
                   for pipe, kind in ((proc.stdout, b"out"), (proc.stderr, b"err"))]
        for t in threads:
            t.start()
        return threads

    def _pump(self, rank: int | str, stream, kind: bytes, own, left: list) -> None:
        prefix = (f"[node {rank}] " if isinstance(rank, int) else f"[{rank}] ").encode()
        try:
            for line in iter(stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                with self.lock:
                    own.write(line)
                    self.log.write(b"%.3f %s " % (time.time(), kind) + prefix + line)
        finally:
            with self.lock:
                left[0] -= 1
                if not left[0]:
                    own.close()

    def _terminate_all(self) -> None:
        self.procs = self.procs + [p for _, p in self.servers]
        self.servers = []
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + GRACE_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def _reap_orphans(self) -> None:
        """Stop what the nodes left behind (like SLURM at a job's end). Runs after every node
        process was waited for, so reaping any child here cannot steal a node's exit code."""
        stop_tagged(str(self.d), also=lambda: children(os.getpid()))

    def _on_signal(self, signum, frame) -> None:
        self.cancelled = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # A signal wakes the wait for the nodes below (a handler alone would not end select).
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        become_subreaper()
        if (self.d / CANCEL_MARK).exists():
            self._save(state="CANCELLED", nodes_running=0, ended=time.time(), reason="cancelled by user")
            return 0
        # What each node adds to (or drops from) this inherited environment comes from the plan
        # the submitting command wrote (the variable names are its to choose); secrets stay in
        # the environment, never in the plan.
        plan = self.meta["launch"]
        env = dict(os.environ)
        for var in plan["unset"]:
            env.pop(var, None)
        env.update(plan["env"])
        # Nodes run with the submitting Python's environment: its torchrun first on PATH.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        pumps = []
        # Servers first: they come up while the trainer nodes run their setup; the trainer's entry
        # waits for their health before torchrun. Trainer nodes learn the addresses from the env.
        for srv in plan["servers"]:
            srv_env = {**env, **srv["env"], NAMES.local_job: str(self.d)}
            for var in srv["unset"]:
                srv_env.pop(var, None)
            p = subprocess.Popen(
                ["bash", str(self.d / srv["script"])],
                env=srv_env, cwd=self.meta["cwd"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.servers.append((srv["label"], p))
            pumps += self._start_pumps(srv["label"], p)
        for rank, node in enumerate(plan["nodes"]):
            # Each "node" owns its own GPUs (CUDA_VISIBLE_DEVICES in its env), as on separate hosts.
            node_env = {**env, **node["env"], NAMES.local_job: str(self.d)}
            p = subprocess.Popen(
                ["bash", str(self.d / node["script"])],
                env=node_env, cwd=self.meta["cwd"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.procs.append(p)
            pumps += self._start_pumps(rank, p)
        self._save(state="RUNNING", started=time.time(), nodes_running=self.n,
                   pids=[p.pid for p in self.procs], starts=[start_time(p.pid) for p in self.procs])

        exit_code, failed_rank, cancelled = 0, None, False
        while True:
            if self.cancelled or (self.d / CANCEL_MARK).exists():
                cancelled = True  # decided here: a cancel arriving during clean-up changes nothing
                self._terminate_all()
                break
            codes = [p.poll() for p in self.procs]
            # A node killed by signal N reports 128+N, as a shell would.
            codes = [c if c is None or c >= 0 else 128 - c for c in codes]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            gone = [(label, p.poll()) for label, p in self.servers if p.poll() is not None]
            if gone and not bad and any(c is None for c in codes):
                # A server that ends while the trainer runs is a dead rank: the job fails.
                label, code = gone[0]
                code = code if code >= 0 else 128 - code
                failed_rank, exit_code = label, code or 1
                self._say(f"[halo-sched] {label} exited with {code} while the trainer ran; stopping the job\n")
                self._terminate_all()
                break
            if bad and failed_rank is None:
                failed_rank, exit_code = bad[0]
                self._say(f"[halo-sched] node {failed_rank} exited with {exit_code}; stopping the other nodes\n")
                self._terminate_all()
                break
            running = sum(c is None for c in codes)
            if running == 0:
                if self.servers:
                    # The trainer ended: the servers end with it, never left running.
                    self._terminate_all()
                break
            if running != self.state.get("nodes_running"):
                self._save(nodes_running=running)
            # Woken by a node's or server's exit or a signal; 1 s bounds a cancel mark without one.
            live = [p.pid for p in self.procs + [p for _, p in self.servers] if p.poll() is None]
            wait_any(live, wake_r, 1.0)
        self._save(nodes_running=0)
        self._reap_orphans()
        for t in pumps:
            t.join(timeout=5)
        if cancelled:
            self._save(state="CANCELLED", nodes_running=0, ended=time.time(), reason="cancelled by user")
        elif isinstance(failed_rank, str):
            self._save(state="FAILED", nodes_running=0, ended=time.time(), exit_code=exit_code,
                       reason=f"{failed_rank} exited with {exit_code} while the trainer ran (a dead server fails the job)")
        elif failed_rank is not None:
            report = failure_report(self.d)
            reason = report.describe() if report else None
            if not reason:  # no failure line: the entry script's own words, if it gave up ("torchrun not found")
                from .failures import entry_failure_in

                reason = entry_failure_in([self.d / f"node-{failed_rank}.log"], failed_rank)
            self._save(state="FAILED", nodes_running=0, ended=time.time(), exit_code=exit_code,
                       reason=reason or f"node {failed_rank} exited with {exit_code}")
        else:
            self._save(state="COMPLETED", nodes_running=0, ended=time.time(), exit_code=0)
        return 0


def main(argv: list[str]) -> int:
    """``python -m halo_sched.node.local_supervisor JOBDIR``: run the job, record its end.

    One supervisor per job, and only while the job is PENDING: it holds an exclusive ``flock`` on
    ``JOBDIR/supervisor.lock`` for its life (not inherited by the nodes), so that a supervisor
    started again for the same job (a run's actor taking a dead one's place:
    halo_sched/backends/local.py ``_start``) exits at once while one runs, or once the job ran.
    It writes its own pid file too: the process that started it may have died before writing it."""
    import fcntl

    d = Path(argv[0])
    fd = os.open(d / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)  # open (locked) until the process ends
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another supervisor runs the job
    if json.loads((d / "state.json").read_text()).get("state") != "PENDING":
        return 0  # it ran already
    pid = d / "supervisor.pid"
    tmp = pid.with_name(f".supervisor.pid.{os.getpid()}")
    tmp.write_text(f"{os.getpid()} {start_time(os.getpid())}")
    os.replace(tmp, pid)
    return _Supervisor(d).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
