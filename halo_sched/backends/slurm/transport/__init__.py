"""The only code that talks to SLURM: submit (a typed ``SbatchRequest``, ../request.py), query,
cancel, job_info. One module per transport:

* ``cli.py``: ``CliTransport`` (default), sbatch/squeue/sacct/scontrol/scancel;
* ``rest.py``: ``RestTransport``, slurmrestd (API versions in ``rest.API_VERSIONS``);
* ``pyslurm.py``: ``PyslurmTransport``, pyslurm built for the cluster's exact Slurm release;
* ``base.py``: the ``Transport`` interface and what they share (``CLUSTER:ID`` job ids, the
  job's environment, retries).

No torch here: the CLI imports this package.
"""
from __future__ import annotations

from halo_sched.errors import UsageError

from .base import Transport, split_cluster
from .cli import CliTransport, default_runner
from .pyslurm import PyslurmTransport
from .rest import API_VERSIONS, RestTransport, rest_job_properties, rest_job_state


def get_transport(name: str = "cli", **kw) -> Transport:
    """``cli`` (default), ``rest`` or ``pyslurm``; keyword arguments go to the class."""
    factories = {"cli": CliTransport, "rest": RestTransport, "pyslurm": PyslurmTransport}
    try:
        cls = factories[name]
    except KeyError:
        raise UsageError(f"unknown SLURM transport {name!r} (HALO_SLURM_TRANSPORT): choose one of {', '.join(factories)}") from None
    return cls(**kw)


__all__ = [
    "API_VERSIONS",
    "Transport",
    "CliTransport",
    "RestTransport",
    "PyslurmTransport",
    "get_transport",
    "default_runner",
    "split_cluster",
    "rest_job_properties",
    "rest_job_state",
]
