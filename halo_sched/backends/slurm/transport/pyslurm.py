"""The pyslurm transport: Slurm's C API through pyslurm.

NOT exercised against a real Slurm here: pyslurm must be built against the cluster's exact Slurm
release (PyPI has 25.11 only, Debian 12 ships 22.05), so this is written against pyslurm's
documented 23.x+ API (``pyslurm.Jobs``/``pyslurm.Job``/``pyslurm.JobSubmitDescription``) and
refuses to run on a version mismatch. It talks to the local cluster only: ``--clusters`` and
``CLUSTER:ID`` ids need the cli transport.
"""
from __future__ import annotations

import os
import re
from typing import Sequence

from halo_sched.backends.base import JobState
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError

from .base import Transport, names_clusters, split_cluster, unique
from .cli import CliTransport, Runner


class PyslurmTransport(Transport):
    """pyslurm's API, for the cluster whose Slurm release ``cluster_version`` (default: what
    ``scontrol --version`` says) names."""

    name = "pyslurm"

    def __init__(self, cluster_version: str | None = None, runner: Runner | None = None):
        try:
            import pyslurm  # noqa: PLC0415 - optional dependency
        except ImportError as e:
            raise MissingDependency(
                "the pyslurm transport needs the 'pyslurm' package built for this cluster's Slurm "
                "release (pip install 'halo-sched[slurm]' only works where that release's headers "
                "exist); the default 'cli' transport needs nothing"
            ) from e
        self.pyslurm = pyslurm
        have = getattr(pyslurm, "__version__", "")
        want = cluster_version or CliTransport(runner=runner).version()
        if _major_minor(have) != _major_minor(want) or not have:
            raise MissingDependency(
                f"pyslurm {have or '(unknown version)'} does not match this cluster's Slurm {want}: "
                "pyslurm must be built for the same major.minor release; use the 'cli' transport"
            )

    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        if extra_args:
            raise SchedulerError("the pyslurm transport takes options only as #SBATCH lines in the script")
        if names_clusters(script):
            raise SchedulerError("the pyslurm transport submits to the local cluster only; --clusters needs the cli transport")
        # sbatch's default --export=ALL; then the #SBATCH lines, as sbatch reads them.
        desc = self.pyslurm.JobSubmitDescription(script=script, environment=dict(os.environ))
        desc.load_sbatch_options()
        return str(desc.submit())

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        ids = [_local(i) for i in unique(ids)]
        if not ids:
            return {}
        try:
            jobs = self.pyslurm.Jobs.load()  # every job slurmctld holds: one RPC
        except self.pyslurm.RPCError as e:  # pragma: no cover - needs a real pyslurm
            raise SchedulerError(f"pyslurm: {e}") from e
        states = [self._state(job) for job in jobs.values()]
        found = st.select_states(ids, states)
        why = "slurmctld does not know this job id"
        return {i: found.get(i) or st.unknown_state(i, why) for i in ids}

    @staticmethod
    def _state(job) -> JobState:
        job_id = str(job.id)
        if job.array_id and job.array_task_id is not None:
            display = f"{job.array_id}_{job.array_task_id}"
        elif job.array_id and job.array_tasks_waiting:
            display = f"{job.array_id}_[{job.array_tasks_waiting}]"
        elif job.heterogeneous_id:
            display = f"{job.heterogeneous_id}+{job.heterogeneous_offset or 0}"
        else:
            display = job_id
        return st.make_state(
            display,
            str(job.state or ""),
            exit_rc=job.exit_code,
            exit_sig=job.exit_code_signal or 0,
            nodes=job.num_nodes,
            reason=str(job.state_reason or ""),
            source="pyslurm",
            extra={"job_id_raw": job_id, "nodelist": job.allocated_nodes or ""},
        )

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        for job_id in unique(ids):
            job = self.pyslurm.Job(_raw_int_id(_local(job_id)))
            if signal:
                # The batch script alone, as `scancel --batch` (pyslurm's steps="batch" is
                # KILL_JOB_BATCH): it passes the warning on to every rank.
                sig = signal.upper()
                job.send_signal(sig if sig.startswith("SIG") else "SIG" + sig, steps="batch")
            else:
                job.cancel()

    def job_info(self, job_id: str) -> dict:
        job = self.pyslurm.Job.load(_raw_int_id(_local(job_id)))
        return {
            "JobId": str(job.id),
            "JobState": str(job.state),
            "NodeList": job.allocated_nodes or "",
            "BatchHost": job.batch_host or "",
            "WorkDir": job.working_directory or "",
            "StdOut": job.standard_output or "",
            "StdErr": job.standard_error or "",
            "NumNodes": str(job.num_nodes or ""),
            "_raw": job.to_dict(),
        }


def _raw_int_id(job_id: str) -> int:
    """pyslurm addresses jobs by integer id: ``123_4``/``123+1`` -> 123 (the whole array/het
    job); cancelling one array task needs the cli transport."""
    return int(str(job_id).split("_", 1)[0].split("+", 1)[0])


def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"^\D*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _local(job_id: str) -> str:
    cluster, local = split_cluster(job_id)
    if cluster:
        raise SchedulerError(f"job {job_id} is on cluster {cluster}: the pyslurm transport reaches the local cluster only; use the cli transport")
    return local
