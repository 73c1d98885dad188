"""The Nomad backend: render (``render.py``), talk to the API (``client.py``), fold what Nomad
says into a state (``state.py``), explain a plan (``plan.py``), and watch a job, stopping it when a
rank dies or it does not place in time (``watchdog.py``). This class only joins them.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Callable, Iterator, Sequence

from ...errors import SchedulerError, UsageError
from ...models import JobSpec
from ..base import DryRun, JobState, Scheduler
from .render import TASK, client_requirements, job_payload, render_hcl, submission_id, variable_path

_ID_RE = re.compile(r"^(?:([A-Za-z0-9_-]+):)?(?:([A-Za-z0-9_-]+)/)?([A-Za-z0-9][A-Za-z0-9_.-]*)\Z")


def _say(msg: str) -> None:
    print(f"halo-sched: {msg}", file=sys.stderr, flush=True)


class NomadScheduler(Scheduler):
    """Each submission gets a fresh Nomad job ID (``NAME-YYYYmmdd-HHMMSS-xxxxxx``). The id halo-sched
    reports is ``[REGION:][NAMESPACE/]ID`` when the job file names a region or namespace, so that
    ``status``/``logs``/``cancel`` reach the right place from the id alone."""

    name = "nomad"

    def __init__(self, client=None, retry_s: float | None = None):
        self._client = client  # one client for every namespace/region (tests, embedding)
        self.retry_s = retry_s  # submit/cancel ride out outages this long (None: HALO_SUBMIT_RETRY_S or 120 s)
        self._scoped: dict[tuple, object] = {}
        self._failure_logs = None  # FailureLogs, built on the first failure seen

    def watch_key(self):
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

            self._scoped[key] = NomadClient(NomadConfig.from_env(namespace=namespace, region=region))
        return self._scoped[key]

    def _split(self, job_id: str):
        m = _ID_RE.match(job_id)
        if not m:
            raise UsageError(f"{job_id!r} is not a Nomad job id ([REGION:][NAMESPACE/]ID)")
        region, namespace, name = m.groups()
        return self._client_for(namespace, region), name

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
        payload["Job"]["Meta"][TOKEN_META] = new_token()
        # --dry-run shows exactly the payload that would be sent.
        return DryRun(self.name, spec, json.dumps(payload, indent=2, ensure_ascii=False) + "\n", payload)

    # ---- scheduler calls ----------------------------------------------------------------------

    def _preflight(self, client, spec: JobSpec, payload: dict) -> None:
        """On stderr: features the server is too old for, and the client settings the job needs
        (neither shows in Nomad's own plan)."""
        from .plan import version_warnings

        try:
            version_lines = version_warnings(payload["Job"], client.server_version())
        except SchedulerError as err:
            # That line says why; version_warnings(None) would blame the token's permissions.
            version_lines = [f"could not read the Nomad server version: {err}"]
        for line in version_lines:
            _say(f"warning: {line}")
        for line in client_requirements(spec):
            _say(f"every Nomad client that may run this job needs: {line}")

    def schedule(self, dryrun: DryRun) -> str:
        nm = dryrun.spec.nomad
        client = self._client_for(nm.namespace, nm.region)
        secrets = dryrun.spec.secret_values()  # a missing one is a SpecError before any request
        self._preflight(client, dryrun.spec, dryrun.payload)
        from .client import TOKEN_META

        token = dryrun.payload["Job"]["Meta"][TOKEN_META]
        if secrets:
            # Before the job exists: its tasks read the Variable once, when they start.
            client.put_variable(variable_path(dryrun.payload["Job"]["ID"]), secrets, retry_s=self.retry_s,
                                on_retry=_say)
        resp = client.submit_job(dryrun.payload, token, retry_s=self.retry_s, on_retry=_say) or {}
        if resp.get("found_after_retry"):
            _say(f"the job was registered by an earlier attempt (token {token}); not registering it again")
        warnings = resp.get("Warnings") or ""
        for w in warnings.splitlines():
            if w.strip():
                _say(f"nomad warning: {w.strip()}")
        # Where the job really went: the job file's namespace/region, else NOMAD_NAMESPACE/REGION.
        cfg = getattr(client, "config", None)
        region = nm.region or getattr(cfg, "region", None)
        namespace = nm.namespace or getattr(cfg, "namespace", None)
        job_id = dryrun.payload["Job"]["ID"]
        return f"{region + ':' if region else ''}{namespace + '/' if namespace else ''}{job_id}"

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        m = _ID_RE.match(job_id)
        region, namespace, name = m.groups() if m else (None, None, job_id)
        return {"scheduler": {"region": region, "namespace": namespace, "job": name}}

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        from .plan import format_plan, plan_summary

        client = self._client_for(spec.nomad.namespace, spec.nomad.region)
        # A fresh ID, as submit would use: planning under the job's name would diff against
        # whatever job of that name is already there.
        payload = job_payload(spec, submission_id(spec))
        self._preflight(client, spec, payload)
        resp = client.plan(payload)
        groups = plan_summary(resp)
        return all(g.can_place for g in groups), format_plan(resp, spec.name)

    def _by_client(self, ids: Sequence[str]) -> list[tuple[object, list[tuple[str, str]]]]:
        """The ids grouped by the client (namespace/region) that reaches them: [(client, [(id, name)])]."""
        groups: dict[int, tuple[object, list[tuple[str, str]]]] = {}
        for i in ids:
            c, name = self._split(i)
            groups.setdefault(id(c), (c, []))[1].append((i, name))
        return list(groups.values())

    def describe(self, ids: Sequence[str]) -> dict[str, JobState]:
        """At most three calls per namespace/region, whatever the number of jobs: job stubs,
        allocation stubs, and (only when some rank is unplaced) the evaluations saying why."""
        from .state import job_state

        out = {}
        for c, items in self._by_client(ids):
            names = [name for _, name in items]
            jobs = {j.get("ID"): j for j in c.job_stubs(names)}
            known = [n for n in names if n in jobs]
            allocs: dict[str, list] = {}
            for a in c.allocation_stubs(known) if known else ():
                allocs.setdefault(a.get("JobID"), []).append(a)
            states = {n: job_state(jobs.get(n), allocs.get(n, []), [], n) for n in names}
            unplaced = [n for n in known if states[n].extra["nodes_placed"] < (states[n].nodes_total or 0)]
            evals: dict[str, list] = {}
            for e in c.placement_evaluations(unplaced) if unplaced else ():
                evals.setdefault(e.get("JobID"), []).append(e)
            for i, name in items:
                st = job_state(jobs.get(name), allocs.get(name, []), evals.get(name, []), i)
                # Which rank failed first: the failure lines in the dead allocations' logs.
                st.failure = self._failures().report(c, st, allocs.get(name, []))
                out[i] = st
        return out

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
            except SchedulerError:
                return state
            state.failure = self._failures().report(c, state, allocs)
        return state

    def cancel(self, ids: Sequence[str], purge: bool = False, **opts) -> None:
        """Stop each job, riding out outages (``retry_s``); a job already stopped or finished
        counts as cancelled. Ids Nomad does not know are reported after the others are stopped."""
        missing = []
        for c, items in self._by_client(ids):
            for job_id, name in items:
                if not c.stop_job(name, purge=purge, retry_s=self.retry_s, on_retry=_say):
                    missing.append(job_id)
                elif purge:
                    c.delete_variable(variable_path(name))  # the job's secrets go with it
        if missing:
            others = " (the others were stopped)" if len(missing) < len(ids) else ""
            raise SchedulerError(f"no Nomad job {', '.join(map(repr, missing))}{others}")

    def watch(self, spec: JobSpec, job_id: str, on_progress: Callable[[JobState], None] | None = None) -> JobState:
        """Right after submit, with ``nomad.placement_timeout_s``: watch until every rank started,
        stopping the job when the timeout passes first (or a rank dies meanwhile)."""
        timeout = spec.nomad.placement_timeout_s
        if timeout is None:
            return super().watch(spec, job_id, on_progress)
        from .watchdog import watch_job

        c, name = self._split(job_id)
        res = watch_job(c, name, placement_timeout_s=timeout, until_placed=True,
                        on_change=_with_id(on_progress, job_id))
        if res.timed_out:
            _say(res.describe())
        res.state.id = job_id
        return self._with_failure(c, name, res.state)

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change: Callable[[JobState], None] | None = None,
             on_tick: Callable[[JobState], None] | None = None) -> JobState:
        """Until the job ends, through blocking queries; a rank that dies while others run or
        wait gets the job stopped at once (``reason`` names the rank that died first)."""
        from .watchdog import watch_job

        c, name = self._split(job_id)
        res = watch_job(c, name, timeout=timeout, on_change=_with_id(on_change, job_id),
                        on_tick=_with_id(on_tick, job_id), poll_s=poll)
        res.state.id = job_id
        state = self._with_failure(c, name, res.state)
        if res.stopped and state.failure is not None:
            # The state's text now leads with the first failure; say what the watcher did too.
            _say(res.stop_reason)
        return state

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """Every node rank's output, each line tagged ``[node K]``."""
        from .state import latest_allocations

        c, name = self._split(job_id)
        allocs = latest_allocations(c.job_allocations(name)[0])
        if not allocs:
            raise SchedulerError(f"job {job_id!r} has no allocations (yet): nothing to show")
        tagged = {f"[node {rank}] ": allocs[rank] for rank in sorted(allocs)}
        if follow:
            # One stream per node and kind, merged line by line as they arrive.
            yield from self._follow_all(c, tagged)
            return
        for tag, alloc in tagged.items():
            for kind in ("stdout", "stderr"):
                yield from _prefixed(tag, c.logs(alloc["ID"], TASK, type=kind, follow=follow))

    def _follow_all(self, c, allocs: dict) -> Iterator[str]:
        import queue
        import threading

        q: queue.Queue = queue.Queue()
        done = object()

        def pump(tag: str, alloc_id: str, kind: str) -> None:
            try:
                for line in _prefixed(tag, c.logs(alloc_id, TASK, type=kind, follow=True)):
                    q.put(line)
            except SchedulerError as err:
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


def _with_id(callback: Callable[[JobState], None] | None, job_id: str) -> Callable[[JobState], None] | None:
    """``callback`` seeing states under the id the user holds (``[REGION:][NAMESPACE/]ID``)."""
    if callback is None:
        return None

    def call(state: JobState) -> None:
        state.id = job_id
        callback(state)

    return call


def _prefixed(prefix: str, chunks) -> Iterator[str]:
    """Split a stream of text chunks into whole lines, each with ``prefix``."""
    buf = ""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            yield f"{prefix}{line}\n"
    if buf:
        yield f"{prefix}{buf}\n"
