"""What a valid value of a job-file field is: the patterns names and scheduler options must match,
the limits a value must stay within, and the parsers of sizes, times and durations.

No pydantic and no I/O: the models (halo_sched/models.py) check each field with these, the
renderers hold what they write to the same patterns (halo_sched/templating.py), and the CLI parses
its own options with them. Each check raises ValueError with a message that names no field; the
model's validator gives the field.
"""
from __future__ import annotations

import re
from typing import Any

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
#: The warning when ``slurm.signal`` is unset (what ``cancel --signal`` then delivers).
DEFAULT_WARNING = ("", "USR2", None)


#: ``list --limit``'s and ``halo_sched.list(limit=)``'s largest count (SQLite's LIMIT takes a
#: 64-bit integer; no history is this long).
MAX_LIMIT = 10 ** 12

_AGE_RE = re.compile(r"(\d{1,6})([smhd])")


def parse_since(text: Any, now: float) -> float:
    """``since`` (``list --since``, ``logs --since``, the library's ``since=``): an age (``30s``,
    ``30m``, ``12h``, ``7d``) before ``now``, or an ISO date/time (``2026-12-01``,
    ``2026-12-01T08:00``: local time unless it names a zone), as the epoch seconds it means; the
    library's ``datetime``, ``timedelta`` (an age) or epoch seconds too. ValueError saying what
    it takes."""
    import math
    from datetime import datetime, timedelta

    if isinstance(text, timedelta):
        return now - text.total_seconds()
    if isinstance(text, datetime):
        try:
            return text.timestamp()
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"{text!r} is no time a clock can show") from None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text):
            raise ValueError(f"{text!r} is not a time")
        return float(text)
    if not isinstance(text, str):
        raise ValueError(f"a {type(text).__name__}: give an age (30m, 12h, 7d), an ISO date/time, a datetime, "
                         "a timedelta or epoch seconds")
    m = _AGE_RE.fullmatch(text.strip())
    if m:
        return now - int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(f"{shown!r} is not an age (30m, 12h, 7d) or an ISO date/time") from None


def parse_warning(text: Any) -> tuple[str, str, int | None] | None:
    """(flags, signal name, seconds) of a ``slurm.signal`` value ``[B:]SIG[@secs]``, or None when
    it is not one; the one parser of it (the job file's field, a job record's copy, ``cancel
    --signal``)."""
    m = SLURM_SIGNAL_RE.match(text) if isinstance(text, str) else None
    if m is None:
        return None
    return m.group(1) or "", m.group(2), int(m.group(3)) if m.group(3) else None

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


def check_arg_size(value: str, what: str) -> int:
    """Bytes ``value`` takes as one process argument (with its NUL); too large: ValueError."""
    n = _utf8_len(value) + 1
    if n > MAX_ARG_STRLEN:
        raise ValueError(f"{what} is {n - 1} bytes; Linux passes at most {MAX_ARG_STRLEN - 1} bytes in one argument "
                         "(MAX_ARG_STRLEN; the process would fail with 'Argument list too long'): put it in a file "
                         "the job reads")
    return n


def check_env_size(k: str, val: str) -> int:
    """Bytes ``k=val`` takes in a process's environment (with its NUL); too large: ValueError."""
    n = _utf8_len(k) + 1 + _utf8_len(val) + 1
    if n > MAX_ARG_STRLEN:
        raise ValueError(f"{k}'s value is {n - len(k) - 2} bytes; Linux passes at most {MAX_ARG_STRLEN - 1} bytes in "
                         f"one variable, NAME=value (MAX_ARG_STRLEN; every rank would fail with 'Argument list too "
                         "long'): put the value in a file the job reads")
    return n


def check_process_size(env: dict[str, str], argv: list[str], argv_field: str, argv_name: str) -> None:
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


def no_nul(value: str, what: str) -> str:
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

def env_values_are_text(v: Any) -> Any:
    """YAML turns `on`, `1.0`, `0755` into bool/float/int silently; require the user to quote,
    so the value that reaches the processes is exactly the text in the file."""
    if isinstance(v, dict):
        for k, val in v.items():
            if isinstance(val, (bool, int, float)) or val is None:
                raise ValueError(f"{k}: value must be a string (quote it: {k}: \"{val}\"), got {type(val).__name__}")
            if not isinstance(val, str):  # a section or a list: its text could be any size
                raise ValueError(f"{k}: value must be a string, got {type(val).__name__}")
    return v


SLURM_CONSTRAINT_RE = re.compile(r"\A[A-Za-z0-9_.,:@+%/=&|\[\]*()!-]+\Z")
IMAGE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:/@+#-]*\Z")


def checked_image(v: str | None) -> str | None:
    """``image`` of the job or of a server role."""
    if v is not None and not IMAGE_RE.fullmatch(v):
        raise ValueError("not a container image reference (registry/name:tag or name@sha256:...)")
    return v


def checked_secret_names(v: list[str]) -> list[str]:
    """``secret_env`` of the job or of a server role: names only, each once."""
    for i, k in enumerate(v):
        _check_env_name(k)
        if k in v[:i]:
            raise ValueError(f"{k} is named twice")
    return v


def checked_env(v: dict[str, str]) -> dict[str, str]:
    for k, val in v.items():
        _check_env_name(k)
        no_nul(val, f"{k}'s value")
        check_env_size(k, val)
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


# The longest a rank may be told to wait (store, collectives, placement): a week, as
# rendezvous.timeout_s. Longer is a typo or .inf, and overflows what trainers convert it to.
MAX_TIMEOUT_HOURS = 7 * 24


# Every option the SLURM backend sets itself (sbatch_request() in backends/slurm/render.py: the
# request every transport sends and the script's "#SBATCH" header show), with the field that sets it or, in
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


def sbatch_option_owner(option: str) -> str:
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


SERVER_NAME_RE = re.compile(r"\A[a-z]([a-z0-9-]{0,22}[a-z0-9])?\Z")


#: A host name as schedulers report it: an RFC 1123 label or dotted name (SLURM NodeName, Nomad
#: node name). Nothing else can reach ``--exclude=`` or a Nomad constraint.
HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}))*")
MAX_HOST_CHARS = 253


def valid_host(host: Any) -> bool:
    """A host name the node ledger, ``--exclude`` and a Nomad constraint may carry."""
    return isinstance(host, str) and len(host) <= MAX_HOST_CHARS and HOST_RE.fullmatch(host) is not None

