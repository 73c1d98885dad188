"""What every SLURM transport shares: the interface, job ids that name a cluster, the job's
environment, and which failures are worth a retry (the retrying itself: :mod:`halo_sched.retry`).
Each transport submits a typed :class:`~halo_sched.backends.slurm.request.SbatchRequest`."""
from __future__ import annotations

import abc
import re
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from halo_sched.backends.base import JobState
from halo_sched.errors import SchedulerError, UsageError
from halo_sched.retry import Transient

if TYPE_CHECKING:  # pragma: no cover
    from ..request import SbatchRequest


class Transport(abc.ABC):
    """What SlurmScheduler needs from SLURM."""

    name = ""

    @abc.abstractmethod
    def submit(self, request: SbatchRequest) -> str:
        """Submit the request (its options and its script); return the job id (``CLUSTER:ID``
        when it names --clusters)."""

    @abc.abstractmethod
    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """State of every id (UNKNOWN with a reason for ids SLURM does not know)."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        """Cancel jobs, or warn them: ``signal`` is the job's warning signal (e.g. ``"USR2"``),
        which its batch script passes on to every rank; a transport that cannot reach the batch
        script alone sends the warning carrier (``halo_sched.node.contract``) to every process of the
        job instead."""

    @abc.abstractmethod
    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` fields (StdOut, StdErr, WorkDir, NodeList, ...)."""

    def show_config(self, cluster: str | None = None) -> str | None:
        """``scontrol show config``'s text (of ``cluster``, sbatch --clusters), or None where this
        transport cannot read the configuration (slurmrestd serves none)."""
        return None

    def test_only(self, request: SbatchRequest) -> tuple[bool, str] | None:
        """``sbatch --test-only``: (would SLURM take the job, its answer: when and where it would
        start, or why not), or None where this transport cannot ask."""
        return None


# ---------------------------------------------------------------------------------------------
# Job ids

# A SLURM cluster name (slurm.conf ClusterName, sbatch --clusters).
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
# What SLURM itself prints or takes as a job id: 123, 123_4, 123_[1-5%2], 123+1.
_LOCAL_ID_RE = re.compile(r"^\d+(?:_(?:\d+|\[[0-9,\-:%]+\]))?(?:\+\d+)?\Z")


def split_cluster(job_id: str) -> tuple[str | None, str]:
    """``halo:123`` (as halo-sched prints it) or ``123;halo`` (as ``sbatch --parsable -M``
    prints it) -> (``halo``, ``123``); ``123`` -> (None, ``123``).

    Anything else is a UsageError: ids reach the command line of squeue/scancel, and a
    ``--signal=KILL`` there must never read as an option.
    """
    text = str(job_id).strip()
    cluster, local = None, text
    if ":" in text:
        cluster, local = text.split(":", 1)
    elif ";" in text:
        local, cluster = text.split(";", 1)
    if cluster is not None and not _CLUSTER_RE.match(cluster):
        raise UsageError(f"job id {job_id!r}: {cluster!r} is not a SLURM cluster name")
    if not _LOCAL_ID_RE.match(local):
        raise UsageError(f"job id {job_id!r} is not a SLURM job id (123, 123_4, 123+1, or CLUSTER:123)")
    return cluster, local


def with_cluster(cluster: str | None, local_id: str) -> str:
    return f"{cluster}:{local_id}" if cluster else local_id


def unique(ids: Iterable) -> list[str]:
    return list(dict.fromkeys(str(i).strip() for i in ids if str(i).strip()))


def by_cluster(ids: Iterable) -> dict[str | None, dict[str, list[str]]]:
    """{cluster or None: {local id: [ids as requested]}}: SLURM's clients take one cluster per
    call (``halo:5`` and ``5;halo`` are one job)."""
    groups: dict[str | None, dict[str, list[str]]] = {}
    for job_id in unique(ids):
        cluster, local = split_cluster(job_id)
        groups.setdefault(cluster, {}).setdefault(local, []).append(job_id)
    return groups


def chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


# ---------------------------------------------------------------------------------------------
# The job's environment (the rest and pyslurm transports build it themselves; sbatch does for cli)

# Variables that carry the submitter's own credentials. sbatch's --export=ALL would copy them into
# the job (and so into slurmctld's state, StateSaveLocation/.../environment); the transports that
# build the environment themselves leave them out unless the job names them in secret_env.
# SLURM_JWT never goes: it is slurmrestd's token for this submission, and spec refuses it as a
# secret_env name.
NEVER_EXPORTED = frozenset({"SLURM_JWT"})
# NOMAD_TOKEN, HF_TOKEN, AWS_SECRET_ACCESS_KEY/AWS_ACCESS_KEY_ID/AWS_SESSION_TOKEN,
# AZURE_CLIENT_SECRET, GOOGLE_APPLICATION_CREDENTIALS, WANDB_API_KEY, NOMAD_CLIENT_KEY, ...
CREDENTIAL_NAME_RE = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|_KEY$", re.IGNORECASE)


def job_environment(request: SbatchRequest, environ: Mapping[str, str]) -> dict[str, str]:
    """What the job gets: the request's ``--export`` (ALL by default; NONE; NAME or NAME=value
    items) applied to ``environ``, less the submitter's credentials (``CREDENTIAL_NAME_RE``)
    unless the job names them in secret_env (the request's ``secret_names``). SLURM_JWT never."""
    from ....node.contract import NAMES

    # The job's failure key (node/failures.py) goes too: the entry script takes it out of the
    # environment before any rank starts.
    wanted = set(request.secret_names) | {NAMES.failure_key}
    export = request.get("export") or "ALL"
    items = [x for x in export.split(",") if x]
    picked = {k: v for k, v in environ.items() if "ALL" in items}
    for item in items:
        if item in ("ALL", "NONE"):
            continue
        k, eq, v = item.partition("=")
        if eq:
            picked[k] = v
        elif k in environ:
            picked[k] = environ[k]
    explicit = {i.partition("=")[0] for i in items if i not in ("ALL", "NONE")}
    return {k: v for k, v in picked.items()
            if k not in NEVER_EXPORTED and (k in wanted or k in explicit or not CREDENTIAL_NAME_RE.search(k))}


# ---------------------------------------------------------------------------------------------
# Retries

# Messages slurmctld clients print when the controller is busy or restarting: worth a retry for
# idempotent calls (a Transient, retried by halo_sched.retry.SLURM_CALLS). Anything else is a
# real answer. A connection reset is slurmctld stopping during the call (squeue 24.11 printed
# "slurm_load_jobs error: Connection reset by peer" in a controller outage).
TRANSIENT = re.compile(
    r"socket timed out|unable to contact slurm controller|resource temporarily unavailable|"
    r"connection refused|connection reset by peer|transport endpoint is not connected|"
    r"slurm backup controller in standby",
    re.IGNORECASE,
)


def gave_up(what: str) -> Callable[[Transient, int], SchedulerError]:
    """The error once a retried SLURM call is spent: it names ``what`` and SLURM's words."""

    def error(last: Transient, tries: int) -> SchedulerError:
        times = f" {tries} times" if tries > 1 else ""
        return SchedulerError(f"{what} failed{times}: {last}")

    return error
