"""The node runtime as one versioned file: the modules the nodes run (``halo_sched.node.CARRIED``)
in one zip, the same bytes at every render of the same tree.

A node runs them from its own halo-sched when that install's ``runtime_version()`` is the job's;
else from this zip, which the job carries once: base64 after the end of the SLURM batch script,
in the job's Nomad Variable (one per job, read by a small template in each task), a file of the
local job's directory. The entry script inflates it and checks the zip's SHA-256 before it imports
anything from it (halo_sched/templates/fragments.sh.j2, load_runtime). What a site needs: docs/node-runtime.md.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import tokenize
import zipfile
import zlib
from typing import NamedTuple

from . import node

#: The Variable item / file / batch-script section that carries the zip, base64.
ITEM = "halo_node_runtime"
#: The item of the keeper's Nomad Variable that carries its copy (:func:`keeper_runtime`).
KEEPER_ITEM = "halo_keeper_runtime"
#: The Nomad Variable item that carries the rollout servers' shell (:func:`server_shell`) as text.
SERVER_ITEM = "halo_server_shell"
#: A fixed date for every member: the zip's bytes depend on the files' contents alone.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_LINE = 76  # base64 line length (as `base64` writes it)


class NodeRuntime(NamedTuple):
    version: str  # halo_sched.node.runtime_version()
    sha256: str  # of the zip's bytes
    zip_bytes: bytes

    @property
    def base64(self) -> str:
        """The zip, compressed as one zlib stream, in base64, one line: the members are stored, so
        that one stream compresses them together (12% less than a deflated zip; zipimport reads
        stored members, and zlib is in every python the nodes run)."""
        return _packed(self.zip_bytes)

    def base64_lines(self) -> str:
        """The zip in base64, in lines of 76 characters (no final newline)."""
        text = self.base64
        return "\n".join(text[i:i + _LINE] for i in range(0, len(text), _LINE))


@functools.lru_cache(maxsize=2)
def runtime(batch: bool = True) -> NodeRuntime:
    """The node runtime of this install: ``halo_sched/__init__.py`` (empty, so that importing
    ``halo_sched.node`` from the zip loads nothing of the submitter's side) and every carried module
    under ``halo_sched/node/``, stored, in a fixed order with fixed dates, its Python without
    comments (:func:`_without_comments`: the same code in fewer bytes, for the one srun argument
    a SLURM job hands each node it in). ``batch=False``: without what only a SLURM batch shell
    runs (``node.BATCH_ONLY``), the copy a Nomad job's Variable carries; the version is the same
    (it names the code, not the copy)."""
    if batch:
        return _zip(tuple(n for n in node.CARRIED if n not in node.KEEPER_ONLY + node.NOMAD_ONLY), strip=True)
    return _zip(tuple(n for n in node.CARRIED if n not in node.BATCH_ONLY + node.KEEPER_ONLY), strip=True)


@functools.lru_cache(maxsize=1)
def keeper_runtime() -> NodeRuntime:
    """The copy a Nomad run's keeper runs from (``node.KEEPER``, without comments): carried in a
    Variable of its own (:data:`KEEPER_ITEM`), the trainer's copy and the job's secrets fill theirs."""
    return _zip(node.KEEPER, strip=True)


def checksums() -> str:
    """The SHA-256s an entry script accepts for a carried copy: the whole runtime's and the
    Nomad copy's, so that the entry stays byte-identical on every backend."""
    return f"{runtime().sha256} {runtime(batch=False).sha256}"


def _without_comments(source: bytes) -> bytes:
    """``source`` with each comment cut from its line, every line kept where it was: the same code
    (its syntax tree, line numbers included: tests/test_node_runtime.py), in the fewer bytes that a
    Nomad job's Variable, 64 KiB with the job's secrets, has room for."""
    lines = source.decode("utf-8").splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            line = lines[row - 1]
            lines[row - 1] = line[:col].rstrip() + line[len(line.rstrip("\r\n")):]
    return "".join(lines).encode("utf-8")


def _zip(names, strip: bool = False) -> NodeRuntime:
    here = node.source_path("__init__").parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        members = [("halo_sched/__init__.py", b'"""halo-sched\'s node runtime (halo_sched/node/), carried by a job."""\n')]
        members += [(f"halo_sched/node/{name}", here.joinpath(name).read_bytes()) for name in names]
        if strip:
            members = [(n, _without_comments(d) if n.endswith(".py") else d) for n, d in members]
        for name, data in members:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            z.writestr(info, data, zipfile.ZIP_STORED)
    data = buf.getvalue()
    return NodeRuntime(node.runtime_version(), hashlib.sha256(data).hexdigest(), data)


@functools.lru_cache(maxsize=4)
def _packed(zip_bytes: bytes) -> str:
    return base64.b64encode(zlib.compress(zip_bytes, 9)).decode("ascii")


def server_shell() -> str:
    """The rollout servers' job-free shell (halo_sched/node/server.sh, one of the carried files):
    pure bash, so it reaches a server node as text, never as a module (docs/node-runtime.md)."""
    return node.source_path("__init__").parent.joinpath("server.sh").read_text()
