"""The keeper of a Nomad run: the run's actor, inside the Nomad job itself (docs/recovery.md).

A job with ``retry:`` (or ``nomad.spare_nodes``) carries a group ``keeper`` of its own (count 1,
its own ``reschedule`` policy: Nomad places it again elsewhere when its node goes) whose one task
runs ``python -m halo_sched.node.nomad_keeper``. It watches its version's trainer allocations
through the Task API and, when a node rank fails or its node is lost, decides what the submitter
used to decide, with nobody at a terminal:

* a failure ``retry.on`` names, with attempts left: the run's next attempt is registered as a new
  version of the same job (the culprit's Nomad node excluded by a ``${node.unique.name} != HOST``
  constraint, ``HALO_RESTART_COUNT`` and ``Meta.halo_sched_attempt`` one up, the attempt's own
  service names); registering it stops this version's survivors, this keeper among them, and the
  new version's keeper takes over;
* any other failure: the job is stopped (its survivors release their nodes), and the run ends.

**Exactly once, by Nomad's own primitives.** The register is a check-and-set on the
``JobModifyIndex`` read just before, with the job still at this attempt (``EnforceIndex``:
nomad/job_endpoint.go ``Register`` -> nomad/structs/job.go ``Job.EnforceIndex``, checked again
inside the write, nomad/state/state_store.go ``upsertJobImpl``, v2.0.5). Two keepers of one
version (one rescheduled while the other was cut off) or a keeper and a person's ``nomad job
run``: the second register is refused, the job read back is at the next attempt already, and the
loser does nothing. No local store, no claim: the keeper keeps no state of its own; what it acts
on is Nomad's (the job, its allocations), so a keeper placed again reads where the run is.

**The Task API** (client/allocrunner/taskrunner/api_hook.go, v2.0.5): every task has the agent's
HTTP API on ``${NOMAD_SECRETS_DIR}/api.sock``; it always wants a token (command/agent/http.go
``authMiddleware``: 401 without one, 403 with one it does not know), here the task's workload
identity (``identity { env = true }``: ``NOMAD_TOKEN``, client/taskenv/env.go; ``file = true``:
``secrets/nomad_token``, client/allocrunner/taskrunner/identity_hook.go). With ACLs on, the
identity may do what the policies attached to it allow (nomad/auth/auth.go
``ResolvePoliciesForClaims``: those attached to the namespace, the job, the group or the task)
plus reading its own Variables (acl/acl.go); docs/nomad.md gives the policy and the command.

Standard library only, like the rest of halo_sched/node/.
"""
from __future__ import annotations

import copy
import http.client
import json
import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from urllib.parse import quote, urlencode

from .contract import NAMES
from .failure_classes import classify_failure
from .failure_collector import TAG
from .failures import FailureReport, RankFailure, parse_lines
from .nomad_names import (
    NOMAD_ATTEMPT_META, NOMAD_EXCLUDED_META, NOMAD_SERVERS_META, NOMAD_TOKEN_META, NOMAD_TRAINER_GROUP,
    NOMAD_TRAINER_TASK, nomad_attempt_key, nomad_rdzv_service, nomad_server_service,
)

#: Words a keeper's lines start with (its task's stdout, ``nomad alloc logs``).
WHO = "halo-sched keeper"
#: After the first rank died, how long to wait for the others to end before judging: the first
#: failure is the one whose line is earliest, and the culprit's peers die moments after it (a rank
#: stuck on a host that is gone may never end: then the lost allocation decides).
SETTLE_S = 5.0
#: A blocking query's wait (nomad/blocking.go: answered at once on a change, else after this).
WAIT_S = 30.0
#: How long the keeper keeps trying to register the next attempt or stop the job (a policy not yet
#: attached, an outage), before it gives up with a line saying why.
ACT_S = 3600.0
#: Of each dead allocation's stderr, the tail read for its failure lines (as the submitter reads it).
TAIL_BYTES = 65536
#: ``allocation exceeded max_run_duration`` (nomad/structs/alloc.go AllocTimeoutReasonMaxRunDuration).
MAX_RUN_DURATION_DESC = "allocation exceeded max_run_duration"
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")
#: What the phases of a trainer allocation are; these end a static torchrun world.
DEAD = ("failed", "lost", "unknown", "timeout")


class APIError(Exception):
    """An HTTP answer other than 2xx (``status``), or none at all (``status`` 0)."""

    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text}" if status else text)
        self.status = status
        self.text = text


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TaskAPI:
    """The Nomad HTTP API through the task's Task API socket, with its workload identity.

    A unix socket's path holds at most 107 bytes (``sun_path``), and an allocation directory is
    deep: a longer path is reached through the directory's descriptor (``/proc/self/fd/N/api.sock``,
    which the kernel resolves like the path itself)."""

    def __init__(self, socket_path: str, token: str, namespace: str = "", region: str = ""):
        self.socket_path, self.token, self.namespace, self.region = socket_path, token, namespace, region
        self._dir_fd: int | None = None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "TaskAPI":
        secrets_dir = env.get("NOMAD_SECRETS_DIR") or ""
        token = env.get("NOMAD_TOKEN") or ""
        if not token and secrets_dir:
            try:
                with open(os.path.join(secrets_dir, "nomad_token"), encoding="utf-8") as f:
                    token = f.read(8192).strip()
            except OSError:
                token = ""
        return cls(os.path.join(secrets_dir, "api.sock"), token, env.get("NOMAD_NAMESPACE") or "",
                   env.get("NOMAD_REGION") or "")

    def _path(self) -> str:
        if len(os.fsencode(self.socket_path)) < 100:
            return self.socket_path
        if self._dir_fd is None:
            self._dir_fd = os.open(os.path.dirname(self.socket_path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._dir_fd}/{os.path.basename(self.socket_path)}"

    def call(self, method: str, path: str, query: dict | None = None, body: Any = None,
             timeout: float = 30.0) -> tuple[Any, int]:
        """(the decoded JSON answer, or its text when not JSON; the X-Nomad-Index). Raises
        APIError for any status but 2xx, and for no answer (status 0)."""
        q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        if self.namespace and "namespace" not in q:
            q["namespace"] = self.namespace
        if self.region and "region" not in q:
            q["region"] = self.region
        url = path + ("?" + urlencode(q) if q else "")
        headers = {"X-Nomad-Token": self.token} if self.token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = _UnixConnection(self._path(), timeout)
        try:
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(64 << 20)
            index = resp.getheader("X-Nomad-Index") or "0"
        except (OSError, http.client.HTTPException) as err:
            raise APIError(0, f"no answer from the Task API ({type(err).__name__}: {err})") from err
        finally:
            conn.close()
        text = raw.decode("utf-8", "replace")
        if not 200 <= resp.status < 300:
            raise APIError(resp.status, " ".join(text.split())[:300])
        try:
            out: Any = json.loads(text) if text else None
        except ValueError:
            out = text
        return out, int(index) if index.isdigit() else 0


    def stream_lines(self, path: str, query: dict, stop: threading.Event, timeout: float = 600.0):
        """The lines of a streaming answer (``follow=true`` logs) as they come, until it ends or
        ``stop`` is set (checked between reads). Raises APIError as :meth:`call`."""
        q = dict(query)
        if self.namespace:
            q.setdefault("namespace", self.namespace)
        conn = _UnixConnection(self._path(), timeout)
        try:
            conn.request("GET", path + "?" + urlencode(q), headers={"X-Nomad-Token": self.token} if self.token else {})
            resp = conn.getresponse()
            if not 200 <= resp.status < 300:
                raise APIError(resp.status, " ".join(resp.read(4096).decode("utf-8", "replace").split())[:300])
            buf = b""
            while not stop.is_set():
                chunk = resp.read1(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
                if len(buf) > 1 << 20:  # a line that long is no failure line: dropped
                    buf = b""
        except (OSError, http.client.HTTPException) as err:
            raise APIError(0, f"the stream broke ({type(err).__name__}: {err})") from err
        finally:
            conn.close()


# ---- what the keeper reads of the job ----------------------------------------------------------


def attempt_of(job: dict) -> int:
    """The attempt a version of the job is (0: the run's first, which carries no such Meta)."""
    raw = str((job.get("Meta") or {}).get(NOMAD_ATTEMPT_META) or "0")
    return int(raw) if raw.isdigit() and len(raw) < 7 else 0


def phase(alloc: dict) -> str:
    """running | pending | complete | failed | lost | unknown | timeout | stopped, as the
    submitter's state fold reads an allocation (halo_sched/backends/nomad/state.py)."""
    client, desired = alloc.get("ClientStatus") or "", alloc.get("DesiredStatus") or ""
    if client == "complete" and alloc.get("ClientDescription") == MAX_RUN_DURATION_DESC:
        return "timeout"
    if client in ("running", "pending"):
        return "stopped" if desired in ("stop", "evict") and client == "pending" else client
    if client in ("failed", "lost", "unknown"):
        return client
    if client == "complete":
        killed = any(ev.get("Type") == "Killing" for ts in (alloc.get("TaskStates") or {}).values()
                     for ev in (ts or {}).get("Events") or ())
        return "stopped" if desired in ("stop", "evict") and killed else "complete"
    return "pending"


def _index(alloc: dict) -> int | None:
    m = re.search(r"\[(\d+)\]$", alloc.get("Name") or "")
    return int(m.group(1)) if m else None


def trainer_slots(allocs: list[dict], version: int) -> dict[int, dict]:
    """The newest trainer allocation of each name index of ``version``."""
    out: dict[int, dict] = {}
    for a in sorted(allocs, key=lambda a: (a.get("CreateIndex") or 0, a.get("ModifyIndex") or 0)):
        i = _index(a)
        if a.get("TaskGroup") == NOMAD_TRAINER_GROUP and a.get("JobVersion") == version and i is not None:
            out[i] = a
    return out


@dataclass(frozen=True)
class LostRank(RankFailure):
    """A node rank whose Nomad node went down or disconnected: Nomad's word, the cause whatever
    the times say (failure_classes.classify_failure reads ``verb``)."""

    verb: str = "lost"

    def where(self) -> str:
        return f"node {self.node} (Nomad node {self.node_name or self.host})"

    def how(self) -> str:
        return self.verb


def next_job(job: dict, culprit: str, number: int, token: str) -> dict:
    """The run's attempt ``number`` (0-based) as a new version of ``job`` (a version of it as
    ``GET /v1/job/:id`` answers): the same job, keeping off ``culprit`` as well (its Nomad node
    name), with ``HALO_RESTART_COUNT`` = ``number`` in the trainer's tasks, ``Meta`` saying the
    attempt, the token and the hosts kept off, and the attempt's own service names (nodes never
    read a registration an earlier attempt left: halo_sched/backends/nomad/servers.py
    attempt_key). What the submitter's own renderer gives for the attempt (tests/test_nomad_keeper.py
    compares the two)."""
    j = copy.deepcopy(job)
    for k in ("Status", "StatusDescription", "Stable", "Version", "SubmitTime", "CreateIndex", "ModifyIndex",
              "JobModifyIndex", "VersionTag"):
        j.pop(k, None)
    j["Stop"] = False
    meta = j.setdefault("Meta", {})
    excluded = [h for h in str(meta.get(NOMAD_EXCLUDED_META) or "").split(",") if h]
    constraints = j.setdefault("Constraints", []) or []
    j["Constraints"] = constraints
    if culprit and _NODE_NAME.match(culprit):
        if culprit not in excluded:
            excluded.append(culprit)
        rule = {"LTarget": "${node.unique.name}", "RTarget": culprit, "Operand": "!="}
        if not any(c.get("LTarget") == rule["LTarget"] and c.get("RTarget") == culprit and c.get("Operand") == "!="
                   for c in constraints):
            constraints.append(rule)
    meta[NOMAD_ATTEMPT_META] = str(number)
    meta[NOMAD_TOKEN_META] = token
    if excluded:
        meta[NOMAD_EXCLUDED_META] = ",".join(excluded)
    job_id = j["ID"]
    old, new = nomad_attempt_key(job_id, attempt_of(job)), nomad_attempt_key(job_id, number)
    renames = {nomad_rdzv_service(old): nomad_rdzv_service(new)}
    for part in str(meta.get(NOMAD_SERVERS_META) or "").split(","):
        role = part.rpartition(":")[0]
        if role:
            renames[nomad_server_service(old, role)] = nomad_server_service(new, role)
    for group in j.get("TaskGroups") or []:
        for svc in group.get("Services") or []:
            svc["Name"] = renames.get(svc.get("Name"), svc.get("Name"))
        for task in group.get("Tasks") or []:
            if group.get("Name") == NOMAD_TRAINER_GROUP and task.get("Name") == NOMAD_TRAINER_TASK:
                task["Env"] = {**(task.get("Env") or {}), NAMES.restart_count: str(number)}
            for tpl in task.get("Templates") or []:
                if tpl.get("LeftDelim"):  # a script (its own delimiters): the job's text, never renamed
                    continue
                text = tpl.get("EmbeddedTmpl") or ""
                for a, b in renames.items():  # nomadService "[TAG.]NAME" queries only
                    text = re.sub(r'(nomadService "(?:[^"\\.]*\.)?)' + re.escape(a) + '"', lambda m: m.group(1) + b + '"',
                                  text)
                tpl["EmbeddedTmpl"] = text
    return j


# ---- the keeper ---------------------------------------------------------------------------------


@dataclass
class Settings:
    job_id: str
    alloc_id: str
    nodes: int
    attempts: int
    retry_on: tuple[str, ...]
    key: str
    spares: int = 0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Settings":
        def number(name: str) -> int:
            raw = env.get(name) or "0"
            return int(raw) if raw.isdigit() and len(raw) < 7 else 0

        return cls(job_id=env.get("NOMAD_JOB_ID") or "", alloc_id=env.get("NOMAD_ALLOC_ID") or "",
                   nodes=number(NAMES.keeper_nodes), attempts=number(NAMES.keeper_attempts),
                   retry_on=tuple(w for w in (env.get(NAMES.keeper_retry_on) or "").split(",") if w),
                   key=env.get(NAMES.failure_key) or "", spares=number(NAMES.keeper_spares))


#: With hot spares: how long after a rank's first failure line the keeper waits for its peers'
#: (the earliest line decides), and how often it looks at the allocations meanwhile.
SPARE_SETTLE_S = 3.0
SPARE_LOOK_S = 1.0


@dataclass
class World:
    """Which slot of the trainer's group (its allocation index) runs which node rank, as the keeper
    wrote it into the world Variable (generation 0: slots 0..N-1 as ranks, never written); rank
    0's slot is ``master``."""

    attempt: int
    generation: int = 0
    ranks: dict[int, int] = field(default_factory=dict)
    state: str = "running"
    swaps: list[dict] = field(default_factory=list)
    index: int = 0  # the Variable's ModifyIndex, for the next check-and-set (0: none yet)

    @property
    def master(self) -> int:
        return next(slot for slot, rank in self.ranks.items() if rank == 0)

    def items(self) -> dict[str, str]:
        return {"attempt": str(self.attempt), "generation": str(self.generation), "state": self.state,
                "master": str(self.master),
                "ranks": ",".join(f"{slot}:{rank}" for slot, rank in sorted(self.ranks.items(), key=lambda kv: kv[1])),
                "swaps": json.dumps(self.swaps, separators=(",", ":"))}

    @classmethod
    def parse(cls, items: dict, attempt: int, nodes: int) -> "World | None":
        """A world as written (None: another attempt's, or not well formed)."""
        try:
            if int(items.get("attempt", "")) != attempt:
                return None
            ranks = {}
            for pair in str(items.get("ranks") or "").split(","):
                slot, _, rank = pair.partition(":")
                ranks[int(slot)] = int(rank)
            swaps = json.loads(items.get("swaps") or "[]")
            world = cls(attempt, int(items["generation"]), ranks, str(items.get("state") or "running"),
                        swaps if isinstance(swaps, list) else [])
        except (ValueError, KeyError, TypeError):
            return None
        return world if sorted(world.ranks.values()) == list(range(nodes)) else None


class Keeper:
    """One keeper of one version of one job: :meth:`run` until the version ended, was replaced by
    a newer one, or was stopped. ``api`` is a :class:`TaskAPI` (anything with its ``call``, and
    ``stream_lines`` for hot spares)."""

    def __init__(self, api, settings: Settings, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 settle_s: float = SETTLE_S, wait_s: float = WAIT_S, act_s: float = ACT_S,
                 spare_settle_s: float = SPARE_SETTLE_S):
        self.api, self.s = api, settings
        self.say = say or _say
        self.clock, self.sleep = clock, sleep
        self.settle_s, self.wait_s, self.act_s, self.spare_settle_s = settle_s, wait_s, act_s, spare_settle_s
        self._said: set[str] = set()
        self._job_path = "/v1/job/" + quote(settings.job_id, safe="")
        self.world = World(0, ranks={i: i for i in range(settings.nodes)})
        # Hot spares: each slot's failure lines of the current world, as its log stream brings them.
        self._lines: queue.Queue = queue.Queue()
        self._streams: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self._seen: dict[int, list[RankFailure]] = {}
        self._since = 0.0  # the current world's start, from its first swap on (wall clock: the lines' times are)
        self._out: set[int] = set()  # slots a spare replaced

    # -- calls, each retried while Nomad cannot be asked (an outage, a policy not attached yet) --

    def _call(self, what: str, method: str, path: str, query: dict | None = None, body: Any = None,
              timeout: float = 30.0, until: float | None = None) -> tuple[Any, int]:
        delay = 1.0
        until = self.clock() + self.act_s if until is None else until
        while True:
            try:
                return self.api.call(method, path, query, body, timeout)
            except APIError as err:
                if err.status in (400, 404, 409) or (err.status == 500 and "Enforcing job modify index" in err.text):
                    raise
                if err.status in (401, 403):
                    self.once(f"{what}: HTTP {err.status} ({err.text[:120]}): this task's workload identity may not; "
                              "attach the keeper's ACL policy (docs/nomad.md, \"The run's keeper\"); trying again")
                else:
                    self.once(f"{what}: {err}; trying again")
                if self.clock() + delay > until:
                    raise
            self.sleep(delay)
            delay = min(delay * 2, 30.0)

    def once(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self.say(line)

    def job(self) -> dict | None:
        try:
            return self._call("read the job", "GET", self._job_path)[0]
        except APIError as err:
            if err.status == 404:
                return None
            raise

    def own_version(self) -> int:
        alloc, _ = self._call("read this allocation", "GET", "/v1/allocation/" + quote(self.s.alloc_id, safe=""))
        return int(alloc.get("JobVersion") or 0)

    def allocations(self, index: int, wait_s: float) -> tuple[list[dict], int]:
        query = {"index": str(index), "wait": f"{max(1, int(wait_s))}s"} if index else None
        return self._call("read the job's allocations", "GET", self._job_path + "/allocations", query,
                          timeout=wait_s + 30.0)

    def log_tail(self, alloc_id: str) -> str:
        try:
            text, _ = self.api.call("GET", "/v1/client/fs/logs/" + quote(alloc_id, safe=""),
                                    {"task": NOMAD_TRAINER_TASK, "type": "stderr", "origin": "end",
                                     "offset": str(TAIL_BYTES), "plain": "true"}, timeout=20.0)
        except APIError as err:
            self.once(f"could not read allocation {alloc_id[:8]}'s output ({err}); judging without it")
            return ""
        return text if isinstance(text, str) else ""

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        s = self.s
        version = self.own_version()
        self.say(f"keeping {s.job_id} version {version}: {s.nodes} node ranks"
                 + (f", {s.spares} hot spare{'s' if s.spares != 1 else ''}" if s.spares else "") + ", "
                 + (f"retry on {','.join(s.retry_on) or 'nothing'} up to {s.attempts} attempts" if s.attempts
                    else "no retry:"))
        try:
            return self._run(version)
        finally:
            self._stop.set()

    def _run(self, version: int) -> int:
        s = self.s
        index, first_dead = 0, None
        loaded = False
        while True:
            wait = SPARE_LOOK_S if s.spares else self.wait_s
            if first_dead is not None:
                wait = max(1.0, min(wait, first_dead + self.settle_s - self.clock()))
            allocs, index = self.allocations(index, wait)
            job = self.job()
            if job is None:
                self.say("the job is gone (purged): nothing to keep")
                return 0
            if job.get("Stop"):
                self.say("the job was stopped: the run ends here")
                return 0
            if job.get("Version") != version:
                self.say(f"version {job.get('Version')} was registered since: its own keeper keeps it")
                return 0
            slots = trainer_slots(allocs, version)
            if s.spares:
                if not loaded:
                    self.load_world(attempt_of(job))
                    loaded = True
                self.follow_logs(slots)
                self.take_lines(slots)
            phases = {slot: phase(slots[slot]) for slot in self.world.ranks if slot in slots}
            if len(phases) == s.nodes and all(p == "complete" for p in phases.values()):
                self.say(f"every node rank completed: attempt {attempt_of(job) + 1} of the run is done")
                if s.spares:
                    self.end_world("done")
                return 0
            dead = [slot for slot, p in phases.items() if p in DEAD]
            failing = set(dead) | {slot for slot in self._seen if slot in self.world.ranks}
            if not failing:
                first_dead = None
                continue
            now = self.clock()
            first_dead = now if first_dead is None else first_dead
            settle = self.spare_settle_s if s.spares else self.settle_s
            waiting = [slot for slot, p in phases.items() if slot not in failing and p in ("running", "pending")]
            if waiting and now < first_dead + settle:
                continue
            if s.spares:
                if self.swap(slots, phases):
                    first_dead = None
                    continue
                # No spare takes it: the world ends (its slots end with their last exit code, as a
                # job without spares would have), and the attempt is judged as one.
                self.end_world("done")
                slots, phases = self.ended(version, slots)
            return self.act(job, version, slots, phases)

    # -- hot spares -------------------------------------------------------------------------

    def _world_path(self) -> str:
        return "/v1/var/" + quote(f"nomad/jobs/{self.s.job_id}/{NOMAD_TRAINER_GROUP}", safe="/")

    def load_world(self, attempt: int) -> None:
        """The world a keeper of this attempt wrote before (this one placed again), else
        generation 0; the Variable's index either way, for the next check-and-set."""
        self.world = World(attempt, ranks={i: i for i in range(self.s.nodes)})
        try:
            var, _ = self._call("read the run's world", "GET", self._world_path())
        except APIError as err:
            if err.status != 404:
                raise
            return
        found = World.parse(var.get("Items") or {}, attempt, self.s.nodes)
        if found is not None:
            self.world = found
            self._since = max([float(sw.get("time") or 0) for sw in found.swaps if isinstance(sw, dict)] or [0.0])
            self._out = {int(sw["slot"]) for sw in found.swaps if isinstance(sw, dict) and str(sw.get("slot", "")).isdigit()}
            self.say(f"the run's world is at generation {found.generation} (ranks on slots "
                     f"{','.join(str(sl) for sl, _ in sorted(found.ranks.items(), key=lambda kv: kv[1]))})")
        self.world.index = int(var.get("ModifyIndex") or 0)

    def write_world(self, world: World) -> bool:
        """Check-and-set on the world Variable (nomad/state/state_store_variables.go varSetCASTxn,
        v2.0.5: ``cas`` = the ModifyIndex last read, 0 for none): False when another keeper wrote
        it since (its world is read back and kept)."""
        try:
            var, _ = self._call("write the run's world", "PUT", self._world_path(), {"cas": str(self.world.index)},
                                body={"Items": world.items()})
        except APIError as err:
            if err.status != 409:
                raise
            self.say("another keeper wrote the run's world first: reading it back")
            self.load_world(self.world.attempt)
            return False
        world.index = int((var or {}).get("ModifyIndex") or 0)
        self.world = world
        return True

    def end_world(self, state: str) -> None:
        """The world's end: every slot still waiting (a spare, a rank whose torchrun ended) ends too."""
        ended = World(self.world.attempt, self.world.generation, dict(self.world.ranks), state,
                      list(self.world.swaps), self.world.index)
        self.write_world(ended)

    def follow_logs(self, slots: dict[int, dict]) -> None:
        """One stream per live slot of its task's stderr (``follow=true``, from the last 64 KiB:
        command/agent/fs_endpoint.go Logs -> client/fs_endpoint.go, v2.0.5): a failure line is
        seen the moment its node writes it, while the slot's allocation runs on (it waits for the
        next world)."""
        for slot, alloc in slots.items():
            aid = alloc.get("ID") or ""
            if not aid or aid in self._streams or alloc.get("ClientStatus") not in ("running", "pending"):
                continue
            t = threading.Thread(target=self._follow, args=(slot, aid), daemon=True, name=f"keeper-log-{slot}")
            self._streams[aid] = t
            t.start()

    def _follow(self, slot: int, alloc_id: str) -> None:
        query = {"task": NOMAD_TRAINER_TASK, "type": "stderr", "follow": "true", "plain": "true", "origin": "end",
                 "offset": str(TAIL_BYTES)}
        while not self._stop.is_set():
            try:
                for line in self.api.stream_lines("/v1/client/fs/logs/" + quote(alloc_id, safe=""), query, self._stop):
                    if TAG in line:
                        self._lines.put((slot, alloc_id, line))
                return  # the task ended: its log is whole
            except APIError as err:
                if err.status in (400, 404):
                    return
                self.once(f"slot {slot}'s output: {err}; following it again")
                if self._stop.wait(2.0):
                    return
                query["offset"] = "0"

    def take_lines(self, slots: dict[int, dict]) -> None:
        """The failure lines the streams brought since: this world's (dated from its start on; not
        a rank the world's change stopped), each under the slot that wrote it, named after its node."""
        while True:
            try:
                slot, alloc_id, line = self._lines.get_nowait()
            except queue.Empty:
                return
            for f in parse_lines([line], self.s.key):
                if not f.trusted or f.stopped or f.time < self._since - 2.0:
                    continue
                name = (slots.get(slot) or {}).get("NodeName") or ""
                self._seen.setdefault(slot, []).append(replace(f, node_name=name) if name else f)

    def swap(self, slots: dict[int, dict], phases: dict[int, str]) -> bool:
        """A node's fault with a spare left: the next world gives the bad node's rank to the spare
        (written with check-and-set); every slot of the world starts its torchrun again in it."""
        failures: list[RankFailure] = []
        lost = []
        for slot in sorted(self.world.ranks):
            a, p = slots.get(slot) or {}, phases.get(slot)
            if p in ("lost", "unknown"):
                f = LostRank(node=self.world.ranks[slot], rank=None, local_rank=None, host=a.get("NodeName") or "",
                             exit_code=None, signal=None, time=int(a.get("ModifyTime") or 0) / 1e9,
                             node_name=a.get("NodeName") or "", verb="lost" if p == "lost" else "disconnected")
                failures.append(f)
                lost.append(f)
            failures += self._seen.get(slot, [])
        if not failures:
            return False
        report = FailureReport(failures, cause=min(lost, key=lambda f: f.time) if lost else None)
        cls = classify_failure(report, "NODE_FAIL" if lost else "FAILED")
        culprit = next((slot for slot in self.world.ranks if cls.host and (slots.get(slot) or {}).get("NodeName") == cls.host),
                       None)
        if not cls.node or culprit is None:
            self.say(f"{cls.describe()}: not a node's fault a spare can take ({report.describe()[:300]})")
            return False
        others_up = all(phases.get(slot) == "running" for slot in self.world.ranks if slot != culprit)
        spares = [slot for slot in sorted(slots) if slot not in self.world.ranks and slot not in self._out
                  and phase(slots[slot]) == "running"]
        if not spares or not others_up:
            self.say(f"{cls.describe()}: no spare left to take node rank {self.world.ranks[culprit]}"
                     if not spares else f"{cls.describe()}: another rank of the world has ended; no swap")
            return False
        spare = spares[0]
        rank = self.world.ranks[culprit]
        ranks = {sl: r for sl, r in self.world.ranks.items() if sl != culprit}
        ranks[spare] = rank
        swap = {"rank": rank, "bad": cls.host, "spare": slots[spare].get("NodeName") or "", "slot": culprit, "to": spare,
                "reason": cls.reason or cls.describe(), "by": cls.by, "time": round(time.time(), 3),
                "generation": self.world.generation + 1}
        nxt = World(self.world.attempt, self.world.generation + 1, ranks, "running", self.world.swaps + [swap],
                    self.world.index)
        if not self.write_world(nxt):
            return True  # another keeper's world: judged again from it
        self._out.add(culprit)
        self._seen.clear()
        self._since = time.time()
        self.say(f"{cls.describe()}: node rank {rank} moves from slot {culprit} ({cls.host}) to spare slot {spare} "
                 f"({swap['spare']}); generation {nxt.generation} of the run's world, {len(self.world.ranks)} ranks "
                 f"starting again; {len([sl for sl in slots if sl not in ranks and sl not in self._out])} spare(s) left")
        return True

    def ended(self, version: int, slots: dict[int, dict]) -> tuple[dict[int, dict], dict[int, str]]:
        """After the world's end: the world's slots once each has ended (its entry exits with its
        last exit code on the end), at most the settle time."""
        until = self.clock() + self.settle_s
        while True:
            allocs, _ = self.allocations(0, 1.0)
            slots = trainer_slots(allocs, version)
            phases = {slot: phase(slots[slot]) for slot in self.world.ranks if slot in slots}
            if all(p not in ("running", "pending") for p in phases.values()) or self.clock() > until:
                return slots, phases
            self.sleep(0.5)

    def report(self, slots: dict[int, dict], phases: dict[int, str]) -> tuple[FailureReport | None, str]:
        """The failures of the dead ranks (their failure lines, signed with the job's key; a lost
        node as Nomad says it) and the job's status as the submitter folds it: TIMEOUT, else
        NODE_FAIL, else FAILED."""
        failures: list[RankFailure] = []
        lost: list[RankFailure] = []
        for i in sorted(phases):
            p, a = phases[i], slots[i]
            name = a.get("NodeName") or ""
            when = int(a.get("ModifyTime") or 0) / 1e9
            if p in ("lost", "unknown"):
                f = LostRank(node=self.world.ranks.get(i, i), rank=None, local_rank=None, host=name, exit_code=None,
                             signal=None, time=when,
                             node_name=name, verb="lost" if p == "lost" else "disconnected",
                             error=f"allocation {str(a.get('ID'))[:8]} {p}")
                failures.append(f)
                lost.append(f)
            elif p in ("failed", "timeout"):
                text = self.log_tail(a.get("ID") or "")
                found = [f for f in parse_lines((ln for ln in text.splitlines() if TAG in ln), self.s.key)
                         if f.time >= self._since - 2.0]  # this world's (with spares: since its last swap)
                # The allocation's node is the scheduler's name for where the line was written.
                failures += [replace(f, node_name=name) if name else f for f in found]
        phase_set = set(phases.values())
        status = "TIMEOUT" if "timeout" in phase_set else "NODE_FAIL" if phase_set & {"lost", "unknown"} else "FAILED"
        if not failures:
            return None, status
        return FailureReport(failures, cause=min(lost, key=lambda f: f.time) if lost else None), status

    def wants_retry(self, cls, status: str, attempt: int) -> tuple[bool, str]:
        """As the submitter's runs.wants_retry: the failure class's ``retry: on:`` word in
        ``retry.on``, and an attempt left."""
        if not self.s.attempts:
            return False, "the job has no retry:"
        if status == "TIMEOUT":
            return False, "not retried: max_run_duration"
        if cls.failure.retry_on is None:
            return False, f"not retried: {cls.describe()}"
        if not cls.failure.retried_by(self.s.retry_on):
            return False, f"not retried: {cls.failure.retry_on} is not in retry.on"
        if attempt + 1 >= self.s.attempts:
            return False, f"not retried: all {self.s.attempts} attempts used"
        return True, cls.failure.retry_on

    def act(self, job: dict, version: int, slots: dict[int, dict], phases: dict[int, str]) -> int:
        report, status = self.report(slots, phases)
        cls = classify_failure(report, status)
        attempt = attempt_of(job)
        what = f"{status} ({cls.describe()})" + (f": {report.describe()[:400]}" if report is not None else "")
        again, why = self.wants_retry(cls, status, attempt)
        if again:
            return self.retry(version, attempt, cls.host, why, what)
        self.say(f"attempt {attempt + 1} of the run ended {what}; {why}; stopping the job to release its nodes")
        self.stop()
        return 0

    def retry(self, version: int, attempt: int, culprit: str, why: str, what: str) -> int:
        token = secrets.token_hex(16)
        until = self.clock() + self.act_s
        while True:
            if self.clock() > until:
                self.say(f"could not register attempt {attempt + 2} within {self.act_s:.0f} s; stopping the job")
                self.stop()
                return 1
            job = self.job()
            if job is None or job.get("Stop"):
                self.say("the job was stopped before the next attempt was registered: the run ends here")
                return 0
            if job.get("Version") != version or attempt_of(job) != attempt:
                mine = (job.get("Meta") or {}).get(NOMAD_TOKEN_META) == token
                self.say(f"attempt {attempt_of(job) + 1} is version {job.get('Version')}"
                         + ("" if mine else ", registered by another keeper: nothing more to do"))
                return 0
            nxt = next_job(job, culprit, attempt + 1, token)
            self.once(f"attempt {attempt + 1} ended {what}; retrying ({why}): registering attempt {attempt + 2} "
                      f"against JobModifyIndex {job.get('JobModifyIndex')}" + (f", keeping off {culprit}" if culprit else ""))
            try:
                self._call("register the run's next attempt", "PUT", self._job_path,
                           body={"Job": nxt, "EnforceIndex": True, "JobModifyIndex": int(job.get("JobModifyIndex") or 0)},
                           until=until)
            except APIError as err:
                if err.status == 500 and "Enforcing job modify index" in err.text:
                    continue  # someone registered since the read: read it again
                if err.status == 0 or 500 <= err.status < 600:
                    continue  # no answer: it may have been applied; the read says (the token)
                self.say(f"could not register attempt {attempt + 2}: {err}; stopping the job")
                self.stop()
                return 1
            back = self.job() or {}
            self.say(f"attempt {attempt + 2} registered as version {back.get('Version', '?')}"
                     + (f", keeping off {culprit}" if culprit else ""))
            return 0

    def stop(self) -> None:
        try:
            self._call("stop the job", "DELETE", self._job_path)
        except APIError as err:
            self.say(f"could not stop the job ({err}): its survivors hold their nodes until their own timeouts")


def _say(line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"{WHO} {stamp}: {' '.join(line.split())[:2000]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    env = dict(os.environ)
    settings = Settings.from_env(env)
    os.environ.pop(NAMES.failure_key, None)
    if not settings.job_id or not settings.alloc_id:
        _say("not in a Nomad task (no NOMAD_JOB_ID / NOMAD_ALLOC_ID): nothing to keep")
        return 2
    api = TaskAPI.from_env(env)
    if not api.token:
        _say("no workload identity token (NOMAD_TOKEN): the job's keeper task needs identity { env = true }")
        return 2
    import signal

    def stopped(signum, frame):  # Nomad stops the keeper with its version (kill_signal, SIGINT)
        _say(f"stopped by Nomad ({signal.Signals(signum).name}): this version is over")
        os._exit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)
    try:
        return Keeper(api, settings).run()
    except APIError as err:
        _say(f"gave up: {err}")
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # Its log streams' threads may sit in a read for a while yet: the keeper's work is done.
    os._exit(code)
