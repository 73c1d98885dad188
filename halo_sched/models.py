"""The job file's sections as pydantic models: :class:`JobSpec` and its parts (trainer,
rendezvous, storage, network, slurm, nomad, parallelism, servers), each field checked as it is
read, and the rules across fields and server roles.

What a valid value is lives in halo_sched/values.py; reading a job file (YAML, the bounds on it,
errors named by field and line) in halo_sched/spec.py, which is also where ``load``/``loads``
come from.
"""
from __future__ import annotations

import os
import re
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .errors import SpecError
from .node.contract import WARNING_CARRIER
from .values import (
    DEFAULT_WARNING, ENV_NAME_RE, IFACE_RE, MAX_TIMEOUT_HOURS, MODULE_RE, NAME_RE, NOMAD_MAX_CPU_MHZ, NOMAD_MAX_MEMORY_MB, SBATCH_ARG_RE,
    SBATCH_CONFLICTS, SBATCH_EXACT_PREFIXES, SBATCH_OPTIONS_REFUSED, SBATCH_OPTIONS_SET_BY,
    SBATCH_SHORT_OPTIONS, SERVER_NAME_RE, SLURM_CONSTRAINT_RE, SLURM_DEFAULT_WARNING_S, SLURM_MAX_CPUS_PER_TASK,
    SLURM_TIME_RE, SLURM_WARNING_EARLY_S, SLURM_WORD_RE, WARNING_SIGNALS, check_arg_size,
    check_env_size, check_process_size, checked_env, checked_image, checked_secret_names, env_values_are_text,
    no_nul, parse_go_duration, parse_size, parse_slurm_mem, parse_slurm_time, parse_warning,
    sbatch_option_owner,
)


class _Model(BaseModel):
    # strict: YAML already gives native types, and `nodes: true` or `port: "29500"` is a mistake.
    # defer_build: a model's validator is built when it first validates, not at import. Validating a
    # job file builds JobSpec's alone (its sections inlined), not one more per section model as well
    # (docs/performance.md, "Start-up": ~9 ms of `render`).
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False, strict=True, defer_build=True)


class Trainer(_Model):
    """What torchrun starts on every node: a script or a module, with its arguments."""

    script: str | None = Field(None, description="Path of the training script (a .py file), as seen on the nodes.")
    module: str | None = Field(None, description="A Python module to run with `python -m` semantics (torchrun -m).")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script, each verbatim.")

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        if v is None:
            return v
        no_nul(v, "script")
        check_arg_size(v, "the path")
        if not v.strip() or not v.endswith(".py"):
            raise ValueError("must be the path of a .py file (use trainer.module for a module)")
        if v.startswith("-"):
            raise ValueError("must not start with '-' (it would be read as a torchrun option)")
        return v

    @field_validator("module")
    @classmethod
    def _module(cls, v: str | None) -> str | None:
        if v is not None and not MODULE_RE.fullmatch(v):
            raise ValueError("must be a dotted Python module name such as pkg.train")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        for i, a in enumerate(v):
            no_nul(a, "an argument")
            check_arg_size(a, f"argument {i}")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> "Trainer":
        if (self.script is None) == (self.module is None):
            raise ValueError("set exactly one of trainer.script or trainer.module")
        return self


class Rendezvous(_Model):
    """Static torchrun rendezvous at rank 0 (node 0)."""

    port: int | None = Field(
        None, ge=1024, le=65535,
        description="Master port on node 0; must be reachable node to node. Unset: each job its own (SLURM: "
                    "28500 + SLURM_JOB_ID % 1000; Nomad: a dynamic port; local: a free port at submit).",
    )
    timeout_s: int = Field(
        900, ge=1, le=7 * 86400,
        description="Bound on waiting for rank 0 and the other nodes (torchrun store timeout; Nomad workers' wait for the leader).",
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

    @field_validator("interface")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        if v is None or IFACE_RE.fullmatch(v):
            return v
        # Why, as Linux would refuse it (net/core/dev.c dev_valid_name: IFNAMSIZ is 16 with the NUL).
        what = "must be a network interface name such as ib0 or eth0"
        if not v:
            raise ValueError(f"{what}, not empty")
        if len(v) > 15:
            raise ValueError(f"{what}: {v!r} is {len(v)} characters, and Linux allows at most 15")
        bad = next(c for c in v if not IFACE_RE.fullmatch(c))
        raise ValueError(f"{what}: {bad!r} is not allowed in one (letters, digits and _ . : @ - are)")

    @model_validator(mode="after")
    def _ep(self) -> "Network":
        if self.cross_node_expert_parallel and self.fabric != "efa":
            raise ValueError("cross_node_expert_parallel: applies to fabric: efa only (other fabrics use NCCL defaults)")
        return self


class Slurm(_Model):
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

    @field_validator("partition", "account", "qos")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_WORD_RE.fullmatch(v):
            raise ValueError("may contain only letters, digits and _ . , : @ + % / = -")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: str | None) -> str | None:
        if v is not None:
            parse_slurm_mem(v)
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_CONSTRAINT_RE.fullmatch(v):
            raise ValueError("a SLURM feature expression: letters, digits, _ . , : and & | [ ] * ( ) !, no spaces or quotes")
        return v

    @field_validator("partition", "account", "qos", "constraint", "mem", "time", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        # YAML turns `time: 1:30:00` into the number 5400 and `account: 12345` into an int.
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f"must be a string; quote it (YAML read this as the number {v})")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_TIME_RE.fullmatch(v):
            raise ValueError("not a SLURM time: use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
        return v

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parsed = parse_warning(v)
        if parsed is None:
            raise ValueError("use [B:]SIGNAL[@seconds] with a signal name, e.g. USR2@120")
        name = parsed[1]
        if name == "USR1":
            raise ValueError("USR1 is used by NCCL; choose USR2 or HUP for the preemption warning")
        if name == WARNING_CARRIER:
            raise ValueError(f"{name} carries the warning to every node (the batch script's forward); choose USR2 or HUP")
        if name not in WARNING_SIGNALS:
            raise ValueError(f"{name} cannot be the warning: it must be a signal the trainer can catch while the "
                             f"job goes on, one of {', '.join(WARNING_SIGNALS)} (USR2 recommended)")
        return v

    @field_validator("container_workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or not SLURM_WORD_RE.fullmatch(v) or "," in v or ":" in v):
            raise ValueError("an absolute path inside the image, without spaces, quotes, ',' or ':'")
        return v

    def warning_notes(self) -> list[tuple[str, str]]:
        """(field, message): a warning SLURM would send at the job's start, leaving no training."""
        if self.signal is None or self.time is None:
            return []
        limit = parse_slurm_time(self.time)
        secs = self.warning[2]
        secs = SLURM_DEFAULT_WARNING_S if secs is None else secs
        if limit is None or secs + SLURM_WARNING_EARLY_S < limit:
            return []
        return [("slurm.signal", f"the warning comes {secs} s before the time limit (slurm.time={self.time}, {limit} s), "
                                 f"and slurmctld may send it up to {SLURM_WARNING_EARLY_S} s earlier: that can be the "
                                 "job's first seconds, and the ranks will save as soon as they start; shorten the "
                                 "warning or lengthen slurm.time")]

    @property
    def warning(self) -> tuple[str, str, int | None]:
        """(flags, signal name, seconds) of ``signal``; USR2 when unset (still the signal that
        ``cancel --signal USR2`` delivers as a warning)."""
        if self.signal is None:
            return DEFAULT_WARNING
        parsed = parse_warning(self.signal)
        if parsed is None:  # only a spec built without validation holds such a value
            raise TypeError(f"slurm.signal {self.signal!r} is not a [B:]SIGNAL[@seconds]")
        return parsed

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if not SLURM_WORD_RE.fullmatch(m) or ":" not in m:
                raise ValueError(f"{m!r}: each mount is SRC:DST[:FLAGS] without spaces or quotes")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for a in v:
            if a.startswith("-") and not a.startswith("--"):
                # Short forms are not taken (SBATCH_ARG_RE): name the long one, and its field.
                long = SBATCH_SHORT_OPTIONS.get(a[1:2])
                if long in SBATCH_OPTIONS_SET_BY or long in SBATCH_OPTIONS_REFUSED:
                    raise ValueError(f"{a!r} is {long}: {sbatch_option_owner(long)}")
                raise ValueError(f"{a!r}: write sbatch options in their long form, --name or --name=value")
            if not SBATCH_ARG_RE.fullmatch(a):
                raise ValueError(f"{a!r}: each extra arg is --name or --name=value, without spaces, quotes, '#', '$' or '`'")
            name, eq, _ = a.partition("=")
            if name == "--exclusive" and eq:  # --exclusive=user|mcs|topo: slurm.exclusive cannot say it
                continue
            # sbatch accepts any unambiguous prefix of a long option (--ntasks-per-n); an exact
            # name wins over the longer ones it begins (--gpus is not --gpus-per-node).
            hit = name if name in SBATCH_OPTIONS_SET_BY or name in SBATCH_OPTIONS_REFUSED else None
            if hit is None and len(name) > 3 and name not in SBATCH_EXACT_PREFIXES:
                hit = next((m for m in (*SBATCH_OPTIONS_SET_BY, *SBATCH_OPTIONS_REFUSED) if m.startswith(name)), None)
            if hit:
                raise ValueError(f"{a!r}: {sbatch_option_owner(hit)}")
            # --clusters (-M): the job id then names the cluster sbatch chose, and every later
            # query and cancel goes there.
            if len(name) > 4 and "--clusters".startswith(name) and not re.fullmatch(
                r"[A-Za-z0-9][A-Za-z0-9_.-]*(,[A-Za-z0-9][A-Za-z0-9_.-]*)*", a.partition("=")[2]
            ):
                raise ValueError(f"{a!r}: name the cluster(s) as --clusters=NAME[,NAME...]")
        return v

    @model_validator(mode="after")
    def _extra_conflicts(self) -> "Slurm":
        for a in self.extra_args:
            name = a.partition("=")[0]
            for option, field in SBATCH_CONFLICTS:
                if name == option and getattr(self, field):
                    raise ValueError(f"extra_args: {a!r} conflicts with slurm.{field} (sbatch refuses both); "
                                     f"use one of them")
        return self


class Nomad(_Model):
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

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None:
            m = re.fullmatch(r"(\d{1,10}):(\d{1,10})", v)
            if not m or max(int(m.group(1)), int(m.group(2))) > 2**31 - 1:
                raise ValueError(f"{v!r}: give the numeric user and group ids as UID:GID, e.g. 1000:1000")
        return v

    @property
    def owner(self) -> tuple[int, int] | None:
        """``user`` as (uid, gid), or None."""
        if self.user is None:
            return None
        uid, gid = self.user.split(":")
        return int(uid), int(gid)

    @field_validator("datacenters")
    @classmethod
    def _dcs(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("needs at least one datacenter ('*' for all)")
        for dc in v:
            if not re.fullmatch(r"[A-Za-z0-9_.*-]+", dc):
                raise ValueError(f"{dc!r} is not a datacenter name")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,128}", v):
            raise ValueError("a Nomad namespace: letters, digits and -")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", v):
            raise ValueError("may contain only letters, digits, _ and -")
        return v

    @field_validator("max_run_duration")
    @classmethod
    def _dur(cls, v: str | None) -> str | None:
        if v is not None:
            parse_go_duration(v)
        return v

    @field_validator("shm_size", mode="before")
    @classmethod
    def _shm(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            parse_size(v)
        return v

    @field_validator("volumes")
    @classmethod
    def _vols(cls, v: list[str]) -> list[str]:
        if not v:  # the default: no unicodedata (0.1 MiB of render's peak memory)
            return v
        import unicodedata

        for vol in v:
            no_nul(vol, "a volume")
            # The Nomad client decodes driver config into cty strings, which are always Unicode
            # NFC: another form would mount a different path than the one written.
            if not unicodedata.is_normalized("NFC", vol):
                raise ValueError(f"{ascii(vol)} is not in Unicode NFC form, which Nomad would normalize it to: "
                                 f"write {ascii(unicodedata.normalize('NFC', vol))}")
            parts = vol.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise ValueError(f"{vol!r}: use host_path:container_path[:ro|rw]")
        return v

    @property
    def shm_bytes(self) -> int | None:
        return None if self.shm_size is None else parse_size(self.shm_size)

    @property
    def max_run_duration_ns(self) -> int | None:
        return None if self.max_run_duration is None else parse_go_duration(self.max_run_duration)

    @model_validator(mode="after")
    def _docker_only(self) -> "Nomad":
        if self.driver != "docker":
            for field, value in (("shm_size", self.shm_size), ("volumes", self.volumes)):
                if value:
                    raise ValueError(f"{field}: applies to the docker driver only, not {self.driver} (it would be ignored)")
        return self

    @model_validator(mode="after")
    def _shm_fits(self) -> "Nomad":
        if self.shm_bytes is not None and self.shm_bytes >= self.memory * 1024 * 1024:
            raise ValueError(
                f"shm_size: {self.shm_size} must be smaller than memory ({self.memory} MB): "
                "docker counts /dev/shm against the task's hard memory limit"
            )
        return self


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

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SERVER_NAME_RE.fullmatch(v):
            raise ValueError("must be 1-24 characters: lower-case letters, digits and '-', starting with a letter and "
                             "not ending with '-' (a DNS label; it names variables, groups and services)")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v or not v[0]:
            raise ValueError("must be a non-empty list: the program, then its arguments")
        for i, a in enumerate(v):
            no_nul(a, "an argument")
            check_arg_size(a, f"argument {i}")
        return v

    @field_validator("health_path")
    @classmethod
    def _health(cls, v: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@/%?-]*", v):
            raise ValueError("an absolute URL path such as /health (printable URL characters, no spaces)")
        return v

    _image = field_validator("image")(classmethod(lambda cls, v: checked_image(v)))

    _env_types = field_validator("env", mode="before")(classmethod(lambda cls, v: env_values_are_text(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: checked_env(v)))
    _secret_env = field_validator("secret_env")(classmethod(lambda cls, v: checked_secret_names(v)))

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_lines(cls, v: Any) -> Any:
        return v.splitlines() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _process_size(self) -> "Server":
        check_process_size(self.env, self.command, "command", "command")
        return self

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        for line in v:
            if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
                raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
        return v


class Hang(_Model):
    """Hang detection: a monitor beside torchrun on every node ends the job as HUNG when no rank of
    its node made progress for ``timeout_s`` (README: "Hangs")."""

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

    @property
    def first_step_limit(self) -> int:
        return self.first_step_s if self.first_step_s is not None else 2 * self.timeout_s


#: The failure classes ``retry.on`` may name (docs/failures.md, "Retry"): ``node`` is any node
#: fault (the ledger's), ``preflight`` a failed preflight check only, ``hang`` a HUNG job.
RETRY_CLASSES = ("node", "hang", "preflight")
#: The most attempts a run may have: past that, a node fault is not what is failing the run.
MAX_ATTEMPTS = 20


class Retry(_Model):
    """``retry: {attempts: N, on: [node, hang, preflight]}``: run the job again after a failure of
    a listed class, up to ``attempts`` attempts in all (the first included)."""

    attempts: int = Field(ge=1, le=MAX_ATTEMPTS, description=f"Attempts in all, the first included (1-{MAX_ATTEMPTS}).")
    on: list[Literal["node", "hang", "preflight"]] = Field(
        default_factory=lambda: ["node"],
        description="Failure classes that start another attempt: node, hang, preflight. Job-class and unknown "
                    "failures are never retried.")


class Attempt(NamedTuple):
    """Which attempt of which run a submission is (set by halo_sched/runs.py, never by a job
    file): its run id (the first attempt's job id), its number (0 for the first: the ranks'
    HALO_RESTART_COUNT), the hosts it must keep off, and the run's git state (recorded once)."""

    run_id: str
    number: int
    exclude: tuple[str, ...] = ()
    git: dict | None = None


class JobFile(NamedTuple):
    """The job file a spec was loaded from: its absolute path and the SHA-256 of the bytes read."""

    path: str
    sha256: str


def _check_hang(spec: "JobSpec") -> None:
    """hang.timeout_s (and first_step_s) must be shorter than the job's time limit, where one is set
    and the job file sets ``hang:`` itself. The default (on, 300 s) is not held against a shorter
    limit: such a job ends at its limit before a hang could be seen, and a short test job need not
    say ``hang: null``."""
    if spec.hang is None or "hang" not in spec.model_fields_set:
        return
    limits = []
    if spec.slurm.time is not None:
        secs = parse_slurm_time(spec.slurm.time)
        if secs is not None:
            limits.append((f"slurm.time ({spec.slurm.time}, {secs} s)", secs))
    if spec.nomad.max_run_duration is not None:
        limits.append((f"nomad.max_run_duration ({spec.nomad.max_run_duration})",
                       parse_go_duration(spec.nomad.max_run_duration) / 1e9))
    for what, secs in limits:
        for name, value in (("timeout_s", spec.hang.timeout_s), ("first_step_s", spec.hang.first_step_s)):
            if value is not None and value >= secs:
                raise ValueError(f"hang.{name}: {value} s is beyond the job's time limit, {what}; "
                                 "the job would end before a hang could be seen")


class Preflight(_Model):
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

    @field_validator("min_busbw", mode="before")
    @classmethod
    def _busbw(cls, v: Any) -> Any:
        if v is not None:
            busbw_gbps(v)  # raises ValueError naming the format
        return v

    @model_validator(mode="after")
    def _busbw_needs_gate(self) -> "Preflight":
        if self.min_busbw is not None and self.gate is not True:
            raise ValueError("preflight.min_busbw needs preflight.gate: true (the floor is checked by the gate "
                             "inside the job); set gate: true or drop min_busbw")
        return self

    def min_busbw_gbps(self) -> float | None:
        """min_busbw in GB/s (10^9 bytes/s), or None."""
        return None if self.min_busbw is None else busbw_gbps(self.min_busbw)


_BUSBW_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([GM])B/s")


def busbw_gbps(text: str) -> float:
    """'5GB/s' -> 5.0, '800MB/s' -> 0.8, '1.5 GB/s' -> 1.5: decimal units, the unit required."""
    m = _BUSBW_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or len(text) > 40:
        raise ValueError(f"{str(text)[:40]!r} is not a bandwidth: write a positive number with its unit, "
                         'e.g. "5GB/s" or "800MB/s" (decimal: 1 GB/s = 10^9 bytes/s)')
    value = float(m.group(1)) / (1 if m.group(2) == "G" else 1000)
    if not 0 < value < 1e6:
        raise ValueError(f"{text.strip()!r}: the floor must be above 0 and below 1,000,000 GB/s")
    return value


NOTIFY_EVENTS = ("failed", "hung", "retried", "completed")


class Notify(_Model):
    """Webhook notifications (docs/failures.md, "Notifications"): the URL is a secret, taken by
    name from the environment of the process that observes the state change; never stored."""

    webhook_env: str = Field(
        description="Name of the variable holding the webhook URL (http or https) in the submitter's environment "
                    "(and in that of any later halo-sched process that should notify: status, watch, list).",
    )
    on: list[Literal["failed", "hung", "retried", "completed"]] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS), min_length=1,
        description='Events that send one JSON POST each: failed, hung, retried, completed. Write the key quoted, '
                    '"on": YAML reads a bare on as true.',
    )

    @field_validator("webhook_env")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ENV_NAME_RE.fullmatch(v):
            raise ValueError(f"{v[:40]!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        return v

    @field_validator("on")
    @classmethod
    def _once(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    def url(self, environ: dict[str, str] | None = None) -> str:
        """The webhook URL from ``environ`` (default: this process's); a SpecError naming
        ``notify.webhook_env`` when it is unset or not an http(s) URL. No error shows the value."""
        from urllib.parse import urlsplit

        environ = os.environ if environ is None else environ
        if self.webhook_env not in environ:
            raise SpecError([("notify.webhook_env", f"{self.webhook_env} is not set in the environment of this "
                                                    "process; export the webhook URL in it before submitting")])
        value = environ[self.webhook_env]
        try:
            parts = urlsplit(value)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c in value for c in "\r\n\x00 ")
            parts.port  # noqa: B018 - a bad port raises
        except ValueError:
            ok = False
        if not ok:
            raise SpecError([("notify.webhook_env", f"{self.webhook_env}'s value is not an http:// or https:// URL "
                                                    "with a host (the value is not shown)")])
        return value


class JobSpec(_Model):
    """One multi-node torchrun job: the same on every backend."""

    #: Set by :func:`load` (and kept by :func:`validated`); the job record keeps it.
    _job_file: JobFile | None = PrivateAttr(default=None)
    #: Set by halo_sched/runs.py for a retry attempt (kept by :func:`validated`).
    _attempt: Attempt | None = PrivateAttr(default=None)

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
        description="Automatic retry: {attempts: N, \"on\": [node, hang, preflight]} (quote \"on\": YAML 1.1 "
                    "reads it as true); a watcher (submit --wait, watch, Run.wait) resubmits. Default: no retry.",
    )
    parallelism: Parallelism | None = Field(None, description="Parallel layout (tp, ep, ...), checked at validate time.")
    servers: list[Server] = Field(
        default_factory=list,
        description="Rollout-server roles on nodes of their own (RL): every trainer rank gets HALO_SERVER_<NAME>_URLS "
                    "and starts once each server answers its health_path.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("must be 1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit")
        return v

    _env_types = field_validator("env", mode="before")(classmethod(lambda cls, v: env_values_are_text(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: checked_env(v)))

    _secret_env = field_validator("secret_env")(classmethod(lambda cls, v: checked_secret_names(v)))

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_lines(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v.splitlines()
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        for line in v:
            no_nul(line, "a setup line")
            if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
                # sbatch refuses a script with a carriage return; other control bytes are typos.
                raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
        return v

    _image = field_validator("image")(classmethod(lambda cls, v: checked_image(v)))

    @model_validator(mode="after")
    def _cross_checks(self) -> "JobSpec":
        check_process_size(self.env, self.trainer.args, "trainer", "trainer.args")
        if self.gpus_per_node and self.nproc_per_node > self.gpus_per_node:
            raise ValueError(
                f"nproc_per_node: {self.nproc_per_node} exceeds gpus_per_node ({self.gpus_per_node}); each rank needs its own GPU"
            )
        if self.gpus_per_node and "CUDA_VISIBLE_DEVICES" in self.env:
            raise ValueError("env: CUDA_VISIBLE_DEVICES is assigned per node by the scheduler when gpus_per_node > 0")
        derived = set(self.derived_env())
        both = sorted(set(self.secret_env) & (set(self.env) | derived | {"CUDA_VISIBLE_DEVICES"}))
        if both:
            raise ValueError(f"secret_env: {', '.join(both)} is also set in env (or derived by halo-sched); "
                             "a variable is either a literal in env or a secret taken at submit time")
        _check_servers(self, derived)
        _check_hang(self)
        clash = sorted(derived & set(self.env))
        if clash:
            raise ValueError(
                f"env: sets {', '.join(clash)}, which halo-sched derives from storage/network; set those sections instead"
            )
        return self

    @property
    def all_nodes(self) -> int:
        """Trainer nodes plus every server node."""
        return self.nodes + sum(r.nodes for r in self.servers)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def _secret_fields(self) -> list[tuple[str, str]]:
        """(field, name) of every secret: the job's, then each server role's."""
        return [(f"secret_env[{i}]", k) for i, k in enumerate(self.secret_env)] + [
            (f"servers[{j}].secret_env[{i}]", k) for j, r in enumerate(self.servers) for i, k in enumerate(r.secret_env)]

    @property
    def secret_names(self) -> list[str]:
        """Every secret the job takes at submit time (the ranks' and the servers'), each once."""
        return list(dict.fromkeys(k for _, k in self._secret_fields()))

    @property
    def job_file(self) -> JobFile | None:
        """The job file this spec was read from (:func:`load`), None when built otherwise."""
        return self._job_file

    def secret_values(self, environ: dict[str, str] | None = None) -> dict[str, str]:
        """Every secret's value (``secret_names``) from ``environ`` (the submitter's environment).
        A name that is not set there is a SpecError naming its field; no error shows a value."""

        environ = os.environ if environ is None else environ
        fields = self._secret_fields()
        missing = [(f, f"{k} is not set in the environment of the submitting process; export it "
                       "before submitting (its value is taken from there, never from the job file)")
                   for f, k in fields if k not in environ]
        if missing:
            raise SpecError(missing)
        bad = [(f, f"{k}'s value in the environment contains a NUL byte") for f, k in fields if "\x00" in environ[k]]
        for f, k in fields:
            try:
                check_env_size(k, environ[k])
            except ValueError as err:  # the size only, never the value
                bad.append((f, str(err).replace(f"{k}'s value", f"{k}'s value in the environment", 1)))
        if bad:
            raise SpecError(bad)
        if self.notify is not None:
            self.notify.url(environ)  # checked at submit; the URL itself goes nowhere
        return {k: environ[k] for k in self.secret_names}

    def derived_env(self) -> dict[str, str]:
        """The DIST_* and NCCL_* variables this spec implies, identical on every rank."""
        st, net = self.storage, self.network
        env: dict[str, str] = {"DIST_SHARED_FILESYSTEM": "1" if st.shared else "0"}
        if st.input_shared is not None:
            env["DIST_INPUT_SHARED_FILESYSTEM"] = "1" if st.input_shared else "0"
        if st.output_shared is not None:
            env["DIST_OUTPUT_SHARED_FILESYSTEM"] = "1" if st.output_shared else "0"
        env["DIST_STORE_TIMEOUT_HOURS"] = f"{st.store_timeout_hours:g}"
        if st.nccl_timeout_minutes is not None:
            env["DIST_NCCL_TIMEOUT_MINUTES"] = str(st.nccl_timeout_minutes)
        if net.interface:
            env["NCCL_SOCKET_IFNAME"] = net.interface
            env["GLOO_SOCKET_IFNAME"] = net.interface
        if net.fabric == "efa":
            env["NCCL_NET_PLUGIN"] = "ofi"
            env["NCCL_NET"] = "Libfabric"
            if net.cross_node_expert_parallel:
                env["NCCL_GIN_TYPE"] = "2"
        if net.nccl_proto_simple:
            env["NCCL_PROTO"] = "simple"
        if net.nccl_debug:
            env["NCCL_DEBUG"] = net.nccl_debug
        from .layout import environment as layout_env

        env.update(layout_env(self))
        return env


def cpu_notes(spec: "JobSpec") -> list[tuple[str, str]]:
    """(field, message): SLURM CPUs that cannot give each rank one of its own. slurm.cpus_per_task
    is the node's one torchrun's; under task/affinity its ranks and their DataLoader workers are
    all bound to those CPUs. (Unset, each rank gets its own: backends/slurm/render.py.)"""
    cpus, ranks = spec.slurm.cpus_per_task, spec.nproc_per_node
    if cpus is None or cpus >= ranks:
        return []
    return [("slurm.cpus_per_task", f"{ranks} ranks per node share {cpus} CPU{'s' if cpus != 1 else ''} (one task per "
                                    f"node holds them all, and SLURM binds its ranks and their DataLoader workers to "
                                    f"them): set it to at least nproc_per_node ({ranks}), or leave it unset for "
                                    f"{'four CPUs' if spec.gpus_per_node else 'one CPU'} per rank")]


def _check_servers(spec: "JobSpec", derived: set[str]) -> None:
    """Checks across server roles and the job (the first problem, as "servers: ...")."""
    rdzv = spec.rendezvous.port  # None: each backend derives the job's own around the ports below
    seen: dict[str, int] = {}
    group_ports: dict[int, str] = {}
    for i, r in enumerate(spec.servers):
        where = f"servers[{i}] ({r.name})"
        if r.name in seen:
            raise ValueError(f"servers: {where}: name {r.name!r} is used by servers[{seen[r.name]}] too; names are unique")
        seen[r.name] = i
        if r.port == rdzv:
            raise ValueError(f"servers: {where}.port {r.port} is rendezvous.port; choose another port")
        if r.group_port is not None:
            if r.group_port == rdzv:
                raise ValueError(f"servers: {where}.group_port {r.group_port} is rendezvous.port: both are bound on "
                                 "the trainer's rank 0; choose another port")
            if r.group_port in group_ports:
                raise ValueError(f"servers: {where}.group_port {r.group_port} is also {group_ports[r.group_port]}'s: "
                                 "every group port is bound on the trainer's rank 0, so each must differ")
            group_ports[r.group_port] = r.name
        if spec.gpus_per_node and r.gpus_per_node and "CUDA_VISIBLE_DEVICES" in r.env:
            raise ValueError(f"servers: {where}.env: CUDA_VISIBLE_DEVICES is assigned per node by the scheduler")
        clash = sorted(derived & set(r.env))
        if clash:
            raise ValueError(f"servers: {where}.env sets {', '.join(clash)}, which halo-sched derives from "
                             "storage/network for the servers too (the same fabric as the trainer); set those sections")
        both = sorted(set(r.secret_env) & (set(r.env) | derived | {"CUDA_VISIBLE_DEVICES"}))
        if both:
            raise ValueError(f"servers: {where}.secret_env: {', '.join(both)} is also set in its env (or derived by "
                             "halo-sched); a variable is either a literal in env or a secret taken at submit time")
