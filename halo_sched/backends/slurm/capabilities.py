"""What a SLURM transport may do beyond ``submit``/``query``/``cancel``/``job_info``
(transport/base.py), each declared once as a :class:`typing.Protocol`; the backend asks with
``isinstance``. A transport given by the caller (a stand-in, an embedding) may have any of them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from .request import SbatchRequest


@runtime_checkable
class Named(Protocol):
    """A transport with a name for messages (``cli``, ``rest``, ``pyslurm``)."""

    name: str


@runtime_checkable
class SubmitsOnce(Protocol):
    """Submits exactly once through an outage: retries for ``retry_s`` seconds, and after an
    ambiguous failure finds the job by its ``token`` instead of submitting it again."""

    def submit_once(self, request: SbatchRequest, token: str = "", retry_s: float | None = None,
                    on_retry: Callable[[str], None] | None = None) -> str: ...


@runtime_checkable
class CancelsOnce(Protocol):
    """Cancels through an outage (retries for ``retry_s`` seconds)."""

    def cancel_once(self, ids: Sequence[str], retry_s: float | None = None,
                    on_retry: Callable[[str], None] | None = None) -> None: ...


@runtime_checkable
class ReadsConfig(Protocol):
    """Reads ``scontrol show config`` of a cluster (None where it cannot)."""

    def show_config(self, cluster: str | None = None) -> str | None: ...


@runtime_checkable
class TestsOnly(Protocol):
    """Asks ``sbatch --test-only`` whether and when a request would start (None where it cannot)."""

    def test_only(self, request: SbatchRequest) -> tuple[bool, str] | None: ...


@runtime_checkable
class ReadsPartitions(Protocol):
    """Reads the partitions and nodes of a cluster (``scontrol show partition``/``show node``
    records as dicts), so a job file can be checked against them before it is submitted; None
    where it cannot."""

    def partitions(self, cluster: str | None = None) -> tuple[list[dict], list[dict]] | None: ...


__all__ = ["CancelsOnce", "Named", "ReadsConfig", "ReadsPartitions", "SubmitsOnce", "TestsOnly"]


@runtime_checkable
class Lists(Protocol):
    """A transport with a bounded variant for ``list`` (one attempt of each call; cli.py)."""

    def for_listing(self) -> "Lists": ...
