"""What a Nomad client may offer beyond the calls every one makes (client.py's NomadClient has
all of them; a client given by the caller, such as a test's stand-in, may not), each declared
once as a :class:`typing.Protocol` and asked with ``isinstance``."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Configured(Protocol):
    """A client that says where it points: ``config.region`` and ``config.namespace``
    (NomadConfig), where a job file names neither."""

    config: Any


@runtime_checkable
class ReadsLogTail(Protocol):
    """A client that reads the end of a task's stdout or stderr (None when it cannot)."""

    def log_tail(self, alloc_id: str, task: str, type: str = "stderr",  # noqa: A002 - Nomad's word
                 nbytes: int = 65536) -> str | None: ...


@runtime_checkable
class ReadsAllocFiles(Protocol):
    """A client that lists and reads an allocation's files (Nomad's fs/ls and fs/cat), bounded:
    None when it cannot (progress.py reads the ranks' progress files with it)."""

    def fs_list(self, alloc_id: str, path: str, timeout_s: float = 2.0) -> list[dict] | None: ...

    def fs_cat(self, alloc_id: str, path: str, max_bytes: int = 65536,
               timeout_s: float = 2.0) -> bytes | None: ...


__all__ = ["Configured", "ReadsAllocFiles", "ReadsLogTail"]
