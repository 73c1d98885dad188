"""A fake Nomad HTTP API for tests: a stdlib HTTP server on 127.0.0.1 (ephemeral port) in a thread.

It behaves like a Nomad server for the calls halo-sched makes, with Nomad's field names and shapes:

* ``PUT|POST /v1/jobs`` and ``POST /v1/job/<id>``: register. Task groups are placed at once on a
  configurable set of client nodes, respecting Count, Datacenters, GPU device counts, CPU/memory,
  reserved ports and ``distinct_hosts``. Groups that cannot be placed get FailedTGAllocs metrics
  on the evaluation and a follow-up *blocked* evaluation, like Nomad's scheduler.
* ``POST /v1/job/<id>/plan``: the same placement as a dry run (Annotations, FailedTGAllocs, Diff,
  Warnings).
* ``GET /v1/job/<id>``, ``.../allocations``, ``.../evaluations``, ``GET /v1/jobs?prefix=``.
* ``DELETE /v1/job/<id>?purge=``: stop (Job.Stop=true, allocations told to stop and killed) or purge.
* ``GET /v1/client/fs/logs/<alloc>?task=&type=&plain=&follow=``: plain or framed, optionally
  following until the allocation ends.

Knobs for tests: HTTPS with a given certificate; ACL tokens (403 without a good one; every
request's headers are recorded); injected HTTP 5xx answers and dropped connections; moving
allocations to running / complete / failed / killed-by-max_run_duration; nodes joining later
(which unblocks blocked evaluations); log text; plan/register warnings.

Not modelled: blocking queries, deployments, rescheduling and restarts (halo-sched sets both to 0),
multi-region forwarding, node drain.
"""
from __future__ import annotations

import base64
import copy
import fnmatch
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

MAX_RUN_DURATION_DESC = "allocation exceeded max_run_duration"  # Nomad's AllocTimeoutReasonMaxRunDuration
NOT_RESTARTING_MSG = 'Exceeded allowed attempts 0 in interval 24h0m0s and mode is "fail"'
GPU_DEVICE_NAMES = ("gpu", "nvidia/gpu")


@dataclass
class FakeNode:
    """A Nomad client node. ``busy_gpus`` are held by workloads outside the fake (another team)."""

    name: str
    gpus: int = 8
    cpu_mhz: int = 200_000
    memory_mb: int = 1_000_000
    datacenter: str = "dc1"
    busy_gpus: int = 0
    status: str = "ready"
    id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any
    status: int | None = None  # None: the connection was dropped without an answer


class _HTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def _rfc3339(ns: int) -> str:
    seconds, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


def _event(etype: str, when: int, display: str = "", **fields: Any) -> dict:
    """A TaskEvent with every field Nomad serialises (zero values where unused)."""
    event = {
        "Type": etype, "Time": when, "Message": "", "DisplayMessage": display, "Details": {},
        "FailsTask": False, "RestartReason": "", "SetupError": "", "DriverError": "", "DriverMessage": "",
        "ExitCode": 0, "Signal": 0, "KillReason": "", "KillTimeout": 0, "KillError": "", "StartDelay": 0,
        "DownloadError": "", "ValidationError": "", "DiskLimit": 0, "FailedSibling": "", "VaultError": "",
        "TaskSignalReason": "", "TaskSignal": "", "GenericSource": "",
    }
    event.update(fields)
    return event


def _task_demand(tg: dict) -> tuple[int, int, int, list[tuple[str, int]]]:
    """(gpus, cpu MHz, memory MB, reserved ports) a task group asks of one node."""
    gpus = cpu = mem = 0
    for task in tg.get("Tasks") or []:
        res = task.get("Resources") or {}
        cpu += int(res.get("CPU") or 100)
        mem += int(res.get("MemoryMB") or 300)
        for dev in res.get("Devices") or []:
            name = (dev.get("Name") or "").lower()
            if name in GPU_DEVICE_NAMES or name.startswith("nvidia/gpu/"):
                gpus += int(dev.get("Count") or 1)
    ports = [(p.get("Label", ""), int(p.get("Value"))) for net in tg.get("Networks") or []
             for p in net.get("ReservedPorts") or [] if p.get("Value")]
    return gpus, cpu, mem, ports


def _distinct_hosts(job: dict, tg: dict) -> bool:
    for c in (job.get("Constraints") or []) + (tg.get("Constraints") or []):
        if c.get("Operand") == "distinct_hosts" and str(c.get("RTarget", "true")).lower() in ("true", ""):
            return True
    return False


class FakeNomad:
    """The fake server and its cluster. Use as a context manager or call :meth:`start`/:meth:`close`."""

    def __init__(
        self,
        nodes: list[FakeNode] | None = None,
        *,
        token: str | None = None,
        acl_tokens: dict[str, str] | None = None,
        region: str = "global",
        auto_run: bool = True,
        tls: tuple[str, str] | None = None,
    ):
        self.nodes: list[FakeNode] = list(nodes if nodes is not None else [FakeNode("gpu-a"), FakeNode("gpu-b")])
        # token -> "write" | "read"; ACLs are enforced as soon as one token exists.
        self.acl_tokens: dict[str, str] = dict(acl_tokens or {})
        if token:
            self.acl_tokens[token] = "write"
        self.region = region
        self.tls = tls  # (certfile, keyfile): serve HTTPS
        self.auto_run = auto_run  # placed allocations start running at once
        self.plan_warnings = ""
        self.register_warnings = ""
        # group name -> exit code: on stop, such a running group dies on its own (a torchrun rank
        # crashing because rank 0 was killed) instead of being killed.
        self.stop_collateral: dict[str, int] = {}

        self.requests: list[RecordedRequest] = []
        self._lock = threading.RLock()
        self._index = 10
        self._last_event_ns = 0
        self._jobs: dict[tuple[str, str], dict] = {}
        self._allocs: dict[str, dict] = {}
        self._alloc_demand: dict[str, tuple[int, int, int, list[tuple[str, int]]]] = {}
        self._evals: dict[str, dict] = {}
        self._logs: dict[tuple[str, str, str], str] = {}
        self._fail_queue: list[tuple[int, str, str | None]] = []
        self._drop_queue: list[str | None] = []
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------- lifecycle

    def start(self) -> "FakeNomad":
        fake = self

        class Handler(_Handler):
            pass

        Handler.fake = fake
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            # A handshake the client aborts (it does not trust us) raises in accept(); socketserver
            # treats that OSError as "no request" and keeps serving.
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-nomad", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeNomad":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the fake first"
        return self._server.server_address[1]

    @property
    def address(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------------- knobs

    def fail_next(self, n: int, status: int = 500, body: str = "No cluster leader", path_contains: str | None = None) -> None:
        """Answer the next ``n`` matching requests with ``status`` (before auth, like a proxy/leaderless server)."""
        with self._lock:
            self._fail_queue += [(status, body, path_contains)] * n

    def drop_next(self, n: int, path_contains: str | None = None) -> None:
        """Close the connection of the next ``n`` matching requests without answering."""
        with self._lock:
            self._drop_queue += [path_contains] * n

    def add_node(self, node: FakeNode) -> None:
        """A client node joins; blocked evaluations are retried (Nomad unblocks on capacity change)."""
        with self._lock:
            self.nodes.append(node)
            self._unblock()

    def set_busy_gpus(self, node_name: str, busy: int) -> None:
        """Another workload takes or frees GPUs on a node; freeing retries blocked evaluations."""
        with self._lock:
            node = next(n for n in self.nodes if n.name == node_name)
            freed = busy < node.busy_gpus
            node.busy_gpus = busy
            if freed:
                self._unblock()

    def set_running(self, job_id: str, group: str | None = None, namespace: str = "default") -> None:
        """Start the pending allocations of a job (or of one group)."""
        with self._lock:
            for alloc in self._live_allocs(job_id, namespace, group):
                if alloc["ClientStatus"] == "pending":
                    self._start_alloc(alloc)
            self._touch_job(job_id, namespace)

    def finish(self, job_id: str, group: str, exit_code: int = 0, namespace: str = "default") -> dict:
        """The group's task exits with ``exit_code`` (non-zero: no restart, the allocation fails)."""
        with self._lock:
            alloc = self._running_alloc(job_id, group, namespace)
            for task_name, ts in alloc["TaskStates"].items():
                ts["Events"].append(_event("Terminated", self._now(), f"Exit Code: {exit_code}", ExitCode=exit_code,
                                           Details={"exit_code": str(exit_code), "signal": "0", "oom_killed": "false"}))
                if exit_code:
                    ts["Events"].append(_event("Not Restarting", self._now(), NOT_RESTARTING_MSG, FailsTask=True,
                                               RestartReason=NOT_RESTARTING_MSG,
                                               Details={"fails_task": "true", "restart_reason": NOT_RESTARTING_MSG}))
                self._end_task(ts, failed=bool(exit_code))
            self._set_client_status(alloc, "failed" if exit_code else "complete",
                                    "Failed tasks" if exit_code else "All tasks have completed")
            self._touch_job(job_id, namespace)
            return copy.deepcopy(alloc)

    def fail_driver(self, job_id: str, group: str, message: str = "failed to pull image", namespace: str = "default") -> dict:
        """The group's task never starts: a driver failure (no exit code)."""
        with self._lock:
            alloc = self._latest_alloc(job_id, group, namespace)
            for ts in alloc["TaskStates"].values():
                ts["Events"].append(_event("Driver Failure", self._now(), message, FailsTask=True, DriverError=message,
                                           Details={"fails_task": "true", "driver_error": message}))
                self._end_task(ts, failed=True)
            self._set_client_status(alloc, "failed", "Failed tasks")
            self._touch_job(job_id, namespace)
            return copy.deepcopy(alloc)

    def time_out(self, job_id: str, group: str, variant: str = "client", namespace: str = "default") -> dict:
        """Kill the group's allocation for exceeding max_run_duration, the way Nomad 2.0.2+ does.

        ``client`` (what the merged feature does, per Nomad PR #27803 and its docs): tasks killed,
        ClientStatus "complete", ClientDescription "allocation exceeded max_run_duration".
        ``server``: the server-side watcher variant seen in Nomad's tests: DesiredStatus "stop",
        DesiredDescription with that text, ClientStatus "failed".
        ``event``: only the task's "Killing" event carries the text (DisplayMessage), the
        allocation is plainly complete; guards against Nomad moving the text between fields.
        """
        with self._lock:
            alloc = self._running_alloc(job_id, group, namespace)
            marker_in_event = variant in ("client", "event")
            for ts in alloc["TaskStates"].values():
                ts["Events"].append(_event(
                    "Killing", self._now(),
                    MAX_RUN_DURATION_DESC if marker_in_event else "Sent interrupt. Waiting 5s before force killing",
                    KillTimeout=5_000_000_000, Details={"kill_timeout": "5s"}))
                ts["Events"].append(_event("Terminated", self._now(), "Exit Code: 137, Signal: 9", ExitCode=137, Signal=9,
                                           Details={"exit_code": "137", "signal": "9", "oom_killed": "false"}))
                ts["Events"].append(_event("Killed", self._now(), "Task successfully killed"))
                self._end_task(ts, failed=False)
            if variant == "client":
                self._set_client_status(alloc, "complete", MAX_RUN_DURATION_DESC)
            elif variant == "server":
                alloc["DesiredStatus"] = "stop"
                alloc["DesiredDescription"] = MAX_RUN_DURATION_DESC
                self._set_client_status(alloc, "failed", "Failed tasks")
            elif variant == "event":
                self._set_client_status(alloc, "complete", "All tasks have completed")
            else:
                raise ValueError(f"unknown variant {variant!r}")
            self._touch_job(job_id, namespace)
            return copy.deepcopy(alloc)

    def write_log(self, alloc_id: str, text: str, task: str = "torchrun", type: str = "stdout") -> None:  # noqa: A002
        with self._lock:
            key = (alloc_id, task, type)
            self._logs[key] = self._logs.get(key, "") + text

    # ------------------------------------------------------------------------- inspection

    def job_record(self, job_id: str, namespace: str = "default") -> dict | None:
        with self._lock:
            job = self._jobs.get((namespace, job_id))
            return copy.deepcopy(job) if job else None

    def allocs_of(self, job_id: str, namespace: str = "default") -> list[dict]:
        with self._lock:
            return copy.deepcopy([a for a in self._allocs.values() if a["JobID"] == job_id and a["Namespace"] == namespace])

    def alloc_for(self, job_id: str, group: str, namespace: str = "default") -> dict:
        with self._lock:
            return copy.deepcopy(self._latest_alloc(job_id, group, namespace))

    def evals_of(self, job_id: str, namespace: str = "default") -> list[dict]:
        with self._lock:
            return copy.deepcopy([e for e in self._evals.values() if e["JobID"] == job_id and e["Namespace"] == namespace])

    def requests_to(self, path_contains: str, method: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if path_contains in r.path and (method is None or r.method == method)]

    # ------------------------------------------------------------------------- internals: time and indexes

    def _next_index(self) -> int:
        self._index += 1
        return self._index

    def _now(self) -> int:
        # Strictly increasing event times, so tests can rely on ordering within one fake.
        self._last_event_ns = max(time.time_ns(), self._last_event_ns + 1)
        return self._last_event_ns

    # ------------------------------------------------------------------------- internals: lookup

    def _job_allocs(self, job_id: str, namespace: str) -> list[dict]:
        return [a for a in self._allocs.values() if a["JobID"] == job_id and a["Namespace"] == namespace]

    def _live_allocs(self, job_id: str, namespace: str, group: str | None = None) -> list[dict]:
        return [a for a in self._job_allocs(job_id, namespace)
                if a["DesiredStatus"] == "run" and a["ClientStatus"] in ("pending", "running")
                and (group is None or a["TaskGroup"] == group)]

    def _latest_alloc(self, job_id: str, group: str, namespace: str) -> dict:
        allocs = [a for a in self._job_allocs(job_id, namespace) if a["TaskGroup"] == group]
        if not allocs:
            raise KeyError(f"no allocation for {job_id}/{group}")
        return max(allocs, key=lambda a: a["CreateIndex"])

    def _running_alloc(self, job_id: str, group: str, namespace: str) -> dict:
        alloc = self._latest_alloc(job_id, group, namespace)
        if alloc["ClientStatus"] == "pending":
            self._start_alloc(alloc)
        if alloc["ClientStatus"] != "running":
            raise ValueError(f"{job_id}/{group} is {alloc['ClientStatus']}, not running")
        return alloc

    # ------------------------------------------------------------------------- internals: state changes

    def _start_alloc(self, alloc: dict) -> None:
        now = self._now()
        for ts in alloc["TaskStates"].values():
            ts["Events"].append(_event("Task Setup", now, "Building Task Directory", Message="Building Task Directory"))
            ts["Events"].append(_event("Started", self._now(), "Task started by client"))
            ts["State"] = "running"
            ts["StartedAt"] = _rfc3339(now)
        self._set_client_status(alloc, "running", "Tasks are running")

    def _end_task(self, ts: dict, failed: bool) -> None:
        ts["State"] = "dead"
        ts["Failed"] = failed
        ts["FinishedAt"] = _rfc3339(self._now())

    def _set_client_status(self, alloc: dict, status: str, description: str) -> None:
        alloc["ClientStatus"] = status
        alloc["ClientDescription"] = description
        idx = self._next_index()
        alloc["ModifyIndex"] = idx
        alloc["ModifyTime"] = time.time_ns()
        if status in ("complete", "failed", "lost"):
            self._alloc_demand.pop(alloc["ID"], None)  # a terminal allocation frees its node

    def _touch_job(self, job_id: str, namespace: str) -> None:
        job = self._jobs.get((namespace, job_id))
        if job is None:
            return
        allocs = self._job_allocs(job_id, namespace)
        if job["Stop"]:
            status = "dead"
        elif any(a["ClientStatus"] in ("pending", "running") and a["DesiredStatus"] == "run" for a in allocs):
            status = "running"
        elif any(e["Status"] in ("pending", "blocked") for e in self._evals.values()
                 if e["JobID"] == job_id and e["Namespace"] == namespace):
            status = "pending"
        elif not allocs:
            status = "pending"
        else:
            status = "dead"
        if status != job["Status"]:
            job["Status"] = status
            job["ModifyIndex"] = self._next_index()

    # ------------------------------------------------------------------------- internals: scheduling

    def _node_usage(self, node: FakeNode, proposed: dict[str, list]) -> tuple[int, int, int, set[int]]:
        gpus, cpu, mem, ports = node.busy_gpus, 0, 0, set()
        for alloc_id, (g, c, m, p) in self._alloc_demand.items():
            if self._allocs[alloc_id]["NodeID"] == node.id:
                gpus, cpu, mem = gpus + g, cpu + c, mem + m
                ports |= {v for _, v in p}
        for g, c, m, p in proposed.get(node.id, []):
            gpus, cpu, mem = gpus + g, cpu + c, mem + m
            ports |= {v for _, v in p}
        return gpus, cpu, mem, ports

    def _eligible_nodes(self, job: dict) -> tuple[list[FakeNode], dict[str, int]]:
        patterns = job.get("Datacenters") or ["*"]
        ready = [n for n in self.nodes if n.status == "ready"]
        in_dc = [n for n in ready if any(fnmatch.fnmatchcase(n.datacenter, p) for p in patterns)]
        available: dict[str, int] = {}
        for pattern in patterns:
            for n in ready:
                if fnmatch.fnmatchcase(n.datacenter, pattern):
                    available[n.datacenter] = available.get(n.datacenter, 0) + 1
            if "*" not in pattern and "?" not in pattern:
                available.setdefault(pattern, 0)
        return sorted(in_dc, key=lambda n: n.name), available

    def _select_node(self, job: dict, tg: dict, proposed: dict[str, list], job_nodes: set[str]) -> tuple[FakeNode | None, dict]:
        gpus, cpu, mem, ports = _task_demand(tg)
        candidates, available = self._eligible_nodes(job)
        metric: dict[str, Any] = {
            "NodesEvaluated": 0, "NodesFiltered": 0, "NodesInPool": sum(1 for n in self.nodes if n.status == "ready"),
            "NodesAvailable": available, "ClassFiltered": None, "ConstraintFiltered": None, "NodesExhausted": 0,
            "ClassExhausted": None, "DimensionExhausted": None, "QuotaExhausted": None, "ResourcesExhausted": None,
            "Scores": None, "ScoreMetaData": None, "AllocationTime": 21_000, "CoalescedFailures": 0,
        }

        def filtered(reason: str) -> None:
            metric["NodesFiltered"] += 1
            metric["ConstraintFiltered"] = metric["ConstraintFiltered"] or {}
            metric["ConstraintFiltered"][reason] = metric["ConstraintFiltered"].get(reason, 0) + 1

        def exhausted(dimension: str) -> None:
            metric["NodesExhausted"] += 1
            metric["DimensionExhausted"] = metric["DimensionExhausted"] or {}
            metric["DimensionExhausted"][dimension] = metric["DimensionExhausted"].get(dimension, 0) + 1

        distinct = _distinct_hosts(job, tg)
        for node in candidates:
            metric["NodesEvaluated"] += 1
            # Feasibility (filters) first, then bin-packing (exhaustion), as Nomad's iterators do.
            if distinct and node.id in job_nodes:
                filtered("distinct_hosts")
                continue
            if gpus and node.gpus < gpus:
                filtered("missing devices")
                continue
            used_gpus, used_cpu, used_mem, used_ports = self._node_usage(node, proposed)
            if gpus and node.gpus - used_gpus < gpus:
                exhausted("devices: no devices match request")
                continue
            if node.cpu_mhz - used_cpu < cpu:
                exhausted("cpu")
                continue
            if node.memory_mb - used_mem < mem:
                exhausted("memory")
                continue
            clash = [(label, value) for label, value in ports if value in used_ports]
            if clash:
                exhausted(f"network: reserved port collision {clash[0][0]}={clash[0][1]}")
                continue
            return node, metric
        return None, metric

    def _schedule(self, job: dict, groups: dict[str, int], exclude_job_allocs: bool = False) -> tuple[list[tuple[dict, int, FakeNode]], dict[str, dict]]:
        """Place ``groups`` (name -> how many) of ``job``: (placements, FailedTGAllocs)."""
        proposed: dict[str, list] = {}
        job_nodes: set[str] = set()
        saved_demand = None
        if exclude_job_allocs:
            # A plan for a new version: the job's current allocations would be replaced, so their
            # nodes and resources count as free.
            saved_demand = dict(self._alloc_demand)
            for a in self._job_allocs(job["ID"], job["Namespace"]):
                self._alloc_demand.pop(a["ID"], None)
        else:
            job_nodes = {a["NodeID"] for a in self._live_allocs(job["ID"], job["Namespace"])}
        try:
            placements: list[tuple[dict, int, FakeNode]] = []
            failed: dict[str, dict] = {}
            for tg in job.get("TaskGroups") or []:
                want = groups.get(tg["Name"], 0)
                for i in range(want):
                    node, metric = self._select_node(job, tg, proposed, job_nodes)
                    if node is None:
                        if tg["Name"] in failed:
                            failed[tg["Name"]]["CoalescedFailures"] += 1
                        else:
                            failed[tg["Name"]] = metric
                        continue
                    placements.append((tg, i, node))
                    proposed.setdefault(node.id, []).append(_task_demand(tg))
                    job_nodes.add(node.id)
            return placements, failed
        finally:
            if saved_demand is not None:
                self._alloc_demand = saved_demand

    def _missing(self, job: dict) -> dict[str, int]:
        """Allocations each group of the current version still needs (batch: done ones count)."""
        current = [a for a in self._job_allocs(job["ID"], job["Namespace"])
                   if a["JobVersion"] == job["Version"] and a["DesiredStatus"] == "run"]
        need = {}
        for tg in job.get("TaskGroups") or []:
            have = sum(1 for a in current if a["TaskGroup"] == tg["Name"])
            if tg.get("Count", 1) - have > 0:
                need[tg["Name"]] = tg.get("Count", 1) - have
        return need

    def _new_eval(self, job: dict, triggered_by: str, status: str = "pending", **fields: Any) -> dict:
        idx = self._next_index()
        now = time.time_ns()
        ev = {
            "ID": str(uuid.uuid4()), "Namespace": job["Namespace"], "Priority": job.get("Priority", 50),
            "Type": job.get("Type", "batch"), "TriggeredBy": triggered_by, "JobID": job["ID"],
            "JobModifyIndex": job["JobModifyIndex"], "NodeID": "", "NodeModifyIndex": 0, "DeploymentID": "",
            "Status": status, "StatusDescription": "", "Wait": 0, "WaitUntil": None, "NextEval": "",
            "PreviousEval": "", "BlockedEval": "", "RelatedEvals": None, "FailedTGAllocs": None,
            "ClassEligibility": None, "QuotaLimitReached": "", "EscapedComputedClass": False, "AnnotatePlan": False,
            "QueuedAllocations": None, "LeaderACL": "", "SnapshotIndex": idx, "CreateIndex": idx, "ModifyIndex": idx,
            "CreateTime": now, "ModifyTime": now,
        }
        ev.update(fields)
        self._evals[ev["ID"]] = ev
        return ev

    def _process_eval(self, ev: dict, job: dict) -> None:
        """Run the scheduler for ``ev``: place what fits; block the rest on a follow-up evaluation."""
        need = self._missing(job)
        placements, failed = self._schedule(job, need)
        for tg, i, node in placements:
            self._create_alloc(job, tg, i, node, ev["ID"])
        queued = {name: 0 for name in (tg["Name"] for tg in job.get("TaskGroups") or [])}
        for name, metric in failed.items():
            queued[name] = 1 + metric["CoalescedFailures"]
        ev["Status"] = "complete"
        ev["FailedTGAllocs"] = failed or None
        ev["QueuedAllocations"] = queued
        ev["ModifyIndex"] = self._next_index()
        ev["ModifyTime"] = time.time_ns()
        if failed:
            blocked = self._new_eval(
                job, "queued-allocs", status="blocked", PreviousEval=ev["ID"],
                FailedTGAllocs=copy.deepcopy(failed), StatusDescription="created to place remaining allocations",
                ClassEligibility={},
            )
            ev["BlockedEval"] = blocked["ID"]
        if self.auto_run:
            for alloc in self._job_allocs(job["ID"], job["Namespace"]):
                if alloc["EvalID"] == ev["ID"] and alloc["ClientStatus"] == "pending":
                    self._start_alloc(alloc)
        self._touch_job(job["ID"], job["Namespace"])

    def _unblock(self) -> None:
        for ev in list(self._evals.values()):
            if ev["Status"] != "blocked":
                continue
            job = self._jobs.get((ev["Namespace"], ev["JobID"]))
            if job is None or job["Stop"]:
                continue
            self._process_eval(ev, job)

    def _create_alloc(self, job: dict, tg: dict, index: int, node: FakeNode, eval_id: str) -> dict:
        idx = self._next_index()
        now = self._now()
        alloc = {
            "ID": str(uuid.uuid4()), "EvalID": eval_id, "Name": f"{job['ID']}.{tg['Name']}[{index}]",
            "Namespace": job["Namespace"], "NodeID": node.id, "NodeName": node.name, "JobID": job["ID"],
            "JobType": job.get("Type", "batch"), "JobVersion": job["Version"], "TaskGroup": tg["Name"],
            "DesiredStatus": "run", "DesiredDescription": "", "DesiredTransition": {"Migrate": None, "Reschedule": None},
            "ClientStatus": "pending", "ClientDescription": "No tasks have started",
            "TaskStates": {
                task["Name"]: {
                    "State": "pending", "Failed": False, "Restarts": 0, "LastRestart": None, "StartedAt": None,
                    "FinishedAt": None, "Events": [_event("Received", now, "Task received by client")],
                }
                for task in tg.get("Tasks") or []
            },
            "DeploymentStatus": None, "FollowupEvalID": "", "RescheduleTracker": None, "PreemptedAllocations": None,
            "PreemptedByAllocation": "", "CreateIndex": idx, "ModifyIndex": idx, "AllocModifyIndex": idx,
            "CreateTime": now, "ModifyTime": now,
        }
        self._allocs[alloc["ID"]] = alloc
        self._alloc_demand[alloc["ID"]] = _task_demand(tg)
        return alloc

    def _kill_alloc(self, alloc: dict, description: str) -> None:
        alloc["DesiredStatus"] = "stop"
        alloc["DesiredDescription"] = description
        alloc["AllocModifyIndex"] = self._next_index()
        if alloc["ClientStatus"] not in ("pending", "running"):
            return
        collateral = self.stop_collateral.get(alloc["TaskGroup"])
        for ts in alloc["TaskStates"].values():
            if collateral is not None and ts["State"] == "running":
                continue
            ts["Events"].append(_event("Killing", self._now(), "Sent interrupt. Waiting 5s before force killing",
                                       KillTimeout=5_000_000_000, Details={"kill_timeout": "5s"}))
            ts["Events"].append(_event("Killed", self._now(), "Task successfully killed"))
            self._end_task(ts, failed=False)
        if collateral is not None and alloc["ClientStatus"] == "running":
            return  # dies on its own, after the others were killed: see _collateral_failures
        self._set_client_status(alloc, "complete", "All tasks have completed")

    def _collateral_failures(self, allocs: list[dict]) -> None:
        for alloc in allocs:
            code = self.stop_collateral.get(alloc["TaskGroup"])
            if code is None or alloc["ClientStatus"] != "running":
                continue
            for ts in alloc["TaskStates"].values():
                ts["Events"].append(_event("Terminated", self._now(), f"Exit Code: {code}", ExitCode=code))
                ts["Events"].append(_event("Not Restarting", self._now(), NOT_RESTARTING_MSG, FailsTask=True))
                self._end_task(ts, failed=True)
            self._set_client_status(alloc, "failed", "Failed tasks")

    # ------------------------------------------------------------------------- HTTP: routing

    def _handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        namespace = query.get("namespace") or "default"
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:1] != ["v1"]:
            raise _HTTPError(404, "Invalid URL")
        rest = parts[1:]
        with self._lock:
            if rest == ["jobs"] and method == "GET":
                return 200, self._list_jobs(namespace, query.get("prefix", ""))
            if rest == ["jobs"] and method in ("PUT", "POST"):
                return 200, self._register(body, namespace, None)
            if len(rest) == 2 and rest[0] == "job":
                job_id = rest[1]
                if method == "GET":
                    return 200, self._get_job(namespace, job_id)
                if method in ("PUT", "POST"):
                    return 200, self._register(body, namespace, job_id)
                if method == "DELETE":
                    return 200, self._deregister(namespace, job_id, query.get("purge", "").lower() in ("true", "1", "t"))
            if len(rest) == 3 and rest[0] == "job":
                job_id, what = rest[1], rest[2]
                if what == "plan" and method in ("PUT", "POST"):
                    return 200, self._plan(body, namespace, job_id)
                if what == "allocations" and method == "GET":
                    return 200, [copy.deepcopy(a) for a in sorted(self._job_allocs(job_id, namespace), key=lambda a: a["CreateIndex"])]
                if what == "evaluations" and method == "GET":
                    return 200, [copy.deepcopy(e) for e in sorted(self._evals.values(), key=lambda e: e["CreateIndex"])
                                 if e["JobID"] == job_id and e["Namespace"] == namespace]
        raise _HTTPError(404, "Invalid URL")

    def _list_jobs(self, namespace: str, prefix: str) -> list[dict]:
        out = []
        for (ns, job_id), job in sorted(self._jobs.items()):
            if (namespace != "*" and ns != namespace) or not job_id.startswith(prefix):
                continue
            summary = {}
            for tg in job.get("TaskGroups") or []:
                allocs = [a for a in self._job_allocs(job_id, ns) if a["TaskGroup"] == tg["Name"]]
                summary[tg["Name"]] = {
                    "Queued": sum((e.get("QueuedAllocations") or {}).get(tg["Name"], 0) for e in self._evals.values()
                                  if e["JobID"] == job_id and e["Namespace"] == ns and e["Status"] == "blocked"),
                    "Complete": sum(a["ClientStatus"] == "complete" for a in allocs),
                    "Failed": sum(a["ClientStatus"] == "failed" for a in allocs),
                    "Running": sum(a["ClientStatus"] == "running" for a in allocs),
                    "Starting": sum(a["ClientStatus"] == "pending" for a in allocs),
                    "Lost": sum(a["ClientStatus"] == "lost" for a in allocs),
                    "Unknown": sum(a["ClientStatus"] == "unknown" for a in allocs),
                }
            out.append({
                "ID": job_id, "ParentID": "", "Name": job.get("Name", job_id), "Namespace": ns,
                "Datacenters": job.get("Datacenters"), "Type": job.get("Type"), "Priority": job.get("Priority"),
                "Periodic": False, "ParameterizedJob": False, "Stop": job["Stop"], "Status": job["Status"],
                "StatusDescription": job.get("StatusDescription", ""),
                "JobSummary": {"JobID": job_id, "Namespace": ns, "Summary": summary,
                               "Children": {"Pending": 0, "Running": 0, "Dead": 0},
                               "CreateIndex": job["CreateIndex"], "ModifyIndex": job["ModifyIndex"]},
                "CreateIndex": job["CreateIndex"], "ModifyIndex": job["ModifyIndex"],
                "JobModifyIndex": job["JobModifyIndex"], "SubmitTime": job["SubmitTime"], "Meta": job.get("Meta"),
            })
        return out

    def _get_job(self, namespace: str, job_id: str) -> dict:
        job = self._jobs.get((namespace, job_id))
        if job is None:
            raise _HTTPError(404, "job not found")
        return copy.deepcopy(job)

    def _validated_job(self, body: Any, namespace: str, path_id: str | None) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("Job"), dict):
            raise _HTTPError(400, "Job must be specified")
        job = copy.deepcopy(body["Job"])
        problems = []
        if not job.get("ID"):
            problems.append("Missing job ID")
        if not job.get("TaskGroups"):
            problems.append("Missing job task groups")
        for tg in job.get("TaskGroups") or []:
            if not tg.get("Name"):
                problems.append("Missing task group name")
            if not tg.get("Tasks"):
                problems.append(f'Task group {tg.get("Name")!r} has no tasks')
        if problems:
            lines = "".join(f"\t* {p}\n" for p in problems)
            raise _HTTPError(400, f"{len(problems)} error{'s' if len(problems) > 1 else ''} occurred:\n{lines}\n")
        if path_id is not None and job["ID"] != path_id:
            raise _HTTPError(400, "Job ID does not match name")
        # Nomad's rule: the job's own namespace wins unless it is empty or "default".
        if not job.get("Namespace") or job["Namespace"] == "default":
            job["Namespace"] = namespace
        job.setdefault("Name", job["ID"])
        job.setdefault("Type", "service")
        job.setdefault("Priority", 50)
        job.setdefault("Region", self.region)
        if not job.get("Datacenters"):
            job["Datacenters"] = ["*"]
        for tg in job["TaskGroups"]:
            tg.setdefault("Count", 1)
        return job

    def _register(self, body: Any, namespace: str, path_id: str | None) -> dict:
        job = self._validated_job(body, namespace, path_id)
        key = (job["Namespace"], job["ID"])
        old = self._jobs.get(key)
        idx = self._next_index()
        job.update({
            "Stop": False, "Status": "pending", "StatusDescription": "", "Stable": False,
            "Version": (old["Version"] + 1) if old else 0, "SubmitTime": time.time_ns(),
            "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx, "JobModifyIndex": idx,
        })
        if old:
            # A new version replaces the old one's allocations (a destructive update).
            for alloc in self._job_allocs(job["ID"], job["Namespace"]):
                if alloc["DesiredStatus"] == "run":
                    self._kill_alloc(alloc, "alloc is being updated due to job update")
            for ev in self._evals.values():
                if ev["JobID"] == job["ID"] and ev["Namespace"] == job["Namespace"] and ev["Status"] == "blocked":
                    ev["Status"] = "canceled"
                    ev["StatusDescription"] = "evaluation superseded by a newer job version"
        self._jobs[key] = job
        ev = self._new_eval(job, "job-register")
        self._process_eval(ev, job)
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"], "JobModifyIndex": job["JobModifyIndex"],
                "Warnings": self.register_warnings, "Index": ev["CreateIndex"], "LastContact": 0, "KnownLeader": False}

    def _plan(self, body: Any, namespace: str, path_id: str) -> dict:
        job = self._validated_job(body, namespace, path_id)
        existing = self._jobs.get((job["Namespace"], job["ID"]))
        job.update({"Version": (existing["Version"] + 1) if existing else 0, "JobModifyIndex": 0, "Stop": False})
        need = {tg["Name"]: tg["Count"] for tg in job["TaskGroups"]}
        placements, failed = self._schedule(job, need, exclude_job_allocs=True)
        updates = {}
        for tg in job["TaskGroups"]:
            updates[tg["Name"]] = {"Ignore": 0, "Place": tg["Count"], "Migrate": 0, "Stop": 0, "InPlaceUpdate": 0,
                                   "DestructiveUpdate": 0, "Canary": 0, "Preemptions": 0}
        diff = None
        if isinstance(body, dict) and body.get("Diff"):
            kind = "Edited" if existing else "Added"
            diff = {"Type": kind, "ID": job["ID"], "Fields": None, "Objects": None, "TaskGroups": [
                {"Type": kind, "Name": tg["Name"], "Fields": None, "Objects": None,
                 "Tasks": [{"Type": kind, "Name": t["Name"], "Annotations": None, "Fields": None, "Objects": None}
                           for t in tg["Tasks"]],
                 "Updates": {"create": tg["Count"]}}
                for tg in job["TaskGroups"]]}
        return {"Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
                "FailedTGAllocs": failed or None, "JobModifyIndex": existing["JobModifyIndex"] if existing else 0,
                "CreatedEvals": None, "Diff": diff, "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
                "Warnings": self.plan_warnings, "Index": self._index}

    def _deregister(self, namespace: str, job_id: str, purge: bool) -> dict:
        key = (namespace, job_id)
        job = self._jobs.get(key)
        if job is None:
            raise _HTTPError(404, "job not found")
        idx = self._next_index()
        job.update({"Stop": True, "Version": job["Version"] + 1, "ModifyIndex": idx, "JobModifyIndex": idx})
        for ev in self._evals.values():
            if ev["JobID"] == job_id and ev["Namespace"] == namespace and ev["Status"] == "blocked":
                ev["Status"] = "canceled"
                ev["StatusDescription"] = "evaluation canceled because the job was stopped"
                ev["ModifyIndex"] = self._next_index()
        ev = self._new_eval(job, "job-deregister", status="complete")
        allocs = sorted(self._job_allocs(job_id, namespace), key=lambda a: (a["TaskGroup"], a["CreateIndex"]))
        for alloc in allocs:
            if alloc["DesiredStatus"] == "run":
                self._kill_alloc(alloc, "alloc not needed due to job update")
        self._collateral_failures(allocs)
        self._touch_job(job_id, namespace)
        if purge:
            del self._jobs[key]
            for alloc in allocs:
                self._allocs.pop(alloc["ID"], None)
                self._alloc_demand.pop(alloc["ID"], None)
            for eid in [e["ID"] for e in self._evals.values() if e["JobID"] == job_id and e["Namespace"] == namespace]:
                del self._evals[eid]
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"], "JobModifyIndex": idx,
                "VolumeEvalID": "", "VolumeEvalIndex": 0, "Index": ev["CreateIndex"], "LastContact": 0,
                "KnownLeader": False}

    # ------------------------------------------------------------------------- HTTP: logs

    def _log_source(self, alloc_id: str, query: dict[str, str]) -> tuple[tuple[str, str, str], bool]:
        with self._lock:
            if alloc_id not in self._allocs:
                raise _HTTPError(404, f"Unknown allocation {alloc_id!r}")
            task = query.get("task", "")
            if not task:
                raise _HTTPError(400, "must include task name")
            if task not in self._allocs[alloc_id]["TaskStates"]:
                raise _HTTPError(400, f"task {task!r} not found in allocation")
            kind = query.get("type", "")
            if kind not in ("stdout", "stderr"):
                raise _HTTPError(400, f"Invalid log type {kind!r}")
            return (alloc_id, task, kind), query.get("plain", "").lower() in ("true", "1", "t")

    def _log_text(self, key: tuple[str, str, str]) -> tuple[str, bool]:
        with self._lock:
            alloc = self._allocs.get(key[0])
            ended = alloc is None or alloc["ClientStatus"] in ("complete", "failed", "lost")
            return self._logs.get(key, ""), ended


class _Handler(BaseHTTPRequestHandler):
    """Reads a request, applies the fake's failure injection and ACLs, then routes it."""

    fake: FakeNomad
    protocol_version = "HTTP/1.1"
    # Headers and body leave in one write, without Nagle: otherwise every answer waits out the
    # client's delayed ACK (~40 ms on Linux) and the suite crawls.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence the default stderr log
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        fake = self.fake
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        record = RecordedRequest(method, split.path, query, {k.lower(): v for k, v in self.headers.items()}, body)
        with fake._lock:
            fake.requests.append(record)
            drop = next((i for i, p in enumerate(fake._drop_queue) if p is None or p in split.path), None)
            if drop is not None:
                fake._drop_queue.pop(drop)
            fail = None
            if drop is None:
                j = next((i for i, (_, _, p) in enumerate(fake._fail_queue) if p is None or p in split.path), None)
                if j is not None:
                    fail = fake._fail_queue.pop(j)
        if drop is not None:
            # Hang up without a word: the client sees the connection reset / closed.
            self.close_connection = True
            return
        try:
            if fail is not None:
                raise _HTTPError(fail[0], fail[1])
            self._authorize(method)
            if split.path.startswith("/v1/client/fs/logs/"):
                record.status = 200
                self._serve_logs(split.path.rsplit("/", 1)[-1], query)
                return
            status, payload = fake._handle(method, split.path, query, body)
        except _HTTPError as err:
            record.status = err.status
            self._send(err.status, err.text.encode(), "text/plain; charset=utf-8")
            return
        record.status = status
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _authorize(self, method: str) -> None:
        tokens = self.fake.acl_tokens
        if not tokens:
            return
        token = self.headers.get("X-Nomad-Token")
        auth = self.headers.get("Authorization") or ""
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        if not token:
            raise _HTTPError(403, "Permission denied")  # the anonymous policy allows nothing here
        if token not in tokens:
            raise _HTTPError(403, "ACL token not found")
        if tokens[token] != "write" and method != "GET":
            raise _HTTPError(403, "Permission denied")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Nomad-Index", str(self.fake._index))
        self.send_header("X-Nomad-KnownLeader", "true")
        self.end_headers()
        self.wfile.write(data)

    def _serve_logs(self, alloc_id: str, query: dict[str, str]) -> None:
        fake = self.fake
        key, plain = fake._log_source(alloc_id, query)
        follow = query.get("follow", "").lower() in ("true", "1", "t")
        offset = int(query.get("offset") or 0)
        file_name = f"alloc/logs/{key[1]}.{key[2]}.0"

        def encode(text: str, start: int) -> bytes:
            data = text.encode()
            if plain:
                return data
            return json.dumps({"File": file_name, "Offset": start + len(data),
                               "Data": base64.b64encode(data).decode()}).encode()

        text, ended = fake._log_text(key)
        if not follow:
            chunk = text[offset:]
            self._send(200, encode(chunk, offset) if chunk or plain else b"", "text/plain; charset=utf-8")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = offset
        try:
            while not fake._closing.is_set():
                text, ended = fake._log_text(key)
                if len(text) > sent:
                    data = encode(text[sent:], sent)
                    sent = len(text)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                elif ended:
                    break  # Nomad ends a follow stream once the task is dead and its log drained
                time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
