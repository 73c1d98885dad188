"""The local backend: N "nodes" as processes on this machine, each the shared entry script.

``submit`` writes a job directory and starts a detached supervisor (``python -m
halo_sched.node.local_supervisor <dir>``: standard library only, so it starts fast) that runs
node 0..N-1 with ``HALO_NODE_RANK``, ``HALO_MASTER_ADDR=127.0.0.1`` and ``HALO_MASTER_PORT``
(``rendezvous.port``, or a port free at submit when it is unset), prefixes every output
line with its node, stops the other nodes when one fails (like ``srun --kill-on-bad-exit``), and
records the job's state and exit code.
The job outlives the submitting command; ``status``/``logs``/``cancel`` read that directory.
"""
from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from ..errors import SchedulerError, UsageError, shown
from ..records import Unreadable, home, read_json, read_small
from .. import store
from ..store import make_home
from ..launch import Launch, compile_launch, render_entry, submission_id
from ..node.contract import LOCAL_PORTS, NAMES
from ..node_runtime import runtime, server_shell
from ..servers import local_addr, render_server
from ..templating import render_template
from . import base
from .base import DryRun, JobState, JobStatus, Scheduler, missing_output, tail_lines
from .watcher import wait_loop
# The supervisor's run-time code and the process helpers shared with it live there, once.
from ..node.local_supervisor import CANCEL_MARK, HEAD_RE, STREAM_OF, failure_report
from ..logtags import Raw
from ..node.processes import same_process, start_time, stop_tagged, tagged, wait_exit, write_json

if TYPE_CHECKING:  # pragma: no cover
    from ..models import JobSpec

LOCAL_MASTER = "127.0.0.1"
#: In the job's directory: rank 0's result, a small JSON value (``HALO_RESULT_FILE``).
RESULT_FILE = "result.json"
START_GRACE_S = 30.0  # a job this young with no supervisor pid yet is still starting
#: The raw state of a job whose cancel was asked for and whose processes are still stopping.
CANCELLING = "CANCELLING"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def state_root() -> Path:
    """Where local jobs live: ``local/`` in halo-sched's state directory (records.home)."""
    return home() / "local"


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOCAL_MASTER, port))
        except OSError:
            return True
    return False


#: How long a port handed to a job stays reserved for it (torchrun binds it seconds later).
PORT_RESERVE_S = 120.0


def _free_master_port(spec: JobSpec, root: Path) -> int:
    """rendezvous.port unset: a port of LOCAL_PORTS that is free on this machine now, none of
    the job's server ports, and not handed to another job in the last PORT_RESERVE_S seconds,
    from a random start. torchrun binds it seconds after submit: until then only the reservation
    (a file under ``root/.ports/``, made under a lock every submitting process and thread takes)
    keeps two jobs submitted at once from both taking it (tests/test_library_concurrency.py: 50
    jobs from 8 threads; without it two rank 0s met EADDRINUSE)."""

    avoid = set(compile_launch(spec).rendezvous.avoid)
    make_home()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    reserved = root / ".ports"
    reserved.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".ports.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.time()
        held = set()
        for e in os.scandir(reserved):
            try:
                fresh = now - e.stat().st_mtime < PORT_RESERVE_S
            except OSError:
                continue
            if fresh and e.name.isdigit():
                held.add(int(e.name))
            else:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
        start = secrets.randbelow(len(LOCAL_PORTS))
        for i in range(len(LOCAL_PORTS)):
            port = LOCAL_PORTS[(start + i) % len(LOCAL_PORTS)]
            if port not in avoid and port not in held and not _port_in_use(port):
                (reserved / str(port)).touch()
                return port
    finally:
        os.close(fd)
    raise SchedulerError(f"no free port in {LOCAL_PORTS.start}-{LOCAL_PORTS.stop - 1} on {LOCAL_MASTER} for "
                         "rank 0; set rendezvous.port")


def _keeper_dir() -> Path:
    make_home()
    d = home() / "keepers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def keeper_lock(backend: str, run_id: str) -> Path:
    return _keeper_dir() / f"{backend}-{run_id}.lock"


def _start_keeper(backend: str, run_id: str) -> subprocess.Popen | None:
    """Start the run's keeper (halo_sched/keeper.py), detached, in this process's environment (the nodes of later
    attempts inherit it, ``secret_env`` values included, as the first attempt's did)."""
    log = open(_keeper_dir() / f"{backend}-{run_id}.log", "ab")
    with log:
        return subprocess.Popen([sys.executable, "-m", "halo_sched.keeper", backend, run_id], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, cwd=os.getcwd())


#: How long :meth:`LocalScheduler.start_owner` waits for the keeper it started to hold its lock.
KEEPER_START_S = 30.0


def _keeper_alive(backend: str, run_id: str) -> bool:
    """Whether a keeper of the run holds its lock now."""
    try:
        fd = os.open(keeper_lock(backend, run_id), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


class LocalScheduler(Scheduler):
    name = "local"
    streams_logs = True  # `submit --wait` follows the node-prefixed log live

    # status() reads the job's state file: no scheduler to spare, so always read afresh.
    status_max_age = 0.0

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else state_root()

    def watcher_key(self):
        return ("local", str(self.root))

    # ---- public API -------------------------------------------------------------------------

    def render(self, spec: JobSpec, **opts) -> str:
        return render_run(compile_launch(spec, backend="local"))

    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        return DryRun(self.name, spec, self.render(spec), payload=render_entry(compile_launch(spec, backend="local")))

    def schedule(self, dryrun: DryRun) -> str:
        return self._start(dryrun, submission_id(dryrun.spec))

    def _start(self, dryrun: DryRun, job_id: str, decided: bool = False) -> str:
        """Lay out job ``job_id``'s directory (``state.json`` last: a directory without it is not
        whole) and start its supervisor. ``decided``: an attempt whose identity a run's actor
        recorded before starting it (:meth:`submit_attempt`), started again by whoever took a dead
        actor's place: a directory left whole only needs its supervisor, started again (one
        already running holds the job's lock and the new one exits: node/local_supervisor.py),
        and one left part-written is written again."""
        spec: JobSpec = dryrun.spec
        spec.secret_values()  # secret_env: the supervisor and its nodes inherit this environment
        d = self.root / job_id
        if decided and os.path.lexists(d / "state.json"):
            self._supervise(d, adopt=True)
            return job_id
        if spec.image:
            print(f"halo-sched: local backend ignores image {spec.image!r}; nodes run on this machine", file=sys.stderr)
        if spec.rendezvous.port is not None and _port_in_use(spec.rendezvous.port):
            raise SchedulerError(
                f"rendezvous.port {spec.rendezvous.port} is in use on {LOCAL_MASTER} (another job?); "
                "choose another rendezvous.port, or leave it unset for a free one"
            )
        _check_local_ports(spec)
        master_port = spec.rendezvous.port if spec.rendezvous.port is not None else _free_master_port(spec, self.root)
        launch = compile_launch(spec, backend="local")
        servers = _server_nodes(launch)
        # Trainer nodes first, then each server "node": disjoint slices of this machine's GPUs.
        gpu_sets = _gpu_sets_for([spec.gpus_per_node] * spec.nodes + [s["gpus"] for s in servers])
        server_gpus = gpu_sets[spec.nodes:] if gpu_sets else None
        gpu_sets = gpu_sets[:spec.nodes] if gpu_sets and spec.gpus_per_node else None
        make_home()  # private (0700) when new; exit 2 naming HALO_SCHED_HOME when it cannot be written
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.mkdir(exist_ok=decided)
        try:
            (d / "entry.sh").write_text(dryrun.payload)
            (d / "entry.sh").chmod(0o755)
            # The node runtime, for a torchrun whose python has another halo-sched (or none).
            (d / "halo-node.b64").write_text(runtime().base64_lines() + "\n")
            for role in launch.servers:
                (d / f"server-{role.name}.sh").write_text(render_server(launch, role))
            if launch.servers:  # the servers' shell (halo_sched/node/server.sh), which each server entry reads
                (d / "halo-server-shell.sh").write_text(server_shell())
            for i, srv in enumerate(servers):
                srv["gpus"] = server_gpus[i] if server_gpus and srv["gpus"] else None
            write_json(d / "job.json", {"name": spec.name, "nodes": spec.nodes, "cwd": os.getcwd(), "gpus": gpu_sets,
                                         "servers": servers, "master_port": master_port,
                                         "launch": _supervisor_job(launch, d, servers, gpu_sets, master_port)})
            (d / "job.log").touch()
            write_json(d / "state.json", {"state": "PENDING", "submitted": time.time()})
        except BaseException:
            # Refused before its supervisor started: no job, so no directory a reader takes for one
            # (a decided attempt's record stays: whoever takes over lays the directory out again).
            shutil.rmtree(d, ignore_errors=True)
            raise
        base.step("laid-out")
        self._supervise(d)
        base.step("started")
        return job_id

    @staticmethod
    def _supervise(d: Path, adopt: bool = False) -> None:
        """Start the job's supervisor (it runs the job only while it is PENDING, one supervisor
        at a time: node/local_supervisor.py ``main``). ``adopt``: one may run already, so the pid
        file is left to the supervisor that runs the job (it writes its own)."""
        with open(d / "supervisor.err", "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "halo_sched.node.local_supervisor", str(d)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True, cwd=os.getcwd(),
            )
        if not adopt:
            (d / "supervisor.pid").write_text(f"{proc.pid} {start_time(proc.pid)}")

    #: A run's retries are owned by one detached process per run, started at its submit
    #: (halo_sched/keeper.py): it outlives the submitting process; waiters follow it.
    starts_successor = True

    def submit(self, spec: JobSpec, **opts):
        job = super().submit(spec, **opts)
        if spec.retry is not None and getattr(spec, "_attempt", None) is None:
            try:
                _start_keeper(self.name, job.id)
            except OSError as err:  # the job runs: its id is still printed; a waiter starts the keeper
                print(f"halo-sched: warning: the run's keeper could not be started ({err.strerror or err}); "
                      f"`halo-sched watch {job.id}` starts it", file=sys.stderr)
        return job

    def submit_attempt(self, spec: JobSpec, previous_id: str):
        """The run's next attempt, decided before it is started: its record (id, failure key,
        attempt number) is kept in the store first, in one transaction that finds the record of
        an earlier decision of the same attempt instead and marks ``previous_id``'s successor as
        being started (records.decide); then exactly that job is started (:meth:`_start`) and
        named ``previous_id``'s successor (records.link), which every reader then follows. Only
        the run's keeper calls it (halo_sched/keeper.py, one per run by its lock); a keeper
        killed at any step leaves either nothing decided, or a decided attempt that the next
        keeper starts or adopts: never a second one (tests/test_one_attempt.py)."""
        from .. import records
        from .base import Job, failure_key_in_env, new_failure_key

        dry = self.dryrun(spec)
        job_id = submission_id(spec)
        fields = {**self.record_fields(dry, job_id), "failure_key": new_failure_key()}
        rec = records.decide(records.build(self.name, spec, job_id, fields, spec.job_file), dry.text, previous_id)
        base.step("decided")
        with failure_key_in_env(rec.get("failure_key") or ""):
            self._start(dry, rec["id"], decided=True)
        records.link(spec._attempt.run_id, self.name, previous_id, rec["id"])
        base.step("recorded")
        return Job(self, rec["id"])

    def owner_gone(self, run_id: str) -> bool:
        return not _keeper_alive(self.name, run_id)

    def start_owner(self, run_id: str) -> bool:
        """Start the run's keeper again when none holds its lock (it was killed, the machine
        rebooted): detached, as ``submit`` starts it; it carries the run on from where the store
        says it is, the attempt a dead keeper decided included. Waits until the new keeper holds
        the lock or has ended (at most :data:`KEEPER_START_S`). True when one was started. The
        caller starts nothing else: the keeper alone decides and starts attempts."""
        if _keeper_alive(self.name, run_id):
            return False
        try:
            proc = _start_keeper(self.name, run_id)
        except OSError as err:
            print(f"halo-sched: warning: the run's keeper could not be started ({err.strerror or err})", file=sys.stderr)
            return False
        deadline = time.monotonic() + KEEPER_START_S
        while (proc is None or proc.poll() is None) and not _keeper_alive(self.name, run_id) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        return True

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        d = self.root / job_id
        nodes = dryrun.spec.nodes
        return {"outputs": [str(d / "job.log")] + [str(d / f"node-{k}.log") for k in range(nodes)],
                "scheduler": {"job_dir": str(d)}}

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        return {i: self._state(i) for i in ids}

    def cancel(self, ids: Sequence[str], **opts) -> dict[str, str]:
        """Stop each job; those already ended are left as they are: {id: state in words}."""
        ended = {}
        for job_id in ids:
            d = self._dir(job_id)
            data, _ = _read_state(d)
            if data is not None and JobStatus(data["state"]).terminal:
                ended[job_id] = self._state(job_id).describe()
                continue  # an unreadable state file: the job may run, so cancel it all the same
            # The mark makes the cancel stick even if the supervisor has not set up its handler yet.
            (d / CANCEL_MARK).touch()
            sup = self._supervisor(d)
            if sup is not None and same_process(*sup):
                try:
                    os.kill(sup[0], signal.SIGTERM)
                except ProcessLookupError:
                    pass
                continue
            # No supervisor to do it: stop every process of the job (torchrun first gets SIGTERM,
            # so it can stop its workers), then record the outcome unless the supervisor did.
            stop_tagged(str(d))
            data, _ = _read_state(d)
            if data is None or not JobStatus(data["state"]).terminal:
                data = data or {}
                data.update(state="CANCELLED", nodes_running=0, ended=time.time(),
                            reason="cancelled by user (the supervisor was gone)")
                write_json(d / "state.json", data)
        return ended

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        d = self._dir(job_id)
        if not (d / "job.log").exists():
            # (submit creates it, before the job starts)
            raise SchedulerError(f"local job {job_id}: {missing_output(d / 'job.log', self._state(job_id))}")
        for line in tail_lines(d / "job.log", follow, lambda: self._state(job_id).status.terminal, poll=0.05):
            yield _read_head(line)

    #: Each line of job.log says when the supervisor read it and from which stream (_read_head).
    log_fields = frozenset({"time", "stream"})

    def read_result(self, job_id: str, record: dict | None = None) -> bytes | None:
        """Rank 0's result file, ``result.json`` in the job's directory (``HALO_RESULT_FILE``)."""
        from ..node.result import read_bounded

        if len(job_id) > 255 or not _ID_RE.match(job_id) or job_id in (".", ".."):
            raise UsageError(f"{shown(job_id)} is not a local job id")
        return read_bounded(self.root / job_id / RESULT_FILE)

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change=None, on_tick=None, outage_s: float | None = None, on_outage=None) -> JobState:
        """Until the job ends: blocks on the supervisor's exit (a pidfd), which follows its last
        state write at once, so the wait returns as the job ends; states in between are read
        every ``poll`` seconds (a file read: no backoff needed). There is no scheduler to lose:
        ``outage_s``/``on_outage`` are accepted for the common signature and unused."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first = [True]

        def next_state(left: float | None) -> JobState:
            if not first[0]:
                sup = self._supervisor(self.root / job_id)
                wait_exit(sup[0] if sup else None, min(poll, left) if left is not None else poll)
            first[0] = False
            return self._state(job_id)

        return wait_loop(next_state, deadline, on_change, on_tick)

    # ---- implementation ---------------------------------------------------------------------

    def _dir(self, job_id: str) -> Path:
        if len(job_id) > 255 or not _ID_RE.match(job_id) or job_id in (".", ".."):
            raise UsageError(f"{shown(job_id)} is not a local job id")
        d = self.root / job_id
        try:
            found = os.path.lexists(d / "state.json")
        except (OSError, ValueError):
            found = False
        if not found:
            raise UsageError(f"no local job {shown(job_id)} under {self.root}")
        return d

    @staticmethod
    def _supervisor(d: Path) -> tuple[int, int | None] | None:
        """(pid, start time) of the job's supervisor, as recorded at submit."""
        try:
            parts = read_small(d / "supervisor.pid", 256).decode().split()
            return int(parts[0]), (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None)
        except (OSError, ValueError, IndexError):
            return None

    def _state(self, job_id: str) -> JobState:
        try:
            d = self._dir(job_id)
        except UsageError as err:
            return JobState(job_id, JobStatus.UNKNOWN, reason=str(err))
        data, why = _read_state(d)
        meta, why_meta = _read_meta(d)
        if data is None or meta is None:
            # A torn or foreign file reports this one job, never fails a command for every job.
            return JobState(job_id, JobStatus.UNKNOWN, raw_state="UNREADABLE", reason=why or why_meta,
                            unreadable=True)
        status = JobStatus(data["state"])
        st = JobState(
            job_id, status, raw_state=data["state"], exit_code=data.get("exit_code"),
            nodes_total=meta["nodes"], nodes_running=data.get("nodes_running", 0), reason=data.get("reason", ""),
            started_at=data.get("started"), ended_at=data.get("ended") if status.terminal else None,
        )
        if status is JobStatus.FAILED:
            from ..records import failure_key

            st.failure = failure_report(d, failure_key(job_id, self.name))
        if status is JobStatus.RUNNING:
            from ..node import stragglers

            st.progress = stragglers.line(d / "ranks")
        if not status.terminal:
            if (d / CANCEL_MARK).exists():
                # Asked to stop, still stopping (torchrun and its workers get SIGTERM, then SIGKILL
                # after a grace): not an end yet, as SLURM's COMPLETING is not, but never shown
                # as if nothing had been asked.
                st.raw_state, st.reason = CANCELLING, "cancel requested; its processes are being stopped"
            sup = self._supervisor(d)
            if sup is None and time.time() - data.get("submitted", 0) < START_GRACE_S:
                return st  # submit has not recorded the supervisor yet
            if sup is None or not same_process(*sup):
                # Re-read: the supervisor may have finished between the two reads.
                data, _ = _read_state(d)
                if data is not None and JobStatus(data["state"]).terminal:
                    return self._state(job_id)
                if (d / CANCEL_MARK).exists():
                    st.status, st.reason = JobStatus.CANCELLED, "cancelled by user"
                else:
                    st.status, st.reason = JobStatus.FAILED, "the local supervisor process died"
                    left = len(tagged(str(d)))
                    if left:
                        st.reason += f"; {left} process{'es' if left != 1 else ''} of the job still run: cancel it to stop them"
        return st


def _read_state(d: Path) -> tuple[dict | None, str]:
    """The job's ``state.json`` (the supervisor's), or None and why it cannot be used. Read
    without blocking and bounded (a FIFO or a huge file of that name is refused)."""
    try:
        data = read_json(d / "state.json", 1 << 20)
    except (OSError, Unreadable) as err:
        return None, f"unreadable state.json: {err if isinstance(err, Unreadable) else err.strerror or err}"
    if not isinstance(data, dict) or data.get("state") not in JobStatus.__members__:
        return None, "unreadable state.json: no valid 'state'"
    for key, types in (("exit_code", (int, type(None))), ("nodes_running", int), ("reason", str),
                       ("submitted", (int, float))):
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool)):
            return None, f"unreadable state.json: {key!r} is a {type(data[key]).__name__}"
    return data, ""


def _read_meta(d: Path) -> tuple[dict | None, str]:
    """The job's ``job.json`` (written at submit), or None and why it cannot be used."""
    try:
        meta = read_json(d / "job.json", 16 << 20)
    except (OSError, Unreadable) as err:
        return None, f"unreadable job.json: {err if isinstance(err, Unreadable) else err.strerror or err}"
    if not isinstance(meta, dict) or not isinstance(meta.get("nodes"), int) or isinstance(meta.get("nodes"), bool):
        return None, "unreadable job.json: no valid 'nodes'"
    return meta, ""


def _read_head(line: str) -> str:
    """A line of ``job.log`` without the time and stream the supervisor wrote before it
    (node/local_supervisor.py ``HEAD_RE``), carrying them (``logtags.Raw``); a line without them
    (a job directory of an earlier release) as it is."""
    m = HEAD_RE.match(line)
    if m is None:
        return line
    return Raw(line[m.end():], float(m.group(1)), STREAM_OF.get(m.group(2)))


def render_run(launch: Launch) -> str:
    """What ``render --backend local`` shows: how each node and server process is started, and
    the scripts they run."""
    port = "PORT" if launch.rendezvous.port is None else str(launch.rendezvous.port)
    return render_template("local/run.txt.j2", launch=launch, names=launch.names, entry=render_entry(launch),
                           master=LOCAL_MASTER, port=port, servers=_server_nodes(launch),
                           port_range=f"{LOCAL_PORTS.start}-{LOCAL_PORTS.stop - 1}",
                           scripts=[(r.name, render_server(launch, r)) for r in launch.servers])


def _supervisor_job(launch: Launch, d: Path, servers: list[dict], gpu_sets: list[str] | None,
                    master_port: int) -> dict:
    """What the supervisor runs, rendered here so that it imports no spec/template code: each
    node's script and the variables it adds to the inherited environment (never a secret: those
    stay in the environment). The supervisor adds the job tag and PATH itself."""
    common = {NAMES.master_addr: LOCAL_MASTER, NAMES.master_port: str(master_port),
              NAMES.node_runtime_file: str(d / "halo-node.b64"),
              # Rank 0's result (halo_sched/node/result.py), read back by read_result.
              NAMES.result_file: str(d / RESULT_FILE)}
    if launch.restart_count:  # a retry of its run: the ranks learn which attempt this is
        common[NAMES.restart_count] = str(launch.restart_count)
    for srv in servers:
        common[srv["addrs_var"]] = ",".join(o["addr"] for o in servers if o["role"] == srv["role"])
    nodes = []
    for rank in range(launch.trainer.nodes):
        # torchrun's per-rank logs and error files stay in the job directory (ranks/node-K/).
        env = {NAMES.node_rank: str(rank), NAMES.log_dir: str(d / "ranks")}
        if gpu_sets:
            # Each "node" owns its own GPUs, as on separate hosts; LOCAL_RANK indexes them.
            env["CUDA_VISIBLE_DEVICES"] = gpu_sets[rank]
        nodes.append({"script": "entry.sh", "env": env})
    server_runs = []
    for srv in servers:
        env = {NAMES.server_index: str(srv["index"]), NAMES.server_addr: srv["addr"], NAMES.trainer_master: LOCAL_MASTER,
               NAMES.server_shell_file: str(d / "halo-server-shell.sh")}
        if srv.get("gpus"):
            env["CUDA_VISIBLE_DEVICES"] = srv["gpus"]
        server_runs.append({"label": f"server {srv['role']} {srv['index']}", "script": f"server-{srv['role']}.sh",
                             "env": env, "unset": [NAMES.master_addr, NAMES.master_port]})
    # HALO_SCHED_HOME names the history store, where the job's failure key is kept: no rank is
    # told it (docs/failures.md, "Only halo-sched's own lines are a verdict"). The job's directory
    # (HALO_LOCAL_JOB, the log directory) holds no key; the supervisor has it in its environment
    # and the entry script hands it to the failure collector alone.
    return {"env": common, "unset": [NAMES.master_addr_file, store.HOME_VAR], "nodes": nodes, "servers": server_runs}


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


def _server_nodes(launch: Launch) -> list[dict]:
    """Every local server "node": its role, index, loopback address of its own, GPU count."""
    return [{"role": r.name, "index": k, "addr": local_addr(r.index, k), "port": r.port, "gpus": r.gpus,
             "addrs_var": r.addrs_var}
            for r in launch.servers for k in range(r.nodes)]


def _check_local_ports(spec: JobSpec) -> None:
    """On this machine rank 0's rendezvous and group ports share 127.0.0.1: each must be free."""
    ports = ([("rendezvous.port", spec.rendezvous.port)] if spec.rendezvous.port is not None else []) + [
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
