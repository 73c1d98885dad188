"""Which rank failed first on Nomad: the ``halo-sched-failure`` lines in the dead allocations' logs.

Each node's entry script prints one such line per failed rank to its task's stderr when torchrun
fails (halo_sched/node/failure_collector.py); Nomad keeps it in the allocation's log files, read
through the client fs API (``/v1/client/fs/logs/ALLOC?task=&type=&origin=end&offset=N&plain=true``,
command/agent/fs_endpoint.go ``Logs``). Bounded: only once the job is final or a rank died, only
allocations that ended (failed, timed out, stopped by the job's stop), only the tail of each,
each allocation read once (its log no longer changes).

Where no line can be read, Nomad itself still says something: a lost allocation names its node
(the node went down: its client cannot be reached, so neither can its logs), a failed one its
task's exit code and events, a server role the last error line of its own stderr.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Iterable

from halo_sched.backends.base import JobState, JobStatus
from halo_sched.node.failure_collector import TAG, error_line
from halo_sched.node.failures import FailureReport, RankFailure, parse_lines

from . import servers as server_roles
from .capabilities import ReadsLogTail
from .render import TASK
from .state import NodeView, failure_detail, node_views, server_views

TAIL_BYTES = 65536    # of each log read: the failure lines come last, after the rank's traceback
MAX_ALLOCS = 64       # allocations read per job; the earliest-dead first
RETRY_UNREADABLE_S = 60.0  # a log that could not be read is asked for again after this long
_READERS = 8


@dataclass(frozen=True)
class AllocFailure(RankFailure):
    """A failure known from Nomad, not from a failure line: a lost node, a server role, or a
    node whose logs could not be read. ``label`` says where; ``verb`` how (``lost``)."""

    label: str = ""
    verb: str = ""

    def where(self) -> str:
        return self.label or super().where()

    def how(self) -> str:
        return self.verb or super().how()

    def describe(self) -> str:
        at = time.strftime("%H:%M:%S", time.localtime(self.time))
        text = f"{self.where()} {self.how()} at {at}"
        return f"{text}: {self.error}" if self.error else text

    def to_dict(self) -> dict:
        return {**super().to_dict(), "where": self.where(), "source": "nomad"}


def needs_report(state: JobState) -> bool:
    """Only when something died: the job ended badly, or a rank died while others run."""
    return (state.status in (JobStatus.FAILED, JobStatus.NODE_FAIL, JobStatus.TIMEOUT)
            or bool(state.nomad is not None and state.nomad.dead))


class FailureLogs:
    """Reads and caches, per allocation, the failures its logs (or Nomad) report."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[RankFailure], float]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # log requests made (tests)

    def report(self, client, state: JobState, allocs: Iterable[dict]) -> FailureReport | None:
        """The failure report of a job whose ``state`` was folded from ``allocs`` (None when
        nothing died or nothing is known)."""
        if not needs_report(state):
            return None
        from halo_sched.records import failure_key

        key = failure_key(state.id, "nomad")
        allocs = list(allocs or ())
        views = node_views(allocs, state.nodes_total) + server_views(allocs)
        ended = sorted((v for v in views if v.alloc and _ended(v)), key=lambda v: (v.died_at, v.rank))
        ended = ended[:MAX_ALLOCS]
        if len(ended) > 1:
            with ThreadPoolExecutor(min(_READERS, len(ended))) as pool:
                found = list(pool.map(lambda v: self._of(client, v, key), ended))
        else:
            found = [self._of(client, v, key) for v in ended]
        failures = [f for fs in found for f in fs]
        lost = [f for v, fs in zip(ended, found) if v.phase in ("lost", "unknown") for f in fs]
        if not failures:
            return None
        return FailureReport(failures, cause=min(lost, key=lambda f: f.time) if lost else None)

    def _of(self, client, v: NodeView, key: str = "") -> list[RankFailure]:
        alloc_id = v.alloc["ID"]
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(alloc_id)
        if hit is not None and hit[1] > now:
            return hit[0]
        failures, readable = self._read(client, v, key)
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[alloc_id] = (failures, float("inf") if readable else now + RETRY_UNREADABLE_S)
        return failures

    def _read(self, client, v: NodeView, key: str = "") -> tuple[list[RankFailure], bool]:
        a = v.alloc
        host = a.get("NodeName") or (a.get("NodeID") or "")[:8]
        when = (v.died_at or int(a.get("ModifyTime") or 0)) / 1e9
        if v.phase in ("lost", "unknown"):
            # The node is gone, and its logs with it (the server cannot reach its client).
            why = a.get("ClientDescription") or ("node down" if v.phase == "lost" else "node disconnected")
            who = f"server {v.server}" if v.server else f"node {v.rank}"
            return [AllocFailure(node=None if v.server else v.rank, rank=None, local_rank=None, host=host,
                                 exit_code=None, signal=None, time=when, label=f"{who} (Nomad node {host})",
                                 verb="lost" if v.phase == "lost" else "disconnected",
                                 error=f"allocation {a['ID'][:8]} {v.phase}: {why}")], True
        if v.server:
            if v.phase == "stopped":  # ended by the job's stop: not a failure
                return [], True
            text = self._tail(client, a["ID"], server_roles.TASK, "stderr")
            lines = [ln for ln in (text or "").splitlines() if ln.strip()]
            error = error_line(lines[-12:]) if lines else failure_detail(a)
            return [AllocFailure(node=None, rank=None, local_rank=None, host=host, exit_code=v.exit_code,
                                 signal=None, time=when, label=f"server {v.server} (Nomad node {host})",
                                 error=error, tail=tuple(lines[-12:]))], text is not None
        readable = False
        failures: list[RankFailure] = []
        for kind in ("stderr", "stdout"):  # the collector writes to stderr; stdout only if not there
            text = self._tail(client, a["ID"], TASK, kind)
            readable = readable or text is not None
            failures = parse_lines((ln for ln in (text or "").splitlines() if TAG in ln), key)
            if failures:
                # Nomad's name for the node (what a ${node.unique.name} constraint matches).
                name = a.get("NodeName") or ""
                return [f if f.node_name or not name else replace(f, node_name=name) for f in failures], True
        if v.phase in ("failed", "timeout"):
            # No failure line: the entry script died before torchrun, the driver failed, or the
            # logs are gone. The task's own events still say how it ended.
            return [AllocFailure(node=v.rank, rank=None, local_rank=None, host=host, exit_code=v.exit_code,
                                 signal=None, time=when, label=f"node {v.rank} (Nomad node {host})",
                                 error=failure_detail(a) if v.phase == "failed" else v.detail)], readable
        return [], readable

    def _tail(self, client, alloc_id: str, task: str, kind: str) -> str | None:
        if not isinstance(client, ReadsLogTail):
            return None
        with self._lock:
            self.reads += 1
        try:
            return client.log_tail(alloc_id, task, kind, TAIL_BYTES)
        except Exception:  # noqa: BLE001 - a log read never turns a status into an error
            return None


def _ended(v: NodeView) -> bool:
    """An allocation whose task is over (its log final), or whose node is gone."""
    if v.phase in ("lost", "unknown"):
        return True
    return v.phase in ("failed", "timeout", "stopped") and (v.alloc or {}).get("ClientStatus") in ("failed", "complete")
