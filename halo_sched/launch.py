"""The launch contract: what every node runs, whatever the scheduler.

One torchrun per node with static rendezvous at node 0. Every node gets the same command and
environment; the only per-node input is ``HALO_NODE_RANK`` (plus ``HALO_NODE_RANK_OFFSET``, which
Nomad's worker group adds to its allocation index). Backends supply it (SLURM from
``$SLURM_NODEID`` inside the task, Nomad from the group and allocation index, local per process) together with rank 0's
address and port: ``HALO_MASTER_ADDR`` and ``HALO_MASTER_PORT``, or ``HALO_MASTER_ADDR_FILE`` — a file
whose first line becomes the address and second the port once rank 0 is known, polled until
``rendezvous.timeout_s`` runs out.

The port is ``rendezvous.port`` when the job file sets it, on every backend. Unset, each job gets
its own, so that two jobs whose node 0 share a host never both take torchrun's customary 29500
(EADDRINUSE, or worse a node joining the other job's store: pytorch#126510): SLURM derives it from
the job id inside ``DERIVED_PORTS``, Nomad assigns a dynamic port, the local backend picks a free
one in ``DERIVED_PORTS`` at submit. The entry script itself is the same text either way.

This module knows no scheduler; it renders ``halo_sched/templates/entry.sh.j2``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .models import JobSpec
from .templating import RenderError, check, checked_int, render_template

from .node_env import (  # noqa: F401 - the backends' per-node interface, named once in node_env.py
    LOG_DIR_VAR, MASTER_ADDR_FILE_VAR, MASTER_ADDR_VAR, MASTER_PORT_VAR, NODE_RANK_OFFSET_VAR, NODE_RANK_VAR,
    SECRETS_DIR_VAR,
)
from .servers import entry_vars as server_entry_vars

#: Where a job's own master port comes from when ``rendezvous.port`` is unset (SLURM: from the job
#: id, local: the first free one from a random start): 28500-29499. Below torchrun's customary
#: 29500 (which hand-written jobs on the same host still take), below SGLang's default 30000, and
#: below Linux's ephemeral range (32768-60999), from which outgoing connections take their ports.
DERIVED_PORTS = range(28500, 29500)


@dataclass(frozen=True)
class LaunchContract:
    spec: JobSpec

    def environment(self) -> dict[str, str]:
        """Environment every rank gets: the spec's DIST_*/NCCL_* first, then the user's (literal)."""
        env = dict(self.spec.derived_env())
        if not isinstance(self.spec.env, dict):
            raise RenderError([("env", "must be a mapping of variable names to text")])
        env.update(self.spec.env)
        return env

    def torchrun_args(self) -> list[str]:
        """torchrun's options that are the same on every node (rank and address come at run time)."""
        s = self.spec
        return [
            f"--nnodes={checked_int(s.nodes, 'nodes')}",
            f"--nproc_per_node={checked_int(s.nproc_per_node, 'nproc_per_node')}",
            # --node_rank, --master_addr and --master_port follow, from the node's environment
            # A fixed-size world: a restarted node could never rejoin a static rendezvous.
            "--max_restarts=0",
            # Static rendezvous store timeout: bounds how long a node waits for the others.
            f"--rdzv_conf=timeout={checked_int(s.rendezvous.timeout_s, 'rendezvous.timeout_s')}",
        ]

    def warning_signal(self) -> str:
        """The signal a trainer gets as the preemption/time-limit warning (``slurm.signal``'s,
        USR2 by default). torchrun ignores it; the trainer handles it (``HALO_WARNING_SIGNAL``)."""
        try:
            name = self.spec.slurm.warning[1]
        except (AttributeError, TypeError):  # not a [B:]SIGNAL[@seconds] at all
            name = self.spec.slurm.signal
        return check(name, "signal name", "slurm.signal")

    def trainer_argv(self) -> list[str]:
        t = self.spec.trainer
        if t.module:
            head = ["-m", check(t.module, "Python module", "trainer.module")]
        elif isinstance(t.script, str) and t.script and not t.script.startswith("-"):
            head = [t.script]  # quoted by the template
        else:  # torchrun would read it as one of its options
            raise RenderError([("trainer.script", "must be the path of a .py file, not starting with '-'")])
        if not isinstance(t.args, (list, tuple)):
            raise RenderError([("trainer.args", "must be a list of arguments")])
        return head + list(t.args)

    def entry_script(self) -> str:
        """The per-node entry script, byte-identical for every node and every backend."""
        s = self.spec
        return render_template(
            "entry.sh.j2",
            spec=s,
            env=self.environment(),
            torchrun_args=self.torchrun_args(),
            trainer_argv=self.trainer_argv(),
            warning_signal=self.warning_signal(),
            node_rank_var=NODE_RANK_VAR,
            master_addr_var=MASTER_ADDR_VAR,
            master_addr_file_var=MASTER_ADDR_FILE_VAR,
            master_port_var=MASTER_PORT_VAR,
            node_rank_offset_var=NODE_RANK_OFFSET_VAR,
            secrets_dir_var=SECRETS_DIR_VAR,
            **failure_report_vars(),
            **(server_entry_vars(s) if s.servers else {}),
        )


def ports_to_avoid(spec: JobSpec) -> list[int]:
    """Ports a derived master port must not take: every server role's ``port`` and
    ``group_port`` (a group port is bound on rank 0 itself; a server port on a host a job may
    share with node 0, as every node of the test cluster and of the local backend does)."""
    return sorted({r.port for r in spec.servers} | {r.group_port for r in spec.servers if r.group_port is not None})


def failure_report_vars() -> dict:
    """What ``halo_sched/templates/entry_failure_report.sh.j2`` needs: the collector's source, run on
    the node."""
    from .node import source as node_source
    from .templating import heredoc_tag

    source = node_source("failure_collector")
    monitor = node_source("hang_monitor")
    return {"collector": source, "collector_tag": heredoc_tag(source, "HALO_COLLECT_EOF"), "log_dir_var": LOG_DIR_VAR,
            "monitor": monitor, "monitor_tag": heredoc_tag(monitor, "HALO_MONITOR_EOF")}


def submission_id(spec: JobSpec) -> str:
    """A fresh id for each submission of ``spec``, ``NAME-YYYYmmdd-HHMMSS-xxxxxx``, like a SLURM
    job id: the local backend's job directory, Nomad's job ID (Nomad would otherwise treat a
    resubmitted file as the same job: not re-run when unchanged, replaced in place when
    changed; ``plan`` uses one too, so it never diffs against a running job of the same name).
    The name is checked again, whatever the model holds: it makes a directory name."""
    import secrets
    import time

    return f"{check(spec.name, 'job name', 'name')}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def entry_script(spec: JobSpec) -> str:
    return LaunchContract(spec).entry_script()
