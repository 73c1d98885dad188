"""The ranks' progress on Nomad, read through the API while a job runs: Nomad has no filesystem the
submitter shares with the nodes, but its clients serve an allocation's files (``fs/ls`` and
``fs/cat``, paths relative to the allocation directory; the token needs read-fs).

The trainer task sets ``HALO_LOG_DIR`` to ``${NOMAD_TASK_DIR}/halo-logs`` (groups.py), so each
node's entry script keeps its progress files at ``torchrun/local/halo-logs/node-K/progress/rank-R``
(the 4 KiB ring of progress.py) and ``rank-R.history`` in its allocation. One bounded pass copies
them into a local directory laid out as a local job's log root, which ``stragglers.read`` and
``timeline.progress_files`` read unchanged. Every failure (a client that does not answer within
the pass's time, 404, 403) reads as "no progress there", never as an error. No torch.
"""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from .capabilities import ReadsAllocFiles
from .names import TASK

#: Inside the task directory (Nomad's ``NOMAD_TASK_DIR`` is its ``local/``).
LOG_DIR_IN_TASK = "${NOMAD_TASK_DIR}/halo-logs"
#: The same, relative to the allocation directory, as fs/ls and fs/cat take it.
LOG_DIR = f"{TASK}/local/halo-logs"
#: The ring (progress.py keeps it under 4 KiB) and the history (a line every few seconds).
RING_MAX = 16 * 1024
HISTORY_MAX = 1024 * 1024
#: One status pass, all allocations together; one request.
PASS_S = 5.0
REQUEST_S = 2.0
MAX_RANKS = 1024

_NODE = re.compile(r"node-\d{1,6}")
_RANK = re.compile(r"rank-\d{1,7}(?:\.left)?|links")  # the ring, the times out of the collective, the links
_HISTORY = re.compile(r"rank-\d{1,7}\.history")


def snapshot(client, allocs: list[dict], dest: Path, *, history: bool = False, running_only: bool = True,
             deadline: float | None = None) -> int:
    """Copy the progress files of ``allocs`` (stubs) into ``dest/node-K/progress/``; the number
    of files copied. Only names that are a node's or a rank's are used (nothing a file name in the
    allocation says can reach outside ``dest``). Stops at ``deadline`` (time.monotonic())."""
    if not isinstance(client, ReadsAllocFiles):
        return 0
    deadline = time.monotonic() + PASS_S if deadline is None else deadline
    copied = 0
    # Oldest first: a replacement allocation of the same node rank overwrites what its
    # predecessor left.
    for alloc in sorted(allocs, key=lambda a: a.get("CreateIndex") or 0):
        alloc_id = alloc.get("ID")
        if not isinstance(alloc_id, str) or not alloc_id:
            continue
        if running_only and alloc.get("ClientStatus") != "running":
            continue
        if alloc.get("ClientStatus") == "lost" or TASK not in (alloc.get("TaskStates") or {TASK: None}):
            continue
        for node in _names(client, alloc_id, LOG_DIR, _NODE, deadline, dirs=True):
            where = f"{LOG_DIR}/{node}/progress"
            wanted = [n for n in _names(client, alloc_id, where, _RANK, deadline)]
            if history:
                wanted += _names(client, alloc_id, where, _HISTORY, deadline)
            for name in wanted[:MAX_RANKS]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return copied
                data = client.fs_cat(alloc_id, f"{where}/{name}",
                                     HISTORY_MAX if name.endswith(".history") else RING_MAX, min(REQUEST_S, left))
                if data:
                    out = dest / node / "progress"
                    try:
                        out.mkdir(parents=True, exist_ok=True)
                        (out / name).write_bytes(data)
                    except OSError:  # a full disk here: no progress line, not an error
                        return copied
                    copied += 1
    return copied


def _names(client, alloc_id: str, path: str, pattern: re.Pattern, deadline: float, dirs: bool = False) -> list[str]:
    left = deadline - time.monotonic()
    if left <= 0:
        return []
    entries = client.fs_list(alloc_id, path, min(REQUEST_S, left)) or []
    return sorted(e["Name"] for e in entries
                  if isinstance(e.get("Name"), str) and pattern.fullmatch(e["Name"]) and bool(e.get("IsDir")) == dirs)


def stragglers_line(client, allocs: list[dict], deadline: float | None = None) -> str:
    """Each node's step and step time and the slowest rank (as a local job's ``status`` shows
    them), from the running allocations' ring files; empty when none could be read."""
    from ...node import stragglers

    with tempfile.TemporaryDirectory(prefix="halo-nomad-progress.") as tmp:
        if not snapshot(client, allocs, Path(tmp), deadline=deadline):
            return ""
        return stragglers.line(Path(tmp))


#: Copies kept for a timeline while it is drawn (removed when the process ends).
_KEPT: list[tempfile.TemporaryDirectory] = []


def timeline_root(client, allocs: list[dict]) -> Path | None:
    """A local copy of every allocation's ring and history files (ended ones too, while their
    client keeps them), for ``timeline``; None when nothing could be read."""
    tmp = tempfile.TemporaryDirectory(prefix="halo-nomad-timeline.")
    if not snapshot(client, allocs, Path(tmp.name), history=True, running_only=False,
                    deadline=time.monotonic() + 3 * PASS_S):
        tmp.cleanup()
        return None
    _KEPT.append(tmp)
    return Path(tmp.name)
