"""Job ids on the command line: without ``--backend``, each id's job record says which backend
it went to (the core knows)."""
from __future__ import annotations

from ..errors import UnknownJob


def resolve_ids(ids, backend: str | None) -> dict[str, list[str]]:
    from ..core import backends_of

    return backends_of(ids, backend)


def resolve_one(job_id: str, backend: str | None) -> str:
    return next(iter(resolve_ids([job_id], backend)))


def refuse_unknown(backend: str, sched, job_id: str) -> None:
    from ..core import unknown_asked

    unknown = unknown_asked(backend, sched, [job_id])
    if unknown:
        raise UnknownJob([job_id], backend, unknown[job_id])
