"""The job file's sections as pydantic models: :class:`JobSpec` and its parts (trainer,
rendezvous, storage, network, slurm, nomad, parallelism, servers): the fields, their types and
bounds, and which check of halo_sched/jobfile_rules.py each field and section runs.

These models, with the plain functions of halo_sched/jobfile_rules.py, are the job file's one
definition: every command that reads a job file validates it here. What a valid value is
lives in halo_sched/values.py; reading a job file (YAML, the bounds on it, errors named by field
and line) in halo_sched/spec.py, which is also where ``load``/``loads`` come from.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from . import jobfile_rules as rules
from .jobfile_rules import (
    MAX_ATTEMPTS, Attempt, HangMethods, JobFile, JobSpecMethods, NomadMethods, NotifyMethods,
    PreflightMethods, ScriptBase, SlurmMethods,
)
from .node.failure_classes import NOTIFY_EVENTS, RETRY_NODE, RETRY_ON
from .values import (
    MAX_TIMEOUT_HOURS, NOMAD_MAX_CPU_MHZ, NOMAD_MAX_MEMORY_MB, SLURM_MAX_CPUS_PER_TASK, checked_env, checked_image,
    checked_secret_names, env_values_are_text,
)


class _Model(BaseModel):
    # strict: YAML already gives native types, and `nodes: true` or `port: "29500"` is a mistake.
    # defer_build: a model's validator is built when it first validates, not at import. Validating a
    # job file builds JobSpec's alone (its sections inlined), not one more per section model as well
    # (~9 ms of a render or a submit).
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False, strict=True, defer_build=True)


class Trainer(_Model):
    """What torchrun starts on every node: a script or a module, with its arguments."""

    script: str | None = Field(None, description="Path of the training script (a .py file), as seen on the nodes.")
    module: str | None = Field(None, description="A Python module to run with `python -m` semantics (torchrun -m).")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script, each verbatim.")

    _script = field_validator("script")(staticmethod(rules.trainer_script))
    _module = field_validator("module")(staticmethod(rules.trainer_module))
    _args = field_validator("args")(staticmethod(rules.trainer_args))
    _one_of = model_validator(mode="after")(rules.trainer_one_of)


class Rendezvous(_Model):
    """Static torchrun rendezvous at rank 0 (node 0)."""

    port: int | None = Field(
        None, ge=1024, le=65535,
        description="Master port on node 0; must be reachable node to node. Unset: each job its own (SLURM: "
                    "28500 + SLURM_JOB_ID % 1000; Nomad: a dynamic port; local: a free port of 27500-28499 at submit).",
    )
    timeout_s: int = Field(
        900, ge=1, le=7 * 86400,
        description="Bound on waiting for rank 0 and the other nodes (torchrun store timeout; on Nomad, each node's wait for rank 0's registration).",
    )


class Storage(_Model):
    """Checkpoint and input storage -> the DIST_* environment every rank gets (identical on all)."""

    shared: bool = Field(True, description="Nodes share a filesystem (NFS/Lustre): rank 0 downloads and writes.")
    input_shared: bool | None = Field(None, description="Read side; set false on a flaky NFS/EFS mount.")
    output_shared: bool | None = Field(None, description="Write side (checkpoints).")
    store_timeout_hours: float = Field(
        4, gt=0, le=MAX_TIMEOUT_HOURS, allow_inf_nan=False,
        description="DIST_STORE_TIMEOUT_HOURS: bound on one rank going first (at most a week).",
    )
    nccl_timeout_minutes: int | None = Field(
        None, ge=1, le=MAX_TIMEOUT_HOURS * 60, description="DIST_NCCL_TIMEOUT_MINUTES, the same on every rank (at most a week).",
    )


class Network(_Model):
    """The compute fabric: which NIC carries rendezvous and NCCL, and fabric-specific NCCL settings."""

    interface: str | None = Field(
        None, description="Fabric NIC (e.g. ib0, eth0 on an overlay): NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, and rank 0's address on SLURM.",
    )
    fabric: Literal["default", "infiniband", "roce", "efa"] = Field(
        "default", description="efa adds NCCL_NET_PLUGIN=ofi NCCL_NET=Libfabric; InfiniBand/RoCE use NCCL defaults.",
    )
    cross_node_expert_parallel: bool = Field(False, description="EFA only: NCCL_GIN_TYPE=2 (and /dev/gdrdrv) for cross-node EP.")
    nccl_proto_simple: bool = Field(False, description="NCCL_PROTO=simple on every rank.")
    nccl_debug: Literal["", "WARN", "INFO", "TRACE"] = Field("", description="NCCL_DEBUG on every rank.")

    _iface = field_validator("interface")(staticmethod(rules.network_iface))
    _ep = model_validator(mode="after")(rules.network_ep)


class Slurm(SlurmMethods, _Model):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = Field(None, description="Time limit in a SLURM format: minutes, HH:MM:SS, D-HH:MM:SS.")
    constraint: str | None = None
    exclusive: bool = False
    cpus_per_task: int | None = Field(
        None, ge=1, le=SLURM_MAX_CPUS_PER_TASK, description="CPUs for each node's torchrun (one task per node).",
    )
    mem: str | None = Field(None, description="Memory per node, e.g. 64G (sbatch --mem).")
    signal: str | None = Field(
        None, description="Preemption/time-limit warning, e.g. USR2@120: sent to the batch script, which forwards it to "
                          "every rank's trainer (torchrun ignores it). USR1 is refused: NCCL uses it.",
    )
    requeue: bool | None = Field(
        None, description="true -> --requeue, and a warned job whose ranks all exit 0 requeues itself (same job id); "
                          "false -> --no-requeue.",
    )
    max_requeues: int = Field(
        3, ge=0, le=1000,
        description="With requeue: true, requeue after a warning only while SLURM_RESTART_COUNT is below this.",
    )
    container_workdir: str | None = Field(
        None, description="pyxis: working directory inside the image (default: the submit directory, mounted).",
    )
    container_runtime: Literal["pyxis", "none"] = Field(
        "pyxis", description="How `image` runs on SLURM: pyxis/enroot (srun --container-image), or none to run on the host.",
    )
    container_mounts: list[str] = Field(default_factory=list, description="pyxis --container-mounts entries (src:dst[:flags]).")
    extra_args: list[str] = Field(default_factory=list, description="More sbatch options, each '--name' or '--name=value'.")
    spare_nodes: int = Field(
        0, ge=0, le=64,
        description="Hot spares: the allocation holds nodes + spare_nodes nodes (sbatch --no-kill) and the trainer runs on "
                    "`nodes` of them; after a node's fault a spare takes the bad node's rank in a new step of the same "
                    "job, without the queue. Needs exclusive: true.",
    )

    _word = field_validator("partition", "account", "qos")(staticmethod(rules.slurm_word))
    _mem = field_validator("mem")(staticmethod(rules.slurm_mem))
    _constraint = field_validator("constraint")(staticmethod(rules.slurm_constraint))
    _quoted = field_validator("partition", "account", "qos", "constraint", "mem", "time", mode="before")(staticmethod(rules.slurm_quoted))
    _time = field_validator("time")(staticmethod(rules.slurm_time))
    _signal = field_validator("signal")(staticmethod(rules.slurm_signal))
    _workdir = field_validator("container_workdir")(staticmethod(rules.slurm_workdir))


    _mounts = field_validator("container_mounts")(staticmethod(rules.slurm_mounts))
    _extra = field_validator("extra_args")(staticmethod(rules.slurm_extra))
    _extra_conflicts = model_validator(mode="after")(rules.slurm_extra_conflicts)
    _spares = model_validator(mode="after")(rules.slurm_spares)


class Nomad(NomadMethods, _Model):
    datacenters: list[str] = Field(default_factory=lambda: ["*"], description="Datacenters to place in ('*' = all).")
    namespace: str | None = None
    region: str | None = None
    driver: Literal["docker", "exec", "raw_exec"] = Field(
        "docker", description="docker needs `image`; exec/raw_exec run on hosts without docker.",
    )
    max_run_duration: str | None = Field(
        None, description="Group max_run_duration (Nomad 2.0.3+; older servers drop it silently), a Go duration such as "
                          "12h: stops each allocation this long after its creation. It does not bound a half-placed job "
                          "(a group that never placed has no allocation, so no timer): placement_timeout_s does.",
    )
    placement_timeout_s: int | None = Field(
        None, ge=1, le=MAX_TIMEOUT_HOURS * 3600, description="`submit --wait` stops the job if not all nodes are running within this many seconds.",
    )
    cpu: int = Field(1000, ge=1, le=NOMAD_MAX_CPU_MHZ, description="CPU per node in MHz.")
    memory: int = Field(
        4096, ge=16, le=NOMAD_MAX_MEMORY_MB, description="Memory per node in MB (a hard cap for docker, shm included).",
    )
    shm_size: int | str | None = Field(None, description="Docker /dev/shm size, e.g. 8GiB; counts against memory.")
    volumes: list[str] = Field(
        default_factory=list,
        description="Docker bind mounts host:container[:ro]; literal text (no ${} interpolation). Host paths need the "
                    "client's docker plugin setting volumes { enabled = true } (off by default).",
    )
    priority: int | None = Field(None, ge=1, le=100)
    user: str | None = Field(
        None, description='"UID:GID" (numbers) the task runs as: the secret files (secret_env) are rendered for this '
                          "owner (mode 0400), and a docker task runs as it whatever the image's USER. Needed for "
                          "secret_env when the image's user is not root; with the exec driver (which runs tasks as "
                          "nobody) give nobody's ids on the clients, usually 65534:65534.",
    )

    keeper: bool = Field(
        True,
        description="With retry: (or spare_nodes), the job carries its run's keeper: a small group of its own whose "
                    "task registers the next attempt (or gives a spare the failed rank) through the Task API, with "
                    "no halo-sched process alive (docs/nomad.md, \"The run's keeper\"; its workload identity needs "
                    "the ACL policy there). false: the job carries no keeper, and a failed attempt is not retried on "
                    "Nomad (no halo-sched process registers one; submit says so).",
    )

    spare_nodes: int = Field(
        0, ge=0, le=64,
        description="Hot spares: the trainer's group holds nodes + spare_nodes allocations, the spares idle; after a "
                    "node's fault the run's keeper gives the bad node's rank to a spare and every rank starts again in "
                    "the same allocations, without a new placement (docs/nomad.md, \"Hot spares\"). Needs keeper: "
                    "true; their idle GPU-hours count in the run's.",
    )

    _user = field_validator("user")(staticmethod(rules.nomad_user))


    _dcs = field_validator("datacenters")(staticmethod(rules.nomad_dcs))
    _namespace = field_validator("namespace")(staticmethod(rules.nomad_namespace))
    _region = field_validator("region")(staticmethod(rules.nomad_region))
    _dur = field_validator("max_run_duration")(staticmethod(rules.nomad_dur))
    _shm = field_validator("shm_size", mode="before")(staticmethod(rules.nomad_shm))
    _vols = field_validator("volumes")(staticmethod(rules.nomad_vols))


    _docker_only = model_validator(mode="after")(rules.nomad_docker_only)
    _spares = model_validator(mode="after")(rules.nomad_spares)
    _shm_fits = model_validator(mode="after")(rules.nomad_shm_fits)


class Parallelism(_Model):
    """The trainer's parallel layout, checked against nodes x GPUs when the file is loaded
    (halo_sched/layout.py) and given to every rank as HALO_PARALLEL_* and NVLINK_DOMAIN_SIZE."""

    tp: int = Field(1, ge=1, le=4096, description="Tensor-parallel size.")
    ep: int = Field(1, ge=1, le=65536, description="Expert-parallel size.")
    etp: int = Field(1, ge=1, le=4096, description="Expert tensor-parallel size.")
    cp: int = Field(1, ge=1, le=4096, description="Context-parallel size.")
    hsdp: bool = Field(False, description="Shard within an NVLink domain, replicate across domains (pure DP or CP only).")
    ep_scope: Literal["auto", "node", "global"] = Field(
        "auto", description="EP groups inside one NVLink domain (node) or spanning domains (global); auto goes "
                            "global once ep outgrows the domain.",
    )
    nvlink_domain_size: int | None = Field(
        None, ge=1, le=65536, description="Ranks (GPUs) per NVLink domain: default one node's (gpus_per_node); 72 on an NVL72 rack.",
    )


class Server(_Model):
    """A rollout-server role (vLLM, SGLang, ...) on nodes of its own, one server per node, on the
    job's fabric. Wiring and entry script: halo_sched/servers.py."""

    name: str = Field(description="Role name: lower-case letters, digits and '-' (at most 24); HALO_SERVER_<NAME>_URLS "
                                  "on every trainer rank, upper-cased with '-' as '_'.")
    nodes: int = Field(ge=1, le=1024, description="Server nodes of this role: one server per node.")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs each server gets (its own, never a trainer rank's).")
    command: list[str] = Field(description="The server's argv, run verbatim (no shell), like trainer.args.")
    port: int = Field(ge=1024, le=65535, description="The server's HTTP port on its node.")
    group_port: int | None = Field(
        None, ge=1024, le=65535,
        description="Weight-sync port the trainer's rank 0 binds and the servers dial back: HALO_SERVER_<NAME>_GROUP_PORT.",
    )
    health_path: str = Field("/health", description="HTTP path that answers 200 once the server is ready.")
    image: str | None = Field(None, description="Container image of the servers (default: the job's image).")
    env: dict[str, str] = Field(default_factory=dict, description="More environment for the servers (literal values).")
    secret_env: list[str] = Field(
        default_factory=list,
        description="Names of variables taken from the submitter's environment at submit time (e.g. HF_TOKEN for a "
                    "model download): every server of the role gets them, as secret_env gives the ranks theirs.",
    )
    setup: list[str] = Field(default_factory=list, description="Shell lines run on each server node before the server.")

    _name = field_validator("name")(staticmethod(rules.server_name))
    _command = field_validator("command")(staticmethod(rules.server_command))
    _health = field_validator("health_path")(staticmethod(rules.server_health))
    _image = field_validator("image")(staticmethod(checked_image))
    _env_types = field_validator("env", mode="before")(staticmethod(env_values_are_text))
    _env = field_validator("env")(staticmethod(checked_env))
    _secret_env = field_validator("secret_env")(staticmethod(checked_secret_names))
    _setup_lines = field_validator("setup", mode="before")(staticmethod(rules.setup_lines))
    _process_size = model_validator(mode="after")(rules.server_process_size)
    _setup = field_validator("setup")(staticmethod(rules.server_setup))


class Hang(HangMethods, _Model):
    """Hang detection: a monitor beside torchrun on every node ends the job as HUNG when no rank of
    its node made progress for ``timeout_s`` (docs/failures.md, "Hangs")."""

    timeout_s: int = Field(
        300, ge=10, le=7 * 86400,
        description="Seconds without progress (a rank's report, see halo_sched/node/progress.py) before the job ends "
                    "as HUNG. Default 300: half of NCCL's 600 s collective timeout, a sixth of gloo's 1800 s, and far "
                    "above a healthy step. At least 10 (the monitor polls each second).",
    )
    first_step_s: int | None = Field(
        None, ge=10, le=7 * 86400,
        description="Before a rank's first progress report (imports, loading, the first step; a trainer without the "
                    "protocol: always) the rank counts as hung after this long with no output. Default: 2 x timeout_s.",
    )


class Retry(_Model):
    """``retry: {attempts: N, on: [node, hang, preflight, job, unknown]}``: run the job again after
    a failure of a listed class, up to ``attempts`` attempts in all (the first included; on SLURM
    a restart in place is one, docs/recovery.md)."""

    attempts: int = Field(ge=1, le=MAX_ATTEMPTS, description=f"Attempts in all, the first included (1-{MAX_ATTEMPTS}); "
                                                             "a restart in place counts as one, a spare swap does not.")
    on: list[Literal[RETRY_ON]] = Field(  # the failure vocabulary's words (node/failure_classes.py)
        default_factory=lambda: [RETRY_NODE], min_length=1,
        description=f"Failure classes that start another attempt: {', '.join(RETRY_ON)}. Default [node]; job (the "
                    "job's own fault: an exception, a crash) and unknown (cause unknown) are opt-in. On SLURM a failure "
                    "that is no node's restarts in place, in the same allocation; the same failure at the same "
                    "step twice (a crash loop) ends the run.")


class Preflight(PreflightMethods, _Model):
    """The preflight gate inside the job (docs/preflight.md)."""

    gate: bool = Field(
        False,
        description="Run the node checks of `halo-sched preflight` (network interface, GPUs, RDMA devices) on every "
                    "node after setup, before torchrun; a failing node fails the attempt as a node fault (ledgered).",
    )
    min_busbw: str | None = Field(
        None,
        description='A bus-bandwidth floor for the gate, a positive number with its unit: "5GB/s" or "800MB/s" '
                    "(decimal, as nccl-tests prints: 1 GB/s = 10^9 bytes/s). The gate then also times a send/recv "
                    "from every node to node 0 before torchrun; a node below the floor fails the attempt as a node "
                    "fault, naming the measured and required figures. Needs gate: true.",
    )

    _busbw = field_validator("min_busbw", mode="before")(staticmethod(rules.preflight_busbw))
    _busbw_needs_gate = model_validator(mode="after")(rules.preflight_busbw_needs_gate)


class Notify(NotifyMethods, _Model):
    """Webhook notifications (docs/failures.md, "Notifications"): the URL is a secret, taken by
    name from the environment of the process that observes the state change; never stored."""

    webhook_env: str = Field(
        description="Name of the variable holding the webhook URL (http or https) in the submitter's environment "
                    "(and in that of a later halo-sched process that delivers: watch, or `halo-sched notify`).",
    )
    on: list[Literal[NOTIFY_EVENTS]] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS), min_length=1,
        description="Events that send one JSON POST each: failed, hung, retried, completed.",
    )

    _name = field_validator("webhook_env")(staticmethod(rules.notify_name))
    _once = field_validator("on")(staticmethod(rules.notify_once))


class JobSpec(JobSpecMethods, _Model):
    """One multi-node torchrun job: the same on every backend."""

    #: Set by :func:`load` (and kept by :func:`validated`); the job record keeps it.
    _job_file: JobFile | None = PrivateAttr(default=None)
    #: Set by halo_sched/runs.py for a retry attempt (kept by :func:`validated`).
    _attempt: Attempt | None = PrivateAttr(default=None)
    #: Where a relative trainer.script is read from: set by :func:`load` (the job file's
    #: directory), kept by :func:`validated`, ``with_changes`` and a run's attempts.
    _script_base: ScriptBase | None = PrivateAttr(default=None)

    name: str = Field(description="Job name (letters, digits, _ . -; at most 63).")
    nodes: int = Field(ge=1, le=4096, description="Number of nodes: one torchrun per node.")
    nproc_per_node: int = Field(ge=1, le=1024, description="Processes (ranks) torchrun starts on each node.")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node; 0 means CPU with gloo.")
    trainer: Trainer
    env: dict[str, str] = Field(default_factory=dict, description="Environment for every rank; values are literal bytes.")
    secret_env: list[str] = Field(
        default_factory=list,
        description="Names of variables taken from the submitter's environment at submit time (tokens, keys): every "
                    "rank gets them, no rendered file, job or log shows their values.",
    )
    setup: list[str] = Field(default_factory=list, description="Shell lines run on each node before torchrun.")
    image: str | None = Field(None, description="Container image (Nomad docker driver; pyxis on SLURM).")
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    storage: Storage = Field(default_factory=Storage)
    network: Network = Field(default_factory=Network)
    slurm: Slurm = Field(default_factory=Slurm)
    nomad: Nomad = Field(default_factory=Nomad)
    avoid_ledgered_nodes: bool = Field(
        True,
        description="Keep off the hosts in the node ledger (`halo-sched nodes`): SLURM --exclude, a Nomad "
                    "constraint on ${node.unique.name}; false: run anywhere.",
    )
    hang: Hang | None = Field(
        default_factory=Hang, description="Hang detection (on by default; `hang: null` turns it off).",
    )
    preflight: Preflight = Field(default_factory=Preflight)
    notify: Notify | None = Field(None, description="Webhook notifications of the job's state changes.")
    retry: Retry | None = Field(
        None,
        description="Automatic retry: {attempts: N, on: [node, hang, preflight, job, unknown]}; on SLURM the "
                    "allocation restarts in place first, then the failed attempt submits the next; local: the run's "
                    "keeper; Nomad: the run's keeper, a task of the job. Default: no retry.",
    )
    parallelism: Parallelism | None = Field(None, description="Parallel layout (tp, ep, ...), checked at validate time.")
    servers: list[Server] = Field(
        default_factory=list,
        description="Rollout-server roles on nodes of their own (RL): every trainer rank gets HALO_SERVER_<NAME>_URLS "
                    "and starts once each server answers its health_path.",
    )

    _name = field_validator("name")(staticmethod(rules.job_name))
    _env_types = field_validator("env", mode="before")(staticmethod(env_values_are_text))
    _env = field_validator("env")(staticmethod(checked_env))
    _secret_env = field_validator("secret_env")(staticmethod(checked_secret_names))
    _setup_lines = field_validator("setup", mode="before")(staticmethod(rules.setup_lines))
    _setup = field_validator("setup")(staticmethod(rules.job_setup))
    _image = field_validator("image")(staticmethod(checked_image))
    _cross_checks = model_validator(mode="after")(rules.job_cross_checks)


