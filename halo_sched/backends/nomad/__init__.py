"""The Nomad backend: render (``render.py``), talk to the API (``client.py``), read state
(``status.py``). This class only joins them.

Nomad places groups independently (no gang scheduling), so ``submit --wait`` with
``nomad.placement_timeout_s`` runs a placement watchdog that stops a half-placed job.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Callable, Iterator, Sequence

from ...errors import SchedulerError, UsageError
from ...spec import JobSpec
from ..base import DryRun, JobState, Scheduler
from .render import TASK, job_payload, render_hcl, submission_id

_ID_RE = re.compile(r"^(?:([A-Za-z0-9_-]+):)?(?:([A-Za-z0-9_-]+)/)?([A-Za-z0-9][A-Za-z0-9_.-]*)$")


class NomadScheduler(Scheduler):
    """Each submission gets a fresh Nomad job ID (``NAME-YYYYmmdd-HHMMSS-xxxxxx``). The id halo-sched
    reports is ``[REGION:][NAMESPACE/]ID`` when the job file names a region or namespace, so that
    ``status``/``logs``/``cancel`` reach the right place from the id alone."""

    name = "nomad"

    def __init__(self, client=None):
        self._client = client  # one client for every namespace/region (tests, embedding)
        self._scoped: dict[tuple, object] = {}

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
        payload = job_payload(spec, submission_id(spec))
        # --dry-run shows exactly the payload that would be sent.
        return DryRun(self.name, spec, json.dumps(payload, indent=2, ensure_ascii=False) + "\n", payload)

    # ---- scheduler calls ----------------------------------------------------------------------

    def schedule(self, dryrun: DryRun) -> str:
        nm = dryrun.spec.nomad
        client = self._client_for(nm.namespace, nm.region)
        resp = client.register(dryrun.payload) or {}
        warnings = resp.get("Warnings") or ""
        for w in warnings.splitlines():
            if w.strip():
                print(f"halo-sched: nomad warning: {w.strip()}", file=sys.stderr)
        # Where the job really went: the job file's namespace/region, else NOMAD_NAMESPACE/REGION.
        cfg = getattr(client, "config", None)
        region = nm.region or getattr(cfg, "region", None)
        namespace = nm.namespace or getattr(cfg, "namespace", None)
        job_id = dryrun.payload["Job"]["ID"]
        return f"{region + ':' if region else ''}{namespace + '/' if namespace else ''}{job_id}"

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        from .status import format_plan, plan_summary

        resp = self._client_for(spec.nomad.namespace, spec.nomad.region).plan(job_payload(spec))
        groups = plan_summary(resp)
        return all(g.can_place for g in groups), format_plan(resp, spec.name)

    def describe(self, ids: Sequence[str]) -> dict[str, JobState]:
        from .status import job_state

        out = {}
        for i in ids:
            c, name = self._split(i)
            job = c.job(name)
            if job is None:  # one unknown id must not hide the others' states
                out[i] = job_state(None, [], [], i)
            else:
                out[i] = job_state(job, c.allocations(name), c.evaluations(name), i)
        return out

    def cancel(self, ids: Sequence[str], purge: bool = False, **opts) -> None:
        missing = []
        for job_id in ids:
            c, name = self._split(job_id)
            if c.job(name) is None:
                missing.append(job_id)
                continue
            c.stop(name, purge=purge)
        if missing:
            others = " (the others were stopped)" if len(missing) < len(ids) else ""
            raise SchedulerError(f"no Nomad job {', '.join(map(repr, missing))}{others}")

    def watch(self, spec: JobSpec, job_id: str, on_progress: Callable[[JobState], None] | None = None) -> JobState:
        timeout = spec.nomad.placement_timeout_s
        if timeout is None:
            return super().watch(spec, job_id, on_progress)
        from .status import watch_placement

        c, name = self._split(job_id)
        res = watch_placement(c, name, spec.nodes, timeout, on_progress=on_progress)
        if not res.placed:
            print(f"halo-sched: {res.describe()}", file=sys.stderr)
        if res.state is None:
            return self.describe([job_id])[job_id]
        res.state.id = job_id
        return res.state

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        from .status import latest_allocations

        c, name = self._split(job_id)
        allocs = latest_allocations(c.allocations(name))
        if not allocs:
            raise SchedulerError(f"job {job_id!r} has no allocations (yet): nothing to show")
        if follow:
            # One stream per node and kind, merged line by line as they arrive.
            yield from self._follow_all(c, allocs)
            return
        for group, alloc in allocs.items():
            for kind in ("stdout", "stderr"):
                yield from _prefixed(f"[{group}] ", c.logs(alloc["ID"], TASK, type=kind, follow=follow))

    def _follow_all(self, c, allocs: dict) -> Iterator[str]:
        import queue
        import threading

        q: queue.Queue = queue.Queue()
        done = object()

        def pump(group: str, alloc_id: str, kind: str) -> None:
            try:
                for line in _prefixed(f"[{group}] ", c.logs(alloc_id, TASK, type=kind, follow=True)):
                    q.put(line)
            except SchedulerError as err:
                q.put(f"[{group}] halo-sched: log stream ended: {err}\n")
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
