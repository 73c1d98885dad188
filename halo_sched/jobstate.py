"""What a backend says about a job: its status, and the typed details each scheduler adds.

Every backend maps its scheduler's states onto :class:`JobStatus` and answers with a
:class:`JobState`. What only one scheduler knows sits in that scheduler's detail
(:class:`SlurmDetail`, :class:`NomadDetail`), each field typed and documented here, once.
:meth:`JobState.change_key` is the one definition of "the job changed" that every wait loop
uses (the shared watcher, the local backend's wait, the Nomad watchdog).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .node.failure_classes import HUNG_ON_NODE, Classification, classify_failure

if TYPE_CHECKING:  # pragma: no cover
    from .node.failures import FailureReport


class JobStatus(str, enum.Enum):
    """The small documented set every backend maps its states onto."""

    PENDING = "PENDING"
    PARTIAL = "PARTIAL"  # Nomad: k of N node allocations placed/running; never a final state
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:  # pragma: no cover - str(enum) readability
        return self.value


#: What ``list --state`` and ``halo_sched.list(state=)`` take besides a status: records that cannot be read.
UNREADABLE = "UNREADABLE"


def state_named(text: object) -> str:
    """A state's name for ``list --state`` and ``halo_sched.list(state=)``: a :class:`JobStatus`
    or its name in any case, or ``UNREADABLE``; ValueError naming the states otherwise."""
    name = text.value if isinstance(text, JobStatus) else str(text).strip().upper()
    valid = [s.value for s in JobStatus] + [UNREADABLE]
    if name not in valid:
        from .errors import shown

        raise ValueError(f"{shown(text)} is not a state; use one of {', '.join(valid)}")
    return name


_TERMINAL = {
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.TIMEOUT,
    JobStatus.NODE_FAIL,
    JobStatus.PREEMPTED,
    JobStatus.OUT_OF_MEMORY,
}

#: States that are a failure to classify even without a failure report (the scheduler's word).
_CLASSIFIED = {JobStatus.FAILED, JobStatus.NODE_FAIL, JobStatus.OUT_OF_MEMORY}


@dataclass
class SlurmDetail:
    """What SLURM says beyond the common fields (squeue, sacct, scontrol, slurmrestd, pyslurm)."""

    #: Which query answered: squeue, sacct, scontrol, slurmrestd or pyslurm.
    source: str | None = None
    #: The signal that ended the job (the second half of sacct's ExitCode), when one did.
    signal: int | None = None
    #: The id the job's array/het family is known by (``123`` for ``123_4`` and ``123+1``).
    base_id: str | None = None
    array_task: str | None = None
    het_offset: str | None = None
    #: SLURM's own job id of this record (an array task's own number).
    job_id_raw: str | None = None
    nodelist: str | None = None
    #: The cluster (``sbatch -M``) the job runs on, for a multi-cluster id ``CLUSTER:ID``.
    cluster: str | None = None
    #: Whether the job may run again (sbatch --requeue).
    requeue: bool | None = None
    #: sacct: each step's state, by step id.
    steps: dict[str, str] | None = None
    derived_exit_code: int | None = None
    #: sacct: the last reason the job was blocked (kept after it ran).
    last_block_reason: str | None = None
    #: An array or het job answered as one: each component's status.
    components: dict[str, str] | None = None
    #: A requested array task still inside its pending record ``123_[5-9]``: that record's id.
    pending_array: str | None = None
    #: When the job was submitted, and when SLURM expects it to start (``squeue --start``; local
    #: times as SLURM prints them, ``2026-12-01T12:25:13``), and what it depends on.
    submitted: str | None = None
    expected_start: str | None = None
    dependency: str | None = None


@dataclass
class NomadDetail:
    """What Nomad says beyond the common fields (halo_sched/backends/nomad/state.py folds it)."""

    #: Per node rank: the allocation that runs it (alloc id and name, node, client status, phase).
    nodes: list[dict] = field(default_factory=list)
    #: Node ranks with an allocation placed (running or not).
    nodes_placed: int = 0
    #: Why ranks are unplaced, by task group (from the blocked evaluation).
    blocked: dict[str, str] = field(default_factory=dict)
    blocked_eval: bool = False
    #: Allocations that ended while the job should run: a dead rank or server.
    dead: list[dict] = field(default_factory=list)
    namespace: str | None = None
    #: Per rollout server node: its allocation, as ``nodes`` (with the server's name).
    servers: list[dict] = field(default_factory=list)
    #: Rollout server nodes the job declares, and those still running.
    servers_expected: int = 0
    servers_running: int = 0
    #: Someone asked Nomad to stop the job (the watchdog, or a cancel).
    stop_requested: bool = False
    #: The watchdog stopped it (a rank died while others ran or waited).
    stopped_by_watcher: bool = False


@dataclass
class JobState:
    """One job's state as a backend reports it; ``raw_state`` keeps the scheduler's own word."""

    id: str
    status: JobStatus
    raw_state: str = ""
    exit_code: int | None = None
    nodes_total: int | None = None
    nodes_running: int | None = None
    reason: str = ""
    #: SLURM: how many times the job was requeued (this is run ``restarts + 1``).
    restarts: int | None = None
    #: Which rank failed first and why, when the job's nodes reported it; ``describe`` then
    #: leads with it.
    failure: FailureReport | None = None
    #: Local: the job's state file cannot be read (the job exists: it is not an unknown id).
    unreadable: bool = False
    #: The job record's last known state, for a job the scheduler no longer knows.
    last_known: dict | None = None
    slurm: SlurmDetail | None = None
    nomad: NomadDetail | None = None
    #: Why the job ended, in words, where halo-sched itself ended it (a SLURM job that can never
    #: start: what to change in the job file); ``describe`` then says it.
    verdict: str = ""
    #: While it runs, where the ranks' progress reports can be read (local): each node's step and
    #: step time and the slowest rank (halo_sched/node/stragglers.py).
    progress: str = ""
    #: When the job started and ended by the scheduler's own clock (epoch seconds), where the
    #: backend reports them (local: the supervisor's times); a run's GPU-hours are counted from
    #: them (halo_sched/runs.py).
    started_at: float | None = None
    ended_at: float | None = None
    #: SLURM with slurm.spare_nodes: ``{"total", "left", "swaps": [{rank, bad, spare, reason, by,
    #: time, spares_left, planned, warned, cost_s}]}``, from the batch script's signed swap lines
    #: (backends/slurm/spares.py): ``planned`` a host that left for maintenance (``warned``: when the
    #: trainers were warned), ``cost_s`` the seconds from the warning (or the swap) to training again.
    spares: dict | None = None
    #: What rank 0 handed back (``HALO_RESULT_FILE``, halo_sched/node/result.py): a JSON value
    #: (None when there is none), filled in for an ended job by the reads and waits that return
    #: it (``Run.result()``, ``wait()``, ``status``); ``value_note`` says why there is none: ""
    #: when a value was read (rank 0 may have written ``null``), None when nobody looked (the
    #: job has not ended).
    value: object = None
    value_note: str | None = None
    #: SLURM with retry:: the batch script's restarts in place and crash loop, ``[{action, restart,
    #: attempt, class, reason, step, time}]`` (``action`` inplace or stop), from its signed restart
    #: lines (node/restart.py, backends/slurm/spares.py).
    in_place: list[dict] | None = None

    def change_key(self) -> tuple:
        """What counts as a change while waiting (a progress line; the watcher's polls go back to
        the shortest interval): the status, the nodes running or placed, the scheduler's word, the
        run, and why it waits or ended (``reason``: PENDING for Resources, then for Priority, is
        two states to a person watching)."""
        return (self.status, self.nodes_running, self.raw_state, self.restarts, self.reason,
                self.nomad.nodes_placed if self.nomad is not None else None,
                len(self.spares["swaps"]) if self.spares else None, len(self.in_place or ()))

    def failure_class(self) -> Classification | None:
        """Whose fault the failure is (halo_sched/node/failure_classes.py), for a job that failed
        (FAILED, NODE_FAIL, OUT_OF_MEMORY, TIMEOUT with a failure report); None otherwise."""
        if self.status not in _CLASSIFIED and self.failure is None:
            return None
        if not self.status.terminal and self.failure is None:
            return None
        return classify_failure(self.failure, self.status)

    def describe(self) -> str:
        """The state in words, one line: ``FAILED: rank 3 (node 1, ...) exit 1 ...``; with hot
        spares, how many are left and which node each replaced; the restarts in place."""
        text = self._describe()
        if self.spares:
            text += f"; {_describe_spares(self.spares)}"
        if self.in_place:
            text += f"; {_describe_restarts(self.in_place)}"
        return text

    def _describe(self) -> str:
        if self.failure is not None and self.failure.first is not None:
            cls = self.failure_class()
            # A node's fault leads the line (the host to avoid); a job's own is the rank's words.
            # NODE_FAIL says it already, and its first failure names the node; so does a HUNG line.
            node = cls is not None and cls.node and self.status is not JobStatus.NODE_FAIL and cls.failure is not HUNG_ON_NODE
            # A node pattern in the rank's words alone labels the line, as what it is: unknown cause.
            said = cls is not None and cls.said
            head = f"{self.status.value} ({cls.describe()})" if node or said else self.status.value
            text = f"{head}: {self.failure.describe()}"
            return text + (f" (raw={self.raw_state})" if self.raw_state and self.raw_state != self.status.value else "")
        if self.verdict:
            return f"{self.status.value}: {self.verdict}"
        parts = [self.status.value]
        if self.nodes_total is not None and self.nodes_running is not None and not self.status.terminal:
            parts.append(f"{self.nodes_running}/{self.nodes_total} nodes running")
        if self.raw_state and self.raw_state != self.status.value:
            parts.append(f"raw={self.raw_state}")
        if self.exit_code is not None:
            parts.append(f"exit={self.exit_code}{_signal_words(self)}")
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.restarts:  # a requeued job: which run this is
            parts.append(f"run {self.restarts + 1}")
        if self.progress and not self.status.terminal:
            parts.append(f"({self.progress})")
        return " ".join(parts)


def _signal_words(state: JobState) -> str:
    """`` (128+9: killed by signal 9, SIGKILL)`` for an exit code SLURM says is a signal."""
    sig = state.slurm.signal if state.slurm is not None else None
    if not sig or state.exit_code != 128 + sig:
        return ""
    import signal as signals

    try:
        name = f", {signals.Signals(sig).name}"
    except ValueError:
        name = ""
    return f" (128+{sig}: killed by signal {sig}{name})"


def _describe_spares(spares: dict) -> str:
    """``1 spare left`` / ``0 of 1 spares left (node2 -> node3: NCCL network error)``."""
    left, total = spares["left"], spares["total"]
    head = f"{left} spare{'s' if left != 1 else ''} left" if not spares["swaps"] else \
        f"{left} of {total} spare{'s' if total != 1 else ''} left"
    moved = ", ".join(f"{s['bad']} -> {s['spare']}" + (": maintenance" if s.get("planned") else "")
                      + ((f" ({s['reason']})" if s.get("planned") else f": {s['reason']}") if s["reason"] else "")
                      + (f", training again {s['cost_s']:g} s after the {'warning' if s.get('planned') else 'swap'}"
                         if s.get("cost_s") is not None else "")
                      for s in spares["swaps"])
    return head + (f" ({moved})" if moved else "")


def in_place_fields(restarts: list[dict] | None) -> dict:
    """``{"in_place_restarts": [...], "crash_loop": {...}}`` of a job's restart lines, each key only
    where it has something: as a record's ``last_state`` and ``status --json`` carry them
    (halo_sched/ettr.py reads each restart's ``time``)."""
    again = [r for r in restarts or () if r.get("action") == "inplace"]
    stop = [r for r in restarts or () if r.get("action") == "stop"]
    return {**({"in_place_restarts": again} if again else {}), **({"crash_loop": stop[-1]} if stop else {})}


def _describe_restarts(restarts: list[dict]) -> str:
    """``2 restarts in place (job fault: Python exception at step 12; ...)``, and a crash loop's end."""
    def what(r: dict) -> str:
        return r["reason"] + (f" at step {r['step']}" if r.get("step") is not None else "")

    again = [r for r in restarts if r["action"] == "inplace"]
    parts = []
    if again:
        shown = "; ".join(what(r) for r in again[-3:])
        parts.append(f"{len(again)} restart{'s' if len(again) != 1 else ''} in place "
                     f"({'...; ' if len(again) > 3 else ''}{shown})")
    stop = next((r for r in reversed(restarts) if r["action"] == "stop"), None)
    if stop is not None:
        parts.append(f"crash loop: {what(stop)} twice, not restarted")
    return "; ".join(parts)


__all__ = ["JobState", "JobStatus", "NomadDetail", "SlurmDetail", "UNREADABLE", "in_place_fields", "state_named"]
