"""What the job file's sections check and derive, without pydantic.

The models (halo_sched/models.py) declare the fields; every check they run past a field's type
and bounds is a plain function here (``<section>_<what>``: a field's value in, the value out,
or a section in and the same section out), and what a section derives (``JobSpec.derived_env``,
``Slurm.warning``, ...) is a method of its ``<Section>Methods`` mixin. Together with the models
they are the one definition of a valid job file; each check is written once, here.

What a valid value is lives in halo_sched/values.py.
"""
from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from .errors import SpecError
from .node.contract import WARNING_CARRIER
from .sbatch_options import SHORT, parse_setting
from .values import (
    DEFAULT_WARNING, ENV_NAME_RE, IFACE_RE, MODULE_RE, NAME_RE, SBATCH_ARG_RE, SBATCH_CONFLICTS,
    SBATCH_EXACT_PREFIXES, SBATCH_OPTIONS_REFUSED, SBATCH_OPTIONS_SET_BY, SERVER_NAME_RE,
    SLURM_CONSTRAINT_RE, SLURM_DEFAULT_WARNING_S, SLURM_TIME_RE, SLURM_WARNING_EARLY_S, SLURM_WORD_RE,
    WARNING_SIGNALS, check_arg_size, check_env_size, check_process_size, no_nul, parse_go_duration, parse_size,
    parse_slurm_mem, parse_slurm_time, parse_warning, sbatch_option_owner,
)

# A section here is a model of halo_sched/models.py (never imported here: the models import this).
Section = Any

#: The most attempts a run may have: past that, a node fault is not what is failing the run.
MAX_ATTEMPTS = 20


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


def check_hang(spec: Section) -> None:
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


# The notify events and the retry words are the failure vocabulary's: halo_sched/node/failure_classes.py.


def cpu_notes(spec: Section) -> list[tuple[str, str]]:
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


def check_servers(spec: Section, derived: set[str]) -> None:
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




def trainer_script(v: str | None) -> str | None:
    if v is None:
        return v
    no_nul(v, "script")
    check_arg_size(v, "the path")
    if not v.strip() or not v.endswith(".py"):
        raise ValueError("must be the path of a .py file (use trainer.module for a module)")
    if v.startswith("-"):
        raise ValueError("must not start with '-' (it would be read as a torchrun option)")
    return v


def _missing(script: str, path: str, base: "ScriptBase | None") -> str:
    """Why ``trainer.script`` cannot run: ``path`` (where ``script`` was looked for) is no file."""
    what = "is a directory, not a file" if os.path.isdir(path) else "no such file"
    if base is None:
        return f"{path}: {what}"
    where = "the current directory (the job file came through a pipe)" if base.piped else "the job file's directory"
    return f"{path}: {what} (a relative trainer.script is read from {where}, {base.job_dir})"


def _for_nodes(path: str) -> str:
    """An absolute ``path`` as the nodes are given it: they start in the directory halo-sched
    submits from (local and SLURM alike), so a file below it is given relative to it (as the job
    file's author would write it), any other by its absolute path."""
    try:
        rel = os.path.relpath(path, os.getcwd())
    except (OSError, ValueError):  # the current directory is gone
        return path
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def trainer_module(v: str | None) -> str | None:
    if v is not None and not MODULE_RE.fullmatch(v):
        raise ValueError("must be a dotted Python module name such as pkg.train")
    return v


def trainer_args(v: list[str]) -> list[str]:
    for i, a in enumerate(v):
        no_nul(a, "an argument")
        check_arg_size(a, f"argument {i}")
    return v


def trainer_one_of(self: Section) -> Section:
    if (self.script is None) == (self.module is None):
        raise ValueError("set exactly one of trainer.script or trainer.module")
    return self


def network_iface(v: str | None) -> str | None:
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


def network_ep(self: Section) -> Section:
    if self.cross_node_expert_parallel and self.fabric != "efa":
        raise ValueError("cross_node_expert_parallel: applies to fabric: efa only (other fabrics use NCCL defaults)")
    return self


def slurm_word(v: str | None) -> str | None:
    if v is not None and not SLURM_WORD_RE.fullmatch(v):
        raise ValueError("may contain only letters, digits and _ . , : @ + % / = -")
    return v


def slurm_mem(v: str | None) -> str | None:
    if v is not None:
        parse_slurm_mem(v)
    return v


def slurm_constraint(v: str | None) -> str | None:
    if v is not None and not SLURM_CONSTRAINT_RE.fullmatch(v):
        raise ValueError("a SLURM feature expression: letters, digits, _ . , : and & | [ ] * ( ) !, no spaces or quotes")
    return v


def slurm_quoted(v: Any) -> Any:
    # YAML turns `time: 1:30:00` into the number 5400 and `account: 12345` into an int.
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raise ValueError(f"must be a string; quote it (YAML read this as the number {v})")
    return v


def slurm_time(v: str | None) -> str | None:
    if v is not None and not SLURM_TIME_RE.fullmatch(v):
        raise ValueError("not a SLURM time: use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    return v


def slurm_signal(v: str | None) -> str | None:
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


def slurm_workdir(v: str | None) -> str | None:
    if v is not None and (not v.startswith("/") or not SLURM_WORD_RE.fullmatch(v) or "," in v or ":" in v):
        raise ValueError("an absolute path inside the image, without spaces, quotes, ',' or ':'")
    return v


def slurm_mounts(v: list[str]) -> list[str]:
    for m in v:
        if not SLURM_WORD_RE.fullmatch(m) or ":" not in m:
            raise ValueError(f"{m!r}: each mount is SRC:DST[:FLAGS] without spaces or quotes")
    return v


def slurm_extra(v: list[str]) -> list[str]:
    for a in v:
        if a.startswith("-") and not a.startswith("--"):
            # Short forms are not taken (SBATCH_ARG_RE): name the long one, and its field.
            long = "--" + SHORT.get(a[1:2], "")
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
    # Each one typed as the transports take it (sbatch_options.py): a bad value fails here, at
    # load time, not at submit; an option given twice would leave one of them unsaid.
    seen = set()
    for a in v:
        option = parse_setting(a).option
        if option in seen:
            raise ValueError(f"--{option} is given twice; give it once")
        seen.add(option)
    return v


def slurm_extra_conflicts(self: Section) -> Section:
    for a in self.extra_args:
        name = a.partition("=")[0]
        for option, field in SBATCH_CONFLICTS:
            if name == option and getattr(self, field):
                raise ValueError(f"extra_args: {a!r} conflicts with slurm.{field} (sbatch refuses both); "
                                 f"use one of them")
    return self


def slurm_spares(self: Section) -> Section:
    # A spare idles until a node fails: on a shared node another user's job would hold what the
    # swap needs (and spread this job's GPUs among strangers' work).
    if self.spare_nodes and not self.exclusive:
        raise ValueError("spare_nodes: hot spares need exclusive: true (whole nodes held by this job; on shared "
                         "nodes other users' jobs would take what a swap needs)")
    return self


def nomad_user(v: str | None) -> str | None:
    if v is not None:
        m = re.fullmatch(r"(\d{1,10}):(\d{1,10})", v)
        if not m or max(int(m.group(1)), int(m.group(2))) > 2**31 - 1:
            raise ValueError(f"{v!r}: give the numeric user and group ids as UID:GID, e.g. 1000:1000")
    return v


def nomad_dcs(v: list[str]) -> list[str]:
    if not v:
        raise ValueError("needs at least one datacenter ('*' for all)")
    for dc in v:
        if not re.fullmatch(r"[A-Za-z0-9_.*-]+", dc):
            raise ValueError(f"{dc!r} is not a datacenter name")
    return v


def nomad_namespace(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,128}", v):
        raise ValueError("a Nomad namespace: letters, digits and -")
    return v


def nomad_region(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", v):
        raise ValueError("may contain only letters, digits, _ and -")
    return v


def nomad_dur(v: str | None) -> str | None:
    if v is not None:
        parse_go_duration(v)
    return v


def nomad_shm(v: int | str | None) -> int | str | None:
    if v is not None:
        parse_size(v)
    return v


def nomad_vols(v: list[str]) -> list[str]:
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


def nomad_docker_only(self: Section) -> Section:
    if self.driver != "docker":
        for field, value in (("shm_size", self.shm_size), ("volumes", self.volumes)):
            if value:
                raise ValueError(f"{field}: applies to the docker driver only, not {self.driver} (it would be ignored)")
    return self


def nomad_shm_fits(self: Section) -> Section:
    if self.shm_bytes is not None and self.shm_bytes >= self.memory * 1024 * 1024:
        raise ValueError(
            f"shm_size: {self.shm_size} must be smaller than memory ({self.memory} MB): "
            "docker counts /dev/shm against the task's hard memory limit"
        )
    return self


def server_name(v: str) -> str:
    if not SERVER_NAME_RE.fullmatch(v):
        raise ValueError("must be 1-24 characters: lower-case letters, digits and '-', starting with a letter and "
                         "not ending with '-' (a DNS label; it names variables, groups and services)")
    return v


def server_command(v: list[str]) -> list[str]:
    if not v or not v[0]:
        raise ValueError("must be a non-empty list: the program, then its arguments")
    for i, a in enumerate(v):
        no_nul(a, "an argument")
        check_arg_size(a, f"argument {i}")
    return v


def server_health(v: str) -> str:
    if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@/%?-]*", v):
        raise ValueError("an absolute URL path such as /health (printable URL characters, no spaces)")
    return v


def setup_lines(v: Any) -> Any:
    return v.splitlines() if isinstance(v, str) else v


def server_process_size(self: Section) -> Section:
    check_process_size(self.env, self.command, "command", "command")
    return self


def server_setup(v: list[str]) -> list[str]:
    for line in v:
        if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
            raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
    return v


def preflight_busbw(v: Any) -> Any:
    if v is not None:
        busbw_gbps(v)  # raises ValueError naming the format
    return v


def preflight_busbw_needs_gate(self: Section) -> Section:
    if self.min_busbw is not None and self.gate is not True:
        raise ValueError("preflight.min_busbw needs preflight.gate: true (the floor is checked by the gate "
                         "inside the job); set gate: true or drop min_busbw")
    return self


def notify_name(v: str) -> str:
    if not ENV_NAME_RE.fullmatch(v):
        raise ValueError(f"{v[:40]!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return v


def notify_once(v: list[str]) -> list[str]:
    return list(dict.fromkeys(v))


def job_name(v: str) -> str:
    if not NAME_RE.fullmatch(v):
        raise ValueError("must be 1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit")
    return v



def job_setup(v: list[str]) -> list[str]:
    for line in v:
        no_nul(line, "a setup line")
        if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", line):
            # sbatch refuses a script with a carriage return; other control bytes are typos.
            raise ValueError(f"setup line {line!r} contains a control character (carriage return?)")
    return v


def job_cross_checks(self: Section) -> Section:
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
    check_servers(self, derived)
    if self.slurm.spare_nodes and self.servers:
        raise ValueError("slurm.spare_nodes: hot spares are for the trainer's nodes only; a job with servers cannot "
                         "have them yet")
    if self.nomad.spare_nodes and self.servers:
        raise ValueError("nomad.spare_nodes: hot spares are for the trainer's nodes only; a job with servers cannot "
                         "have them yet")
    check_hang(self)
    clash = sorted(derived & set(self.env))
    if clash:
        raise ValueError(
            f"env: sets {', '.join(clash)}, which halo-sched derives from storage/network; set those sections instead"
        )
    return self


class SlurmMethods:
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


def nomad_spares(self):
    """``nomad.spare_nodes`` needs the run's keeper: it is what gives a spare the bad node's rank."""
    if self.spare_nodes and not self.keeper:
        raise ValueError("spare_nodes: hot spares need keeper: true (the run's keeper gives a spare the bad node's rank)")
    return self


class NomadMethods:
    @property
    def owner(self) -> tuple[int, int] | None:
        """``user`` as (uid, gid), or None."""
        if self.user is None:
            return None
        uid, gid = self.user.split(":")
        return int(uid), int(gid)

    @property
    def shm_bytes(self) -> int | None:
        return None if self.shm_size is None else parse_size(self.shm_size)

    @property
    def max_run_duration_ns(self) -> int | None:
        return None if self.max_run_duration is None else parse_go_duration(self.max_run_duration)


class HangMethods:
    @property
    def first_step_limit(self) -> int:
        return self.first_step_s if self.first_step_s is not None else 2 * self.timeout_s


class PreflightMethods:
    def min_busbw_gbps(self) -> float | None:
        """min_busbw in GB/s (10^9 bytes/s), or None."""
        return None if self.min_busbw is None else busbw_gbps(self.min_busbw)


class NotifyMethods:
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


class ScriptBase(NamedTuple):
    """Where a relative ``trainer.script`` of a job file is read from (set by :func:`load`, kept
    by ``validated``, ``with_changes`` and a run's attempts; rebuilt from a job's record): the
    job file's directory, and the directory halo-sched was run in when it read the file (the
    place a relative script was read from before, searched second, with a warning)."""

    job_dir: str
    cwd: str
    #: The job file as it was named (for errors).
    source: str | None = None
    #: Read from a pipe (``validate <(envsubst < job.yaml)``): no directory of its own, so
    #: ``job_dir`` is the current one.
    piped: bool = False

    @classmethod
    def of_record(cls, record: dict) -> "ScriptBase | None":
        """The base of a job's record (``script_dir``, the directory it was submitted from);
        a record older than ``script_dir`` read the script from its submit directory. None for
        a spec that was not read from a job file."""
        job_dir, cwd = record.get("script_dir"), record.get("submit_dir")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            return None
        if isinstance(job_dir, str) and os.path.isabs(job_dir):
            return cls(job_dir, cwd)
        return cls(cwd, cwd) if isinstance(record.get("job_file"), str) else None


class ScriptCheck(NamedTuple):
    """``trainer.script`` as a backend gives it to its nodes (:meth:`JobSpecMethods.script_check`)."""

    #: The path the nodes are given (None: the trainer is a module).
    on_nodes: str | None
    #: Why submit refuses it (no such file; a directory), None when it is fine or cannot be checked.
    problem: str | None = None
    #: Warning lines: why it cannot be checked here, or that it was found by the former rule.
    notes: tuple[str, ...] = ()


def _is_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def script_not_checked(spec: Section, backend: str) -> str | None:
    """Where ``backend``'s nodes read ``trainer.script`` when this machine cannot look there (an
    image, Nomad's clients); None when the nodes see this machine's files: the local backend, and
    SLURM on the host (the cluster's shared filesystem)."""
    if backend == "local":
        return None
    if backend == "slurm":
        if spec.image and spec.slurm.container_runtime == "pyxis":
            return f"read inside image {spec.image} (pyxis)"
        return None
    if backend == "nomad":
        return f"read inside image {spec.image}" if spec.image else "read on the Nomad clients' own hosts"
    return f"read on the {backend} backend's nodes"


class JobSpecMethods:
    def script_check(self, backend: str) -> ScriptCheck:
        """``trainer.script`` on ``backend``'s nodes, and whether it is there.

        A job file's relative script is read from the job file's directory (``ScriptBase``), and
        the nodes of a backend that shares this machine's files (local; SLURM on the host) are
        given that file (:func:`_for_nodes`), so they run the file that was checked. When it is not there but
        is found from the directory halo-sched was run in (how a relative script was read before),
        that one is used, with a warning. Where the nodes read it elsewhere (an image, Nomad's
        task) it is given as written and cannot be checked here: a note says so. A spec built in
        code has no job file: its script is given as written (relative to the directory the
        nodes start in) and not checked."""
        script = self.trainer.script
        if not isinstance(script, str) or not script:
            return ScriptCheck(None)
        base: ScriptBase | None = getattr(self, "_script_base", None)
        if base is None:
            return ScriptCheck(script)
        elsewhere = script_not_checked(self, backend)
        if elsewhere:
            return ScriptCheck(script, notes=(f"trainer.script {script}: not checked ({elsewhere})",))
        if os.path.isabs(script):
            found = _is_file(script)
            return ScriptCheck(script, None if found else _missing(script, script, None))
        here = os.path.normpath(os.path.join(base.job_dir, script))
        before = os.path.normpath(os.path.join(base.cwd, script))
        if _is_file(here):
            notes = ()
            if before != here and _is_file(before) and not _same_file(here, before):
                notes = (f"trainer.script {script}: {here} (from the job file's directory) is used; {before}, from "
                         "the current directory, is another file (relative scripts were read from there before)",)
            return ScriptCheck(_for_nodes(here), notes=notes)
        if before != here and _is_file(before):
            rel = os.path.relpath(before, base.job_dir)
            return ScriptCheck(_for_nodes(before), notes=(
                f"trainer.script {script} is not in the job file's directory ({base.job_dir}); {before}, found from "
                f"the current directory as before, is used: write it relative to the job file ({rel}) or as an "
                "absolute path",))
        return ScriptCheck(_for_nodes(here), _missing(script, here, base))

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
