"""The job file: one backend-agnostic description of a multi-node torchrun job.

``load(path)`` parses YAML into a validated :class:`JobSpec`; every problem is reported with its
field path (and line, when it came from a file) as a :class:`~halo_sched.errors.SpecError`.
Validation is strict on purpose: a value that reaches a generated script must not be able to
change its meaning, so names and scheduler options are held to safe character sets here, and
free text (env values, args, setup) is quoted by the renderers.
"""
from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecError
from .node.contract import WARNING_CARRIER

NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
ENV_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
MODULE_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
# SLURM option values that land on "#SBATCH" lines: no spaces, quotes or comment characters.
SLURM_WORD_RE = re.compile(r"\A[A-Za-z0-9_.,:@+%/=-]+\Z")
SLURM_TIME_RE = re.compile(r"\A(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)\Z")
# One sbatch option on an #SBATCH line: no space (sbatch splits the line there), no quote, '#',
# '\\', '$' or '`', no control character (a line break would start a shell line).
SBATCH_ARG_RE = re.compile(r"\A--[a-z][a-z0-9-]*(=[^\s'\"\\#`$\x00-\x1f\x7f-\x9f]+)?\Z")
GO_DURATION_RE = re.compile(r"\A(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+\Z")
SIZE_RE = re.compile(r"\A(\d+) ?(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|k|m|g)?\Z", re.IGNORECASE)
IFACE_RE = re.compile(r"\A[A-Za-z0-9_.:@-]{1,15}\Z")
# sbatch --signal=[{R|B}:]SIG[@secs], by name (the batch script traps it and forwards it).
SLURM_SIGNAL_RE = re.compile(r"\A(?:([BR]+):)?(?:SIG)?([A-Z][A-Z0-9]*)(?:@(\d+))?\Z")
# The signals a warning may be: those SLURM knows by name (src/common/proc_args.c
# signals_mapping) that a trainer can catch while the rest of the job goes on. Not USR1 (NCCL's),
# not URG (the carrier that takes the warning to every node), not those that end, stop or resume
# processes (torchrun must keep its default for these).
WARNING_SIGNALS = ("USR2", "HUP", "ALRM", "XCPU")

# Variables torchrun or halo-sched itself set on every rank: a user value would be silently
# overwritten (or would break the launch), so it is an error to set them in `env`.
RESERVED_ENV = {
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK", "TORCHELASTIC_RUN_ID",
}
RESERVED_ENV_PREFIXES = ("HALO_", "TORCHELASTIC_", "SLURM_", "NOMAD_", "BASH")
# bash's own variables: read-only ones abort the script when exported, others (SECONDS, IFS)
# silently change how the entry script computes its deadline or splits words.
SHELL_ENV = {
    "SECONDS", "IFS", "UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "RANDOM", "LINENO", "FUNCNAME",
    "GROUPS", "PIPESTATUS", "OPTIND", "OPTARG", "POSIXLY_CORRECT",
}


# Linux caps each single argument or environment string ("NAME=value") of a process at
# MAX_ARG_STRLEN, 32 pages = 131072 bytes with its terminating NUL (include/uapi/linux/binfmts.h):
# execve fails with E2BIG, "Argument list too long" (exit 126), for a longer one, on every node.
MAX_ARG_STRLEN = 131072
# All arguments and environment of one process together are capped at a quarter of the stack
# limit (ARG_MAX: 2 MiB under the usual 8 MiB `ulimit -s`). What a job file gives one process
# (its env and args; a server's env and command) is held to half of that: the scheduler's, the
# site's and torchrun's own variables need the rest.
MAX_ARGS_ENV_BYTES = 1024 * 1024


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _check_arg_size(value: str, what: str) -> int:
    """Bytes ``value`` takes as one process argument (with its NUL); too large: ValueError."""
    n = _utf8_len(value) + 1
    if n > MAX_ARG_STRLEN:
        raise ValueError(f"{what} is {n - 1} bytes; Linux passes at most {MAX_ARG_STRLEN - 1} bytes in one argument "
                         "(MAX_ARG_STRLEN; the process would fail with 'Argument list too long'): put it in a file "
                         "the job reads")
    return n


def _check_env_size(k: str, val: str) -> int:
    """Bytes ``k=val`` takes in a process's environment (with its NUL); too large: ValueError."""
    n = _utf8_len(k) + 1 + _utf8_len(val) + 1
    if n > MAX_ARG_STRLEN:
        raise ValueError(f"{k}'s value is {n - len(k) - 2} bytes; Linux passes at most {MAX_ARG_STRLEN - 1} bytes in "
                         f"one variable, NAME=value (MAX_ARG_STRLEN; every rank would fail with 'Argument list too "
                         "long'): put the value in a file the job reads")
    return n


def _check_process_size(env: dict[str, str], argv: list[str], argv_field: str, argv_name: str) -> None:
    """env + argv of one process within MAX_ARGS_ENV_BYTES; ValueError "field: message" naming
    the larger part (``env``, or ``argv_field`` of the model, shown to the user as ``argv_name``)."""
    env_bytes = sum(_utf8_len(k) + _utf8_len(v) + 2 for k, v in env.items())
    argv_bytes = sum(_utf8_len(a) + 1 for a in argv)
    if env_bytes + argv_bytes > MAX_ARGS_ENV_BYTES:
        field = "env" if env_bytes >= argv_bytes else argv_field
        raise ValueError(f"{field}: env and {argv_name} come to {env_bytes + argv_bytes} bytes; at most "
                         f"{MAX_ARGS_ENV_BYTES} are allowed for one process (Linux's ARG_MAX for all of a process's "
                         "arguments and environment is 2 MiB at the usual stack limit, and the scheduler's own "
                         "variables need the rest): move large values into files the job reads")


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL byte, which no process argument or environment can carry")
    return value


def _check_env_name(k: str) -> None:
    """A name a user may give a variable every rank gets (``env`` keys, ``secret_env``)."""
    if not ENV_NAME_RE.fullmatch(k):
        raise ValueError(f"{k!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    # halo_ in any case: the entry script's own variables are lower-case halo_*.
    if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIXES) or k.upper().startswith("HALO_"):
        raise ValueError(f"{k} is set by torchrun, the scheduler, bash or halo-sched on every rank; it cannot be set here")
    if k in SHELL_ENV:
        raise ValueError(f"{k} is a bash variable the node entry script relies on; it cannot be set here")

def _env_values_are_text(v: Any) -> Any:
    """YAML turns `on`, `1.0`, `0755` into bool/float/int silently; require the user to quote,
    so the value that reaches the processes is exactly the text in the file."""
    if isinstance(v, dict):
        for k, val in v.items():
            if not isinstance(val, str):
                raise ValueError(f"{k}: value must be a string (quote it: {k}: \"{val}\"), got {type(val).__name__}")
    return v


SLURM_CONSTRAINT_RE = re.compile(r"\A[A-Za-z0-9_.,:@+%/=&|\[\]*()!-]+\Z")
IMAGE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:/@+#-]*\Z")


def _checked_image(v: str | None) -> str | None:
    """``image`` of the job or of a server role."""
    if v is not None and not IMAGE_RE.fullmatch(v):
        raise ValueError("not a container image reference (registry/name:tag or name@sha256:...)")
    return v


def _checked_secret_names(v: list[str]) -> list[str]:
    """``secret_env`` of the job or of a server role: names only, each once."""
    for i, k in enumerate(v):
        _check_env_name(k)
        if k in v[:i]:
            raise ValueError(f"{k} is named twice")
    return v


def _checked_env(v: dict[str, str]) -> dict[str, str]:
    for k, val in v.items():
        _check_env_name(k)
        _no_nul(val, f"{k}'s value")
        _check_env_size(k, val)
    return v



def parse_size(value: int | str) -> int:
    """'16GiB' -> bytes. Bare integers are bytes."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a size such as 8GiB or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size must not be negative")
        return value
    m = SIZE_RE.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a size; use e.g. 512MiB, 16GiB or a number of bytes")
    unit = (m.group(2) or "B").lower()
    mult = {
        "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
        "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "k": 1024, "m": 1024**2, "g": 1024**3,
    }[unit]
    return int(m.group(1)) * mult


def parse_slurm_time(value: str) -> int | None:
    """A SLURM time limit (``SLURM_TIME_RE``) in seconds; None when unlimited. Forms as sbatch(1):
    minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    if value in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


# slurmctld looks at time limits every PERIODIC_TIMEOUT (30 s) and sends a warning as soon as
# its time is less than that away (src/slurmctld/job_mgr.c send_job_warn_signal).
SLURM_WARNING_EARLY_S = 30
# sbatch's warning time when `--signal` names none (src/common/proc_args.c).
SLURM_DEFAULT_WARNING_S = 60


def parse_go_duration(value: str) -> int:
    """A Go duration ('2h', '90m', '1h30m') in nanoseconds."""
    if not GO_DURATION_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a duration; use Go syntax such as 30m, 2h or 1h30m")
    scale = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
    total = 0.0
    for num, _, unit in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", value):
        total += float(num) * scale[unit]
    if total < 10**9:
        raise ValueError(f"{value!r} is shorter than a second")
    if total >= 2**63:
        raise ValueError(f"{value!r} is longer than Nomad can express")
    return int(total)


class _Model(BaseModel):
    # strict: YAML already gives native types, and `nodes: true` or `port: "29500"` is a mistake.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False, strict=True)


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
        _no_nul(v, "script")
        _check_arg_size(v, "the path")
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
            _no_nul(a, "an argument")
            _check_arg_size(a, f"argument {i}")
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


# The longest a rank may be told to wait (store, collectives, placement): a week, as
# rendezvous.timeout_s. Longer is a typo or .inf, and overflows what trainers convert it to.
MAX_TIMEOUT_HOURS = 7 * 24


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


# Every option the SLURM backend writes on its own "#SBATCH" lines (halo_sched/templates/slurm/sbatch.sh.j2,
# and sbatch_options() in backends/slurm/render.py), with the field that sets it or, in
# parentheses, why it is fixed. slurm.extra_args may not repeat one: sbatch would silently take
# whichever comes last. tests/test_spec.py holds this list against a rendered script.
SBATCH_OPTIONS_SET_BY = {
    "--job-name": "name",
    "--nodes": "nodes (and servers[].nodes)",
    "--ntasks-per-node": "(always 1: one torchrun per node)",
    "--gpus-per-node": "gpus_per_node (and servers[].gpus_per_node)",
    "--output": "(the job's output file, where logs and failure reports are read)",
    "--open-mode": "(always append: a requeued job's runs share one output file)",
    "--partition": "slurm.partition",
    "--account": "slurm.account",
    "--qos": "slurm.qos",
    "--time": "slurm.time",
    "--constraint": "slurm.constraint",
    "--cpus-per-task": "slurm.cpus_per_task",
    "--mem": "slurm.mem",
    "--signal": "slurm.signal",
    "--exclusive": "slurm.exclusive",
    "--requeue": "slurm.requeue",
    "--no-requeue": "slurm.requeue",
}
# sbatch options that would make the job something else than the one rendered.
SBATCH_OPTIONS_REFUSED = {
    "--array": "a halo-sched job is one job, not an array of copies of it",
    "--ntasks": "there is one task per node (nodes)",
    "--error": "errors go to the output file with everything else, where failure reports read them",
    "--export": "every rank's environment is set by halo-sched (env, secret_env)",
    "--chdir": "the output file and a relative trainer.script are found from the submit directory",
    "--wrap": "the batch script is the rendered one",
    "--test-only": "a test submission submits nothing (use `halo-sched submit --dry-run`)",
    "--wait": "sbatch would block until the job ends (use `halo-sched submit --wait`)",
}
# Exact sbatch options that begin one of the above: sbatch takes them as themselves.
SBATCH_EXACT_PREFIXES = {"--gpus"}
# Options sbatch refuses together with one a field writes: (option, field of Slurm).
SBATCH_CONFLICTS = (("--mem-per-cpu", "mem"), ("--mem-per-gpu", "mem"), ("--exclusive", "exclusive"),
                    ("--cpus-per-gpu", "cpus_per_task"))
# sbatch's one-letter options of those above, to name the long one when a short form is given.
SBATCH_SHORT_OPTIONS = {"J": "--job-name", "N": "--nodes", "o": "--output", "p": "--partition", "A": "--account",
                        "q": "--qos", "t": "--time", "C": "--constraint", "c": "--cpus-per-task", "a": "--array",
                        "n": "--ntasks", "e": "--error", "D": "--chdir", "W": "--wait"}

# Slurm keeps cpus_per_task in 16 bits; 0xfffe and 0xffff mean "unset" and "infinite", and sbatch
# does not refuse a larger number: it wraps (slurm.h NO_VAL16, INFINITE16).
SLURM_MAX_CPUS_PER_TASK = 0xFFFD
# sbatch --mem: a whole number with an optional unit K, M, G or T (powers of 1024; M by default),
# a trailing B allowed (src/common/proc_args.c str_to_mbytes); 0 asks for all of a node's memory.
SLURM_MEM_RE = re.compile(r"\A(\d{1,20})(?:([KMGT])B?)?\Z", re.IGNORECASE)
SLURM_MAX_MEM_MB = 2**27  # 128 TiB, as nomad.memory


def parse_slurm_mem(value: str) -> int:
    """A SLURM memory size (``--mem``) in MiB, as sbatch reads it; malformed: ValueError."""
    m = SLURM_MEM_RE.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a SLURM memory size: a whole number with an optional unit K, M, G or T "
                         "(default M), e.g. 64G or 512000M")
    unit = (m.group(2) or "M").upper()
    mib = -(-int(m.group(1)) * {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit] // 1024)
    if mib > SLURM_MAX_MEM_MB:
        raise ValueError(f"{value!r} is more memory than any node has (at most {SLURM_MAX_MEM_MB // 1024**2} TiB)")
    return mib


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
        m = SLURM_SIGNAL_RE.fullmatch(v)
        if not m:
            raise ValueError("use [B:]SIGNAL[@seconds] with a signal name, e.g. USR2@120")
        name = m.group(2)
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
            return "", "USR2", None
        m = SLURM_SIGNAL_RE.fullmatch(self.signal)
        return m.group(1) or "", m.group(2), int(m.group(3)) if m.group(3) else None

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
                    raise ValueError(f"{a!r} is {long}: {_sbatch_option_owner(long)}")
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
                raise ValueError(f"{a!r}: {_sbatch_option_owner(hit)}")
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


def _sbatch_option_owner(option: str) -> str:
    """Why slurm.extra_args may not give ``option`` (SBATCH_OPTIONS_SET_BY/_REFUSED)."""
    if option in SBATCH_OPTIONS_SET_BY:
        field = SBATCH_OPTIONS_SET_BY[option]
        return f"halo-sched sets {option} itself " + (field if field.startswith("(") else f"(use {field} instead)")
    return f"{option} cannot be given here: {SBATCH_OPTIONS_REFUSED[option]}"


# Bounds on what reaches Nomad as integers (Go int64; MemoryMB becomes bytes, x 2**20, on the
# client): far above any node, far below any overflow. 10,000,000 MHz is 2,000 cores at 5 GHz;
# 2**27 MB is 128 TiB.
NOMAD_MAX_CPU_MHZ = 10_000_000
NOMAD_MAX_MEMORY_MB = 2**27


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
        import unicodedata

        for vol in v:
            _no_nul(vol, "a volume")
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


SERVER_NAME_RE = re.compile(r"\A[a-z]([a-z0-9-]{0,22}[a-z0-9])?\Z")


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
            _no_nul(a, "an argument")
            _check_arg_size(a, f"argument {i}")
        return v

    @field_validator("health_path")
    @classmethod
    def _health(cls, v: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@/%?-]*", v):
            raise ValueError("an absolute URL path such as /health (printable URL characters, no spaces)")
        return v

    _image = field_validator("image")(classmethod(lambda cls, v: _checked_image(v)))

    _env_types = field_validator("env", mode="before")(classmethod(lambda cls, v: _env_values_are_text(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: _checked_env(v)))
    _secret_env = field_validator("secret_env")(classmethod(lambda cls, v: _checked_secret_names(v)))

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_lines(cls, v: Any) -> Any:
        return v.splitlines() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _process_size(self) -> "Server":
        _check_process_size(self.env, self.command, "command", "command")
        return self

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        for line in v:
            if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
                raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
        return v


class JobSpec(_Model):
    """One multi-node torchrun job: the same on every backend."""

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

    _env_types = field_validator("env", mode="before")(classmethod(lambda cls, v: _env_values_are_text(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: _checked_env(v)))

    _secret_env = field_validator("secret_env")(classmethod(lambda cls, v: _checked_secret_names(v)))

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
            _no_nul(line, "a setup line")
            if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
                # sbatch refuses a script with a carriage return; other control bytes are typos.
                raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
        return v

    _image = field_validator("image")(classmethod(lambda cls, v: _checked_image(v)))

    @model_validator(mode="after")
    def _cross_checks(self) -> "JobSpec":
        _check_process_size(self.env, self.trainer.args, "trainer", "trainer.args")
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
                _check_env_size(k, environ[k])
            except ValueError as err:  # the size only, never the value
                bad.append((f, str(err).replace(f"{k}'s value", f"{k}'s value in the environment", 1)))
        if bad:
            raise SpecError(bad)
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


def _cpu_notes(spec: "JobSpec") -> list[tuple[str, str]]:
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


# --------------------------------------------------------------------------------------------
# Loading


def _line_index(text: str) -> dict[tuple, int]:
    """Map each YAML key path to its 1-based line, so errors can point into the file."""
    import yaml

    lines: dict[tuple, int] = {}

    def walk(root, top):
        # Iterative, and each node once: an alias shares its anchor's node, so a recursive walk
        # of a "billion laughs" file would never end (and a deep one would overflow the stack).
        seen: set[int] = set()
        todo = [(root, top)]
        while todo:
            node, path = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                for k, val in node.value:
                    key = k.value
                    lines[path + (key,)] = k.start_mark.line + 1
                    todo.append((val, path + (key,)))
            elif isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    lines[path + (i,)] = item.start_mark.line + 1
                    todo.append((item, path + (i,)))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return lines
    if root is not None:
        walk(root, ())
    return lines


_UNION_TAGS = {"int", "str", "float", "bool", "none", "dict", "list"}


def problems_from(err: ValidationError) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    for e in err.errors(include_url=False):
        # Union members show up as loc parts ("int", "str", "list[str]"): not fields the user wrote.
        loc = tuple(x for x in e["loc"] if x not in ("function-after", "function-before")
                    and not (isinstance(x, str) and (x in _UNION_TAGS or "[" in x)))
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            # Checks across fields (model validators) name their field as "field: message".
            m = re.fullmatch(r"([a-z_]+): (.*)", msg, re.S)
            if m and e["type"] == "value_error" and m.group(1) in _fields_at(loc):
                loc, msg = loc + (m.group(1),), m.group(2)
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(loc) + " (see `halo-sched schema` for the fields this section accepts)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        if out and out[-1][0] == loc:  # the members of one union: one problem
            out[-1] = (loc, f"{out[-1][1]}, or {msg[0].lower()}{msg[1:]}")
        else:
            out.append((loc, msg))
    return out


def _fields_at(loc: tuple) -> set[str]:
    """The fields of the section at ``loc`` (("servers", 0) -> a Server's); none for a value."""
    import typing

    model: Any = JobSpec
    for part in loc:
        if isinstance(part, int):  # an item of a list[Model]
            model = next((a for a in typing.get_args(model) if hasattr(a, "model_fields")), None)
        else:
            field = getattr(model, "model_fields", {}).get(part)
            if field is None:
                return set()
            model = field.annotation
            # `Model | None` and `list[Model]`: the model (a list's items come with an index)
            if not hasattr(model, "model_fields") and typing.get_origin(model) is not list:
                model = next((a for a in typing.get_args(model) if hasattr(a, "model_fields")), None)
    return set(getattr(model, "model_fields", {}))


def _did_you_mean(loc: tuple) -> str:
    """", did you mean X?" for an unknown key at ``loc`` close to a field of its section."""
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], sorted(_fields_at(loc[:-1])), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _fmt_loc(loc: tuple) -> str:
    s = ""
    for part in loc:
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s


def from_dict(data: Any, source: str | None = None, text: str | None = None) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError([("", "the job file must be a mapping of keys (name, nodes, trainer, ...)")], source)

    @functools.lru_cache(maxsize=1)
    def line_index() -> dict:  # only when there is something to report: it parses the YAML again
        return _line_index(text) if text else {}

    def located(loc: tuple) -> str:
        where, lines = _fmt_loc(loc), line_index()
        for n in range(len(loc), 0, -1):
            if lines.get(loc[:n]):
                return f"{where} (line {lines[loc[:n]]})"
        return where

    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError([(located(loc), msg) for loc, msg in problems_from(err)], source) from None
    # Layout rules need the whole job (nodes x GPUs), so they run on the validated spec.
    import warnings

    from .layout import LayoutWarning, check as check_layout

    errors, notes = check_layout(spec)
    notes = notes + spec.slurm.warning_notes() + _cpu_notes(spec)
    if errors:
        raise SpecError([(located(tuple(f.split("."))), msg) for f, msg in errors], source)
    for field, msg in notes:
        warnings.warn(f"{source + ': ' if source else ''}{located(tuple(field.split('.')))}: {msg}", LayoutWarning, stacklevel=2)
    return spec


MAX_JOB_FILE_BYTES = 1024 * 1024
# Bounds on what a job file may make the loader build, checked on the YAML events and the composed
# node graph BEFORE any Python value is constructed: a few hundred bytes of anchors can otherwise
# ask for gigabytes ("billion laughs"), and an alias inside its own anchor for an endless value.
MAX_YAML_VALUES = 100_000  # values after every alias is expanded
MAX_YAML_DEPTH = 64        # nesting, in the text and through aliases
MAX_YAML_ALIASES = 1_000   # `*name` references (a job file uses a handful)

_KEY_KINDS = {"null": "null (nothing)", "bool": "a boolean", "int": "a number", "float": "a number",
              "timestamp": "a date", "binary": "binary data"}


@functools.lru_cache(maxsize=1)
def _unique_key_loader():
    import yaml

    class Refused(yaml.MarkedYAMLError):
        """What the loader itself refuses (not a syntax error): reported with its line."""

        def __init__(self, problem: str, mark) -> None:
            super().__init__(problem=problem, problem_mark=mark)

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice (plain YAML keeps the last one silently), a
        key that is not text, an alias inside its own anchor, and files that nest or alias beyond
        the bounds above, as it composes (before anything is built)."""

        def __init__(self, stream):
            super().__init__(stream)
            self.halo_open: dict[str, Any] = {}  # anchors whose value is still being read -> mark
            self.halo_depth = 0
            self.halo_aliases = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self.halo_aliases += 1
                if self.halo_aliases > MAX_YAML_ALIASES:
                    raise Refused(f"more than {MAX_YAML_ALIASES} aliases (*name); a job file needs far fewer",
                                  event.start_mark)
                if event.anchor in self.halo_open:
                    at = self.halo_open[event.anchor]
                    raise Refused(f"alias *{event.anchor} is inside the value of its own anchor &{event.anchor} "
                                  f"(line {at.line + 1}): a value cannot contain itself", event.start_mark)
                return super().compose_node(parent, index)
            if self.halo_depth >= MAX_YAML_DEPTH:
                raise Refused(f"values nested more than {MAX_YAML_DEPTH} levels deep; a job file is far shallower",
                              event.start_mark)
            anchor = getattr(event, "anchor", None)
            if anchor is not None and anchor not in self.anchors:  # (a duplicate: YAML's own error)
                self.halo_open[anchor] = event.start_mark
            self.halo_depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.halo_depth -= 1
                self.halo_open.pop(anchor, None)

        def construct_document(self, node):
            _check_expansion(node, Refused)
            return super().construct_document(node)

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: SafeLoader merges below
                continue
            key = loader.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "found unhashable key", key_node.start_mark) from None
            if not isinstance(key, str):
                kind = _KEY_KINDS.get(key_node.tag.rpartition(":")[2], type(key).__name__)
                raise Refused(f"key {key_node.value!r} is read by YAML as {kind}, not as a name; every key is a "
                              "name (quote it if this is the name you mean)", key_node.start_mark)
            if duplicate:
                raise Refused(f"duplicate key {key!r} (the first one would be silently lost)", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)

    def construct_str(loader, node):
        value = loader.construct_scalar(node)
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:  # "\ud800": YAML takes the escape, no file or argument can
                raise Refused(f"the text has U+{ord(value[err.start]):04X}, half of a UTF-16 surrogate pair, "
                              "which is no character and cannot be written to a script or passed to a process",
                              node.start_mark) from None
        return value

    Loader.add_constructor("tag:yaml.org,2002:str", construct_str)
    Loader.Refused = Refused
    return Loader


def _check_expansion(root, refused) -> None:
    """Refuse a document whose aliases expand to more than MAX_YAML_VALUES values or that nests
    deeper than MAX_YAML_DEPTH (a "billion laughs" file is a few hundred bytes), or whose node
    graph has a cycle. Counted on the composed node graph, each node once (memoized), so the
    check stays linear; a node met again while its own children are counted is a cycle (the
    composer refuses those first; this keeps the count finite whatever graph it is given)."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()

    def kids_of(node) -> list:
        return ([x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])

    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            kids = kids_of(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_YAML_VALUES:
                raise refused(f"the document expands to more than {MAX_YAML_VALUES} values through its aliases "
                              "(anchors referencing anchors); a job file is far smaller", node.start_mark)
            if depth[key] > MAX_YAML_DEPTH:
                raise refused(f"values nested more than {MAX_YAML_DEPTH} levels deep; a job file is far shallower",
                              node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise refused("a value contains itself (an alias inside its own anchor)", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids_of(node) if id(k) not in size)


def loads(text: str, source: str | None = None) -> JobSpec:
    import yaml

    if len(text) > MAX_JOB_FILE_BYTES:
        raise SpecError([("", f"the job file is {len(text)} characters; at most {MAX_JOB_FILE_BYTES} are read "
                              "(move large values into files the job reads)")], source)
    loader = _unique_key_loader()
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise SpecError([("YAML", f"values nested too deeply to read (a job file nests at most "
                                  f"{MAX_YAML_DEPTH} levels)")], source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err)
        if not isinstance(err, loader.Refused):
            problem = f"YAML syntax error: {problem}"
        raise SpecError([(where, problem)], source) from None
    return from_dict(data, source, text)


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_a_file(mode: int) -> str | None:
    """Why a file of this mode cannot be a job file (None: a regular file or a pipe)."""
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    kind = next((k for test, k in _FILE_KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file; give the path of a job file"


#: How long a job file given as a pipe (`validate <(envsubst < job.yaml)`, a named pipe) may take
#: to arrive whole: a pipe no one writes to ends the wait, never blocks it.
PIPE_READ_S = 10.0


def _read_pipe(fd: int, path: Path) -> bytes:
    """A pipe's bytes up to its end (the writer closed it), at most MAX_JOB_FILE_BYTES + 1, within
    PIPE_READ_S. ``fd`` is non-blocking; a named pipe with no writer reads as empty at once."""
    import select
    import time

    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + PIPE_READ_S
    while size <= MAX_JOB_FILE_BYTES:
        try:
            chunk = os.read(fd, 65536)  # b"": the end (or a named pipe no one opened to write)
        except BlockingIOError:  # a writer, nothing from it yet
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SpecError([("", f"{path} is a pipe that did not end within {PIPE_READ_S:g} s; give the path "
                                      "of a job file, or close the pipe's writing end")], str(path)) from None
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def load(path: str | Path) -> JobSpec:
    """Read and validate a job file: a regular file, or a pipe read until its end within
    PIPE_READ_S (a device or directory is refused without reading it, so nothing can make this
    block), at most MAX_JOB_FILE_BYTES."""
    p = Path(path)
    try:
        why = _not_a_file(os.stat(p).st_mode)  # before opening: opening a device can act on it
        if why:
            raise SpecError([("", f"{p} {why}")], str(p))
        # O_NONBLOCK: opening a named pipe waits for a writer otherwise, and what was checked
        # above may since have been replaced.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            why = _not_a_file(mode)
            if why:
                raise SpecError([("", f"{p} {why}")], str(p))
            if stat.S_ISFIFO(mode):
                raw = _read_pipe(f.fileno(), p)
            else:
                raw = f.read(MAX_JOB_FILE_BYTES + 1)  # never more than the limit, whatever the file's size
        if len(raw) > MAX_JOB_FILE_BYTES:
            raise SpecError([("", f"the job file is larger than {MAX_JOB_FILE_BYTES} bytes (move large values "
                                  "into files the job reads)")], str(p))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise SpecError([("", f"no such file: {p}")], str(p)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([("", f"cannot read: {err}")], str(p)) from None
    return loads(text, str(p))


def json_schema() -> dict:
    return JobSpec.model_json_schema()


def validated(spec: Any) -> JobSpec:
    """``spec`` validated again, as a job file is (``from_dict``: the fields, then the layout
    rules; its notes are not repeated), whatever built it: ``model_copy(update=...)`` and
    ``model_construct`` skip pydantic's validation, and ``JobSpec(...)`` skips the layout rules.
    Returns a new JobSpec; raises the SpecError a job file with the same content would."""
    if not isinstance(spec, JobSpec):
        raise SpecError([("", f"expected a JobSpec (halo_sched.load or loads), got {type(spec).__name__}")])
    try:
        data = spec.model_dump(warnings=False)
    except Exception as err:  # noqa: BLE001 - a value no job file could hold
        raise SpecError([("", f"the spec holds a value that cannot be read back ({type(err).__name__})")]) from None
    try:
        checked = JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError([(_fmt_loc(loc), msg) for loc, msg in problems_from(err)]) from None
    from .layout import check as check_layout

    errors, _ = check_layout(checked)
    if errors:
        raise SpecError(errors)
    return checked
