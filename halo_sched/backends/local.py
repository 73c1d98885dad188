"""The local backend: N "nodes" as processes on this machine, each the shared entry script.

``submit`` writes a job directory and starts a detached supervisor (``python -m
halo_sched.backends.local <dir>``) that runs node 0..N-1 with ``HALO_NODE_RANK`` and
``HALO_MASTER_ADDR=127.0.0.1``, prefixes every output line with its node, stops the other nodes
when one fails (like ``srun --kill-on-bad-exit``), and records the job's state and exit code.
The job outlives the submitting command; ``status``/``logs``/``cancel`` read that directory.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import SchedulerError, UsageError
from ..launch import LOG_DIR_VAR, MASTER_ADDR_FILE_VAR, MASTER_ADDR_VAR, NODE_RANK_VAR, entry_script
from ..spec import JobSpec
from ..servers import SERVER_ADDR_VAR, SERVER_INDEX_VAR, TRAINER_MASTER_VAR, addrs_var, local_addr, server_script
from ..templating import render_template
from .base import DryRun, JobState, JobStatus, Scheduler, tail_lines

LOCAL_MASTER = "127.0.0.1"
GRACE_S = 10.0
CANCEL_MARK = "cancel-requested"  # written by cancel; read by the supervisor and by status
START_GRACE_S = 30.0  # a job this young with no supervisor pid yet is still starting
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def state_root() -> Path:
    env = os.environ.get("HALO_SCHED_HOME")
    if env:
        return Path(env) / "local"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "halo-sched" / "local"


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOCAL_MASTER, port))
        except OSError:
            return True
    return False


class LocalScheduler(Scheduler):
    name = "local"
    streams_logs = True  # `submit --wait` follows the node-prefixed log live

    # status() reads the job's state file: no scheduler to spare, so always read afresh.
    status_max_age = 0.0

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else state_root()

    def watch_key(self):
        return ("local", str(self.root))

    # ---- public API -------------------------------------------------------------------------

    def render(self, spec: JobSpec, **opts) -> str:
        return render_template("local/run.txt.j2", spec=spec, entry=entry_script(spec), master=LOCAL_MASTER,
                               servers=_server_plan(spec), server_script=server_script)

    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        return DryRun(self.name, spec, self.render(spec), payload=entry_script(spec))

    def schedule(self, dryrun: DryRun) -> str:
        spec: JobSpec = dryrun.spec
        spec.secret_values()  # secret_env: the supervisor and its nodes inherit this environment
        if spec.image:
            print(f"halo-sched: local backend ignores image {spec.image!r}; nodes run on this machine", file=sys.stderr)
        if _port_in_use(spec.rendezvous.port):
            raise SchedulerError(
                f"rendezvous.port {spec.rendezvous.port} is in use on {LOCAL_MASTER} (another job?); "
                "choose another rendezvous.port"
            )
        _check_local_ports(spec)
        servers = _server_plan(spec)
        # Trainer nodes first, then each server "node": disjoint slices of this machine's GPUs.
        gpu_sets = _gpu_sets_for([spec.gpus_per_node] * spec.nodes + [s["gpus"] for s in servers])
        server_gpus = gpu_sets[spec.nodes:] if gpu_sets else None
        gpu_sets = gpu_sets[:spec.nodes] if gpu_sets and spec.gpus_per_node else None
        self.root.mkdir(parents=True, exist_ok=True)
        job_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        d = self.root / job_id
        d.mkdir()
        (d / "entry.sh").write_text(dryrun.payload)
        (d / "entry.sh").chmod(0o755)
        for role in spec.servers:
            (d / f"server-{role.name}.sh").write_text(server_script(spec, role))
        for i, srv in enumerate(servers):
            srv["gpus"] = server_gpus[i] if server_gpus and srv["gpus"] else None
        _write_json(d / "job.json", {"name": spec.name, "nodes": spec.nodes, "cwd": os.getcwd(), "gpus": gpu_sets,
                                     "servers": servers})
        _write_json(d / "state.json", {"state": "PENDING", "submitted": time.time()})
        (d / "job.log").touch()
        proc = subprocess.Popen(
            [sys.executable, "-m", "halo_sched.backends.local", str(d)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(d / "supervisor.err", "wb"),
            start_new_session=True, cwd=os.getcwd(),
        )
        (d / "supervisor.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}")
        return job_id

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        d = self.root / job_id
        nodes = dryrun.spec.nodes
        return {"outputs": [str(d / "job.log")] + [str(d / f"node-{k}.log") for k in range(nodes)],
                "scheduler": {"job_dir": str(d)}}

    def describe(self, ids: Sequence[str]) -> dict[str, JobState]:
        return {i: self._state(i) for i in ids}

    def cancel(self, ids: Sequence[str], **opts) -> None:
        for job_id in ids:
            d = self._dir(job_id)
            data = json.loads((d / "state.json").read_text())
            if JobStatus(data["state"]).terminal:
                continue
            # The mark makes the cancel stick even if the supervisor has not set up its handler yet.
            (d / CANCEL_MARK).touch()
            sup = self._supervisor(d)
            if sup is not None and _same_process(*sup):
                try:
                    os.kill(sup[0], signal.SIGTERM)
                except ProcessLookupError:
                    pass
                continue
            # No supervisor to do it: stop every process of the job (torchrun first gets SIGTERM,
            # so it can stop its workers), then record the outcome unless the supervisor did.
            _stop_tagged(str(d))
            data = json.loads((d / "state.json").read_text())
            if not JobStatus(data["state"]).terminal:
                data.update(state="CANCELLED", nodes_running=0, ended=time.time(),
                            reason="cancelled by user (the supervisor was gone)")
                _write_json(d / "state.json", data)

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        d = self._dir(job_id)
        if not (d / "job.log").exists():
            raise UsageError(f"local job {job_id!r} has no log yet")
        yield from tail_lines(d / "job.log", follow, lambda: self._state(job_id).status.terminal, poll=0.05)

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change=None, on_tick=None) -> JobState:
        """Until the job ends: blocks on the supervisor's exit (a pidfd), which follows its last
        state write at once, so the wait returns as the job ends; states in between are read
        every ``poll`` seconds (a file read: no backoff needed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            state = self._state(job_id)
            key = (state.status, state.nodes_running)
            if key != last:
                last = key
                if on_change:
                    on_change(state)
            if on_tick:
                on_tick(state)
            if state.status.terminal or state.status is JobStatus.UNKNOWN:
                return state
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return state
            sup = self._supervisor(self.root / job_id)
            _wait_exit(sup[0] if sup else None, min(poll, left) if left is not None else poll)

    # ---- implementation ---------------------------------------------------------------------

    def _dir(self, job_id: str) -> Path:
        if not _ID_RE.match(job_id) or job_id in (".", ".."):
            raise UsageError(f"{job_id!r} is not a local job id")
        d = self.root / job_id
        if not (d / "state.json").is_file():
            raise UsageError(f"no local job {job_id!r} under {self.root}")
        return d

    @staticmethod
    def _supervisor(d: Path) -> tuple[int, int | None] | None:
        """(pid, start time) of the job's supervisor, as recorded at submit."""
        try:
            parts = (d / "supervisor.pid").read_text().split()
            return int(parts[0]), (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None)
        except (OSError, ValueError, IndexError):
            return None

    def _state(self, job_id: str) -> JobState:
        try:
            d = self._dir(job_id)
        except UsageError as err:
            return JobState(job_id, JobStatus.UNKNOWN, reason=str(err))
        data = json.loads((d / "state.json").read_text())
        meta = json.loads((d / "job.json").read_text())
        status = JobStatus(data["state"])
        st = JobState(
            job_id, status, raw_state=data["state"], exit_code=data.get("exit_code"),
            nodes_total=meta["nodes"], nodes_running=data.get("nodes_running", 0), reason=data.get("reason", ""),
        )
        if status is JobStatus.FAILED:
            st.failure = _failure_report(d)
        if not status.terminal:
            sup = self._supervisor(d)
            if sup is None and time.time() - data.get("submitted", 0) < START_GRACE_S:
                return st  # submit has not recorded the supervisor yet
            if sup is None or not _same_process(*sup):
                # Re-read: the supervisor may have finished between the two reads.
                data = json.loads((d / "state.json").read_text())
                if JobStatus(data["state"]).terminal:
                    return self._state(job_id)
                if (d / CANCEL_MARK).exists():
                    st.status, st.reason = JobStatus.CANCELLED, "cancelled by user"
                else:
                    st.status, st.reason = JobStatus.FAILED, "the local supervisor process died"
                    left = len(_tagged(str(d)))
                    if left:
                        st.reason += f"; {left} process{'es' if left != 1 else ''} of the job still run: cancel it to stop them"
        return st


def _wait_exit(pid: int | None, timeout: float) -> None:
    """Sleep until process ``pid`` exits or ``timeout`` passes, woken by the exit itself (pidfd,
    Linux 5.3+); a short sleep where that is not available."""
    try:
        fd = os.pidfd_open(pid) if pid else None
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        time.sleep(min(timeout, 0.1))
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def _wait_any(pids: list[int], wake_fd: int | None, timeout: float) -> None:
    """Sleep until one of ``pids`` exits, a signal arrives (``wake_fd``, signal.set_wakeup_fd),
    or ``timeout`` passes: the supervisor sees a node's end as it happens, not at its next poll."""
    fds = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        time.sleep(min(timeout, 0.1))
        return
    try:
        ready, _, _ = select.select(fds + ([wake_fd] if wake_fd is not None else []), [], [], timeout)
        if wake_fd in ready:
            try:
                os.read(wake_fd, 512)
            except BlockingIOError:
                pass
    finally:
        for fd in fds:
            os.close(fd)


def _failure_report(d: Path):
    """Which rank failed first: from the failure lines the nodes wrote into their output."""
    from ..failures import report_from_files

    return report_from_files(sorted(d.glob("node-*.log")) or [d / "job.log"])


def _visible_gpus() -> list[str] | None:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES entries (honouring one already set), or None
    when it cannot tell (no nvidia-smi). torch is never imported for this."""
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [g for g in preset.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def _server_plan(spec: JobSpec) -> list[dict]:
    """Every local server "node": its role, index, loopback address of its own, GPU count."""
    return [{"role": r.name, "index": k, "addr": local_addr(i, k), "port": r.port, "gpus": r.gpus_per_node,
             "addrs_var": addrs_var(r.name)}
            for i, r in enumerate(spec.servers) for k in range(r.nodes)]


def _check_local_ports(spec: JobSpec) -> None:
    """On this machine rank 0's rendezvous and group ports share 127.0.0.1: each must be free."""
    ports = [("rendezvous.port", spec.rendezvous.port)] + [
        (f"servers[{i}].group_port", r.group_port) for i, r in enumerate(spec.servers) if r.group_port is not None]
    for field, port in ports:
        if _port_in_use(port):
            raise SchedulerError(f"{field} {port} is in use on {LOCAL_MASTER} (another job?); choose another port")


def _gpu_sets_for(per_node: list[int]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each local node (trainer and server nodes), disjoint."""
    total = sum(per_node)
    if total == 0:
        return None
    gpus = _visible_gpus()
    if gpus is None:
        raise SchedulerError(
            f"the job asks for {total} GPUs but no GPUs can be found here (nvidia-smi missing and "
            "CUDA_VISIBLE_DEVICES unset); the local backend gives each node (trainer or server) its own GPUs"
        )
    if len(gpus) < total:
        raise SchedulerError(
            f"the local backend needs {total} GPUs (trainer nodes x gpus_per_node plus every server node's "
            f"gpus_per_node, each node its own); this machine has {len(gpus)}"
        )
    out, at = [], 0
    for n in per_node:
        out.append(",".join(gpus[at:at + n]))
        at += n
    return out


def _gpu_sets(nodes: int, per_node: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each local node: disjoint slices of this machine's GPUs."""
    if per_node == 0:
        return None
    gpus = _visible_gpus()
    if gpus is None:
        raise SchedulerError(
            f"gpus_per_node={per_node} but no GPUs can be found here (nvidia-smi missing and "
            "CUDA_VISIBLE_DEVICES unset); the local backend gives each node its own GPUs"
        )
    if len(gpus) < nodes * per_node:
        raise SchedulerError(
            f"the local backend needs nodes x gpus_per_node = {nodes * per_node} GPUs (each node its own); "
            f"this machine has {len(gpus)}"
        )
    return [",".join(gpus[i * per_node:(i + 1) * per_node]) for i in range(nodes)]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _same_process(pid: int, start: int | None) -> bool:
    """Whether ``pid`` still runs and is the process recorded then (not a reused pid, not a zombie)."""
    fields = _stat(pid)
    if fields is None:
        return False
    if fields[0] == "Z":
        return False
    return start is None or int(fields[19]) == start


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[1]) == pid:
                out.append(int(entry))
    return out


JOB_TAG_VAR = "HALO_LOCAL_JOB"  # in every node's environment: finds the job's processes, however deep


def _tagged(tag: str) -> list[int]:
    """Live processes (other than this one) whose environment carries ``HALO_LOCAL_JOB=tag``."""
    want = f"{JOB_TAG_VAR}={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env and _same_process(int(entry), None):
            out.append(int(entry))
    return out


def _stop_tagged(tag: str, grace: float = GRACE_S, also=None) -> None:
    """SIGTERM every process of the job, SIGKILL what is left after ``grace``, and repeat until
    none is left (a process reparented meanwhile is caught on the next round). ``also`` (the
    supervisor only) adds its own children, which the tag may miss (a scrubbed env), and reaps
    them: nowhere else may this wait for arbitrary children."""
    term_until = time.monotonic() + grace
    give_up = term_until + 10.0
    signalled: set[int] = set()
    while time.monotonic() < give_up:
        while also is not None:  # collect children that already ended (we are their subreaper)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        procs = set(_tagged(tag)) | {p for p in (also() if also else []) if _same_process(p, None)}
        if not procs:
            return
        late = time.monotonic() >= term_until
        for pid in procs:
            if late or pid not in signalled:
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
                signalled.add(pid)
        time.sleep(0.1)


def _become_subreaper() -> None:
    """Orphaned descendants (torchrun's workers run in sessions of their own) become our children,
    so none outlives the job. Linux only; elsewhere the node process groups are all we stop."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


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
        _write_json(self.d / "state.json", self.state)

    def _pump(self, rank: int | str, stream) -> None:
        # A trainer node is "node K"; a server node "server ROLE K" (its own log file too).
        prefix = (f"[node {rank}] " if isinstance(rank, int) else f"[{rank}] ").encode()
        own_name = f"node-{rank}.log" if isinstance(rank, int) else rank.replace(" ", "-") + ".log"
        # Each node's output also in a file of its own (what a node of a cluster would keep).
        with open(self.d / own_name, "ab", buffering=0) as own:
            for line in iter(stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                own.write(line)
                with self.lock:
                    self.log.write(prefix + line)

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
        _stop_tagged(str(self.d), also=lambda: _children(os.getpid()))

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
        _become_subreaper()
        if (self.d / CANCEL_MARK).exists():
            self._save(state="CANCELLED", nodes_running=0, ended=time.time(), reason="cancelled by user")
            return 0
        env = dict(os.environ)
        env.pop(MASTER_ADDR_FILE_VAR, None)
        env[MASTER_ADDR_VAR] = LOCAL_MASTER
        # Nodes run with the submitting Python's environment: its torchrun first on PATH.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        pumps = []
        servers = self.meta.get("servers") or []
        # Servers first: they come up while the trainer nodes run their setup; the trainer's entry
        # waits for their health before torchrun. Trainer nodes learn the addresses from the env.
        for srv in servers:
            env[srv["addrs_var"]] = ",".join(o["addr"] for o in servers if o["role"] == srv["role"])
        for srv in servers:
            label = f"server {srv['role']} {srv['index']}"
            srv_env = {**env, JOB_TAG_VAR: str(self.d), SERVER_INDEX_VAR: str(srv["index"]),
                       SERVER_ADDR_VAR: srv["addr"], TRAINER_MASTER_VAR: LOCAL_MASTER}
            srv_env.pop(MASTER_ADDR_VAR, None)
            if srv.get("gpus"):
                srv_env["CUDA_VISIBLE_DEVICES"] = srv["gpus"]
            p = subprocess.Popen(
                ["bash", str(self.d / f"server-{srv['role']}.sh")],
                env=srv_env, cwd=self.meta["cwd"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.servers.append((label, p))
            t = threading.Thread(target=self._pump, args=(label, p.stdout), daemon=True)
            t.start()
            pumps.append(t)
        gpu_sets = self.meta.get("gpus")
        for rank in range(self.n):
            # torchrun's per-rank logs and error files stay in the job directory (ranks/node-K/).
            node_env = {**env, NODE_RANK_VAR: str(rank), JOB_TAG_VAR: str(self.d), LOG_DIR_VAR: str(self.d / "ranks")}
            if gpu_sets:
                # Each "node" owns its own GPUs, as on separate hosts; LOCAL_RANK indexes them.
                node_env["CUDA_VISIBLE_DEVICES"] = gpu_sets[rank]
            p = subprocess.Popen(
                ["bash", str(self.d / "entry.sh")],
                env=node_env, cwd=self.meta["cwd"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.procs.append(p)
            t = threading.Thread(target=self._pump, args=(rank, p.stdout), daemon=True)
            t.start()
            pumps.append(t)
        self._save(state="RUNNING", started=time.time(), nodes_running=self.n,
                   pids=[p.pid for p in self.procs], starts=[_start_time(p.pid) for p in self.procs])

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
                with self.lock:
                    self.log.write(f"[halo-sched] {label} exited with {code} while the trainer ran; "
                                   "stopping the job\n".encode())
                self._terminate_all()
                break
            if bad and failed_rank is None:
                failed_rank, exit_code = bad[0]
                with self.lock:
                    self.log.write(f"[halo-sched] node {failed_rank} exited with {exit_code}; stopping the other nodes\n".encode())
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
            _wait_any(live, wake_r, 1.0)
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
            report = _failure_report(self.d)
            self._save(state="FAILED", nodes_running=0, ended=time.time(), exit_code=exit_code,
                       reason=report.describe() if report else f"node {failed_rank} exited with {exit_code}")
        else:
            self._save(state="COMPLETED", nodes_running=0, ended=time.time(), exit_code=0)
        return 0


def main(argv: list[str]) -> int:
    return _Supervisor(Path(argv[0])).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
