"""The failure vocabulary, defined once: each failure class with its name, whose fault it is, its
words, the ``retry: on:`` word that retries it and the ``notify: on:`` event it raises; and how a
failed job's first failure is put into one (:func:`classify_failure`). Every other module
imports these (the job file's ``retry.on`` and ``notify.on`` words, the node ledger, a run's
retries, notifications, ``status``); none spells them again.

A **node** fault is one a healthy node would not have had, known from the NODE's side: the
scheduler's word (SLURM ``NODE_FAIL`` or a node it marked down, a Nomad allocation ``lost``), the
node's own evidence (a failure line's ``evidence``: the kernel's Xid log, nvidia-smi, a failed
preflight check), a rank ended by a signal nothing in the job sent (:data:`NODE_SIGNALS`, no OOM
kill in the node's cgroup), or a hang whose culprit the node's monitor found outside any
collective. The host goes into the node ledger (halo_sched/ledger.py) and new jobs avoid it.

**A rank's words label, never decide.** An Xid or NCCL message in a rank's error or output alone
makes the class unknown, labelled (:attr:`Classification.said`: "the rank reported an NCCL network
error"): never retried by ``retry.on: [node]``, no host blamed; the ledger fences its host only
once :data:`halo_sched.ledger.REPEATED` jobs failed so there. Printing a line retries nothing.

A **job** fault is the job's own: a Python exception in user code, a bad argument, the process
running out of memory. Running it elsewhere fails the same way; ``retry.on: [job]`` (opt-in)
starts it again, in place on SLURM (node/restart.py), a crash loop excepted.

**unknown** is its own class (nothing matched): it is never taken for a node fault, and retried
only where ``retry.on`` lists ``unknown`` (opt-in).

Only the first failure is classified (:attr:`FailureReport.first`): its peers fail moments later
with "Connection reset by peer" and the like because it died, and are not the cause. Each
:class:`Pattern` carries a real message it matches (``example``) and where that message comes
from (``source``); tests/test_failure_classes.py checks every one. Standard library only: this
module runs wherever the failure report is read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

# ---- whose fault -------------------------------------------------------------------------------

NODE = "node"
JOB = "job"
UNKNOWN = "unknown"
FAULTS = (NODE, JOB, UNKNOWN)
#: What a person reads for each: the head of ``status``'s words for a failure.
FAULT_WORDS = {NODE: "node fault", JOB: "job fault", UNKNOWN: "unknown cause"}

# ---- the words of the job file -------------------------------------------------------------------

#: ``retry: on:`` words: the failure classes a run may start another attempt after (``job`` and
#: ``unknown`` only where the job file lists them: the default is ``[node]``).
RETRY_NODE, RETRY_HANG, RETRY_PREFLIGHT, RETRY_JOB, RETRY_UNKNOWN = "node", "hang", "preflight", "job", "unknown"
RETRY_ON = (RETRY_NODE, RETRY_HANG, RETRY_PREFLIGHT, RETRY_JOB, RETRY_UNKNOWN)
#: ``notify: on:`` words: a failed attempt raises one of the first two (its class's ``event``).
FAILED, HUNG, RETRIED, COMPLETED = "failed", "hung", "retried", "completed"
NOTIFY_EVENTS = (FAILED, HUNG, RETRIED, COMPLETED)


@dataclass(frozen=True)
class FailureClass:
    """One failure class: its ``name`` (as records and ``status --json`` keep it), whose fault it
    is, the ``reason`` a person reads when no pattern gives one, the ``retry: on:`` word that
    retries it and the ``notify: on:`` event a failure of it raises."""

    name: str
    fault: str  # NODE, JOB or UNKNOWN
    reason: str
    retry_on: str | None
    event: str

    @property
    def words(self) -> str:
        """``node fault`` / ``job fault`` / ``unknown cause``."""
        return FAULT_WORDS[self.fault]

    def retried_by(self, on: Iterable[str]) -> bool:
        """Whether a job file's ``retry.on`` words retry this class: its own word, or ``node``
        for any node fault (a preflight failure and a hang with a culprit node are node faults)."""
        on = set(on)
        return self.retry_on is not None and (self.retry_on in on or (self.fault == NODE and RETRY_NODE in on))


NODE_FAULT = FailureClass("node", NODE, "", RETRY_NODE, FAILED)
PREFLIGHT_FAILED = FailureClass("preflight", NODE, "preflight check failed", RETRY_PREFLIGHT, FAILED)
HUNG_ON_NODE = FailureClass("hang", NODE, "hung (this node was the culprit)", RETRY_HANG, HUNG)
#: A hang whose culprit is inside a collective or unread: no evidence against any node.
HUNG_NO_CULPRIT = FailureClass("hang-no-culprit", UNKNOWN, "hung (no culprit node)", RETRY_HANG, HUNG)
JOB_FAULT = FailureClass("job", JOB, "", RETRY_JOB, FAILED)
UNKNOWN_CAUSE = FailureClass("unknown", UNKNOWN, "", RETRY_UNKNOWN, FAILED)
CLASSES = (NODE_FAULT, PREFLIGHT_FAILED, HUNG_ON_NODE, HUNG_NO_CULPRIT, JOB_FAULT, UNKNOWN_CAUSE)
_BY_NAME = {c.name: c for c in CLASSES}


@dataclass(frozen=True)
class Pattern:
    """One kind of message: what it says about whose fault a failure is."""

    name: str
    failure: FailureClass  # the class it decides
    reason: str  # in words, as ``status`` shows it
    regex: str
    example: str  # a real message it matches
    source: str  # where that message is written

    @property
    def kind(self) -> str:
        """Whose fault: NODE or JOB."""
        return self.failure.fault

    def search(self, text: str) -> bool:
        return re.search(self.regex, text) is not None


#: Checked in this order over the node's evidence (any pattern decides), then over the rank's words,
#: its error line and output's tail (a job pattern decides, a node pattern only labels). Node
#: patterns come first: an NCCL error reaches Python as an exception (``DistBackendError``).
PATTERNS: tuple[Pattern, ...] = (
    Pattern("preflight", PREFLIGHT_FAILED, PREFLIGHT_FAILED.reason,
            r'halo-sched-preflight-node \{.*"fatal": ?true',
            'halo-sched-preflight-node {"node": 1, "host": "h2", "checks": [{"check": "interface", "ok": false, '
            '"detail": "no interface ib0", "fix": "set network.interface", "fatal": true}]}',
            "halo_sched/node/trainers/preflight_bw.py (NODE_MARK line, a check with fatal true)"),
    Pattern("xid", NODE_FAULT, "GPU Xid error",
            r"NVRM: Xid \(",
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "NVIDIA kernel driver (dmesg); Xid catalogue: docs.nvidia.com/deploy/xid-errors"),
    Pattern("ecc", NODE_FAULT, "GPU ECC error",
            r"uncorrectable ECC error encountered",
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "CUDA runtime's cudaGetErrorString(cudaErrorECCUncorrectable) after torch's \"CUDA error: \" "
            "(C10_CUDA_CHECK, c10/cuda/CUDAException.cpp c10_cuda_check_implementation)"),
    Pattern("cuda-launch", NODE_FAULT, "CUDA device error",
            r"CUDA error: unspecified launch failure",
            "RuntimeError: CUDA error: unspecified launch failure",
            "cudaGetErrorString(cudaErrorLaunchFailure) via C10_CUDA_CHECK (c10/cuda/CUDAException.cpp)"),
    Pattern("cuda-illegal-address", NODE_FAULT, "CUDA device error",
            r"CUDA error: an illegal memory access was encountered",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "cudaGetErrorString(cudaErrorIllegalAddress) via C10_CUDA_CHECK (c10/cuda/CUDAException.cpp); an Xid 13/31 on "
            "the node; a kernel bug in user code can cause it too)"),
    Pattern("gpu-lost", NODE_FAULT, "GPU lost",
            r"GPU is lost|fallen off the bus",
            "nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system "
            "to recover this GPU",
            "nvidia-smi (NVML's NVML_ERROR_GPU_IS_LOST, nvmlErrorString); read on the node by "
            "halo_sched/node/failure_collector.py gpu_health"),
    Pattern("nccl-ib", NODE_FAULT, "NCCL network error",
            r"NCCL WARN NET/(?:IB|Socket|OFI)",
            "h2:22890:22900 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
            "10.77.0.1<35162> with status=12 opcode=129 len=65536",
            "NCCL src/transport/net_ib.cc (WARN lines on a failed work completion)"),
    Pattern("nccl-system", NODE_FAULT, "NCCL network error",
            r"unhandled system error|remote process exited or there was a network error|ncclSystemError|"
            r"ncclRemoteError",
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "NCCL src/init.cc ncclGetErrorString(ncclSystemError / ncclRemoteError), wrapped by torch's "
            "C10D_NCCL_CHECK (torch/csrc/distributed/c10d/NCCLUtils.hpp)"),
    Pattern("nccl-cuda", NODE_FAULT, "CUDA device error",
            r"unhandled cuda error",
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
            ":1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
            "NCCL src/init.cc ncclGetErrorString(ncclUnhandledCudaError)"),
    Pattern("peer-reset", NODE_FAULT, "network error (connection to a peer lost)",
            r"Connection reset by peer|Connection closed by (?:remote )?peer|No route to host",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.0.0.2]:62261",
            "gloo/transport/tcp/pair.cc (Pair::read on EOF: GLOO_ERROR_MSG(\"Connection closed by peer \", "
            "peer_.str())); ECONNRESET's strerror 'Connection reset by peer' from gloo and c10d's TCPStore"),
    # --- the job's own ----------------------------------------------------------------------
    Pattern("cuda-oom", JOB_FAULT, "out of memory (GPU, the process)",
            r"CUDA out of memory|OutOfMemoryError",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 1.06 GiB is free.",
            "c10/cuda/CUDACachingAllocator.cpp (TORCH_CHECK_WITH(OutOfMemoryError, ..., 'CUDA out of memory. "
            "Tried to allocate ...'))"),
    Pattern("host-oom", JOB_FAULT, "out of memory (the process)",
            r"MemoryError|Killed process \d+ .*out of memory|oom-kill|OUT_OF_MEMORY",
            "MemoryError",
            "CPython (PyErr_NoMemory); the kernel's OOM killer ('Killed process 1234 (python) total-vm...'); "
            "SLURM's OUT_OF_MEMORY state; the node's cgroup (failure_collector.node_evidence 'cgroup: oom-kill')"),
    Pattern("bad-argument", JOB_FAULT, "bad argument",
            r"error: (?:unrecognized arguments|the following arguments are required|argument \S+:)|"
            r"can't open file|No module named",
            "train.py: error: unrecognized arguments: --lr=0.1",
            "CPython Lib/argparse.py (ArgumentParser.error); the interpreter's \"can't open file\"; "
            "ModuleNotFoundError"),
    Pattern("python-exception", JOB_FAULT, "Python exception",
            r"(?m)^(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception)(?::|$)|Traceback \(most recent call last\)",
            "ValueError: rank 3 fails on purpose",
            "CPython traceback printing (the last line names the exception)"),
)


@dataclass(frozen=True)
class Classification:
    """A failure put into its class: why (in words), the host to blame (node faults only), and
    what decided (``by``: a pattern's ``name``, or ``node-lost``, ``node-fail``, ``hung``,
    ``preflight``, ``out-of-memory``)."""

    failure: FailureClass
    reason: str = ""
    host: str = ""
    by: str = ""
    #: Only the rank's words named a node pattern: unknown class, no host blamed; ``suspect`` is
    #: its host, which the ledger counts toward repeated failures there.
    said: bool = False
    suspect: str = ""

    @property
    def kind(self) -> str:
        """Whose fault: NODE, JOB or UNKNOWN."""
        return self.failure.fault

    @property
    def node(self) -> bool:
        return self.failure.fault == NODE

    def describe(self) -> str:
        """``node fault: host h2, NCCL network error`` / ``job fault: Python exception`` / ``unknown cause``."""
        if self.kind == UNKNOWN:
            return self.failure.words + (f": {self.reason}" if self.said and self.reason else "")
        bits = [f"host {self.host}"] if self.host else []
        if self.reason:
            bits.append(self.reason)
        return self.failure.words + (f": {', '.join(bits)}" if bits else "")

    def to_dict(self) -> dict:
        """As a record keeps it (``last_state.failure_class``) and ``status --json`` prints it."""
        return {"class": self.kind, "failure": self.failure.name, "reason": self.reason, "host": self.host,
                "by": self.by, **({"said": True, "suspect": self.suspect} if self.said else {})}

    @classmethod
    def from_dict(cls, data: Any) -> "Classification | None":
        """A record's ``failure_class`` as the typed value (None for anything else). A record
        kept before ``failure`` was: the class of its fault alone."""
        if not isinstance(data, dict):
            return None
        # The plain classes are named as their faults are (node, job, unknown).
        failure = next((_BY_NAME[n] for n in (data.get("failure"), data.get("class"))
                        if isinstance(n, str) and n in _BY_NAME), None)
        if failure is None:
            return None
        text = {k: data.get(k) if isinstance(data.get(k), str) else "" for k in ("reason", "host", "by", "suspect")}
        said = data.get("said") is True
        return cls(failure, text["reason"], text["host"], text["by"], said, text["suspect"] if said else "")


def _texts(first: Any) -> list[str]:
    """The rank's own words: its error line and the tail of its output."""
    out = []
    for value in (getattr(first, "error", ""), *(getattr(first, "tail", ()) or ())):
        if isinstance(value, str) and value:
            out.append(value)
    return out


from .failure_collector import NODE_SIGNALS  # noqa: E402  (signals nothing in the job sends)


def _evidence(first: Any) -> list[str]:
    """The node's own lines on a failure (a trusted line's ``evidence``), never a rank's words."""
    if first is None or getattr(first, "trusted", True) is False:
        return []
    return [e for e in (getattr(first, "evidence", ()) or ()) if isinstance(e, str) and e]


def _signal(first: Any) -> str:
    """The signal that ended a trusted, not stopped, failure when it is one of NODE_SIGNALS."""
    sig = getattr(first, "signal", None)
    ok = first is not None and getattr(first, "trusted", True) is not False and not getattr(first, "stopped", False)
    return sig if ok and sig in NODE_SIGNALS else ""


def _a(words: str) -> str:
    return ("an " if words[:1].lower() in "aeiou" or words.startswith(("NCCL", "ECC")) else "a ") + words


def said_by_rank(p: Pattern, host: str) -> Classification:
    """A node pattern in the rank's words alone: a label on an unknown cause, its host a suspect."""
    return Classification(UNKNOWN_CAUSE, f"the rank reported {_a(p.reason)} (its own output; no node-side evidence)",
                          "", p.name, said=True, suspect=host)


def match(texts: Iterable[str], kind: str | None = None) -> Pattern | None:
    """The first pattern (of ``kind``, when given) any of ``texts`` matches."""
    texts = list(texts)
    for p in PATTERNS:
        if kind is not None and p.kind != kind:
            continue
        if any(p.search(t) for t in texts):
            return p
    return None


def _kind_is(want: str, *objs: Any) -> bool:
    """Whether a failure (or its report) carries ``kind`` ``want`` (a string or an enum's value)."""
    for obj in objs:
        kind = getattr(obj, "kind", None)
        kind = getattr(kind, "value", kind)
        if isinstance(kind, str) and kind.upper() == want:
            return True
    return False


def _is_hung(*objs: Any) -> bool:
    return _kind_is("HUNG", *objs)


def classify_failure(report: Any = None, status: Any = None) -> Classification:
    """The class of a failed job: ``report`` is its :class:`~halo_sched.node.failures.FailureReport`
    (or one :class:`~halo_sched.node.failures.RankFailure`), ``status`` its JobStatus (or the
    status's name): ``NODE_FAIL`` is a node fault whatever the ranks said, ``OUT_OF_MEMORY`` the
    job's. Without a report and without such a status, the cause is unknown."""
    status = getattr(status, "value", status)
    first = getattr(report, "first", report) if report is not None else None
    # The scheduler's name for the node where the failure line carries it (what --exclude and a
    # Nomad constraint take), else torchrun's host.
    host = str(getattr(first, "node_name", "") or getattr(first, "host", "") or "") if first is not None else ""
    # A Nomad allocation whose node went down or disconnected (failure_logs.AllocFailure): the
    # report makes it the cause, and it names the node.
    verb = getattr(first, "verb", "") if first is not None else ""
    if verb in ("lost", "disconnected"):
        return Classification(NODE_FAULT, f"node {verb} (Nomad allocation {'lost' if verb == 'lost' else 'unknown'})",
                              host, "node-lost")
    if verb == "down":  # a node SLURM itself marked down (backends/slurm/down_nodes.py)
        return Classification(NODE_FAULT, "node failed (NODE_FAIL), SLURM marked it down", host, "node-fail")
    if verb == "left":  # a host SLURM took out of a --no-kill job (down_nodes.LeftNode; node/successor.py LEFT)
        return Classification(NODE_FAULT, "node left the allocation (SLURM marked it down)", host, "node-fail")
    if status == "NODE_FAIL":
        # SLURM's NODE_FAIL names no node, and the first failure line is usually a healthy peer
        # that crashed waiting for the dead one: blame a host only where that node's own evidence
        # says so (an Xid in its kernel log, a lost GPU), never on a rank's words.
        p = match(_evidence(first), NODE) if first is not None else None
        if p is not None and p.name == "peer-reset":  # what a victim of the dead node says
            p = None
        return Classification(NODE_FAULT, "node failed (NODE_FAIL)" + (f", {p.reason}" if p else ""),
                              host if p else "", "node-fail")
    if first is None:
        if status == "OUT_OF_MEMORY":
            return Classification(JOB_FAULT, "out of memory (the process)", "", "out-of-memory")
        return Classification(UNKNOWN_CAUSE)
    if _is_hung(first, report):
        # The hang report's first failure is the culprit its rule chose (node/failures.py);
        # with its stack read and outside any collective, the evidence points at its node.
        if host and getattr(first, "stack_read", False) and getattr(first, "waiting_in", "") is None:
            return Classification(HUNG_ON_NODE, HUNG_ON_NODE.reason, host, "hung")
        return Classification(HUNG_NO_CULPRIT, HUNG_NO_CULPRIT.reason, "", "hung")
    if _kind_is("PREFLIGHT", first, report):
        # A preflight gate's failure (a kind the gate sets): that node's fault.
        return Classification(PREFLIGHT_FAILED, PREFLIGHT_FAILED.reason, host, "preflight")
    # The node's side first: its own evidence decides, whatever the pattern (an Xid in its kernel
    # log, a failed preflight check, an out-of-memory kill in its cgroup).
    said = match(_texts(first))
    p = match(_evidence(first))
    if p is not None:
        return Classification(p.failure, _with_label(p.reason, said, p), host if p.kind == NODE else "", p.name)
    if status == "OUT_OF_MEMORY":
        return Classification(JOB_FAULT, "out of memory (the process)", "", "out-of-memory")
    sig = _signal(first)
    if sig:
        return Classification(NODE_FAULT, _with_label(f"killed by {sig} (nothing in the job sent it)", said),
                              host, "signal")
    # The rank's words: a job pattern decides (the job's own fault blames no host, and is
    # retried only by retry.on's opt-in `job`); a node pattern only labels.
    if said is not None:
        if said.kind == NODE:
            return said_by_rank(said, host)
        return Classification(said.failure, said.reason, "", said.name)
    return Classification(UNKNOWN_CAUSE)


def _with_label(reason: str, said: Pattern | None, decided: Pattern | None = None) -> str:
    """The node-side reason, and what the rank's own words add to it where they name another
    node pattern ("killed by SIGKILL ...; the rank reported an NCCL network error")."""
    if said is None or said.kind != NODE or (decided is not None and said.reason == decided.reason):
        return reason
    return f"{reason}; the rank reported {_a(said.reason)}"


__all__ = ["CLASSES", "COMPLETED", "Classification", "FAILED", "FAULTS", "FAULT_WORDS", "FailureClass", "HUNG",
           "HUNG_NO_CULPRIT", "HUNG_ON_NODE", "JOB", "JOB_FAULT", "NODE", "NODE_FAULT", "NODE_SIGNALS", "NOTIFY_EVENTS",
           "PATTERNS", "PREFLIGHT_FAILED", "Pattern", "RETRIED", "RETRY_JOB", "RETRY_ON", "RETRY_UNKNOWN", "UNKNOWN", "UNKNOWN_CAUSE",
           "classify_failure", "match", "said_by_rank"]
