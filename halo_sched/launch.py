"""The launch plan: a validated JobSpec compiled into one immutable, typed description of what
runs where, and the per-node entry script rendered from it.

:func:`compile_launch` is the only place that turns the job file into launch facts: the trainer's
node group and each server role with their node offsets, node counts, ports, GPUs and images; the
environment every rank or server gets (derived, then the user's) and the secret names; the
rendezvous port or the rule that derives one; the warning signal and its carrier; the SLURM
output file and cluster; the job's name and id; and the environment variable names the nodes
read (:data:`halo_sched.node.contract.NAMES`). Every renderer (SLURM, Nomad, local) and every
template is a view of a :class:`Launch`; nothing is parsed back out of rendered text.

The launch contract itself: one torchrun per node with static rendezvous at node 0. Every node
gets the same command and environment; the only per-node input is the node rank (plus an offset,
which Nomad's worker group adds to its allocation index). Backends supply it (SLURM from
``$SLURM_NODEID`` inside the task, Nomad from the group and allocation index, local per process)
together with rank 0's address and port, or a file to poll for them until
``rendezvous.timeout_s`` runs out.

The port is ``rendezvous.port`` when the job file sets it, on every backend. Unset, each job gets
its own, so that two jobs whose node 0 share a host never both take torchrun's customary 29500
(EADDRINUSE, or worse a node joining the other job's store: pytorch#126510): SLURM derives it from
the job id inside ``DERIVED_PORTS``, Nomad assigns a dynamic port, the local backend picks a free
one in ``LOCAL_PORTS`` (a range of its own) at submit. The entry script itself is the same text either way.

This module knows no scheduler; it renders ``halo_sched/templates/entry.sh.j2``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, NamedTuple

from .node.contract import DERIVED_PORTS, INDEX_TAG, NAMES, WARNING_CARRIER, EnvNames
from .node_runtime import checksums, runtime
from .templating import RenderError, check, checked_int, render_template
from .values import valid_host

if TYPE_CHECKING:  # pragma: no cover
    from .models import JobSpec

#: The SLURM job's one output file (sbatch's filename pattern): every node writes into it.
SLURM_OUTPUT = "halo-%x-%j.out"

Env = tuple[tuple[str, str], ...]  # (name, value) in order: the derived variables, then the user's


class Trainer(NamedTuple):
    """The trainer's node group: nodes 0..nodes-1 of the job, one torchrun each."""

    nodes: int
    nproc_per_node: int
    gpus: int  # per node
    image: str | None
    env: Env
    secret_names: tuple[str, ...]
    setup: tuple[str, ...]
    #: torchrun's options that are the same on every node (rank and address come at run time).
    torchrun_args: tuple[str, ...]
    #: What torchrun runs: ``-m MODULE`` or the script, then the trainer's arguments.
    argv: tuple[str, ...]
    offset: int = 0


class ServerRole(NamedTuple):
    """One role of ``servers:``: one server per node, on nodes of its own."""

    index: int  # its place in ``servers:``
    name: str
    nodes: int
    #: Its first node in the whole allocation (after the trainer's nodes and earlier roles').
    offset: int
    port: int
    group_port: int | None
    gpus: int  # per node
    image: str | None  # the role's own, else the job's
    env: Env  # the job's derived fabric/storage env (identical to the ranks'), then the role's
    secret_names: tuple[str, ...]
    setup: tuple[str, ...]
    command: tuple[str, ...]
    health_path: str
    # What the trainer's nodes learn of the role (halo_sched/templates/entry_servers.sh.j2).
    urls_var: str
    group_port_var: str
    addrs_var: str
    addrs_file_var: str


class Rendezvous(NamedTuple):
    """Rank 0's port: ``port`` when the job file sets it; else each backend derives the job's own
    (SLURM from its id within ``derived``, skipping ``avoid``; local a free one of its own range,
    ``LOCAL_PORTS``, skipping ``avoid``; Nomad a dynamic port)."""

    port: int | None
    timeout_s: int
    derived: range
    #: Ports a derived port must not take: every server role's port and group port (a group port
    #: is bound on rank 0 itself; a server port on a host a job may share with node 0).
    avoid: tuple[int, ...]


class WarningSignal(NamedTuple):
    """The preemption/time-limit warning: ``signal`` is what a trainer gets (``slurm.signal``'s,
    USR2 by default; torchrun ignores it, the trainer handles it); ``carrier`` takes it to every
    node's entry script, which hands ``signal`` on to the ranks."""

    signal: str
    #: slurm.signal is set: SLURM sends the warning ``seconds`` before the time limit (sbatch's
    #: default when None), and to the batch script alone with ``B`` among ``flags``. Unset, only
    #: ``halo-sched cancel --signal`` warns the job.
    requested: bool = False
    flags: str = ""
    seconds: int | None = None
    carrier: str = WARNING_CARRIER


class Launch(NamedTuple):
    """One job, compiled: what every renderer writes, and nothing else."""

    #: The validated job file, for what only one scheduler's renderer reads (its own section).
    spec: JobSpec
    name: str
    #: The scheduler's job id where the renderer writes one (Nomad), else the name.
    job_id: str
    trainer: Trainer
    servers: tuple[ServerRole, ...]
    rendezvous: Rendezvous
    warning: WarningSignal
    #: Every secret the job takes at submit time (the ranks' and the servers'), each once.
    secret_names: tuple[str, ...]
    #: SLURM: the output file's pattern, and the cluster ``--clusters=NAME`` names (None: the local one).
    output: str
    cluster: str | None
    #: network.interface: the fabric NIC whose address rank 0 and the servers take (None: the
    #: address the scheduler reaches each node by).
    interface: str | None
    #: Hosts the job must not run on, as ``(backend, host)`` (``*``: every backend): the node
    #: ledger's active entries (halo_sched/ledger.py) unless the job file sets
    #: ``avoid_ledgered_nodes: false``. Each backend takes its own (:meth:`exclude_hosts`): SLURM
    #: ``--exclude``, a Nomad constraint on ``${node.unique.name}``; the local backend runs on
    #: one host and ignores them. A host another scheduler named means nothing here (sbatch
    #: refuses an ``--exclude`` naming a node it does not know).
    excluded: tuple[tuple[str, str], ...] = ()
    names: EnvNames = NAMES
    index_tag: str = INDEX_TAG
    #: Which attempt of its run this submission is (halo_sched/runs.py; 0: the first): the ranks'
    #: HALO_RESTART_COUNT starts there (SLURM adds its own requeues, SLURM_RESTART_COUNT).
    restart_count: int = 0

    def exclude_hosts(self, backend: str) -> tuple[str, ...]:
        """The hosts ``backend``'s job keeps off, sorted, each once."""
        return tuple(sorted({h for b, h in self.excluded if b in (backend, "*")}))

    @property
    def all_nodes(self) -> int:
        """Trainer nodes plus every server node."""
        return self.trainer.nodes + sum(r.nodes for r in self.servers)

    @property
    def max_gpus(self) -> int:
        """The most GPUs any node of the job asks for (trainer or server)."""
        return max([self.trainer.gpus] + [r.gpus for r in self.servers])


def _env(pairs: dict, what: str) -> Env:
    if not isinstance(pairs, dict):
        raise RenderError([(what, "must be a mapping of variable names to text")])
    return tuple(pairs.items())


def _trainer_argv(spec: JobSpec, backend: str | None) -> tuple[str, ...]:
    t = spec.trainer
    if t.module:
        head = ["-m", check(t.module, "Python module", "trainer.module")]
    elif isinstance(t.script, str) and t.script and not t.script.startswith("-"):
        # Quoted by the template; a job file's relative script, as the backend's nodes see it
        # (jobfile_rules.JobSpecMethods.script_check: local and SLURM on the host get it absolute).
        head = [spec.script_check(backend).on_nodes if backend else t.script]
    else:  # torchrun would read it as one of its options
        raise RenderError([("trainer.script", "must be the path of a .py file, not starting with '-'")])
    if not isinstance(t.args, (list, tuple)):
        raise RenderError([("trainer.args", "must be a list of arguments")])
    return tuple(head + list(t.args))


def _warning(spec: JobSpec) -> WarningSignal:
    try:
        flags, name, secs = spec.slurm.warning
    except (AttributeError, TypeError):  # not a [B:]SIGNAL[@seconds] at all: refused below
        flags, name, secs = "", spec.slurm.signal, None
    return WarningSignal(signal=check(name, "signal name", "slurm.signal"), requested=spec.slurm.signal is not None,
                         flags=flags, seconds=None if secs is None else checked_int(secs, "slurm.signal"))


def _cluster(extra_args) -> str | None:
    """The one cluster ``--clusters=NAME`` (or ``--cluster=NAME``) in slurm.extra_args names,
    as the transports read it (``names_clusters``); None for the local one or several."""
    names = [value for name, _, value in (a.partition("=") for a in extra_args)
             if name in ("--clusters", "--cluster") and value]
    return names[-1] if names and "," not in names[-1] else None


def _excluded(spec: JobSpec, ledgered) -> tuple[tuple[str, str], ...]:
    """The hosts to keep off, as (backend, host), each host a checked host name: it lands on an
    ``#SBATCH`` line and in a Nomad constraint."""
    attempt = spec._attempt
    pairs = [tuple(p) for p in ledgered] if spec.avoid_ledgered_nodes else []
    # a retry keeps off the hosts its run's earlier attempts failed on
    pairs += [("*", h) for h in (attempt.exclude if attempt is not None else ())]
    if not pairs:
        return ()
    for _, h in pairs:
        if not valid_host(h):
            raise RenderError([("exclude_hosts", f"{h!r} is not a host name")])
    return tuple(sorted(set(pairs)))


def compile_launch(spec: JobSpec, job_id: str | None = None, ledgered: Iterable[tuple[str, str]] = (),
                   backend: str | None = None) -> Launch:
    """The launch plan of a validated ``spec``. Every number and every word that a renderer
    writes where nothing can quote it is checked here as it is taken (whatever the model holds:
    ``model_copy`` does not validate); the templates' filters check again. ``job_id``: the
    scheduler's id of this submission where the renderer writes one (Nomad), else the name.
    ``ledgered``: the node ledger's hosts as (backend, host) (``ledger.exclusions()``, which the
    backend reads: compiling reads no store), kept off unless ``avoid_ledgered_nodes`` is false.
    ``backend``: whose nodes run it, for the path of a job file's relative ``trainer.script``
    (None: as written)."""
    s = spec
    nodes = checked_int(s.nodes, "nodes")
    nproc = checked_int(s.nproc_per_node, "nproc_per_node")
    timeout_s = checked_int(s.rendezvous.timeout_s, "rendezvous.timeout_s")
    derived = s.derived_env()
    trainer = Trainer(
        nodes=nodes, nproc_per_node=nproc, gpus=checked_int(s.gpus_per_node, "gpus_per_node"), image=s.image,
        env=tuple(derived.items()) + _env(s.env, "env"), secret_names=tuple(s.secret_env), setup=tuple(s.setup),
        torchrun_args=(
            f"--nnodes={nodes}",
            f"--nproc_per_node={nproc}",
            # --node_rank, --master_addr and --master_port follow, from the node's environment
            # A fixed-size world: a restarted node could never rejoin a static rendezvous.
            "--max_restarts=0",
            # Static rendezvous store timeout: bounds how long a node waits for the others.
            f"--rdzv_conf=timeout={timeout_s}",
        ),
        argv=_trainer_argv(s, backend),
    )
    roles, offset = [], nodes
    for i, r in enumerate(s.servers):
        name = check(r.name, "server name", f"servers[{i}].name")
        count = checked_int(r.nodes, f"servers[{i}].nodes")
        roles.append(ServerRole(
            index=i, name=name, nodes=count, offset=offset, port=checked_int(r.port, f"servers[{i}].port"),
            group_port=None if r.group_port is None else checked_int(r.group_port, f"servers[{i}].group_port"),
            gpus=checked_int(r.gpus_per_node, f"servers[{i}].gpus_per_node"), image=r.image or s.image,
            env=tuple(derived.items()) + _env(r.env, f"servers[{i}].env"), secret_names=tuple(r.secret_env),
            setup=tuple(r.setup), command=tuple(r.command), health_path=r.health_path,
            urls_var=NAMES.role_urls(name), group_port_var=NAMES.role_group_port(name),
            addrs_var=NAMES.role_addrs(name), addrs_file_var=NAMES.role_addrs_file(name),
        ))
        offset += count
    port = s.rendezvous.port
    avoid = sorted({r.port for r in roles} | {r.group_port for r in roles if r.group_port is not None})
    return Launch(
        spec=s, name=check(s.name, "job name", "name"), job_id=check(job_id or s.name, "job id", "name"),
        trainer=trainer, servers=tuple(roles),
        rendezvous=Rendezvous(port=None if port is None else checked_int(port, "rendezvous.port"),
                              timeout_s=timeout_s, derived=DERIVED_PORTS, avoid=tuple(avoid)),
        warning=_warning(s), secret_names=tuple(s.secret_names), output=SLURM_OUTPUT,
        cluster=_cluster(s.slurm.extra_args), interface=s.network.interface,
        excluded=_excluded(s, ledgered),
        restart_count=checked_int(s._attempt.number, "retry") if s._attempt is not None else 0,
    )


class _Gate(NamedTuple):
    fabric: str
    gdr: int
    min_busbw: str = ""  # GB/s as digits, "" without preflight.min_busbw
    busbw_size: str = ""


def needs_gdr(spec: JobSpec) -> bool:
    """Whether the job needs GPUDirect RDMA (/dev/gdrdrv): cross-node expert parallelism."""
    from .layout import Layout

    lay = Layout.of(spec)
    return bool(spec.network.cross_node_expert_parallel or (lay and lay.ep_crosses_nodes and spec.network.fabric == "efa"))


def _gate(spec: JobSpec) -> _Gate:
    """What the preflight gate checks beyond the node's interface: as ``halo-sched preflight``."""
    floor = spec.preflight.min_busbw_gbps() if spec.preflight.gate is True else None
    return _Gate(fabric=str(spec.network.fabric), gdr=int(needs_gdr(spec)),  # fabric: quoted by the template
                 min_busbw="" if floor is None else repr(float(floor)),
                 # GPUs: a size in NCCL's bandwidth regime; CPUs (gloo): one a 2-core host times in ~0.1 s.
                 busbw_size="256M" if spec.gpus_per_node else "64M")


def render_entry(launch: Launch) -> str:
    """The per-node entry script, byte-identical for every node and every backend."""
    return render_template(
        "entry.sh.j2", launch=launch, names=launch.names, warning=launch.warning,
        trainer=launch.trainer, runtime=runtime(), sums=checksums(), gate=_gate(launch.spec),
        spares=launch.spec.nomad.spare_nodes,
    )


def submission_id(spec: JobSpec) -> str:
    """A fresh id for each submission of ``spec``, ``NAME-YYYYmmdd-HHMMSS-xxxxxx``, like a SLURM
    job id: the local backend's job directory, Nomad's job ID (Nomad would otherwise treat a
    resubmitted file as the same job: not re-run when unchanged, replaced in place when
    changed; ``plan`` uses one too, so it never diffs against a running job of the same name).
    The name is checked again, whatever the model holds: it makes a directory name."""
    import secrets
    import time

    return f"{check(spec.name, 'job name', 'name')}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
