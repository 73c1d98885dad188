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
* ``GET /v1/client/fs/logs/<alloc>?task=&type=&plain=&follow=&origin=&offset=``: plain or
  framed, from the start or (``origin=end``) the last ``offset`` bytes, optionally following
  until the allocation ends; 404 before the task started or after the client's GC, 500 when the
  node is down (client/fs_endpoint.go, nomad/client_fs_endpoint.go).
* ``GET /v1/client/fs/ls/<alloc>?path=`` and ``/v1/client/fs/cat/<alloc>?path=``: an allocation's
  files, from the attached simulator's allocation directory (``fs_ls``/``fs_cat``).
* ``GET|PUT|DELETE /v1/var/<path>``: Nomad Variables (``variables`` holds them), ``?cas=`` included.
* ``GET /v1/allocation/<id>``, ``GET /v1/job/<id>/versions`` (a stop is a version too).
* The Task API (:meth:`FakeNomad.serve_task_api`): the same API on a task's unix socket, which takes
  a token always, here a task's workload identity (:meth:`FakeNomad.workload_token`), with the
  policies attached to it (:meth:`FakeNomad.attach_policy`) when ACLs are on.

Knobs for tests: HTTPS with a given certificate; ACL tokens (403 without a good one; every
request's headers are recorded); injected HTTP 5xx answers and dropped connections (before the
request is applied, or after: ``drop_after_next``); register's EnforceIndex; moving
allocations to running / complete / failed / killed-by-max_run_duration; nodes joining later
(which unblocks blocked evaluations); log text; plan/register warnings.

Lost nodes follow Nomad 2.0.5's heartbeat and reconciler (``nomad_version="1.11.1"`` for the rules
before PR #27053): see :meth:`FakeNomad.node_down`; ``advance(seconds)`` moves the clock for
lost_after and max_run_duration. ``attach_sim(cluster)`` runs the job's allocations in a
tests/nomad/client_sim.SimCluster (the clients): exits, logs, node deaths and stops go through it.

Not modelled: blocking queries, deployments, rescheduling and restarts (halo-sched sets both to 0),
multi-region forwarding, node drain.
"""
from __future__ import annotations

import base64
import copy
import fnmatch
import json
import os
import re
import ssl
import stat
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
    """A Nomad client node. ``busy_gpus`` are held by workloads outside the fake (another team).

    ``docker_*`` are the client's docker plugin settings (drivers/docker/config.go), defaults as
    there: ``volumes { enabled = false }``, ``allow_privileged = false``, ``allowed_modes`` empty
    (since 2.0.4 no host namespace mode is allowed unless listed), e.g. ``{"ipc": ["host"]}``.
    """

    name: str
    gpus: int = 8
    cpu_mhz: int = 200_000
    memory_mb: int = 1_000_000
    datacenter: str = "dc1"
    busy_gpus: int = 0
    status: str = "ready"
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    docker_volumes_enabled: bool = False
    docker_allow_privileged: bool = False
    docker_allowed_modes: dict[str, list[str]] = field(default_factory=dict)
    # What ``docker info`` lists as runtimes (a host with the NVIDIA Container Toolkit configured
    # has "nvidia"); the fingerprint reports them sorted, comma-joined, as driver.docker.runtimes
    # (drivers/docker/fingerprint.go:170-183@v2.0.5). Without "nvidia" a GPU docker task fails at
    # start (driver.go:1065-1068).
    docker_runtimes: tuple[str, ...] = ("io.containerd.runc.v2", "nvidia", "runc")
    # Drivers detected and healthy (the fake places any driver; raw_exec is listed because it does).
    drivers: tuple[str, ...] = ("docker", "exec", "raw_exec")
    gpu_model: str = "NVIDIA H100 80GB HBM3"


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any
    status: int | None = None  # None: the connection was dropped without an answer
    at: float = field(default_factory=time.monotonic)  # when it arrived (time.monotonic)
    #: "http", or "task-api" for a request through a task's Task API socket (``token`` its identity's).
    via: str = "http"


class _HTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


#: Go's zero time.Time as encoding/json writes it (time.Time.MarshalJSON, RFC 3339): what Nomad
#: sends for a TaskState's StartedAt/FinishedAt/LastRestart not set yet (nomad/structs/structs.go
#: v2.0.5 TaskState: plain time.Time fields, never null).
ZERO_TIME = "0001-01-01T00:00:00Z"


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


def _excluded_names(job: dict, tg: dict) -> set[str]:
    """Node names ruled out by ``${node.unique.name} != NAME`` constraints (scheduler/feasible/
    feasible.go v2.0.5: resolveTarget gives the node's Name for ``${node.unique.name}``
    (:1110-1111); checkConstraint's ``!=``/``not`` hold where it differs from RTarget (:1148-1149))."""
    return {str(c.get("RTarget")) for c in (job.get("Constraints") or []) + (tg.get("Constraints") or [])
            if c.get("LTarget") == "${node.unique.name}" and c.get("Operand") in ("!=", "not")}


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
        nomad_version: str = "2.0.5",
    ):
        #: The server version whose lost-node rules apply (see node_down): 2.0.5, or e.g. 1.11.1.
        self.nomad_version: tuple[int, ...] = tuple(int(p) for p in nomad_version.split("."))
        #: Added to the wall clock (advance()): expiries without sleeping.
        self.clock_offset_ns = 0
        self._replace_now: set[str] = set()  # unknown allocations a pre-1.11.2 server replaces at once
        self._sims: dict[str, Any] = {}  # job ID -> client_sim.SimCluster running its allocations
        # allocation ID -> the SimCluster that runs it (a job's versions each run in their own)
        self._sim_of_alloc: dict[str, Any] = {}
        #: attach_sims(): makes a SimCluster for each job registered from then on.
        self._sim_factory: Any = None
        self._sim_allocs: dict[str, Any] = {}  # allocation ID -> client_sim.Allocation
        self.nodes: list[FakeNode] = list(nodes if nodes is not None else [FakeNode("gpu-a"), FakeNode("gpu-b")])
        # token -> "write" | "jobs" (no Variable writes) | "read"; ACLs are enforced as soon as one token exists.
        self.acl_tokens: dict[str, str] = dict(acl_tokens or {})
        if token:
            self.acl_tokens[token] = "write"
        self.region = region
        self.tls = tls  # (certfile, keyfile): serve HTTPS
        self.auto_run = auto_run  # placed allocations start running at once
        self.plan_warnings = ""
        self.register_warnings = ""
        # group name, or one index of it (``trainer[1]``) -> exit code: on stop, such a running
        # allocation dies on its own (a torchrun rank crashing because rank 0 was killed) instead
        # of being killed.
        self.stop_collateral: dict[str, int] = {}
        # The deregister evaluation stays pending (the job still reads "running") until
        # process_evals(); stopped allocations keep ClientStatus running until complete_kills().
        self.defer_evals = False
        self.hold_kills = False
        self._deferred: list[tuple[dict, list[dict]]] = []

        self.requests: list[RecordedRequest] = []
        #: Workload identities handed to tasks (token -> claims: Namespace, JobID, TaskGroup, Task,
        #: AllocationID), and the ACL policies attached to them (attach_policy).
        self.identities: dict[str, dict[str, str]] = {}
        self.job_acl_policies: list[dict[str, Any]] = []
        self._task_api_servers: list[Any] = []
        # (namespace, job ID) -> every version as the servers keep it, stops included (versions endpoint)
        self._versions: dict[tuple[str, str], list[dict]] = {}
        self._lock = threading.RLock()
        self._index = 10
        self._last_event_ns = 0
        self._jobs: dict[tuple[str, str], dict] = {}
        # Each register's job as applied, in order (``nomad job history`` lists the versions;
        # a stop's versions, which only flip Stop, are not kept here).
        self._registered: dict[tuple[str, str], list[dict]] = {}
        # (namespace, path) -> the Variable (Items and metadata), for /v1/var/<path>.
        self.variables: dict[tuple[str, str], dict] = {}
        self._allocs: dict[str, dict] = {}
        self._alloc_demand: dict[str, tuple[int, int, int, list[tuple[str, int]]]] = {}
        self._evals: dict[str, dict] = {}
        self._logs: dict[tuple[str, str, str], str] = {}
        #: Allocations whose client no longer keeps their directory (client GC): logs answer 404.
        self.gc_logs: set[str] = set()
        self._fail_queue: list[tuple[int, str, str | None]] = []
        self._drop_queue: list[str | None] = []
        self._drop_after_queue: list[tuple[str | None, str | None, int | None]] = []
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
        for srv in self._task_api_servers:
            srv.shutdown()
            srv.server_close()
        self._task_api_servers.clear()
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

    def drop_after_next(self, n: int, path_contains: str | None = None, method: str | None = None,
                        status: int | None = None) -> None:
        """Apply the next ``n`` matching requests, then close the connection without answering (or,
        with ``status``, answer that 5xx): the ambiguous failure (the server acted, the client
        never heard so)."""
        with self._lock:
            self._drop_after_queue += [(path_contains, method, status)] * n

    # ------------------------------------------------------------------------- workload identities and the Task API

    def workload_token(self, alloc_id: str, task: str) -> str:
        """The signed workload identity of ``task`` of allocation ``alloc_id`` (the servers sign one
        per task, nomad/structs/alloc.go ``SignedIdentities``; the client hands it to the task:
        client/allocrunner/taskrunner/identity_hook.go setDefaultToken, v2.0.5). Its claims
        (nomad/structs/workload_id.go IdentityClaims) name the namespace, job, group, task and
        allocation; here the token is opaque and the fake keeps the claims."""
        with self._lock:
            alloc = self._allocs[alloc_id]
            token = "wid." + uuid.uuid4().hex
            self.identities[token] = {"Namespace": alloc["Namespace"], "JobID": alloc["JobID"],
                                      "TaskGroup": alloc["TaskGroup"], "Task": task, "AllocationID": alloc_id}
            return token

    def attach_policy(self, namespace: str, capabilities: tuple[str, ...] = (), *, job: str = "", group: str = "",
                      task: str = "", variables: dict[str, tuple[str, ...]] | None = None) -> None:
        """``nomad acl policy apply -namespace NS [-job J [-group G [-task T]]] NAME FILE``: a policy
        with ``namespace "NS" { capabilities = [...] }`` and ``variables { path "P" { capabilities =
        [...] } }`` rules, attached to the workload identities it names (command/acl_policy_apply.go:
        -job needs -namespace, -group needs -job; nomad/auth/auth.go ResolvePoliciesForClaims,
        v2.0.5: a policy attached to the namespace alone applies to every job's tasks there, one
        attached to the job to its tasks, to a group or a task to those)."""
        if group and not job:
            raise ValueError("-group needs -job")
        if task and not group:
            raise ValueError("-task needs -group")
        with self._lock:
            self.job_acl_policies.append({"Namespace": namespace, "JobID": job, "Group": group, "Task": task,
                                          "Capabilities": set(capabilities), "Variables": dict(variables or {})})

    def _identity_allows(self, claims: dict[str, str], method: str, path: str, namespace: str) -> bool:
        """What a workload identity may do (ACLs on): the capabilities of the policies attached to
        it (nomad/auth/auth.go ResolvePoliciesForClaims, v2.0.5) in its own namespace, by endpoint
        as command/agent and nomad/*_endpoint.go check them (a job's reads: read-job; register and
        stop: submit-job; an allocation's logs: read-logs); its own Variables it may read without
        any (acl/acl.go matchingVariablesCapabilitySet: nomad/jobs, nomad/jobs/J, nomad/jobs/J/G,
        nomad/jobs/J/G/T), others as a variables rule allows (acl/acl.go findClosestMatchingGlob:
        the closest glob)."""
        attached = [p for p in self.job_acl_policies if p["Namespace"] == claims["Namespace"] and (
            not p["JobID"] or (p["JobID"] == claims["JobID"] and (
                not p["Group"] or (p["Group"] == claims["TaskGroup"] and (not p["Task"] or p["Task"] == claims["Task"])))))]
        caps = set().union(*(p["Capabilities"] for p in attached)) if attached else set()
        parts = [unquote(x) for x in path.strip("/").split("/")][1:]
        if parts[:1] == ["var"]:
            var = "/".join(parts[1:])
            implicit = {"nomad/jobs", f"nomad/jobs/{claims['JobID']}", f"nomad/jobs/{claims['JobID']}/{claims['TaskGroup']}",
                        f"nomad/jobs/{claims['JobID']}/{claims['TaskGroup']}/{claims['Task']}"}
            if method == "GET" and namespace == claims["Namespace"] and var in implicit:
                return True
            rules = [(pat, set(c)) for p in attached for pat, c in p["Variables"].items() if fnmatch.fnmatchcase(var, pat)]
            if not rules or namespace != claims["Namespace"]:
                return False
            _, allowed = min(rules, key=lambda r: len(r[0].replace("*", "")) * -1)  # the closest glob
            need = {"GET": "read", "PUT": "write", "POST": "write", "DELETE": "destroy"}.get(method, "")
            return need in allowed
        if namespace != claims["Namespace"]:
            return False
        if parts[:3] == ["client", "fs", "logs"]:
            return "read-logs" in caps
        if parts[:1] in (["job"], ["allocation"]):
            return ("read-job" if method == "GET" else "submit-job") in caps
        return False

    def serve_task_api(self, path: str) -> None:
        """The Task API on the unix socket ``path`` (client/allocrunner/taskrunner/api_hook.go,
        v2.0.5: ``${NOMAD_SECRETS_DIR}/api.sock`` of every task, served by the agent): the HTTP API
        behind command/agent/http.go ``authMiddleware``, which wants a token in every request, ACLs
        on or off (401 "Unauthorized" without one, 403 "Forbidden" when ACL.WhoAmI does not know
        it), and then serves it as the API does for that token. A path longer than a unix socket
        takes is bound through its directory's descriptor."""
        import socketserver

        fake = self

        class Handler(_TaskAPIHandler):
            pass

        Handler.fake = fake
        fd = None
        bind = path
        if len(os.fsencode(path)) >= 100:
            fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            bind = f"/proc/self/fd/{fd}/{os.path.basename(path)}"
        class Server(socketserver.ThreadingUnixStreamServer):
            def handle_error(self, request, client_address):  # a task gone mid-answer (stopped with its version)
                import sys

                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        try:
            srv = Server(bind, Handler)
        finally:
            if fd is not None:
                os.close(fd)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-task-api",
                         daemon=True).start()
        with self._lock:
            self._task_api_servers.append(srv)

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

    # ------------------------------------------------------------------------- lost nodes
    # (kept together: Nomad's heartbeat, reconciler and disconnect rules, by version)

    def _new_reconciler(self) -> bool:
        """Whether this server reconciles unknown allocations the PR #27053 way (v1.11.2+)."""
        return self.nomad_version >= (1, 11, 2)

    @staticmethod
    def _disconnect(tg: dict) -> tuple[int, bool]:
        """(lost_after ns, replace) of a group: nomad/structs/structs.go v2.0.5 TaskGroup.Replace
        (:7705-7712, true without a disconnect block or replace) and GetDisconnectLostAfter
        (:7716-7724, 0 without)."""
        d = tg.get("Disconnect") or {}
        return int(d.get("LostAfter") or 0), d.get("Replace") is not False

    def _group_of(self, alloc: dict) -> tuple[dict | None, dict]:
        job = self._jobs.get((alloc["Namespace"], alloc["JobID"]))
        tg = next((g for g in (job or {}).get("TaskGroups") or [] if g["Name"] == alloc["TaskGroup"]), {})
        return job, tg

    def _mark_lost(self, alloc: dict, description: str) -> None:
        self._sim_node_died(alloc, "lost")
        alloc["DesiredStatus"] = "stop"
        alloc["DesiredDescription"] = description
        alloc["AllocModifyIndex"] = self._next_index()
        self._set_client_status(alloc, "lost", description)

    def _mark_unknown(self, alloc: dict, follow_up_at: int | None) -> None:
        """reconcile_cluster.go v2.0.5 appendUnknownDisconnectingUpdates: ClientStatus unknown,
        the transition recorded in AllocStates (what alloc.go LastUnknown reads, :843-862), and
        the follow-up evaluation createTimeoutLaterEvals makes (:1548-1580) at LastUnknown +
        lost_after (filters.go:591-602 delayByLostAfter; "now" when lost_after is 0)."""
        now = self._clock()
        alloc.setdefault("AllocStates", []).append({"Field": "ClientStatus", "Value": "unknown", "Time": now})
        self._set_client_status(alloc, "unknown", "alloc is unknown since its node is disconnected")
        if follow_up_at is not None:
            job, _ = self._group_of(alloc)
            ev = self._new_eval(job, "max-disconnect-timeout", WaitUntil=follow_up_at,
                                StatusDescription="created for delayed disconnect timeout")
            alloc["FollowupEvalID"] = ev["ID"]

    def _expired(self, alloc: dict, now: int) -> bool:
        """nomad/structs/alloc.go Allocation.Expired. v2.0.5 (:817-838): unknown and LastUnknown +
        lost_after <= now, so with lost_after 0 an unknown allocation is expired at once. v1.11.1
        (:785-812): the same, except lost_after 0 with replace = true is never expired."""
        if alloc["ClientStatus"] != "unknown" or not alloc.get("AllocStates"):
            return False
        _, tg = self._group_of(alloc)
        lost_after, replace = self._disconnect(tg)
        if not self._new_reconciler() and lost_after == 0 and replace:
            return False
        last_unknown = max(st["Time"] for st in alloc["AllocStates"] if st["Value"] == "unknown")
        return last_unknown + lost_after <= now

    def node_down(self, node_name: str) -> None:
        """A client misses its heartbeats. ``nomad_version`` picks the rules (2.0.5 by default;
        anything before 1.11.2 follows v1.11.1). Terminal allocations are left alone.

        The node's new status, nomad/heartbeat.go v2.0.5 :158-173 and disconnectState :207-224
        (same at v1.11.1): ``disconnected`` when one of its allocations that should run has a
        lost_after and is not expired, else ``down``. Then the reconciler classifies each
        allocation on it (scheduler/reconciler/filters.go):

        v2.0.5 (PR #27053, also v1.11.2):
        * disconnected node, pending allocation: lost, replaced at once (filters.go:214-221);
        * disconnected node, lost_after 0: lost (:223-230);
        * disconnected node, running: "disconnecting" (:232-237): ClientStatus unknown and a
          follow-up evaluation at LastUnknown + lost_after; a replacement at once only with
          replace = true (updateByReschedulable :538-541 never reschedules it with false);
        * down node, running, replace = false: "disconnecting" too (:277-284): unknown, with a
          follow-up evaluation NOW (lost_after 0); that evaluation finds it Expired, which is
          checked before the replace = false rules (:188-193), so it is lost
          (reconcile_cluster.go:438-440) and replaced under its name (:856-875);
        * down node, anything else (pending included): lost and replaced (:286-291).

        v1.11.1 (before PR #27053), filters.go:148-175: disconnected node: running ->
        unknown (kept unless replace = true), pending -> lost; down node with replace = false:
        running -> unknown, kept; else lost. An expired unknown allocation with replace = false
        stays (reconcile_cluster.go:441-447): never replaced.

        A lost allocation's replacement takes the same Name ("Add replacements for lost allocs",
        reconcile_cluster.go:856-875), whatever the reschedule policy; it is blocked like any
        placement when it cannot fit. Follow-up evaluations run from :meth:`tick` once due
        (:meth:`advance` moves the fake's clock)."""
        with self._lock:
            node = next(n for n in self.nodes if n.name == node_name)
            now = self._clock()
            mine = [a for a in sorted(self._allocs.values(), key=lambda a: a["CreateIndex"])
                    if a["NodeID"] == node.id and a["DesiredStatus"] == "run"
                    and a["ClientStatus"] in ("pending", "running")]
            node.status = "disconnected" if any(
                self._disconnect(self._group_of(a)[1])[0] > 0 and not self._expired(a, now) for a in mine) else "down"
            touched: dict[tuple[str, str], dict] = {}
            for alloc in mine:
                job, tg = self._group_of(alloc)
                lost_after, replace = self._disconnect(tg)
                pending = alloc["ClientStatus"] == "pending"
                # The machine is gone: its processes with it (client/ side, whatever the servers decide).
                self._sim_node_died(alloc, "unknown" if not pending else "lost")
                if node.status == "disconnected" and not pending and (lost_after > 0 or not self._new_reconciler()):
                    self._mark_unknown(alloc, now + lost_after if self._new_reconciler() or lost_after else None)
                    if replace and not self._new_reconciler():
                        # v1.11.1: replaced at once; since PR #27053 (its title) an unknown
                        # allocation with replace = true follows the reschedule block, whose
                        # 0 attempts (halo-sched's) place nothing before lost_after.
                        self._replace_now.add(alloc["ID"])
                elif node.status == "down" and not pending and not replace:
                    self._mark_unknown(alloc, now if self._new_reconciler() else None)
                else:
                    self._mark_lost(alloc, "alloc is lost since its node is down")
                if job is not None:
                    touched[(job["Namespace"], job["ID"])] = job
            for job in touched.values():
                if job["Stop"]:
                    continue
                ev = self._new_eval(job, "node-update", NodeID=node.id)
                self._process_eval(ev, job)
                self._touch_job(job["ID"], job["Namespace"])
            self._run_due_followups()

    def node_up(self, node_name: str) -> None:
        """A client that was down heartbeats again: nomad/node_endpoint.go ``UpdateStatus`` (v2.0.5)
        takes it back to ``ready`` (its allocations the servers counted lost stay lost; its client
        garbage-collects them), and a node's status change unblocks blocked evaluations
        (nomad/blocked_evals.go, on capacity change), as a node that joins does."""
        with self._lock:
            node = next(n for n in self.nodes if n.name == node_name)
            if node.status != "ready":
                node.status = "ready"
                self._unblock()

    # ------------------------------------------------------------------------- a client simulator behind the fake
    # (kept together: the fake is the servers, a tests/nomad/client_sim.SimCluster the clients)

    def attach_sim(self, cluster: Any) -> None:
        """Run the allocations of ``cluster``'s job (same job ID) as ``cluster`` runs tasks: an
        allocation this fake starts is placed and started there under the same name and index;
        a task's exit there ends the allocation here (exit code, "Terminated" and, non-zero,
        "Not Restarting" events) on the next request; logs are read from its log files; a node
        going down kills its processes there; a stop kills them; its templates' nomadVar reads
        this fake's Variables. ``auto_run`` as usual."""
        with self._lock:
            self._sims[cluster.job_id] = cluster
        # Its templates read this fake's Variables (nomadVar queries the servers). No lock: the
        # simulator asks while holding its own, and this fake calls into it holding this one.
        ns = cluster.namespace

        def variable(path: str) -> dict[str, str] | None:
            var = self.variables.get((ns, path))
            return None if var is None else dict(var["Items"])

        cluster.variable_source = variable

        def task_api(alloc_id: str, task: str, secrets_dir: str) -> str:
            self.serve_task_api(os.path.join(secrets_dir, "api.sock"))
            return self.workload_token(alloc_id, task)

        cluster.task_api = task_api

    def attach_sims(self, factory: Any) -> None:
        """Run every job registered from now on in a simulator of its own: ``factory(job)`` (the
        registered ``Job`` as sent) returns a client_sim.SimCluster, attached as by
        :meth:`attach_sim` before the job's first placement. Nomad's clients run any job's
        allocations; the simulator runs one job per SimCluster, so a waiting process that
        registers the next attempt of a run (a new version of the job) gets a new one: each
        version's allocations run in the simulator of that version (its tasks' Env), the older
        version's go on being stopped in theirs. The caller stops them."""
        with self._lock:
            self._sim_factory = factory

    def _sim_start(self, alloc: dict) -> bool:
        """Start the allocation in the attached simulator; False when it failed to (the failure
        is recorded as Nomad records a task that could not start: a driver failure)."""
        sim = self._sims.get(alloc["JobID"])
        if sim is None:
            return True
        group, _, index = alloc["Name"][len(alloc["JobID"]) + 1:].rpartition("[")
        try:
            # On the node the servers chose, where the simulator has client nodes of its own.
            (sim_alloc,) = sim.place([f"{group}[{index}"], node=alloc["NodeName"] if getattr(sim, "hosts", None) else None,
                                     alloc_id=alloc["ID"])
            self._sim_allocs[alloc["ID"]] = sim_alloc
            self._sim_of_alloc[alloc["ID"]] = sim
            sim.start()
        except Exception as e:  # noqa: BLE001 - whatever the client would report
            self._driver_failure(alloc, f"{type(e).__name__}: {e}")
            return False
        return True

    def _sim_sync(self) -> None:
        """Task exits in the simulator -> this fake's allocations (client updates). Deviation: the
        task's FinishedAt is when this fake takes the exit in (at most allocSyncIntv, 200 ms, after
        it while a blocking query waits; else at the next request), where a Nomad client sets it
        when the task dies (client/allocrunner/taskrunner/task_runner.go) and sends it later."""
        for alloc_id, sim_alloc in list(self._sim_allocs.items()):
            alloc = self._allocs.get(alloc_id)
            if (alloc is None or alloc["DesiredStatus"] != "run" or alloc["ClientStatus"] != "running"
                    or sim_alloc.status_override is not None or not sim_alloc.terminal):
                continue
            self._end_alloc(alloc, sim_alloc.exit_code if sim_alloc.exit_code is not None else 1)
            self._touch_job(alloc["JobID"], alloc["Namespace"])

    def _sim_node_died(self, alloc: dict, status: str) -> None:
        sim_alloc = self._sim_allocs.get(alloc["ID"])
        if sim_alloc is not None and sim_alloc.status_override != status:
            try:
                self._sim_of_alloc[alloc["ID"]].node_died(sim_alloc.name, status)
            except Exception:  # noqa: BLE001 - it had ended there already: nothing left to kill
                pass

    def _sim_kill(self, alloc: dict) -> None:
        sim_alloc = self._sim_allocs.get(alloc["ID"])
        if sim_alloc is not None and sim_alloc.status_override is None:
            self._sim_of_alloc[alloc["ID"]].kill_alloc(sim_alloc.name, grace=5.0)

    def _sim_log(self, key: tuple[str, str, str]) -> str | None:
        sim_alloc = self._sim_allocs.get(key[0])
        if sim_alloc is None:
            return None
        try:
            with open(sim_alloc.log_path(key[1], key[2]), encoding="utf-8", errors="replace") as f:
                return f.read()
        except (OSError, KeyError):
            return ""

    def advance(self, seconds: float) -> None:
        """Move the fake's clock forward (lost_after, follow-up evaluations, max_run_duration)."""
        with self._lock:
            self.clock_offset_ns += int(seconds * 1e9)
        self.tick()

    def _run_due_followups(self) -> None:
        """Follow-up evaluations whose WaitUntil has come (nomad/eval_broker.go delays them until
        then): the reconciler finds Expired unknown allocations (filters.go:188-193, v2.0.5) and
        counts them lost (reconcile_cluster.go:438-440), so they are replaced; before v1.11.2 an
        expired one with replace = false stays unknown (v1.11.1 reconcile_cluster.go:441-447)."""
        now = self._clock()
        for ev in sorted(self._evals.values(), key=lambda e: e["CreateIndex"]):
            if ev["Status"] != "pending" or ev["TriggeredBy"] != "max-disconnect-timeout" or ev["WaitUntil"] > now:
                continue
            job = self._jobs.get((ev["Namespace"], ev["JobID"]))
            for alloc in self._job_allocs(ev["JobID"], ev["Namespace"]):
                if alloc.get("FollowupEvalID") != ev["ID"] or not self._expired(alloc, now):
                    continue
                _, replace = self._disconnect(self._group_of(alloc)[1])
                if self._new_reconciler() or replace:
                    self._mark_lost(alloc, "alloc is lost since its node is down")
            if job is None or job["Stop"]:
                ev["Status"] = "complete"
                continue
            self._process_eval(ev, job)

    def tick(self) -> None:
        """Enforce ``max_run_duration`` (Nomad 2.0.3+): client/allocrunner/max_run_duration_hook.go
        times it from the allocation's CreateTime, whatever its tasks' state (pending included);
        on expiry the tasks are killed and the allocation ends ClientStatus ``complete`` with
        ClientDescription exactly ``allocation exceeded max_run_duration``
        (nomad/structs/alloc.go AllocTimeoutReasonMaxRunDuration). Batch/sysbatch jobs only.
        Called on every request; tests may call it too."""
        with self._lock:
            self._sim_sync()
            self._run_due_followups()
            now = self._clock()
            for alloc in list(self._allocs.values()):
                if alloc["ClientStatus"] not in ("pending", "running") or alloc["DesiredStatus"] != "run":
                    continue
                job = self._jobs.get((alloc["Namespace"], alloc["JobID"]))
                if job is None or job.get("Type") not in ("batch", "sysbatch"):
                    continue
                tg = next((g for g in job.get("TaskGroups") or [] if g["Name"] == alloc["TaskGroup"]), {})
                limit = tg.get("MaxRunDuration")
                if not limit or alloc["CreateTime"] + int(limit) > now:
                    continue
                for ts in alloc["TaskStates"].values():
                    if ts["State"] == "running":
                        ts["Events"].append(_event("Killing", self._now(), MAX_RUN_DURATION_DESC,
                                                   KillTimeout=5_000_000_000, Details={"kill_timeout": "5s"}))
                        ts["Events"].append(_event("Killed", self._now(), "Task successfully killed"))
                    self._end_task(ts, failed=False)
                self._set_client_status(alloc, "complete", MAX_RUN_DURATION_DESC)
                self._touch_job(alloc["JobID"], alloc["Namespace"])

    def process_evals(self) -> None:
        """Apply the deregister evaluations held back by ``defer_evals``."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
            for ev, allocs in deferred:
                self._apply_stop(ev, allocs)

    def complete_kills(self) -> None:
        """The clients finish killing the tasks of stopped allocations held by ``hold_kills``."""
        with self._lock:
            held = [a for a in self._allocs.values() if a["DesiredStatus"] == "stop" and a["ClientStatus"] in ("pending", "running")]
            for alloc in held:
                self._finish_kill(alloc)
            self._collateral_failures(held)
            for alloc in held:
                self._touch_job(alloc["JobID"], alloc["Namespace"])

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
            self._end_alloc(alloc, exit_code)
            self._touch_job(job_id, namespace)
            return copy.deepcopy(alloc)

    def _end_alloc(self, alloc: dict, exit_code: int) -> None:
        for ts in alloc["TaskStates"].values():
            ts["Events"].append(_event("Terminated", self._now(), f"Exit Code: {exit_code}", ExitCode=exit_code,
                                       Details={"exit_code": str(exit_code), "signal": "0", "oom_killed": "false"}))
            if exit_code:
                ts["Events"].append(_event("Not Restarting", self._now(), NOT_RESTARTING_MSG, FailsTask=True,
                                           RestartReason=NOT_RESTARTING_MSG,
                                           Details={"fails_task": "true", "restart_reason": NOT_RESTARTING_MSG}))
            self._end_task(ts, failed=bool(exit_code))
        self._set_client_status(alloc, "failed" if exit_code else "complete",
                                "Failed tasks" if exit_code else "All tasks have completed")

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
        """Kill the group's allocation for exceeding max_run_duration, the way Nomad 2.0.3+ does.

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

    def set_task_times(self, job_id: str, started_ns: int, finished_ns: int | None = None,
                       namespace: str = "default", version: int | None = None) -> None:
        """Every task of the job's allocations (of one job version, given) started (and, given,
        finished) at these times by the clients' clocks: TaskState.StartedAt/FinishedAt
        (nomad/structs/structs.go v2.0.5), RFC 3339 with nanoseconds as Go's
        time.Time.MarshalJSON writes them."""
        with self._lock:
            for alloc in self._job_allocs(job_id, namespace):
                if version is not None and alloc["JobVersion"] != version:
                    continue
                for ts in alloc["TaskStates"].values():
                    ts["StartedAt"] = _rfc3339(started_ns)
                    if finished_ns is not None:
                        ts["FinishedAt"] = _rfc3339(finished_ns)
                alloc["ModifyIndex"] = self._next_index()

    def write_log(self, alloc_id: str, text: str, task: str = "torchrun", type: str = "stdout") -> None:  # noqa: A002
        with self._lock:
            key = (alloc_id, task, type)
            self._logs[key] = self._logs.get(key, "") + text

    # ------------------------------------------------------------------------- inspection

    def job_record(self, job_id: str, namespace: str = "default") -> dict | None:
        with self._lock:
            job = self._jobs.get((namespace, job_id))
            return copy.deepcopy(job) if job else None

    def registered_versions(self, job_id: str, namespace: str = "default") -> list[dict]:
        """The job as each register left it (its Version, Meta, Constraints, tasks' Env), in order."""
        with self._lock:
            return copy.deepcopy(self._registered.get((namespace, job_id), []))

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

    def _clock(self) -> int:
        return time.time_ns() + self.clock_offset_ns

    def _now(self) -> int:
        # Strictly increasing event times, so tests can rely on ordering within one fake.
        self._last_event_ns = max(self._clock(), self._last_event_ns + 1)
        return self._last_event_ns

    # ------------------------------------------------------------------------- internals: lookup

    def _job_allocs(self, job_id: str, namespace: str) -> list[dict]:
        return [a for a in self._allocs.values() if a["JobID"] == job_id and a["Namespace"] == namespace]

    def _live_allocs(self, job_id: str, namespace: str, group: str | None = None) -> list[dict]:
        return [a for a in self._job_allocs(job_id, namespace)
                if a["DesiredStatus"] == "run" and a["ClientStatus"] in ("pending", "running")
                and (group is None or a["TaskGroup"] == group)]

    def _latest_alloc(self, job_id: str, group: str, namespace: str) -> dict:
        """The newest allocation of a group; ``group`` may also name one index, ``trainer[1]``."""
        if "[" in group:
            allocs = [a for a in self._job_allocs(job_id, namespace) if a["Name"] == f"{job_id}.{group}"]
        else:
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
        refusal = self._docker_refusal(alloc)
        if refusal is not None:
            self._driver_failure(alloc, refusal)
            return
        if not self._sim_start(alloc):
            return
        now = self._now()
        for ts in alloc["TaskStates"].values():
            ts["Events"].append(_event("Task Setup", now, "Building Task Directory", Message="Building Task Directory"))
            ts["Events"].append(_event("Started", self._now(), "Task started by client"))
            ts["State"] = "running"
            ts["StartedAt"] = _rfc3339(now)
        self._set_client_status(alloc, "running", "Tasks are running")

    def _docker_refusal(self, alloc: dict) -> str | None:
        """Why the node's docker plugin refuses to create this allocation's container, or None.

        drivers/docker/driver.go createContainerConfig: ``validateNamespace`` refuses ipc/pid/uts/
        userns modes not matched by the plugin's ``allowed_modes`` (globs) unless
        ``allow_privileged``; a bind mount whose source is outside the allocation dir needs
        ``volumes.enabled`` (relative sources mount from the task dir and are always allowed);
        ``privileged = true`` needs ``allow_privileged``. The error is wrapped by StartTask as
        "Failed to create container configuration for image ...".
        """
        node = next((n for n in self.nodes if n.id == alloc["NodeID"]), None)
        job = self._jobs.get((alloc["Namespace"], alloc["JobID"]))
        tg = next((g for g in (job or {}).get("TaskGroups") or [] if g["Name"] == alloc["TaskGroup"]), None)
        if node is None or tg is None:
            return None
        for task in tg.get("Tasks") or []:
            if task.get("Driver") != "docker":
                continue
            cfg = task.get("Config") or {}
            problem = None
            for field_name, key in (("ipc_mode", "ipc"), ("pid_mode", "pid"), ("uts_mode", "uts"), ("userns_mode", "userns")):
                mode = cfg.get(field_name)
                if mode and not node.docker_allow_privileged and not any(
                        fnmatch.fnmatchcase(mode, pattern) for pattern in node.docker_allowed_modes.get(key, [])):
                    problem = f'cannot apply "{field_name}" configuration'
                    break
            if problem is None and not node.docker_volumes_enabled:
                for bind in cfg.get("volumes") or []:
                    if bind.split(":", 1)[0].startswith("/"):
                        problem = f'volumes are not enabled; cannot mount host path: "{bind}"'
                        break
            if problem is None and any(str(d.get("Name", "")).startswith("nvidia") for d in
                                       (task.get("Resources") or {}).get("Devices") or []) \
                    and "nvidia" not in node.docker_runtimes:
                # The device plugin set NVIDIA_VISIBLE_DEVICES; no GPU runtime in docker info
                # (drivers/docker/driver.go:1065-1068@v2.0.5, the default nvidia_runtime "nvidia").
                problem = 'requested docker runtime "nvidia" was not found'
            if problem is None and cfg.get("privileged") and not node.docker_allow_privileged:
                problem = "Docker privileged mode is disabled on this Nomad agent"
            if problem is not None:
                image = cfg.get("image", "")
                return f'Failed to create container configuration for image "{image}" ("sha256:fake"): {problem}'
        return None

    def _driver_failure(self, alloc: dict, message: str) -> None:
        # The task runner records the StartTask error as a "Driver Failure" event that fails the
        # task (client/allocrunner/taskrunner/task_runner.go); restart attempts 0: no retry.
        for ts in alloc["TaskStates"].values():
            ts["Events"].append(_event("Driver Failure", self._now(), message, FailsTask=True, DriverError=message,
                                       Details={"fails_task": "true", "driver_error": message}))
            ts["Events"].append(_event("Not Restarting", self._now(), NOT_RESTARTING_MSG, FailsTask=True,
                                       RestartReason=NOT_RESTARTING_MSG,
                                       Details={"fails_task": "true", "restart_reason": NOT_RESTARTING_MSG}))
            self._end_task(ts, failed=True)
        self._set_client_status(alloc, "failed", "Failed tasks")

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
        # nomad/state/state_store.go getJobStatus: running while any allocation is not terminal
        # (Allocation.TerminalStatus: DesiredStatus stop/evict OR ClientStatus complete/failed/
        # lost), else pending while an evaluation is, else dead once it had one or was stopped.
        # So a stopped job reads "running" until the deregister evaluation marks its allocations
        # to stop, and "dead" from then on even while the client is still killing their tasks.
        job = self._jobs.get((namespace, job_id))
        if job is None:
            return
        allocs = self._job_allocs(job_id, namespace)
        evals = [e for e in self._evals.values() if e["JobID"] == job_id and e["Namespace"] == namespace]
        if any(a["DesiredStatus"] == "run" and a["ClientStatus"] not in ("complete", "failed", "lost") for a in allocs):
            status = "running"
        elif any(e["Status"] in ("pending", "blocked") for e in evals):
            status = "pending"
        elif evals or job["Stop"]:
            status = "dead"
        else:
            status = "pending"
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
        excluded = _excluded_names(job, tg)
        for node in candidates:
            metric["NodesEvaluated"] += 1
            # Feasibility (filters) first, then bin-packing (exhaustion), as Nomad's iterators do.
            if node.name in excluded:
                filtered("${node.unique.name} != " + node.name)
                continue
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
        return {name: len(free) for name, free in self._free_indexes(job).items() if free}

    def _free_indexes(self, job: dict) -> dict[str, list[int]]:
        """Per group, the name indexes new placements take: scheduler/reconciler/allocs.go
        AllocNameIndex.Next hands out the indexes in 0..count-1 that no existing allocation holds,
        lowest first. Existing = not server-terminal (a finished or failed batch allocation keeps
        its index; a lost or stopped one gives it up, so its replacement reuses the Name)."""
        current = [a for a in self._job_allocs(job["ID"], job["Namespace"])
                   if a["JobVersion"] == job["Version"] and a["DesiredStatus"] == "run"]
        free = {}
        for tg in job.get("TaskGroups") or []:
            held = {int(a["Name"].rsplit("[", 1)[1].rstrip("]")) for a in current
                    if a["TaskGroup"] == tg["Name"] and a["ID"] not in self._replace_now}
            free[tg["Name"]] = [i for i in range(tg.get("Count", 1)) if i not in held]
        return free

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
        """Run the scheduler for ``ev``: place what fits; block the rest on a follow-up evaluation.

        scheduler/generic_sched.go: a *blocked* evaluation that still cannot place everything is
        re-blocked (``ReblockEval``, nomad/worker.go -> nomad/blocked_evals.go): the same
        evaluation, updated, goes back to the blocked set; no new one is created."""
        free = self._free_indexes(job)
        need = {name: len(idx) for name, idx in free.items() if idx}
        placements, failed = self._schedule(job, need)
        for tg, i, node in placements:
            self._create_alloc(job, tg, free[tg["Name"]][i], node, ev["ID"])
        queued = {name: 0 for name in (tg["Name"] for tg in job.get("TaskGroups") or [])}
        for name, metric in failed.items():
            queued[name] = 1 + metric["CoalescedFailures"]
        if ev["Status"] == "blocked" and failed:
            ev["ModifyIndex"] = ev["SnapshotIndex"] = self._next_index()
            ev["ModifyTime"] = time.time_ns()
            if self.auto_run:
                for alloc in self._job_allocs(job["ID"], job["Namespace"]):
                    if alloc["EvalID"] == ev["ID"] and alloc["ClientStatus"] == "pending":
                        self._start_alloc(alloc)
            self._touch_job(job["ID"], job["Namespace"])
            return
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
                    "State": "pending", "Failed": False, "Restarts": 0, "LastRestart": ZERO_TIME,
                    "StartedAt": ZERO_TIME, "FinishedAt": ZERO_TIME, "Events": [_event("Received", now, "Task received by client")],
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
        if alloc["ClientStatus"] not in ("pending", "running") or self.hold_kills:
            return
        self._finish_kill(alloc)

    def _finish_kill(self, alloc: dict) -> None:
        self._sim_kill(alloc)
        collateral = self._collateral(alloc)
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

    def _apply_stop(self, ev: dict, allocs: list[dict]) -> None:
        for alloc in allocs:
            if alloc["DesiredStatus"] == "run":
                self._kill_alloc(alloc, "alloc not needed due to job update")
        if not self.hold_kills:
            self._collateral_failures(allocs)
        ev["Status"] = "complete"
        ev["ModifyIndex"] = self._next_index()
        self._touch_job(ev["JobID"], ev["Namespace"])

    def _collateral(self, alloc: dict) -> int | None:
        """The exit code ``stop_collateral`` gives this allocation (by its group or its ``group[K]``)."""
        named = alloc["Name"][len(alloc["JobID"]) + 1:]
        return self.stop_collateral.get(named, self.stop_collateral.get(alloc["TaskGroup"]))

    def _collateral_failures(self, allocs: list[dict]) -> None:
        for alloc in allocs:
            code = self._collateral(alloc)
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
        if method == "GET" and (rest in (["allocations"], ["evaluations"], ["agent", "self"], ["agent", "members"])
                               or rest == ["jobs"] or (len(rest) == 3 and rest[0] == "job" and rest[2] == "allocations")):
            return 200, self._status_side_get(rest, namespace, query)  # status side: see the end of the class
        if method == "GET" and rest == ["nodes"]:
            return 200, self._node_list(query.get("resources", "").lower() in ("true", "1", "t"))
        if rest[:1] == ["var"] and len(rest) > 1:
            return self._variable(method, "/".join(rest[1:]), namespace, body, query.get("cas"))
        if rest == ["vars"] and method == "GET":
            return self._variable_list(namespace, query.get("prefix", ""))
        with self._lock:
            if rest == ["jobs"] and method == "GET":
                return 200, self._list_jobs(namespace, query.get("prefix", ""))
            if rest == ["jobs"] and method in ("PUT", "POST"):
                return 200, self._register(body, namespace, None)
            if len(rest) == 2 and rest[0] == "allocation" and method == "GET":
                # command/agent/alloc_endpoint.go allocGet -> nomad/alloc_endpoint.go GetAlloc: the
                # whole allocation (JobVersion among its fields); 404 "alloc not found".
                alloc = self._allocs.get(rest[1])
                if alloc is None or alloc["Namespace"] != namespace:
                    raise _HTTPError(404, "alloc not found")
                return 200, copy.deepcopy(alloc)
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
                if what == "versions" and method == "GET":
                    # command/agent/job_endpoint.go jobVersions -> nomad/job_endpoint.go GetJobVersions:
                    # state_store.go jobVersionByID, highest version first; the servers keep
                    # JobDefaultTrackedVersions (6, nomad/structs/structs.go) of them.
                    if (namespace, job_id) not in self._jobs:
                        raise _HTTPError(404, "job versions not found")
                    kept = sorted(self._versions.get((namespace, job_id), []), key=lambda j: -j["Version"])[:6]
                    return 200, {"Versions": copy.deepcopy(kept), "Diffs": None, "Index": self._index}
                if what == "evaluations" and method == "GET":
                    return 200, [copy.deepcopy(e) for e in sorted(self._evals.values(), key=lambda e: e["CreateIndex"])
                                 if e["JobID"] == job_id and e["Namespace"] == namespace]
        raise _HTTPError(404, "Invalid URL")

    # Nomad Variables: command/agent/variable_endpoint.go (VariableSpecificRequest: GET query,
    # PUT/POST upsert, DELETE) over nomad/variables_endpoint.go; paths as nomad/structs/variables.go
    # ValidatePath checks them. Locks and CAS are not modelled; the list endpoint answers metadata.
    _VAR_PATH_RE = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")

    def _variable(self, method: str, path: str, namespace: str, body: Any, cas: str | None = None) -> tuple[int, Any]:
        with self._lock:
            key = (namespace, path)
            if cas is not None and method in ("PUT", "POST", "DELETE"):
                # Check-and-set: command/agent/variable_endpoint.go parseCAS (a bad number is 400)
                # and VarOpCAS/VarOpDeleteCAS; nomad/state/state_store_variables.go varSetCASTxn
                # (v2.0.5): cas=0 writes only when no Variable is there; else only when its
                # ModifyIndex is the one given; a conflict is 409 with the Variable as it is (a
                # zero one, Path and Namespace only, when there is none).
                if not cas.isdigit():
                    raise _HTTPError(400, f"can not parse cas: {cas!r}")
                want, old = int(cas), self.variables.get(key)
                if (want == 0 and old is not None) or (want and (old is None or old["ModifyIndex"] != want)):
                    conflict = copy.deepcopy(old) if old is not None else {"Namespace": namespace, "Path": path,
                                                                          "CreateIndex": 0, "ModifyIndex": 0}
                    return 409, conflict
            if method == "GET":
                var = self.variables.get(key)
                if var is None:
                    raise _HTTPError(404, "variable not found")
                return 200, copy.deepcopy(var)
            if method in ("PUT", "POST"):
                if not isinstance(body, dict) or not body.get("Items"):
                    raise _HTTPError(400, "variable missing required Items object")
                if not self._VAR_PATH_RE.match(path):
                    raise _HTTPError(500, f"invalid path {path!r}")
                # The items' keys and values together at most 64 KiB (nomad/structs/variables.go
                # maxVariableSize:53, VariableItems.Size:271-278, Validate:378-379@v2.0.5), a 400
                # (nomad/variables_endpoint.go canonicalizeAndValidate:223-226@v2.0.5).
                if sum(len(str(k).encode()) + len(str(v).encode()) for k, v in body["Items"].items()) > 65536:
                    raise _HTTPError(400, "variables are limited to 64KiB in total size")
                parts = path.split("/")
                if parts[0] == "nomad" and (len(parts) == 1 or parts[1] not in ("jobs", "sentinel", "job-templates")):
                    raise _HTTPError(500, 'only paths at "nomad/jobs" or "nomad/job-templates" and below are valid '
                                          'paths under the top-level "nomad" directory')
                old = self.variables.get(key)
                idx = self._next_index()
                now = time.time_ns()
                self.variables[key] = {
                    "Namespace": namespace, "Path": path, "Items": {str(k): str(v) for k, v in body["Items"].items()},
                    "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx,
                    "CreateTime": old["CreateTime"] if old else now, "ModifyTime": now,
                }
                meta = {k: v for k, v in self.variables[key].items() if k != "Items"}
                return 200, meta
            if method == "DELETE":
                # A missing Variable deletes successfully (nomad/state/state_store_variables.go
                # svDeleteTxn:400-401@v2.0.5); success is 204 No Content, no body
                # (command/agent/variable_endpoint.go variableDelete:266-267@v2.0.5). No check-index
                # (?cas=) nor locks: halo-sched uses neither.
                self.variables.pop(key, None)
                return 204, None
        raise _HTTPError(405, "Invalid method")

    def _node_list(self, resources: bool) -> list[dict]:
        """``GET /v1/nodes[?resources=true]``: NodeListStubs (nomad/structs/structs.go:2337-2357,
        ``Node.Stub`` :2296-2330@v2.0.5). ``Drivers`` carries each driver's fingerprint attributes
        (client/node_updater.go:248), as strings ("true" for a bool attribute); the docker ones as
        drivers/docker/fingerprint.go:130-183 sets them. NodeResources.Devices: one nvidia/gpu
        group with an instance per GPU, as the nvidia device plugin fingerprints them."""
        with self._lock:
            out = []
            for node in self.nodes:
                drivers = {}
                for name in node.drivers:
                    attrs = {f"driver.{name}": "true"}
                    if name == "docker":
                        attrs.update({"driver.docker.version": "27.5.1", "driver.docker.os_type": "linux",
                                      "driver.docker.runtimes": ",".join(sorted(node.docker_runtimes))})
                        if node.docker_allow_privileged:
                            attrs["driver.docker.privileged.enabled"] = "true"
                        if node.docker_volumes_enabled:
                            attrs["driver.docker.volumes.enabled"] = "true"
                    drivers[name] = {"Attributes": attrs, "Detected": True, "Healthy": True,
                                     "HealthDescription": "Healthy", "UpdateTime": "2026-01-01T00:00:00Z"}
                stub = {
                    "Address": "127.0.0.1", "ID": node.id, "Datacenter": node.datacenter, "Name": node.name,
                    "NodePool": "default", "NodeClass": "", "Version": self.server_version, "Drain": False,
                    "SchedulingEligibility": "eligible", "Status": node.status, "StatusDescription": "",
                    "Drivers": drivers, "HostVolumes": None, "LastDrain": None, "CreateIndex": 1, "ModifyIndex": 1,
                }
                if resources:
                    stub["NodeResources"] = {
                        "Cpu": {"CpuShares": node.cpu_mhz}, "Memory": {"MemoryMB": node.memory_mb},
                        "Devices": [{"Vendor": "nvidia", "Type": "gpu", "Name": node.gpu_model, "Attributes": {},
                                     "Instances": [{"ID": f"GPU-{node.id[:8]}-{i}", "Healthy": True,
                                                    "HealthDescription": "", "Locality": None}
                                                   for i in range(node.gpus)]}] if node.gpus else [],
                    }
                out.append(stub)
            return out

    def _variable_list(self, namespace: str, prefix: str) -> tuple[int, list[dict]]:
        """``GET /v1/vars?prefix=``: the metadata of each Variable under the prefix, never its Items
        (command/agent/variable_endpoint.go VariablesListRequest -> nomad/variables_endpoint.go
        List, v2.0.5); pagination is not modelled."""
        with self._lock:
            return 200, [{k: v for k, v in var.items() if k != "Items"}
                         for (ns, path), var in sorted(self.variables.items())
                         if (namespace == "*" or ns == namespace) and path.startswith(prefix)]

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

    # ------------------------------------------------------------------------- status side: list endpoints
    # The calls halo-sched's status and watch make: filtered list endpoints answering with stubs,
    # blocking queries, and the agent's version. Each follows the Nomad source file named.

    server_version = "2.0.6"  # what /v1/agent/members and /v1/agent/self report

    def _status_side_get(self, rest: list[str], namespace: str, query: dict[str, str]) -> Any:
        if rest == ["agent", "members"]:
            # command/agent/agent_endpoint.go AgentMembersRequest -> Status.Members (node:read):
            # each server's serf Tags carry "build" = its version (nomad/server.go).
            return {"ServerName": "server-1.global", "ServerRegion": self.region, "ServerDC": "dc1",
                    "Members": [{"Name": "server-1.global", "Addr": "127.0.0.1", "Port": 4648, "Status": "alive",
                                 "Tags": {"build": self.server_version, "region": self.region, "role": "nomad"}}]}
        if rest == ["agent", "self"]:
            # command/agent/agent_endpoint.go AgentSelfRequest (agent:read): config.Version is a
            # version.VersionInfo; member is the agent's serf member.
            return {"config": {"Version": {"Version": self.server_version, "VersionPrerelease": "",
                                           "VersionMetadata": "", "Revision": "fake"}},
                    "member": {"Name": "server-1.global", "Tags": {"build": self.server_version}}, "stats": {}}
        expr = _bexpr(query["filter"]) if query.get("filter") else (lambda obj: True)
        if rest == ["jobs"]:
            # nomad/job_endpoint.go Job.List: JobListStubs; Meta only with ?meta=true
            # (command/agent/job_endpoint.go jobListRequest); the filter applies to the stubs.
            with self._lock:
                jobs = self._list_jobs(namespace, query.get("prefix", ""))
            if query.get("meta", "").lower() not in ("true", "1", "t"):
                for j in jobs:
                    j.pop("Meta", None)
            return [j for j in jobs if expr(j)]
        if rest == ["allocations"]:
            # nomad/alloc_endpoint.go Alloc.List: AllocListStubs of the namespace (TaskStates
            # included unless task_states=false), filtered.
            with self._lock:
                allocs = [_alloc_stub(a) for a in sorted(self._allocs.values(), key=lambda a: a["CreateIndex"])
                          if namespace == "*" or a["Namespace"] == namespace]
            return [a for a in allocs if expr(a)]
        if rest == ["evaluations"]:
            # nomad/eval_endpoint.go Eval.List: whole evaluations, filtered.
            with self._lock:
                evals = [copy.deepcopy(e) for e in sorted(self._evals.values(), key=lambda e: e["CreateIndex"])
                         if namespace == "*" or e["Namespace"] == namespace]
            return [e for e in evals if expr(e)]
        # GET /v1/job/<id>/allocations: nomad/job_endpoint.go Job.Allocations under blockingRPC
        # (nomad/rpc.go): the answer's index is the allocs *table* index, so a query whose
        # ?index= is already behind it answers at once; otherwise it waits until this job's
        # allocations change, or ?wait= (command/agent/http.go parseWait: a Go duration) passes.
        job_id = rest[1]
        min_index = int(query.get("index") or 0)
        deadline = time.monotonic() + (_go_duration_s(query["wait"]) if query.get("wait") else 300.0)

        def answer() -> list[dict]:
            return [_alloc_stub(a) for a in sorted(self._job_allocs(job_id, namespace), key=lambda a: a["CreateIndex"])]

        with self._lock:
            if not min_index or self._index > min_index:
                return answer()
        next_sync = time.monotonic() + 0.2
        while not self._closing.wait(0.01):
            with self._lock:
                # The clients' updates reach the servers while the query blocks (client/client.go
                # v2.0.5 allocSync: batched every allocSyncIntv, 200 ms, :112-114, :2397) and wake
                # it: an attached simulator's task exits are taken in here, not only on the next
                # request.
                if time.monotonic() >= next_sync:
                    self._sim_sync()
                    next_sync = time.monotonic() + 0.2
                changed = max((max(a["ModifyIndex"], a.get("AllocModifyIndex", 0))
                               for a in self._job_allocs(job_id, namespace)), default=0)
                if changed > min_index or time.monotonic() >= deadline:
                    return answer()
        return []

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
        if body.get("EnforceIndex"):
            # nomad/job_endpoint.go Register -> nomad/structs/job.go Job.EnforceIndex; a plain
            # error, so the HTTP layer answers 500 with its text (command/agent/http.go wrap).
            # v2.0.5 checks it again inside the write (nomad/state/state_store.go upsertJobImpl),
            # so of two registers against the same JobModifyIndex exactly one is applied.
            want = int(body.get("JobModifyIndex") or 0)
            if old is not None and want == 0:
                raise _HTTPError(500, "Enforcing job modify index 0: job already exists")
            if old is not None and want != old["JobModifyIndex"]:
                raise _HTTPError(500, f"Enforcing job modify index {want}: job exists with conflicting job modify "
                                      f"index: {old['JobModifyIndex']}")
            if old is None and want != 0:
                raise _HTTPError(500, f"Enforcing job modify index {want}: job does not exist")
        idx = self._next_index()
        # A re-register is a new Version with JobModifyIndex = its raft index, CreateIndex kept
        # (state_store.go upsertJobImpl v2.0.5); a dead job registered again is pending again
        # (getJobStatus: its new evaluation is not terminal).
        job.update({
            "Stop": False, "Status": "pending", "StatusDescription": "", "Stable": False,
            "Version": (old["Version"] + 1) if old else 0, "SubmitTime": time.time_ns(),
            "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx, "JobModifyIndex": idx,
        })
        if old:
            # A new version replaces the old one's allocations (a destructive update; the
            # description is scheduler/structs/const.go StatusAllocUpdating, v2.0.5). A batch
            # job's allocations of an older version that are terminal (complete, failed, lost,
            # or already told to stop: Allocation.TerminalStatus) are left as they are, neither
            # stopped nor replaced: scheduler/reconciler/filters.go filterOldTerminalAllocs
            # (v2.0.5) sets them aside before anything is computed, so the new version places
            # every group's Count afresh (_free_indexes counts the new version's allocations
            # only) and the old ones keep their ClientStatus and DesiredStatus.
            batch = job.get("Type", "batch") == "batch"
            for alloc in self._job_allocs(job["ID"], job["Namespace"]):
                terminal = alloc["DesiredStatus"] != "run" or alloc["ClientStatus"] in ("complete", "failed", "lost")
                if alloc["DesiredStatus"] == "run" and not (batch and terminal):
                    self._kill_alloc(alloc, "alloc is being updated due to job update")
            for ev in self._evals.values():
                if ev["JobID"] == job["ID"] and ev["Namespace"] == job["Namespace"] and ev["Status"] == "blocked":
                    ev["Status"] = "canceled"
                    ev["StatusDescription"] = "evaluation superseded by a newer job version"
        self._jobs[key] = job
        self._registered.setdefault(key, []).append(copy.deepcopy(job))
        self._versions.setdefault(key, []).append(copy.deepcopy(job))
        if self._sim_factory is not None:
            # A new version runs in a simulator of its own (the tasks as this version has them).
            self.attach_sim(self._sim_factory({**copy.deepcopy(body["Job"]), "Version": job["Version"]}))
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
            # nomad/job_endpoint.go Deregister: an unknown job is no error (`if job == nil { return nil }`).
            return {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": 0, "VolumeEvalID": "", "VolumeEvalIndex": 0,
                    "Index": 0, "LastContact": 0, "KnownLeader": False}
        idx = self._next_index()
        job.update({"Stop": True, "Version": job["Version"] + 1, "ModifyIndex": idx, "JobModifyIndex": idx})
        self._versions.setdefault(key, []).append(copy.deepcopy(job))  # a stop is a version of its own
        for ev in self._evals.values():
            if ev["JobID"] == job_id and ev["Namespace"] == namespace and ev["Status"] == "blocked":
                ev["Status"] = "canceled"
                ev["StatusDescription"] = "evaluation canceled because the job was stopped"
                ev["ModifyIndex"] = self._next_index()
        allocs = sorted(self._job_allocs(job_id, namespace), key=lambda a: (a["TaskGroup"], a["CreateIndex"]))
        if self.defer_evals and not purge:
            # The job is stopped, but until a scheduler worker applies this evaluation its
            # allocations still have DesiredStatus run: the job reads "running".
            ev = self._new_eval(job, "job-deregister", status="pending")
            self._deferred.append((ev, allocs))
            self._touch_job(job_id, namespace)
        else:
            ev = self._new_eval(job, "job-deregister", status="complete")
            self._apply_stop(ev, allocs)
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
        # command/agent/fs_endpoint.go Logs (parameter checks) -> nomad/client_fs_endpoint.go
        # (server side: unknown allocation 404, a node it cannot reach 500) -> client/fs_endpoint.go
        # logs (unknown task 400, a task not started yet 404, a client that garbage-collected the
        # allocation 404).
        with self._lock:
            task = query.get("task", "")
            if not task:
                raise _HTTPError(400, "must provide task name")
            kind = query.get("type", "")
            if kind not in ("stdout", "stderr"):
                raise _HTTPError(400, "must provide log type (stdout/stderr)")
            if query.get("origin", "") not in ("", "start", "end"):
                raise _HTTPError(400, "origin must be start or end")
            if alloc_id not in self._allocs:
                raise _HTTPError(404, f"Unknown allocation {alloc_id!r}")
            alloc = self._allocs[alloc_id]
            if alloc_id in self.gc_logs:
                raise _HTTPError(404, f"state for allocation {alloc_id} not found on client")
            node = next((n for n in self.nodes if n.id == alloc.get("NodeID")), None)
            if node is not None and node.status in ("down", "disconnected"):
                raise _HTTPError(500, f"Unknown node {node.id!r}: no path to node")  # ErrNoNodeConn
            if task not in alloc["TaskStates"]:
                raise _HTTPError(400, f"unknown task name {task!r}")
            # client/fs_endpoint.go v2.0.5 :446 ``taskState.StartedAt.IsZero()``
            if alloc["TaskStates"][task].get("StartedAt") in (None, "", ZERO_TIME):
                raise _HTTPError(404, f"task {task!r} not started yet. No logs available")
            return (alloc_id, task, kind), query.get("plain", "").lower() in ("true", "1", "t")

    # -- fs/ls and fs/cat: an allocation's files, read from the simulator's allocation directory

    def _fs_alloc_dir(self, alloc_id: str) -> str:
        """The checks before a client reads an allocation's files, and that allocation's directory
        in the simulator (client_sim.Allocation.dir: its task directories ``<task>/local``,
        ``<task>/tmp``... and the shared ``alloc/`` beside them, as client/allocdir lays them out).
        command/agent/fs_endpoint.go (v2.0.5): an empty alloc id is 400 "must provide a valid alloc
        id"; nomad/client_fs_endpoint.go (v2.0.5): an allocation the servers do not know is 404,
        a node they cannot reach 500 (as for logs); client/fs_endpoint.go (v2.0.5) List/stream:
        an allocation the client garbage-collected is 404."""
        if not alloc_id:
            raise _HTTPError(400, "must provide a valid alloc id")
        with self._lock:
            if alloc_id not in self._allocs:
                raise _HTTPError(404, f"Unknown allocation {alloc_id!r}")
            alloc = self._allocs[alloc_id]
            node = next((n for n in self.nodes if n.id == alloc.get("NodeID")), None)
            if node is not None and node.status in ("down", "disconnected"):
                raise _HTTPError(500, f"Unknown node {node.id!r}: no path to node")  # ErrNoNodeConn
            sim_alloc = self._sim_allocs.get(alloc_id)
            if alloc_id in self.gc_logs or sim_alloc is None:
                raise _HTTPError(404, f"Unknown allocation {alloc_id!r}")
            return os.path.realpath(sim_alloc.dir)

    @staticmethod
    def _fs_escapes(base: str, path: str) -> bool:
        """helper/escapingfs/escapes.go PathEscapesAllocDir (v2.0.5): the path, joined to a
        placeholder two levels deep, must not climb out of it (PathEscapesAllocViaRelative); and
        where it exists, its symlinks resolved, it must stay under the allocation directory
        (pathEscapesBaseViaSymlink; a path that does not exist passes this check)."""
        placeholder = "/alloc-dir/alloc-id"
        # Go's filepath.Join cleans the joined path: "/x" joins as "x" would.
        rel = os.path.relpath(os.path.normpath(placeholder + "/" + path), placeholder)
        if rel.startswith(".."):
            return True
        full = os.path.join(base, path.lstrip("/"))
        if not os.path.lexists(full):
            return False
        resolved = os.path.realpath(full)
        return not resolved.lower().startswith(base.lower())

    def fs_ls(self, alloc_id: str, path: str) -> list[dict]:
        """``GET /v1/client/fs/ls/<alloc>?path=``. command/agent/fs_endpoint.go DirectoryListRequest
        (v2.0.5): no path lists "/"; an error whose text says "no such file or directory" is 404,
        any other error 500. client/allocdir/alloc_dir.go List (v2.0.5): "Path escapes the alloc
        directory" when it does; os.ReadDir's entries (sorted by name) as AllocFileInfo."""
        base = self._fs_alloc_dir(alloc_id)
        path = path or "/"
        if self._fs_escapes(base, path):
            raise _HTTPError(500, "Path escapes the alloc directory")
        full = os.path.join(base, path.lstrip("/"))
        try:
            names = sorted(os.listdir(full))
        except FileNotFoundError:
            raise _HTTPError(404, f"open {full}: no such file or directory") from None
        except NotADirectoryError:
            raise _HTTPError(500, f"readdirent {full}: not a directory") from None
        except OSError as err:
            raise _HTTPError(500, f"open {full}: {err.strerror}") from None
        out = []
        for name in names:
            try:
                st = os.lstat(os.path.join(full, name))
            except OSError:
                continue
            out.append({"Name": name, "IsDir": stat.S_ISDIR(st.st_mode), "Size": st.st_size,
                        "FileMode": stat.filemode(st.st_mode), "ModTime": _go_time(st.st_mtime),
                        "ContentType": ""})
        return out

    def fs_cat(self, alloc_id: str, path: str) -> bytes:
        """``GET /v1/client/fs/cat/<alloc>?path=``: the whole file. command/agent/fs_endpoint.go
        FileCatRequest (v2.0.5): no path is 400 "must provide a file name". client/fs_endpoint.go
        stream (v2.0.5): the file's Stat failing (no such file, or a path escaping the allocation
        directory: client/allocdir/alloc_dir.go Stat) is 400 with the error's text, a directory
        400 'file "P" is a directory'; alloc_dir.go ReadAt refuses the task's secrets/ and private/
        directories (the stream's error: 500)."""
        if not path:
            raise _HTTPError(400, "must provide a file name")
        base = self._fs_alloc_dir(alloc_id)
        if self._fs_escapes(base, path):
            raise _HTTPError(400, "Path escapes the alloc directory")
        full = os.path.join(base, path.lstrip("/"))
        try:
            st = os.stat(full)
        except OSError as err:
            raise _HTTPError(400, f"stat {full}: {(err.strerror or str(err)).lower()}") from None
        if stat.S_ISDIR(st.st_mode):
            raise _HTTPError(400, f"file {path!r} is a directory".replace("'", '"'))
        for task in os.listdir(base):
            for sub, word in (("secrets", "secret"), ("private", "private")):
                if full.lower().startswith(os.path.join(base, task, sub).lower()):
                    raise _HTTPError(500, f"Reading {word} file prohibited: {path}")
        try:
            with open(full, "rb") as f:
                return f.read()
        except OSError as err:
            raise _HTTPError(500, f"open {full}: {err.strerror}") from None

    def _log_text(self, key: tuple[str, str, str]) -> tuple[str, bool]:
        with self._lock:
            alloc = self._allocs.get(key[0])
            ended = alloc is None or alloc["ClientStatus"] in ("complete", "failed", "lost")
            from_sim = self._sim_log(key)
            return (self._logs.get(key, "") if from_sim is None else from_sim), ended


def _go_time(t: float) -> str:
    """A Unix time as Go's time.Time marshals to JSON (RFC 3339, nanoseconds, UTC here)."""
    ns = int(t * 1e9)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


# ----------------------------------------------------------------------------- status side: helpers


def _alloc_stub(alloc: dict) -> dict:
    """nomad/structs/alloc.go Allocation.Stub: the list endpoints' AllocListStub (no Job, no
    Resources unless asked; TaskStates included)."""
    keep = ("ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "JobType", "JobVersion", "TaskGroup",
            "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription", "DesiredTransition",
            "TaskStates", "DeploymentStatus", "FollowupEvalID", "NextAllocation", "RescheduleTracker",
            "PreemptedAllocations", "PreemptedByAllocation", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime")
    return {k: copy.deepcopy(alloc.get(k)) for k in keep}


def _go_duration_s(text: str) -> float:
    """Go's time.ParseDuration for the units a ``wait`` uses ("500ms", "30s", "5m", "1m30s")."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise _HTTPError(400, "Invalid wait time")
    return sum(float(n) * units[u] for n, u in parts)


_BEXPR_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>==|!=|\(|\))|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))')


def _bexpr(text: str):
    """A go-bexpr subset (github.com/hashicorp/go-bexpr grammar, as Nomad's ``filter`` uses it):
    ``Sel == "v"``, ``Sel != "v"``, ``Sel is empty``, ``Sel is not empty``, ``not``, ``and``,
    ``or`` (``and`` binds tighter), parentheses. Returns a predicate over a decoded JSON object."""
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _BEXPR_TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise _HTTPError(400, f"failed to read filter expression: syntax error at {pos}")
        kind = m.lastgroup
        tokens.append((kind, json.loads(m.group(kind)) if kind == "str" else m.group(kind)))
        pos = m.end()
    i = 0

    def peek(value=None):
        return i < len(tokens) and (value is None or tokens[i][1] == value)

    def take(value=None):
        nonlocal i
        if not peek(value):
            raise _HTTPError(400, f"failed to read filter expression: expected {value!r}")
        i += 1
        return tokens[i - 1]

    def select(obj, selector):
        for part in selector.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else None
        return obj

    def primary():
        if peek("("):
            take("(")
            inner = disjunction()
            take(")")
            return inner
        if peek("not"):
            take("not")
            inner = primary()
            return lambda o: not inner(o)
        _, selector = take()
        if peek("is"):
            take("is")
            negate = peek("not") and bool(take("not"))
            take("empty")
            return lambda o: (not select(o, selector)) != negate
        _, op = take()
        kind, value = take()
        if kind != "str" or op not in ("==", "!="):
            raise _HTTPError(400, "failed to read filter expression: unsupported operator")
        return (lambda o: str(select(o, selector)) == value) if op == "==" else (lambda o: str(select(o, selector)) != value)

    def chain(word, operand, combine):
        terms = [operand()]
        while peek(word):
            take(word)
            terms.append(operand())
        return lambda o: combine(t(o) for t in terms)

    def conjunction():
        return chain("and", primary, all)

    def disjunction():
        return chain("or", conjunction, any)

    expr = disjunction()
    if i != len(tokens):
        raise _HTTPError(400, "failed to read filter expression: trailing input")
    return expr


class _Handler(BaseHTTPRequestHandler):
    """Reads a request, applies the fake's failure injection and ACLs, then routes it."""

    fake: FakeNomad
    via = "http"
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
        record = RecordedRequest(method, split.path, query, {k.lower(): v for k, v in self.headers.items()}, body,
                                 via=self.via)
        fake.tick()  # max_run_duration expiries up to now, before answering
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
            drop_after = None
            if drop is None and fail is None:
                j = next((i for i, (p, m, _) in enumerate(fake._drop_after_queue)
                          if (p is None or p in split.path) and (m is None or m == method)), None)
                if j is not None:
                    drop_after = fake._drop_after_queue.pop(j)
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
            if split.path.startswith(("/v1/client/fs/cat/", "/v1/client/fs/ls/")):
                self._serve_fs(split.path, query, record)
                return
            status, payload = fake._handle(method, split.path, query, body)
            if drop_after is not None:
                if drop_after[2] is not None:
                    raise _HTTPError(drop_after[2], "rpc error: EOF")  # applied, then the server failed
                self.close_connection = True  # applied; the answer is lost
                return
        except _HTTPError as err:
            record.status = err.status
            self._send(err.status, err.text.encode(), "text/plain; charset=utf-8")
            return
        record.status = status
        self._send(status, b"" if status == 204 else json.dumps(payload).encode(), "application/json")

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
        if tokens[token] not in ("write", "jobs") and method != "GET":
            raise _HTTPError(403, "Permission denied")
        # "jobs": may submit jobs but has no variables write capability (a policy without a
        # variables block); Variable writes need "write".
        if tokens[token] == "jobs" and method != "GET" and self.path.startswith("/v1/var/"):
            raise _HTTPError(403, "Permission denied")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Nomad-Index", str(self.fake._index))
        self.send_header("X-Nomad-KnownLeader", "true")
        self.end_headers()
        self.wfile.write(data)

    def _serve_fs(self, path: str, query: dict[str, str], record: RecordedRequest) -> None:
        """``fs/ls`` (JSON list) and ``fs/cat`` (the file's bytes): FakeNomad.fs_ls / fs_cat."""
        kind, _, alloc_id = path[len("/v1/client/fs/"):].partition("/")
        if kind == "ls":
            payload = self.fake.fs_ls(alloc_id, query.get("path", ""))
            record.status = 200
            self._send(200, json.dumps(payload).encode(), "application/json")
            return
        data = self.fake.fs_cat(alloc_id, query.get("path", ""))
        record.status = 200
        # command/agent/fs_endpoint.go FsRequest (v2.0.5): cat goes through wrapUntrustedContent,
        # which forces a Content-Type that no browser renders.
        self._send(200, data, "text/plain")

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
        if query.get("origin") == "end":
            # client/fs_endpoint.go logsImpl: origin "end" negates the offset and findClosest
            # counts it back from the end of the newest file, clamped at the start (one log
            # file here: no rotation is modelled). Offsets are bytes.
            raw = text.encode()
            text = raw[max(0, len(raw) - offset):].decode("utf-8", "replace")
            offset = 0
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


class _TaskAPIHandler(_Handler):
    """The Task API: command/agent/http.go ``authMiddleware`` (v2.0.5) in front of the HTTP API."""

    via = "task-api"
    disable_nagle_algorithm = False  # a unix socket: no Nagle to turn off

    def _authorize(self, method: str) -> None:
        fake = self.fake
        token = self.headers.get("X-Nomad-Token")
        auth = self.headers.get("Authorization") or ""
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        if not token:
            raise _HTTPError(401, "Unauthorized")
        claims = fake.identities.get(token)
        if claims is None:
            if token not in fake.acl_tokens:
                raise _HTTPError(403, "Forbidden")  # ACL.WhoAmI: permission denied
            return super()._authorize(method)
        if not fake.acl_tokens:
            return  # ACLs off: an identity the servers signed may do anything
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        if not fake._identity_allows(claims, method, split.path, query.get("namespace") or "default"):
            raise _HTTPError(403, "Permission denied")
