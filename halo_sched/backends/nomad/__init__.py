"""The Nomad backend: render (``render.py``), talk to the API (``client.py``), fold what Nomad
says into a state (``state.py``), explain a plan (``plan.py``), and watch a job, stopping it when a
rank dies or it does not place in time (``watchdog.py``). This class only joins them.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ...errors import HaloError, SchedulerError, UsageError
from ...launch import submission_id
from ...node.nomad_names import NOMAD_ATTEMPT_META, NOMAD_EXCLUDED_META, NOMAD_KEEPER_META
from ..base import DryRun, Scheduler
from .capabilities import Configured, ReadsAllocFiles
from .render import (
    KEEPER_GROUP, KEEPER_META, KEEPER_TASK, SECRETS_META, TASK, client_requirements, has_keeper, job_payload,
    keeper_variable_items, keeper_variable_path, render_hcl, variable_items, variable_path,
)

if TYPE_CHECKING:  # pragma: no cover
    from ...models import JobSpec
    from ...jobstate import JobState  # rendering reads no job state: imported where a state is made

_ID_RE = re.compile(r"^(?:([A-Za-z0-9_-]+):)?(?:([A-Za-z0-9_-]+)/)?([A-Za-z0-9][A-Za-z0-9_.-]*)(?:~v(\d{1,9}))?\Z")

#: Job.Meta key of a version halo-sched registered as a retry attempt of its run (the attempt's
#: number); absent from a job's first version (attempt 0).
ATTEMPT_META = NOMAD_ATTEMPT_META


def _key(c, name: str) -> tuple[int, str]:
    """A job's key in the secrets caches: the client that reaches it (a version's view is the
    job's client) and the job ID."""
    return id(getattr(c, "base", c)), name


def _superseded(c, job: dict | None) -> bool:
    """Whether a later version of ``job`` (a stub) is a later attempt of its run, which still
    needs the job's secrets Variable though the attempt ``c`` reads has ended. The plain id is
    version 0: superseded once halo-sched registered an attempt (its Meta). ``JOB~vN``: the job is
    at a later version that is not only a stop of N (a stop is a version of its own, one past the
    stopped one: nomad/fsm.go handleJobDeregister -> state_store.go upsertJobImpl, v2.0.5)."""
    if not job:
        return False
    if not isinstance(c, _Version):
        return ATTEMPT_META in (job.get("Meta") or {})
    version = job.get("Version")
    if not isinstance(version, int):
        return False
    return version > c.version + (1 if job.get("Stop") else 0)


def _run_over(job: dict | None) -> bool:
    """Whether the run a job holds can register no further attempt: always for a job without a
    keeper (nothing registers its next attempt: no reader does); with one, once the job is dead
    (the keeper ended with it, and registers a next attempt before it ends)."""
    return KEEPER_META not in ((job or {}).get("Meta") or {}) or (job or {}).get("Status") == "dead"


def _records_find(job_id: str, backend: str) -> list:
    from ... import records

    return records.find(job_id, backend, on_bad=None)


def _own_allocations(c, job: dict | None, allocs: list[dict]) -> list[dict]:
    """The allocations of the attempt the id of ``c`` names, of those of its job: ``JOB~vN``'s
    client narrowed them to version N already; a job halo-sched re-registered as its run's next
    attempt (its Meta) has its plain id name the run's first attempt, version 0."""
    if isinstance(c, _Version) or ATTEMPT_META not in ((job or {}).get("Meta") or {}):
        return allocs
    return [a for a in allocs if a.get("JobVersion") == 0]


class _Version:
    """One version of a Nomad job as halo-sched's id ``JOB~vN`` names it (a retry attempt,
    :meth:`NomadScheduler.submit_attempt`): the client, with the job's allocations narrowed to
    those of version N (an allocation carries its ``JobVersion``, nomad/structs/structs.go
    v2.0.5). Everything else (the job, its stop, logs) is the job's."""

    def __init__(self, client, version: int):
        self.base, self.version = client, version

    def __getattr__(self, name):
        return getattr(self.base, name)

    def _mine(self, allocs):
        return [a for a in allocs or [] if a.get("JobVersion") == self.version]

    def job_allocations(self, job_id: str, index: int = 0, wait_s: float | None = None):
        allocs, idx = self.base.job_allocations(job_id, index=index, wait_s=wait_s)
        return self._mine(allocs), idx

    def allocation_stubs(self, job_ids):
        return self._mine(self.base.allocation_stubs(job_ids))


#: A query of at most this many jobs (``status ID``, ``watch``, ``--wait``) also reads the running
#: allocations' progress files for the stragglers line (progress.py).
PROGRESS_JOBS = 4


def _say(msg: str) -> None:
    print(f"halo-sched: {msg}", file=sys.stderr, flush=True)


#: ``list``'s queries (:meth:`NomadScheduler.for_listing`): one attempt, this long to connect and
#: to answer. A Nomad that is down then costs ``list`` at most LIST_CONNECT_S (plus a DNS lookup).
LIST_CONNECT_S = 0.5
LIST_ANSWER_S = 5.0


def with_failure_key(payload: dict, key: str | None = None) -> dict:
    """The job as registered: ``payload`` (the dry run's, which holds no key) with the job's
    failure key (``Scheduler.submit`` puts it in this process's environment) in the Env of each
    trainer task; their entry script takes it out of the environment before torchrun starts.
    The run's keeper gets it too (it verifies the failure lines it acts on); the server tasks do not."""
    import copy

    from ...node.contract import NAMES

    key = os.environ.get(NAMES.failure_key, "") if key is None else key
    if not key:
        return payload
    payload = copy.deepcopy(payload)
    for group in payload["Job"].get("TaskGroups") or []:
        for task in group.get("Tasks") or []:
            if task.get("Name") in (TASK, KEEPER_TASK):
                task["Env"] = {**(task.get("Env") or {}), NAMES.failure_key: key}
    return payload


def _failure_key_of(job: dict) -> str:
    """The failure key a registered job's trainer tasks carry (:func:`with_failure_key`)."""
    from ...node.contract import NAMES

    for group in job.get("TaskGroups") or []:
        for task in group.get("Tasks") or []:
            key = (task.get("Env") or {}).get(NAMES.failure_key) if task.get("Name") == TASK else None
            if isinstance(key, str) and key:
                return key
    return ""


class NomadScheduler(Scheduler):
    """Each submission gets a fresh Nomad job ID (``NAME-YYYYmmdd-HHMMSS-xxxxxx``). The id halo-sched
    reports is ``[REGION:][NAMESPACE/]ID`` when the job file names a region or namespace, so that
    ``status``/``logs``/``cancel`` reach the right place from the id alone."""

    name = "nomad"
    #: wait() is the watchdog (a dead rank stops the job): an asyncio wait runs it, not the watcher.
    waits_in_thread = True

    def __init__(self, client=None, retry_s: float | None = None):
        self._client = client  # one client for every namespace/region (tests, embedding)
        self.retry_s = retry_s  # submit/cancel ride out outages this long (None: HALO_SUBMIT_RETRY_S or 120 s)
        self._scoped: dict[tuple, object] = {}
        self._failure_logs = None  # FailureLogs, built on the first failure seen
        self._secrets_gone: set[tuple[int, str]] = set()  # (client, job) whose Variable this process deleted
        self._secrets_failed: set[tuple[int, str]] = set()  # ... or failed to (and said so)
        self._config_overrides: dict = {}  # for_listing(): a short connect timeout, no retries

    def watcher_key(self):
        # Handles on schedulers of one client share one watcher; without a client object, those
        # that the environment points at the same agent, namespace and region.
        if self._client is not None:
            return ("nomad", self._client)
        return ("nomad", *(os.environ.get(k) for k in ("NOMAD_ADDR", "NOMAD_NAMESPACE", "NOMAD_REGION")))

    def _client_for(self, namespace: str | None = None, region: str | None = None):
        # Built on first use: rendering needs no connection (nor requests' import time).
        if self._client is not None:
            return self._client
        key = (namespace, region)
        if key not in self._scoped:
            from .client import NomadClient, NomadConfig

            self._scoped[key] = NomadClient(NomadConfig.from_env(namespace=namespace, region=region,
                                                                 **self._config_overrides))
        return self._scoped[key]

    def for_listing(self) -> "NomadScheduler":
        """``list``: one attempt per request, LIST_CONNECT_S to connect, LIST_ANSWER_S to answer
        (a client given to the constructor is used as it is)."""
        if self._client is not None:
            return self
        quick = NomadScheduler(retry_s=self.retry_s)
        quick._config_overrides = {"retry_attempts": 1, "connect_timeout_s": LIST_CONNECT_S,
                                   "timeout_s": LIST_ANSWER_S}
        return quick

    def _split(self, job_id: str):
        m = _ID_RE.match(job_id)
        if not m:
            raise UsageError(f"{job_id!r} is not a Nomad job id ([REGION:][NAMESPACE/]ID)")
        region, namespace, name, version = m.groups()
        c = self._client_for(namespace, region)
        return (c if version is None else _Version(c, int(version))), name

    # ---- rendering ----------------------------------------------------------------------------

    def render(self, spec: JobSpec, format: str = "hcl", **opts) -> str:  # noqa: A002
        if format == "hcl":
            return render_hcl(spec)
        if format == "json":
            return json.dumps(job_payload(spec), indent=2, ensure_ascii=False) + "\n"
        raise UsageError(f"unknown Nomad format {format!r}: use hcl or json")

    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        from ...exactly_once import new_token
        from .client import TOKEN_META

        payload = job_payload(spec, submission_id(spec))
        # The submission token: after an ambiguous failure, the job read back with it is ours.
        token = payload["Job"]["Meta"][TOKEN_META] = new_token()
        # --dry-run shows exactly the payload that would be sent.
        return DryRun(self.name, spec, json.dumps(payload, indent=2, ensure_ascii=False) + "\n", payload, token)

    # ---- scheduler calls ----------------------------------------------------------------------

    def _preflight(self, client, spec: JobSpec, payload: dict, strict: bool = False) -> None:
        """On stderr: features the server is too old for, and the client settings the job needs
        (neither shows in Nomad's own plan). ``strict`` (``plan``): when nothing answered as a
        Nomad agent (unreachable, TLS, not Nomad), that error ends the command here."""
        from .plan import version_warnings

        try:
            version_lines = version_warnings(payload["Job"], client.server_version())
        except SchedulerError as err:
            kind = getattr(err, "kind", None)
            # TLS failures and a server that is not Nomad do not heal: the request that follows
            # would fail the same way (submit would retry it for nothing). Nothing reached
            # Nomad: plan stops; submit rides the outage out (its own lines say so).
            if kind in ("tls", "not_nomad") or (strict and kind == "unreachable"):
                raise
            # Only what could not be checked, and why in a few words: version_warnings(None)
            # would blame the token's permissions.
            why = {"unreachable": "nothing reached Nomad"}.get(kind) or str(err).splitlines()[0][:100]
            version_lines = [f"could not read the Nomad server version ({why}); version checks skipped"] \
                if version_warnings(payload["Job"], None) else []
        for line in version_lines:
            _say(f"warning: {line}")
        for line in client_requirements(spec):
            _say(f"every Nomad client that may run this job needs: {line}")

    def schedule(self, dryrun: DryRun) -> str:
        nm = dryrun.spec.nomad
        client = self._client_for(nm.namespace, nm.region)
        # The secrets and the node runtime; a missing secret is a SpecError before any request.
        items = variable_items(dryrun.spec, dryrun.payload["Job"]["ID"])
        self._preflight(client, dryrun.spec, dryrun.payload)
        from .client import TOKEN_META

        token = dryrun.payload["Job"]["Meta"][TOKEN_META]
        if items:
            # Before the job exists: its tasks read the Variable once, when they start.
            self._write_variable(client, dryrun.spec, variable_path(dryrun.payload["Job"]["ID"]), items)
        self._write_keeper_variable(client, dryrun.spec, dryrun.payload["Job"]["ID"])
        if dryrun.spec.retry is not None and not has_keeper(dryrun.spec):
            _say("note: nomad.keeper: false: this job carries no keeper, so a failed attempt is not retried on Nomad "
                 "(no halo-sched process registers one; docs/recovery.md)")
        resp = client.submit_job(with_failure_key(dryrun.payload), token, retry_s=self.retry_s, on_retry=_say) or {}
        if resp.get("found_after_retry"):
            _say(f"the job was registered by an earlier attempt (token {token}); not registering it again")
        warnings = resp.get("Warnings") or ""
        for w in warnings.splitlines():
            if w.strip():
                _say(f"nomad warning: {w.strip()}")
        # Where the job really went: the job file's namespace/region, else NOMAD_NAMESPACE/REGION.
        cfg = client.config if isinstance(client, Configured) else None
        region = nm.region or (cfg.region if cfg is not None else None)
        namespace = nm.namespace or (cfg.namespace if cfg is not None else None)
        job_id = dryrun.payload["Job"]["ID"]
        return f"{region + ':' if region else ''}{namespace + '/' if namespace else ''}{job_id}"

    def _write_variable(self, client, spec: JobSpec, path: str, items: dict[str, str]) -> None:
        """The job's Variable: its secrets, and the node runtime (docs/node-runtime.md). A token that
        may not write it stops a job with secrets or servers (a server node has no python to fall
        back on: its shell comes from there); a job without them goes on without the carried
        runtime (its nodes then need halo-sched at the job's version), as it did before the runtime
        travelled there."""
        from .transport import NomadAPIError

        try:
            client.put_variable(path, items, retry_s=self.retry_s, on_retry=_say)
        except NomadAPIError as err:
            if err.status != 403 or spec.secret_names or spec.servers:
                raise
            from ...node_runtime import runtime

            _say(f"warning: NOMAD_TOKEN may not write {path}: the job carries no node runtime, so its nodes need "
                 f"halo-sched with node runtime {runtime().version} installed (docs/node-runtime.md)")

    def _write_keeper_variable(self, client, spec: JobSpec, name: str) -> None:
        """The keeper's copy of the node runtime, in the Variable its group reads
        (render.keeper_variable_path). A token that may not write it: the job goes on, and its
        keeper runs only where the node's own halo-sched is the job's version (said once)."""
        from .transport import NomadAPIError

        items = keeper_variable_items(spec, name)
        if not items:
            return
        try:
            client.put_variable(keeper_variable_path(name), items, retry_s=self.retry_s, on_retry=_say)
        except NomadAPIError as err:
            if err.status != 403:
                raise
            from ...node_runtime import runtime

            _say(f"warning: NOMAD_TOKEN may not write {keeper_variable_path(name)}: the run's keeper carries no "
                 f"node runtime, so its node needs halo-sched with node runtime {runtime().version} installed")

    # ---- a run's keeper (node/nomad_keeper.py): it registers the next attempts; waiters follow ----

    #: A run's next attempts are registered by the job's own keeper task (``nomad.keeper``, the
    #: default with ``retry:``): every waiter and reader follows the chain from Nomad
    #: (:meth:`successor_of`) and records it; none registers. A job without a keeper
    #: (``nomad.keeper: false``) is not retried: nothing in it acts, and no reader does.
    starts_successor = True
    #: How long a waiter that saw an attempt fail waits for the keeper's next one (its settle, the
    #: register, an outage ridden out), while the keeper may still act (:meth:`owner_gone`).
    successor_wait_s = 300.0

    @staticmethod
    def _keeper_record(record: dict | None) -> bool:
        """Whether the job of ``record`` carries its run's keeper (as registered: record_fields)."""
        sched = (record or {}).get("scheduler")
        return isinstance(sched, dict) and sched.get("keeper") is True

    def _keeper_run(self, run_id: str) -> bool:
        from ... import records

        return self._keeper_record((records.find(run_id, self.name, on_bad=None) or [None])[0])

    def successor_of(self, record: dict) -> dict | None:
        """The attempt the run's keeper registered after the attempt of ``record``: the version of
        the job whose ``Meta.halo_sched_attempt`` is the next number (the lowest such, not a stop:
        a stop is a version too), as ``{"job": "JOB~vN", "excluded", "submitted_at"}``; None for a
        job without a keeper, or before it registered one."""
        if not self._keeper_record(record):
            return None
        run = record.get("run") if isinstance(record.get("run"), dict) else {}
        attempt = run.get("attempt")
        if not (isinstance(attempt, int) and not isinstance(attempt, bool) and 0 <= attempt < 10**6):
            return None
        m = _ID_RE.match(record.get("id") or "")
        if not m:
            return None
        region, namespace, name, _ = m.groups()
        prefix = f"{region + ':' if region else ''}{namespace + '/' if namespace else ''}"
        c = self._client_for(namespace, region)
        try:
            versions = c.job_versions(name)
        except HaloError:
            return None
        found = [v for v in versions if not v.get("Stop") and isinstance(v.get("Version"), int)
                 and str((v.get("Meta") or {}).get(ATTEMPT_META) or "0") == str(attempt + 1)]
        if not found:
            return None
        v = min(found, key=lambda v: v["Version"])
        excluded = [h for h in str((v.get("Meta") or {}).get(NOMAD_EXCLUDED_META) or "").split(",") if h]
        submitted = v.get("SubmitTime")
        return {"job": f"{prefix}{name}~v{v['Version']}", "excluded": excluded,
                "submitted_at": submitted / 1e9 if isinstance(submitted, int) and submitted > 0 else None}

    def attempt_fields(self, record: dict, job_id: str) -> dict:
        """The record fields of the version the keeper registered: where it is, and the keeper."""
        m = _ID_RE.match(job_id)
        region, namespace, name, version = m.groups() if m else (None, None, job_id, None)
        return {"scheduler": {"region": region, "namespace": namespace, "job": name, "keeper": True,
                              **({"version": int(version)} if version is not None else {})}}

    def owner_gone(self, run_id: str) -> bool:
        """A run without a keeper has none (gone: nothing registers its next attempt). With a
        keeper: gone once the job is stopped, dead (the keeper ended with it: it registers the
        next attempt before it ends) or unknown to Nomad; a keeper lost with its node is placed
        again by Nomad, not by a reader."""
        if not self._keeper_run(run_id):
            return True
        try:
            c, name = self._split(run_id)
            stubs = [j for j in c.job_stubs([name]) if j.get("ID") == name]
        except HaloError:
            return False
        return not stubs or bool(stubs[0].get("Stop")) or stubs[0].get("Status") == "dead"

    def submit_attempt(self, spec: JobSpec, previous_id: str):
        """The run's next attempt as a NEW VERSION of the same Nomad job (``nomad job history``
        lists the attempts): the same job ID re-registered with the attempt's spec (its
        ``${node.unique.name} != HOST`` constraints, ``HALO_RESTART_COUNT`` in the tasks' Env),
        Meta ``halo_sched_attempt`` = its number and a fresh submission token: what the run's
        keeper registers from inside the job (node/nomad_keeper.py), from this process. No
        reader or waiter of halo-sched calls it (they follow the keeper); a tool that carries a
        keeper-less run on by hand, and the tests standing in for a keeper, do. Exactly once:
        registered only while the job is still at the previous attempt (its Meta), and against
        the ``JobModifyIndex`` read then (``EnforceIndex``, :meth:`NomadClient.reregister_job`),
        so that of two processes registering it only one does. A job already at
        this attempt (registered by a process that died before recording it) is recorded and
        followed instead. Its id is ``JOB~vN`` (N: the job's version), its record one of its own."""
        from ... import records
        from ...exactly_once import new_token
        from ..base import Job, failure_key_in_env, new_failure_key
        from .client import TOKEN_META

        m = _ID_RE.match(previous_id)
        if not m or spec._attempt is None:
            raise UsageError(f"{previous_id!r} is not a Nomad job id of a run")
        region, namespace, name, _ = m.groups()
        prefix = f"{region + ':' if region else ''}{namespace + '/' if namespace else ''}"
        client = self._client_for(namespace, region)
        payload = job_payload(spec, name)
        token = payload["Job"]["Meta"][TOKEN_META] = new_token()
        payload["Job"]["Meta"][ATTEMPT_META] = str(spec._attempt.number)
        dry = DryRun(self.name, spec, json.dumps(payload, indent=2, ensure_ascii=False) + "\n", payload, token)
        items = variable_items(spec, name)
        git = records.git_state_started(spec)
        job = client.read_job(name)
        had = (job.get("Meta") or {}).get(ATTEMPT_META) or "0"
        if had == str(spec._attempt.number) and isinstance(job.get("Version"), int):
            # This very attempt, registered by a process that died before recording it:
            # recorded and followed, never registered again.
            job_id = f"{prefix}{name}~v{job['Version']}"
            if not records.find(job_id, self.name, on_bad=None):
                records.record_submit(self.name, spec, dry.text, job_id, {**self.record_fields(dry, job_id),
                                                                          "failure_key": _failure_key_of(job)},
                                      spec.job_file, git)
            return Job(self, job_id)
        self._preflight(client, spec, payload)
        if had != str(spec._attempt.number - 1):
            raise SchedulerError(f"job {name!r} is already at attempt {int(had) + 1} of its run (version "
                                 f"{job.get('Version')}); not registering attempt {spec._attempt.number + 1}")
        if items:
            # The previous attempt's end deleted it (its tasks had read it): written again.
            self._write_variable(client, spec, variable_path(name), items)
            self._secrets_gone.discard(_key(client, name))
            self._secrets_failed.discard(_key(client, name))
        key = new_failure_key()
        with failure_key_in_env(key):
            resp = client.reregister_job(with_failure_key(payload), token, int(job.get("JobModifyIndex") or 0),
                                         retry_s=self.retry_s, on_retry=_say) or {}
        for w in (resp.get("Warnings") or "").splitlines():
            if w.strip():
                _say(f"nomad warning: {w.strip()}")
        # The register's answer has no Version (JobRegisterResponse, nomad/structs/structs.go
        # v2.0.5): the job read back, ours by its token.
        version = resp.get("Version")
        if not isinstance(version, int):
            back = client.read_job(name)
            if (back.get("Meta") or {}).get(TOKEN_META) != token:
                raise SchedulerError(f"job {name!r} was registered again by another process right after this "
                                     "attempt's version; its version is unknown")
            version = back.get("Version")
        job_id = f"{prefix}{name}~v{version}"
        records.record_submit(self.name, spec, dry.text, job_id, {**self.record_fields(dry, job_id), "failure_key": key},
                              spec.job_file, git)
        return Job(self, job_id)

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        m = _ID_RE.match(job_id)
        region, namespace, name, version = m.groups() if m else (None, None, job_id, None)
        keeper = KEEPER_META in ((dryrun.payload or {}).get("Job", {}).get("Meta") or {})
        return {"scheduler": {"region": region, "namespace": namespace, "job": name,
                              **({"version": int(version)} if version is not None else {}),
                              **({"keeper": True} if keeper else {})}}

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        from .plan import format_plan, plan_summary

        client = self._client_for(spec.nomad.namespace, spec.nomad.region)
        # A fresh ID, as submit would use: planning under the job's name would diff against
        # whatever job of that name is already there.
        payload = job_payload(spec, submission_id(spec))
        self._preflight(client, spec, payload, strict=True)
        resp = client.plan(payload)
        groups = plan_summary(resp)
        clients_ok, client_lines = self._check_clients(client, payload["Job"])
        return all(g.can_place for g in groups) and clients_ok, "\n".join([format_plan(resp, spec.name), *client_lines])

    def _check_clients(self, client, job: dict) -> tuple[bool, list[str]]:
        """``plan``: every client setting the job needs, checked on the nodes where the API shows it."""
        from .plan import check_clients
        from .render import client_needs

        try:
            nodes, why = client.nodes(), ""
        except HaloError as err:
            nodes, why = None, (getattr(err, "short", None) or str(err).splitlines()[0])[:200]
        return check_clients(client_needs(job), nodes, job.get("Datacenters") or ["*"], why)

    def _by_client(self, ids: Sequence[str]) -> list[tuple[object, list[tuple[str, str]]]]:
        """The ids grouped by the client (namespace/region) that reaches them: [(client, [(id, name)])]."""
        groups: dict[int, tuple[object, list[tuple[str, str]]]] = {}
        for i in ids:
            c, name = self._split(i)
            groups.setdefault(id(c), (c, []))[1].append((i, name))
        return list(groups.values())

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """At most three calls per namespace/region, whatever the number of jobs: job stubs,
        allocation stubs, and (only when some rank is unplaced) the evaluations saying why."""
        from ...jobstate import JobStatus
        from .state import job_state

        out = {}
        deadline = None
        for c, items in self._by_client(ids):
            names = [name for _, name in items]
            jobs = {j.get("ID"): j for j in c.job_stubs(names)}
            known = [n for n in names if n in jobs]
            allocs: dict[str, list] = {}
            for a in c.allocation_stubs(known) if known else ():
                allocs.setdefault(a.get("JobID"), []).append(a)
            for n in known:
                allocs[n] = _own_allocations(c, jobs[n], allocs.get(n, []))
            from .watchdog import world_of

            worlds = {n: world_of(c, jobs[n]) for n in known}  # hot spares: the run's world (one read each)
            states = {n: job_state(jobs.get(n), allocs.get(n, []), [], n, worlds.get(n)) for n in names}
            unplaced = [n for n in known if states[n].nomad.nodes_placed < (states[n].nodes_total or 0)]
            evals: dict[str, list] = {}
            for e in c.placement_evaluations(unplaced) if unplaced else ():
                evals.setdefault(e.get("JobID"), []).append(e)
            for i, name in items:
                st = job_state(jobs.get(name), allocs.get(name, []), evals.get(name, []), i, worlds.get(name))
                # Which rank failed first: the failure lines in the dead allocations' logs (a job
                # with hot spares: of the ranks its world holds, not of a slot a spare replaced).
                from .state import world_view

                st.failure = self._failures().report(c, st, world_view(jobs.get(name), allocs.get(name, []),
                                                                       worlds.get(name))[0])
                if st.status is JobStatus.RUNNING and len(ids) <= PROGRESS_JOBS and isinstance(c, ReadsAllocFiles):
                    # The slowest rank, from the running allocations' progress files (progress.py):
                    # one bounded pass for all the jobs of this query; a listing of many jobs
                    # keeps its three calls.
                    from .progress import PASS_S, stragglers_line

                    deadline = deadline or time.monotonic() + PASS_S
                    st.progress = stragglers_line(c, allocs.get(name, []), deadline)
                out[i] = st
            self._forget_ended_secrets(c, [(i, name) for i, name in items if out[i].status.terminal
                                           and SECRETS_META in ((jobs.get(name) or {}).get("Meta") or {})
                                           and not _superseded(c, jobs.get(name)) and _run_over(jobs.get(name))])
        return out

    def _forget_ended_secrets(self, c, ended: list[tuple[str, str]]) -> None:
        """Delete the Variables of these ended jobs. For several (``list``), one metadata listing
        first, so that jobs whose Variable is already gone cost no request; where listing is not
        allowed, each is deleted all the same (a delete of nothing succeeds)."""
        ended = [(i, name) for i, name in ended if _key(c, name) not in self._secrets_gone]
        if len(ended) > 1:
            try:
                present = c.variable_paths("nomad/jobs/")
                ended = [(i, name) for i, name in ended if variable_path(name) in present]
            except HaloError:
                pass
        for job_id, name in ended:
            self._forget_secrets(c, job_id, name)

    # ---- secrets: gone once the job ended ------------------------------------------------------

    def _forget_secrets(self, c, job_id: str, name: str) -> bool:
        """Delete the Variable of a job seen ended (idempotent: Nomad answers a delete of a
        missing Variable with success, nomad/state/state_store_variables.go:400-401@v2.0.5). Its
        tasks read it once, when they start, so nothing needs it any more. Never fails the
        command: a failed delete is one warning line; ``halo-sched gc`` tries again."""
        key = _key(c, name)
        if key in self._secrets_gone:
            return True
        if key in self._secrets_failed:
            return False  # one attempt and one warning per process
        path = variable_path(name)
        try:
            c.delete_variable(path)
            if self._keeper_record((_records_find(job_id, self.name) or [None])[0]):
                c.delete_variable(keeper_variable_path(name))  # the keeper's copy of the runtime
        except HaloError as err:
            self._secrets_failed.add(key)
            status = getattr(err, "status", None)
            if status:
                body = " ".join(str(getattr(err, "body", "") or "").split())[:80]
                why = f"HTTP {status}{': ' + body if body else ''}"
            else:
                why = " ".join(str(err).split())[:120]
            hint = '; the token needs "destroy" on nomad/jobs/*' if status == 403 else ""
            _say(f"warning: {job_id}'s secrets Variable not deleted ({why}{hint}); `halo-sched gc` retries")
            return False
        self._secrets_gone.add(key)
        return True

    def _forget_secrets_if_ended(self, c, job_id: str, name: str, state: JobState) -> None:
        """After a wait: the job's Variable goes when the job ended and carries one."""
        if not state.status.terminal or _key(c, name) in self._secrets_gone:
            return
        try:
            stubs = c.job_stubs([name])
        except HaloError:
            stubs = None  # unknown: delete anyway (a missing Variable is no error)
        if stubs is None or any(SECRETS_META in (j.get("Meta") or {}) and not _superseded(c, j) and _run_over(j)
                                for j in stubs if j.get("ID") == name):
            self._forget_secrets(c, job_id, name)

    def collect_secrets(self, ids: Sequence[str]) -> tuple[list[tuple[str, str]], list[str], list[str], list[str]]:
        """``halo-sched gc``: of the jobs ``ids`` (halo-sched's records), delete the Variable of every
        one that ended or that Nomad no longer knows (stopped with purge, garbage-collected). A job
        still pending or running keeps its Variable. Returns (removed [(id, path)], kept [id],
        failed [line per Variable not deleted], notes [line]); a scheduler that cannot be asked
        raises (nothing deleted)."""
        removed: list[tuple[str, str]] = []
        kept: list[str] = []
        failed: list[str] = []
        notes: list[str] = []
        for c, items in self._by_client(ids):
            try:
                # Which Variables exist (metadata only, never a value): to report only real removals.
                present: set[str] | None = c.variable_paths("nomad/jobs/")
            except HaloError as err:
                present = None  # not allowed to list: delete each candidate (idempotent) all the same
                notes.append(f"could not list Nomad Variables ({str(err).splitlines()[0][:200]}); "
                                "deleting each ended job's Variable without knowing whether it existed")
            before = set(self._secrets_gone)
            states = self.query([i for i, _ in items])
            for job_id, name in items:
                st = states[job_id]
                path = variable_path(name)
                gone = st.raw_state == "not found"
                if self._keeper_record((_records_find(job_id, self.name) or [None])[0]) and not gone \
                        and st.raw_state != "dead":
                    # A run whose keeper may still register its next attempt: the next version's
                    # tasks read the Variable when they start.
                    if present is None or path in present:
                        kept.append(job_id)
                    continue
                if not (st.status.terminal or gone):
                    if present is None or path in present:
                        kept.append(job_id)
                    continue
                if present is not None and path not in present:
                    continue
                if (id(c), name) in before:
                    continue  # already deleted by this process earlier: nothing was there any more
                if self._forget_secrets(c, job_id, name):
                    removed.append((job_id, path))
                else:
                    failed.append(f"{job_id}: its Variable {path} could not be deleted")
        return removed, kept, failed, notes

    def _failures(self):
        if self._failure_logs is None:
            from .failure_logs import FailureLogs

            self._failure_logs = FailureLogs()
        return self._failure_logs

    def _with_failure(self, c, name: str, state: JobState) -> JobState:
        """``state`` with its failure report, when a rank died (one more allocation list)."""
        from .failure_logs import needs_report

        if state is not None and state.failure is None and needs_report(state):
            try:
                allocs, _ = c.job_allocations(name)
                if state.spares is not None:  # hot spares: the ranks as the run's world holds them
                    from .state import world_view
                    from .watchdog import world_of

                    job = next((j for j in c.job_stubs([name]) if j.get("ID") == name), None)
                    allocs = world_view(job, allocs, world_of(c, job))[0]
            except SchedulerError:
                return state
            state.failure = self._failures().report(c, state, allocs)
        return state

    def cancel(self, ids: Sequence[str], purge: bool = False, **opts) -> dict[str, str]:
        """Stop each job, riding out outages (``retry_s``). A job already dead (ended) is left as
        it is, unless ``purge``: returned as {id: its state in words}. Ids Nomad does not know are
        reported after the others are stopped."""
        missing, ended = [], {}
        for c, items in self._by_client(ids):
            for job_id, name in items:
                stopped = c.stop_job(name, purge=purge, retry_s=self.retry_s, on_retry=_say, unless_dead=not purge)
                if stopped is None:
                    ended[job_id] = self._ended_words(job_id)
                elif not stopped:
                    missing.append(job_id)
                elif purge:
                    c.delete_variable(variable_path(name))  # the job's secrets go with it
                    if self._keeper_record((_records_find(job_id, self.name) or [None])[0]):
                        c.delete_variable(keeper_variable_path(name))
        if missing:
            others = " (the others were stopped)" if len(missing) < len(ids) else ""
            raise SchedulerError(f"no Nomad job {', '.join(map(repr, missing))}{others}")
        return ended

    def _ended_words(self, job_id: str) -> str:
        try:
            return self.query([job_id])[job_id].describe()
        except HaloError:
            return "dead"

    def guard_placement(self, spec: JobSpec, job_id: str,
                        on_change: Callable[[JobState], None] | None = None,
                        outage_s: float | None = None) -> JobState:
        """Right after submit, with ``nomad.placement_timeout_s``: watch until every rank started,
        stopping the job when the timeout passes first (or a rank dies meanwhile). Nomad
        unreachable is waited through for ``outage_s`` (halo_sched/outage.py, as :meth:`wait`):
        whether the job placed is judged once Nomad answers again; past the budget,
        OutcomeUnknown (exit 3)."""
        timeout = spec.nomad.placement_timeout_s
        if timeout is None:
            return super().guard_placement(spec, job_id, on_change, outage_s)
        from ...outage import Outage
        from .watchdog import watch_job

        c, name = self._split(job_id)
        res = watch_job(c, name, placement_timeout_s=timeout, until_placed=True,
                        on_change=_with_id(on_change, job_id), outage=Outage(self.name, job_id, outage_s))
        if res.timed_out:
            _say(res.describe())
        res.state.id = job_id
        state = self._with_failure(c, name, res.state)
        self._forget_secrets_if_ended(c, job_id, name, state)
        return state

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change: Callable[[JobState], None] | None = None,
             on_tick: Callable[[JobState], None] | None = None,
             outage_s: float | None = None,
             on_outage: Callable[[str], None] | None = None) -> JobState:
        """Until the job ends, through blocking queries; a rank that dies while others run or
        wait gets the job stopped at once (``reason`` names the rank that died first). Nomad
        unreachable (no connection, no leader) is waited through for ``outage_s`` seconds
        (halo_sched/outage.py), then OutcomeUnknown."""
        from ...outage import Outage
        from .watchdog import watch_job

        c, name = self._split(job_id)
        res = watch_job(c, name, timeout=timeout, on_change=_with_id(on_change, job_id),
                        on_tick=_with_id(on_tick, job_id), poll_s=poll,
                        outage=Outage(self.name, job_id, outage_s, on_outage))
        res.state.id = job_id
        state = self._with_failure(c, name, res.state)
        if res.stopped and state.failure is not None:
            # The state's text now leads with the first failure; say what the watcher did too.
            _say(res.stop_reason)
        self._forget_secrets_if_ended(c, job_id, name, state)
        return state

    def read_result(self, job_id: str, record: dict | None = None) -> bytes | None:
        """Rank 0's result file in node 0's newest allocation (names.RESULT_PATH), read through
        the client's fs/cat (the token needs read-fs). None when the task directory is there
        without it; SchedulerError when the client cannot serve that directory."""
        from ...node.result import MAX_BYTES, ResultError
        from .names import RESULT_PATH
        from .state import latest_allocations

        # One bounded attempt per request, as list's (a reader must not wait out an outage for it).
        c, name = self.for_listing()._split(job_id)
        if not isinstance(c, ReadsAllocFiles):
            raise ResultError("not carried: this Nomad client cannot read an allocation's files")
        got = c.job_allocations(name)[0]
        if len({a.get("JobVersion") for a in got}) > 1:  # the job has run more than one version
            got = _own_allocations(c, c.read_job(name), got)
        first = latest_allocations(got).get(0)
        if first is None or not isinstance(first.get("ID"), str):
            raise ResultError("not read: Nomad keeps no allocation of node 0 (garbage-collected, or it never "
                              "placed): its result went with it")
        data = c.fs_cat(first["ID"], RESULT_PATH, MAX_BYTES + 1, 10.0)
        if data is None and c.fs_list(first["ID"], RESULT_PATH.rpartition("/")[0]) is None:
            # Not even its directory: the client cannot serve the allocation now (or ever again).
            raise SchedulerError(f"Nomad's client did not serve node 0's files of job {job_id} (allocation "
                                 "garbage-collected, a token without read-fs, or the client unreachable)")
        return data

    #: A task's stdout and stderr are two streams of Nomad's log API (``logs --stream``).
    log_fields = frozenset({"stream"})

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """Every node rank's output, each line tagged ``[node K]``. A node whose output Nomad no
        longer keeps (or does not have yet) is named at the end, in one line, after the others'."""
        from .state import latest_allocations

        c, name = self._split(job_id)
        got = c.job_allocations(name)[0]
        job = None
        if len({a.get("JobVersion") for a in got}) > 1:  # the job has run more than one version
            job = c.read_job(name)
            got = _own_allocations(c, job, got)
        if any(a.get("TaskGroup") == KEEPER_GROUP for a in got):  # hot spares: the ranks as the world holds them
            from .state import world_view
            from .watchdog import world_of

            job = job or c.read_job(name)
            got = world_view(job, got, world_of(c, job))[0]
        allocs = latest_allocations(got)
        if not allocs:
            state = self._state_or_none(job_id)
            if state is not None and state.status.terminal:
                raise SchedulerError(f"job {job_id} ended ({state.status.value}) and Nomad no longer keeps its "
                                     "allocations (garbage-collected): its output is gone")
            raise SchedulerError(f"job {job_id} has no allocation yet"
                                 + (f" ({state.status.value})" if state is not None else "") + ": no output yet")
        tagged = {f"[node {rank}] ": allocs[rank] for rank in sorted(allocs)}
        if follow:
            # One stream per node and kind, merged line by line as they arrive.
            yield from self._follow_all(c, tagged, job_id)
            return
        missing: dict[str, list[int]] = {}
        for rank in sorted(allocs):
            alloc = allocs[rank]
            for kind in ("stdout", "stderr"):
                try:
                    stream = c.logs(alloc["ID"], TASK, type=kind, follow=False)
                except SchedulerError as err:
                    if getattr(err, "status", None) != 404:
                        raise
                    missing.setdefault(_why_no_output(alloc, getattr(err, "body", "")), []).append(rank)
                    break
                yield from _prefixed(f"[node {rank}] ", stream, kind)
        if missing:
            raise SchedulerError("; ".join(f"node{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {why}"
                                           for why, r in missing.items()))

    def _state_or_none(self, job_id: str) -> JobState | None:
        try:
            return self.query([job_id])[job_id]
        except HaloError:
            return None

    def _follow_all(self, c, allocs: dict, job_id: str = "job") -> Iterator[str]:
        """Every stream (node rank x stdout/stderr) at once, merged line by line. Nomad's log API
        is Nomad itself: a stream that breaks because Nomad cannot be reached (a server restart,
        no leader) is opened again where it stopped (``offset``: the bytes shown so far) for the
        outage budget (halo_sched/outage.py, one line per interval for all streams); past it,
        or on any other error, the stream ends with one line saying why."""
        import queue
        import threading

        from ...outage import RETRY_EVERY_S, Outage

        q: queue.Queue = queue.Queue()
        done = object()
        lock = threading.Lock()
        outage = Outage(self.name, job_id)

        def chunks(alloc_id: str, kind: str) -> Iterator[str]:
            sent = 0  # bytes of this stream shown so far: where a reopened stream starts
            while True:
                asked = time.monotonic()
                try:
                    for text in c.logs(alloc_id, TASK, type=kind, follow=True, offset=sent):
                        with lock:
                            outage.ok()
                        sent += len(text.encode("utf-8"))
                        yield text
                    return
                except SchedulerError as err:
                    if not _resumable(err):
                        raise
                    with lock:
                        outage.failed(err, asked)  # OutcomeUnknown once the budget is spent
                    time.sleep(RETRY_EVERY_S)

        def pump(tag: str, alloc_id: str, kind: str) -> None:
            try:
                for line in _prefixed(tag, chunks(alloc_id, kind), kind):
                    q.put(line)
            except SchedulerError as err:  # OutcomeUnknown (the budget spent) included
                q.put(f"{tag}halo-sched: log stream ended: {err}\n")
            finally:
                q.put(done)

        threads = [threading.Thread(target=pump, args=(g, a["ID"], k), daemon=True)
                   for g, a in allocs.items() for k in ("stdout", "stderr")]
        for t in threads:
            t.start()
        remaining = len(threads)
        while remaining:
            item = q.get()
            if item is done:
                remaining -= 1
            else:
                yield item


def _resumable(err: BaseException) -> bool:
    """A log stream failed because Nomad could not be reached or the stream broke midway (no
    HTTP answer, not TLS): opening it again where it stopped is safe."""
    from ...outage import is_outage

    if is_outage(err):
        return True
    if getattr(err, "status", 0) is not None:
        return False
    try:
        import requests
    except ImportError:  # pragma: no cover
        return False
    cause = err.__cause__
    return isinstance(cause, requests.RequestException) and not isinstance(cause, requests.exceptions.SSLError)


def _why_no_output(alloc: dict, said: str) -> str:
    """Why Nomad answered 404 for an allocation's logs (client/fs_endpoint.go, v2.0.5): the task
    has not started, or the allocation's files are gone (the client or the server garbage-collected
    it after it ended)."""
    if "not started" in said:
        return "no output yet (its task has not started)"
    status = alloc.get("ClientStatus") or ""
    if status in ("complete", "failed", "lost"):
        return f"output gone (allocation {status}; Nomad has removed its files)"
    return "output gone (Nomad no longer has the allocation's files)"


def _with_id(callback: Callable[[JobState], None] | None, job_id: str) -> Callable[[JobState], None] | None:
    """``callback`` seeing states under the id the user holds (``[REGION:][NAMESPACE/]ID``)."""
    if callback is None:
        return None

    def call(state: JobState) -> None:
        state.id = job_id
        callback(state)

    return call


def _prefixed(prefix: str, chunks, kind: str | None = None) -> Iterator[str]:
    """Split a stream of text chunks into whole lines, each with ``prefix`` (and, given ``kind``,
    carrying which stream it came from: ``logs --stream``)."""
    from ...logtags import Raw

    buf = ""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            yield Raw(f"{prefix}{line}\n", stream=kind)
    if buf:
        yield Raw(f"{prefix}{buf}\n", stream=kind)
