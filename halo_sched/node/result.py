"""The result protocol: how rank 0 hands a small JSON value back to whoever submitted the job.

Every backend exports ``HALO_RESULT_FILE`` on the nodes: a path where the submitter can read the
file afterwards (local: ``result.json`` in the job's directory; SLURM: beside the job's output
file, ``.halo-result/JOB_ID.json``; Nomad: ``halo-result.json`` in node 0's task directory, read
back through the client's ``fs/cat``). Rank 0 writes one JSON document there, at most
:data:`MAX_BYTES` bytes and :data:`MAX_DEPTH` levels deep; ``Run.result().value``,
``halo-sched status --json`` and ``export`` return it (docs/library.md, "Results as values").
That is the whole protocol, and a trainer may follow it without halo-sched on the node::

    if os.environ.get("RANK") == "0" and "HALO_RESULT_FILE" in os.environ:
        open(os.environ["HALO_RESULT_FILE"], "w").write(json.dumps({"loss": 0.21}))

:func:`write` below does the same with the checks: only rank 0 writes (every rank may call it),
the value must be JSON (no NaN, no objects ``json`` cannot write), within the bounds, and it is
replaced atomically, so a reader never sees half a value. The reader (:func:`parse`) trusts
nothing of the file: the submitter's side bounds what it reads, refuses what is not strict JSON
within the bounds, and never executes or evaluates any of it. Standard library only.
"""
from __future__ import annotations

import json
import os

from .contract import NAMES

#: The most bytes of JSON a result may take: a metric, a checkpoint's path, a small table; a
#: larger artefact belongs in a file the value names.
MAX_BYTES = 64 * 1024
#: The deepest nesting of lists and objects a result may have.
MAX_DEPTH = 32
#: The variable that names the file.
VAR = NAMES.result_file


class ResultError(ValueError):
    """A value that cannot be a result (not JSON, too large, nested too deep), or a file that is
    not one; the message says which and by how much."""


def depth(value, limit: int = MAX_DEPTH) -> int:
    """How deep ``value``'s lists and objects nest (a number or text: 0), counted without
    recursion and only up to ``limit + 1``; a number that is not finite (``1e999`` reads as
    infinity) raises :class:`ResultError`."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, float) and (item != item or item in (float("inf"), float("-inf"))):
            raise ResultError("the value holds a number that is not finite (NaN or Infinity is not JSON)")
        if isinstance(item, (list, tuple, dict)):
            level += 1
            deepest = max(deepest, level)
            if level > limit:
                return level
            todo.extend((v, level) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def dumps(value) -> bytes:
    """``value`` as the bytes of a result file: strict JSON (no NaN or Infinity), UTF-8; raises
    :class:`ResultError` naming what is wrong."""
    try:
        too_deep = depth(value) > MAX_DEPTH
    except ResultError as err:
        raise ResultError(f"halo-sched result: {err}") from None
    if too_deep:
        raise ResultError(f"halo-sched result: the value nests deeper than {MAX_DEPTH} levels")
    try:
        data = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as err:  # an object json cannot write, NaN, a lone surrogate
        raise ResultError(f"halo-sched result: the value is not JSON ({err})") from None
    if len(data) > MAX_BYTES:
        raise ResultError(f"halo-sched result: the value is {len(data)} bytes of JSON, more than the "
                          f"{MAX_BYTES} a result may take; write large output to a file and return its path")
    return data


def write(value) -> bool:
    """Hand ``value`` (JSON: numbers, text, lists, dicts) back as the job's result, from rank 0;
    True when written. On any other rank, and outside halo-sched (no ``HALO_RESULT_FILE``), it
    does nothing and returns False, so a trainer calls it unconditionally. A value that is not
    JSON or over the bounds raises :class:`ResultError` (a ValueError) on every rank, so the
    mistake shows wherever it is made. Called again, the last value wins."""
    data = dumps(value)
    path = os.environ.get(VAR)
    if not path or os.environ.get("RANK", "0") != "0":
        return False
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on a shared filesystem, whole before the name points at it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def read_bounded(path) -> bytes | None:
    """The bytes of the result file at ``path`` (at most ``MAX_BYTES + 1``: :func:`parse` says
    "too large"), None when there is none. Only a regular file is read (a FIFO or a device a
    job put there would block or never end; a symlink is not followed); any other problem
    raises :class:`ResultError`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ResultError(f"the result file cannot be read ({err.strerror or err})") from None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultError("the result file is not a regular file")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise ResultError(f"the result file cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse(data: bytes):
    """The value of a result file's bytes, which a job wrote (hostile: bounded, parsed as strict
    JSON only, never evaluated); :class:`ResultError` naming what is wrong: too large, not UTF-8,
    not JSON, NaN or Infinity, nested too deep. Lone surrogates in its text become U+FFFD."""
    if len(data) > MAX_BYTES:
        raise ResultError(f"the result file holds more than {MAX_BYTES} bytes (at most {MAX_BYTES})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ResultError(f"the result file is not UTF-8 text (byte {err.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ResultError(f"the result file's JSON nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # JSONDecodeError, NaN, an integer of too many digits
        raise ResultError(f"the result file is not JSON ({' '.join(str(err).split())[:120]})") from None
    if depth(value) > MAX_DEPTH:
        raise ResultError(f"the result file's JSON nests deeper than {MAX_DEPTH} levels")
    from .text import valid_data

    return valid_data(value)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "ResultError", "VAR", "depth", "dumps", "parse", "read_bounded", "write"]
