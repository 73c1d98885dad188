"""The pyslurm transport: Slurm's C API through pyslurm.

pyslurm must be built against the cluster's exact Slurm release (pyslurm X.Y follows Slurm's
major: 22.5 for 22.05 ... 25.11; PyPI has 25.11 only, Debian 12 ships Slurm 22.05), so the
transport refuses to run on a major.minor mismatch. Verified with a real pyslurm 22.5.3 (its
22.5.x branch) built against Debian's libslurm-dev 22.05.8 on the local cluster
(tests/test_slurm_pyslurm.py); written against the ``pyslurm.JobSubmitDescription`` /
``pyslurm.Job`` / ``pyslurm.Jobs`` API that 22.5.x to 25.11.x share.

Submitting: ``JobSubmitDescription`` takes the script as a PATH (``submission.pyx``
``_validate_batch_script``: ``Path(script).is_file()``; a script's text raises "File name too
long" or is taken as a missing file), so the script goes to a private temporary file (0600,
removed after the submit). Its ``load_sbatch_options()`` is NOT used: in every branch from 22.5.x
to 25.11.x its table (``sbatch_opts.pyx``) names attributes that do not exist (``--partition``
-> ``partition``, ``--gpus-per-node`` -> ``gpus_per_node``: AttributeError) and skips the
options it does not know, silently. The attributes are set from the typed request's options
(request.py) instead, nothing read out of the script; an option without one is refused. It
talks to the local cluster only: ``--clusters`` and ``CLUSTER:ID`` ids need the cli transport.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from halo_sched.backends.base import JobState
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError, UsageError

from halo_sched.sbatch_options import Setting, Signal

from .base import NEVER_EXPORTED, Transport, job_environment, split_cluster, unique
from .cli import CliTransport, Runner

if TYPE_CHECKING:  # pragma: no cover
    from ..request import SbatchRequest



def _signal(w: Signal) -> str:
    """``--signal``'s value in the form pyslurm reads (submission.pyx _parse_signal_str_to_dict,
    then helpers.pyx signal_to_num: ``signal.Signals[name]``, which knows SIGUSR2 but not USR2)."""
    return (f"{w.flags}:" if w.flags else "") + "SIG" + w.signal + (f"@{w.seconds}" if w.seconds is not None else "")


def _text(s: Setting):
    return s.value_text()


def _value(s: Setting):
    return s.value


def _fixed(result) -> Callable:
    return lambda s: result


# sbatch option -> (JobSubmitDescription attribute, the setting's value for it). The attributes
# are those of submission.pxd (identical names in pyslurm 22.5.x and 25.11.x); pyslurm parses
# times, sizes and node lists from sbatch's text itself.
_ATTRS: dict[str, tuple[str, Callable]] = {
    "job-name": ("name", _text),
    "nodes": ("nodes", _text),
    "ntasks": ("ntasks", _value),
    "ntasks-per-node": ("ntasks_per_node", _value),
    "cpus-per-task": ("cpus_per_task", _value),
    "mincpus": ("min_cpus_per_node", _value),
    "time": ("time_limit", _text),
    "time-min": ("time_limit_min", _text),
    "partition": ("partitions", _text),
    "account": ("account", _text),
    "qos": ("qos", _text),
    "reservation": ("reservations", _text),
    "comment": ("comment", _text),
    "wckey": ("wckey", _text),
    "licenses": ("licenses", _text),
    "dependency": ("dependencies", _text),
    "array": ("array", _text),
    "constraint": ("constraints", _text),
    "cluster-constraint": ("cluster_constraints", _text),
    "mail-user": ("mail_user", _text),
    "mail-type": ("mail_types", _text),
    "network": ("network", _text),
    "container": ("container", _text),
    "begin": ("begin_time", _text),
    "deadline": ("deadline", _text),
    "output": ("standard_output", _text),
    "error": ("standard_error", _text),
    "input": ("standard_in", _text),
    "chdir": ("working_directory", _text),
    "open-mode": ("log_files_open_mode", _value),
    "mem": ("memory_per_node", _text),
    "mem-per-cpu": ("memory_per_cpu", _text),
    "tmp": ("temporary_disk_per_node", _text),
    "gpus": ("gpus", _text),
    "gpus-per-task": ("gpus_per_task", _text),
    "cpus-per-gpu": ("cpus_per_gpu", _value),
    "gpu-bind": ("gpu_binding", _text),
    "signal": ("signal", lambda s: _signal(s.value)),
    "exclusive": ("resource_sharing", lambda s: {None: "no", "user": "user", "mcs": "mcs"}[s.value]),
    "oversubscribe": ("resource_sharing", _fixed("yes")),
    "requeue": ("is_requeueable", _fixed(True)),
    "no-requeue": ("is_requeueable", _fixed(False)),
    "hold": ("priority", _fixed(0)),
    "nice": ("nice", lambda s: 100 if s.value is None else s.value),
    "exclude": ("excluded_nodes", _text),
    "nodelist": ("required_nodes", _text),
    "kill-on-invalid-dep": ("kill_on_invalid_dependency", _value),
    "wait-all-nodes": ("wait_all_nodes", _value),
    "contiguous": ("requires_contiguous_nodes", _fixed(True)),
    "overcommit": ("overcommit", _fixed(True)),
    "spread-job": ("spreads_over_nodes", _fixed(True)),
    "use-min-nodes": ("use_min_nodes", _fixed(True)),
    "no-kill": ("kill_on_node_fail", lambda s: s.value is not None),
    "threads-per-core": ("threads_per_core", _value),
    "sockets-per-node": ("sockets_per_node", _value),
    "cores-per-socket": ("cores_per_socket", _value),
    "core-spec": ("cores_reserved_for_system", _value),
    "thread-spec": ("threads_reserved_for_system", _value),
}
_REFUSED = {
    "clusters": "the pyslurm transport submits to the local cluster only; --clusters needs the cli transport",
    # submission.pyx _set_memory: the memory_per_gpu branch names an undefined variable.
    "mem-per-gpu": "pyslurm cannot set it (its memory_per_gpu raises NameError)",
}


def pyslurm_attributes(request: SbatchRequest) -> dict:
    """``JobSubmitDescription`` attributes for the request's options, or a UsageError naming
    ``slurm.extra_args`` and every option pyslurm cannot take."""
    attrs: dict = {}
    gres: list[str] = []
    refused = []
    for s in request.options:
        if s.option == "export":
            continue  # the environment
        if s.option in _REFUSED:
            refused.append(f"{s.text()} ({_REFUSED[s.option]})")
        elif s.option == "gpus-per-node":  # gres_per_node takes "gpu:8" (cstr.from_gres_dict)
            gres.append("gpu:" + s.value)
        elif s.option == "gres":
            gres += list(s.value)
        elif s.typed and s.option in _ATTRS:
            attr, conv = _ATTRS[s.option]
            try:
                attrs[attr] = conv(s)
            except KeyError:  # a value it has no word for (--exclusive=topo)
                refused.append(s.text())
        else:
            refused.append(s.text())
    if refused:
        raise UsageError("slurm.extra_args: the pyslurm transport cannot take "
                         + ", ".join(refused) + "; remove them, or submit with the 'cli' transport (sbatch)")
    if gres:
        attrs["gres_per_node"] = ",".join(gres)
    # sbatch derives the task count from the nodes (src/sbatch/opt.c _opt_verify); pyslurm would
    # default it to 1 (submission.pyx _set_defaults), a one-task job that cannot span the nodes.
    if "ntasks" not in attrs and "ntasks_per_node" in attrs and "nodes" in attrs:
        m = re.match(r"^(\d+)", str(attrs["nodes"]))
        if m:
            attrs["ntasks"] = int(m.group(1)) * attrs["ntasks_per_node"]
    return attrs


_ENVIRON_LOCK = threading.Lock()


@contextlib.contextmanager
def _submission_environ(pyslurm) -> Iterator[None]:
    """pyslurm copies every SLURM_* variable of this process into the job, whatever environment
    it is given (submission.pyx ``_set_environment`` reads its module's ``pyenviron``): for the
    submit, that module sees this environment less SLURM_JWT (never a job's)."""
    module = getattr(getattr(getattr(pyslurm, "core", None), "job", None), "submission", None)
    if module is None or not hasattr(module, "pyenviron"):
        yield
        return
    with _ENVIRON_LOCK:
        saved = module.pyenviron
        module.pyenviron = {k: v for k, v in os.environ.items() if k not in NEVER_EXPORTED}
        try:
            yield
        finally:
            module.pyenviron = saved


@contextlib.contextmanager
def private_script(text: str) -> Iterator[str]:
    """The script as a file only this user can read (0600), removed afterwards."""
    fd, path = tempfile.mkstemp(prefix="halo-sbatch-", suffix=".sh")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class PyslurmTransport(Transport):
    """pyslurm's API, for the cluster whose Slurm release ``cluster_version`` (default: what
    ``scontrol --version`` says) names. ``environment``: what the job's environment is taken from
    (default: this process's), less the credentials ``base.job_environment`` leaves out."""

    name = "pyslurm"

    def __init__(self, cluster_version: str | None = None, runner: Runner | None = None,
                 environment: Mapping[str, str] | None = None):
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
        self.environment = environment

    def submit(self, request: SbatchRequest) -> str:
        attrs = pyslurm_attributes(request)
        env = job_environment(request, os.environ if self.environment is None else self.environment)
        # Never empty: pyslurm takes an empty environment as "ALL" (submission.pyx _set_defaults).
        env = env or {"PATH": "/usr/bin:/bin"}
        with private_script(request.script) as path:
            desc = self.pyslurm.JobSubmitDescription(script=path, environment=env)
            try:
                for attr, value in attrs.items():
                    setattr(desc, attr, value)
                with _submission_environ(self.pyslurm):
                    job_id = desc.submit()
            except (ValueError, TypeError, AttributeError) as e:
                raise SchedulerError(f"pyslurm refused the job: {e}") from e
            except Exception as e:
                if type(e).__name__ == "RPCError" or isinstance(e, getattr(self.pyslurm, "RPCError", ())):
                    raise SchedulerError(f"pyslurm: submitting the job failed: {e}") from e
                raise
        return str(job_id)

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
            detail={"job_id_raw": job_id, "nodelist": job.allocated_nodes or ""},
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
