"""The Nomad backend: render (``render.py``), talk to the API (``client.py``), read state
(``status.py``). This class only joins them.

Nomad places groups independently (no gang scheduling), so ``submit --wait`` with
``nomad.placement_timeout_s`` runs a placement watchdog that stops a half-placed job.
"""
from __future__ import annotations

import json
import sys
from typing import Callable, Iterator, Sequence

from ...errors import SchedulerError, UsageError
from ...spec import JobSpec
from ..base import DryRun, JobState, Scheduler
from .render import TASK, job_payload, render_hcl


class NomadScheduler(Scheduler):
    name = "nomad"

    def __init__(self, client=None):
        self._client = client

    @property
    def client(self):
        # Built on first use: rendering needs no connection (nor requests' import time).
        if self._client is None:
            from .client import NomadClient

            self._client = NomadClient()
        return self._client

    # ---- rendering ----------------------------------------------------------------------------

    def render(self, spec: JobSpec, format: str = "hcl", **opts) -> str:  # noqa: A002
        if format == "hcl":
            return render_hcl(spec)
        if format == "json":
            return json.dumps(job_payload(spec), indent=2, ensure_ascii=False) + "\n"
        raise UsageError(f"unknown Nomad format {format!r}: use hcl or json")

    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        payload = job_payload(spec)
        # --dry-run shows exactly the payload that would be sent.
        return DryRun(self.name, spec, json.dumps(payload, indent=2, ensure_ascii=False) + "\n", payload)

    # ---- scheduler calls ----------------------------------------------------------------------

    def schedule(self, dryrun: DryRun) -> str:
        resp = self.client.register(dryrun.payload) or {}
        warnings = resp.get("Warnings") or ""
        for w in warnings.splitlines():
            if w.strip():
                print(f"halo-sched: nomad warning: {w.strip()}", file=sys.stderr)
        return dryrun.payload["Job"]["ID"]

    def plan(self, spec: JobSpec) -> tuple[bool, str]:
        from .status import format_plan, plan_summary

        resp = self.client.plan(job_payload(spec))
        groups = plan_summary(resp)
        return all(g.can_place for g in groups), format_plan(resp, spec.name)

    def describe(self, ids: Sequence[str]) -> dict[str, JobState]:
        from .status import job_state

        c = self.client
        return {i: job_state(c.job(i), c.allocations(i), c.evaluations(i), i) for i in ids}

    def cancel(self, ids: Sequence[str], purge: bool = False, **opts) -> None:
        for job_id in ids:
            if self.client.job(job_id) is None:
                raise SchedulerError(f"no Nomad job {job_id!r}")
            self.client.stop(job_id, purge=purge)

    def watch(self, spec: JobSpec, job_id: str, on_progress: Callable[[JobState], None] | None = None) -> JobState:
        timeout = spec.nomad.placement_timeout_s
        if timeout is None:
            return super().watch(spec, job_id, on_progress)
        from .status import watch_placement

        res = watch_placement(self.client, job_id, spec.nodes, timeout, on_progress=on_progress)
        if not res.placed:
            print(f"halo-sched: {res.describe()}", file=sys.stderr)
        return res.state if res.state is not None else self.describe([job_id])[job_id]

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        from .status import latest_allocations

        allocs = latest_allocations(self.client.allocations(job_id))
        if not allocs:
            raise SchedulerError(f"job {job_id!r} has no allocations (yet): nothing to show")
        if follow and len(allocs) > 1:
            # One stream per node, merged line by line as they arrive.
            yield from self._follow_all(allocs)
            return
        for group, alloc in allocs.items():
            for kind in ("stdout", "stderr"):
                yield from _prefixed(f"[{group}] ", self.client.logs(alloc["ID"], TASK, type=kind, follow=follow))

    def _follow_all(self, allocs: dict) -> Iterator[str]:
        import queue
        import threading

        q: queue.Queue = queue.Queue()
        done = object()

        def pump(group: str, alloc_id: str, kind: str) -> None:
            try:
                for line in _prefixed(f"[{group}] ", self.client.logs(alloc_id, TASK, type=kind, follow=True)):
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
