"""The slurmrestd transport: Slurm's REST API over a unix socket or TCP.

It speaks the API versions in ``API_VERSIONS``: v0.0.38 (Slurm 22.05, 23.02, 23.11) and
v0.0.40 to v0.0.45 (23.11 to 26.05). By default the first request asks slurmrestd which
versions it offers (``GET /openapi/v3``) and takes the newest one spoken here, whichever others
are missing (each release drops its oldest parser: 26.05 serves v0.0.42-45, and v0.0.42 is gone
from the 26.11 branch); ``HALO_SLURMRESTD_API`` (or ``api_version=``) pins one. A slurmrestd that
offers none of them, or a pinned version not spoken here, is refused with an error that names both.

The two families differ in kind, not just in names:

* v0.0.38 (``src/plugins/openapi/v0.0.38/jobs.c``, slurm-22-05-*) hands each job property to
  sbatch's own option parsers (``slurm_process_option_data`` in ``src/common/slurm_opt.c``):
  values are text as on sbatch's command line ("04:00:00", "16G"), the environment is an object,
  and an unknown key is refused.
* v0.0.40+ (``src/plugins/data_parser/v0.0.4x/parsers.c``, slurm-23-11-* to slurm-26-05-*)
  parse typed fields: counts and limits are integers or ``{set, infinite, number}`` objects
  (a time limit in minutes, memory in MiB; "04:00:00" is refused), flags are lists of names,
  the environment is a list of ``NAME=value``, GPUs are TRES strings (``gres/gpu:8``), the
  warning is ``kill_warning_signal/_delay/_flags``, exclusivity is ``shared`` (``exclusive``
  is gone in v0.0.42), the script goes in ``job.script`` (the top-level ``script`` is
  deprecated from v0.0.41), and an unknown key is IGNORED with a warning.

Every option of the typed request (request.py, built by render.py from the launch plan, with
``slurm.extra_args`` typed when the job file is loaded) is translated for both; an option with
no translation is refused before anything is sent, never dropped. The script goes as the
program to run: no option is read out of its ``#SBATCH`` lines.

Auth: JWT (``X-SLURM-USER-NAME``/``X-SLURM-USER-TOKEN``) or rest_auth/local (unix socket, no
token). No torch here: the CLI imports this module.
"""
from __future__ import annotations

import getpass
import http.client
import json
import os
import re
import socket
from typing import TYPE_CHECKING, Callable, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from halo_sched.backends.base import JobState
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError, UsageError
from halo_sched.node.contract import WARNING_CARRIER
from halo_sched.retry import SLURM_CALLS, Transient

from halo_sched.sbatch_options import Memory, Setting, Signal, Time

from .base import Transport, by_cluster, gave_up, job_environment, split_cluster, unique, with_cluster

if TYPE_CHECKING:  # pragma: no cover
    from ..request import SbatchRequest

# The slurmrestd OpenAPI versions this module's requests and parsers are written for, newest first.
# v0.0.38 verified against a real slurmrestd 22.05.8, v0.0.42 against 24.11.5 and v0.0.45 against
# 26.05.3 (tests/test_slurm_transport_cluster.py); v0.0.40-45 against tests/slurmrestd_stub, which
# follows the data_parser sources of each release.
API_VERSIONS = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")
API_ENV = "HALO_SLURMRESTD_API"
class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


# Which releases serve each version (the openapi/ and data_parser/ trees at each tag; 26.05.3's
# and 24.11.5's slurmrestd list them in /openapi/v3: tests/fixtures/slurmrestd). The 26.11 branch
# (master at 284c3b95, 2026-08-20) has data_parser v0.0.43-46: v0.0.42 ends with 26.05.
_SERVED_BY = {"v0.0.38": "22.05-23.11", "v0.0.40": "23.11-25.05", "v0.0.41": "24.05-25.11",
              "v0.0.42": "24.11-26.05", "v0.0.43": "25.05-26.05", "v0.0.44": "25.11-26.05",
              "v0.0.45": "26.05"}


def _serving_advice(api_version: str) -> str:
    """How a slurmrestd is made to serve ``api_version``: v0.0.38 is its own plugin (22.05-23.11);
    from 23.11 openapi/slurmctld serves each data_parser plugin the release has (no
    openapi/v0.0.4x plugin exists, and 24.05+ have no openapi/v0.0.38)."""
    releases = _SERVED_BY.get(api_version, "no release halo-sched knows")
    if api_version == "v0.0.38":
        return f"run slurmrestd with -s openapi/v0.0.38 (Slurm {releases} only)"
    return (f"run slurmrestd with -s openapi/slurmctld -d data_parser/{api_version} (Slurm {releases} "
            "have that parser)")


def _minor(api_version: str) -> int:
    """``v0.0.42`` -> 42."""
    m = re.fullmatch(r"v0\.0\.(\d+)", api_version or "")
    if not m:
        raise UsageError(f"not a slurmrestd API version: {api_version!r}")
    return int(m.group(1))


# ---------------------------------------------------------------------------------------------
# sbatch options -> job properties

_OWN_CLUSTER = "a slurmrestd submits to its own cluster only"
# sbatch --mail-type names -> data_parser JOB_MAIL_FLAGS (v0.0.40+ parsers.c).
_MAIL = {
    "BEGIN": ["BEGIN"], "END": ["END"], "FAIL": ["FAIL"], "REQUEUE": ["REQUEUE"], "STAGE_OUT": ["STAGE_OUT"],
    "TIME_LIMIT": ["TIME=100%"], "TIME_LIMIT_90": ["TIME=90%"], "TIME_LIMIT_80": ["TIME=80%"],
    "TIME_LIMIT_50": ["TIME=50%"], "ARRAY_TASKS": ["ARRAY_TASKS"], "INVALID_DEPEND": ["INVALID_DEPENDENCY"],
    "ALL": ["BEGIN", "END", "FAIL", "REQUEUE", "STAGE_OUT", "INVALID_DEPENDENCY"], "NONE": [],
}


class _Refused(Exception):
    """An option this API version cannot carry (the reason in the message)."""


# Conversions of a setting's typed value (halo_sched/sbatch_options.py) to a v0.0.40+ field.


def _minutes(t: Time) -> int | dict:
    """A time limit in minutes (rounded up, as sbatch's time_str2mins), or infinite."""
    return {"set": False, "infinite": True, "number": 0} if t.minutes is None else t.minutes


def _mebibytes(m: Memory) -> int:
    return m.mib


def _same(value):
    return value


def _gpu_tres(text: str) -> str:
    """``8`` or ``a100:8`` -> ``gres/gpu:8`` / ``gres/gpu:a100:8`` (sbatch's tres strings)."""
    return f"gres/gpu:{text}"


def _node_list(hosts: tuple[str, ...]) -> list[str]:
    """v0.0.40+ take required/excluded nodes as a list (CSV_STRING_LIST in parsers.c; a comma
    string draws a warning from the server); a host range stays one item."""
    return list(hosts)


class _Job:
    """The ``job`` object for one API version, built one setting at a time."""

    def __init__(self, minor: int):
        self.minor = minor
        self.props: dict = {}
        self.tres_per_node: list[str] = []
        self.flags: list[str] = []
        self.warning: tuple[str, str, int] | None = None
        self.requeue: bool | None = None

    @property
    def typed(self) -> bool:
        return self.minor >= 40

    def set(self, key: str, value) -> None:
        self.props[key] = value

    def apply(self, s: Setting) -> None:
        """Raises _Refused for an option this version cannot carry."""
        handler = _HANDLERS.get(s.option) if s.typed else None
        if handler is None:
            raise _Refused("")
        handler(self, s)

    def finish(self) -> dict:
        job = dict(self.props)
        if self.tres_per_node:
            if self.typed:
                job["tres_per_node"] = ",".join(self.tres_per_node)
        if self.flags:
            job["flags"] = list(dict.fromkeys(self.flags))
        if self.requeue is not None:
            if self.typed:
                job["requeue"] = self.requeue
            elif self.requeue:
                job["requeue"] = "yes"
            else:
                # "requeue": false is accepted and ignored by 22.05 (its data setter only sets
                # it); "no_requeue" is sbatch's own --no-requeue (v0.0.38 jobs.c job_params,
                # "not in OAS"; slurm_opt.c arg_set_data_no_requeue sets requeue = 0).
                job["no_requeue"] = True
        if self.warning:
            flags, sig, secs = self.warning
            if self.typed:
                job["kill_warning_signal"] = sig
                job["kill_warning_delay"] = secs
                job["kill_warning_flags"] = (["BATCH_JOB"] if "B" in flags else []) + (
                    ["RESERVATION_JOB"] if "R" in flags else [])
            elif "B" in flags:
                # slurmrestd 22.05 refuses "B:" (get_signal_opts takes it only in a process named
                # sbatch), and without it slurmctld signals the job's steps alone
                # (job_mgr.c send_job_warn_signal: KILL_STEPS_ONLY). So the steps get
                # WARNING_CARRIER, which each node's entry takes as the warning and hands to its
                # ranks as the warning signal (halo_sched/templates/slurm/sbatch.sh.j2); the batch script
                # does not hear it, which only matters for a job that requeues itself (refused).
                if self.requeue:
                    raise _Refused(
                        "slurmrestd v0.0.38 cannot send the warning to the batch script, which must hear it "
                        "to requeue the job (slurm.requeue: true); use slurmrestd v0.0.40+ or the cli transport")
                job["signal"] = ("R:" if "R" in flags else "") + f"{WARNING_CARRIER}@{secs}"
            else:
                job["signal"] = ("R:" if "R" in flags else "") + f"{sig[3:]}@{secs}"
        return job


# Each handler: (job, setting) -> None, raising _Refused. v0.0.38 takes each value as sbatch's
# text (``Setting.value_text``: it hands it to sbatch's own option parsers); v0.0.40+ the typed
# value converted.


def _plain(key38: str, key40: str | None = None, conv: Callable | None = None):
    """A value taken as text by v0.0.38 and as ``conv(value)`` (default: its text) from v0.0.40."""
    def handle(job: _Job, s: Setting):
        if job.typed:
            job.set(key40 or key38, conv(s.value) if conv else s.value_text())
        else:
            job.set(key38, s.value_text())
    return handle


def _flag(key40: str, value40) -> Callable:
    """An option without a value, which v0.0.38 disables."""
    def handle(job: _Job, s: Setting):
        if not job.typed:
            raise _Refused("is disabled in slurmrestd v0.0.38 (jobs.c job_params)")
        job.set(key40, value40)
    return handle


def _only40(key40: str, conv: Callable, max_minor: int = 99) -> Callable:
    def handle(job: _Job, s: Setting):
        if not job.typed:
            raise _Refused("is disabled in slurmrestd v0.0.38 (jobs.c job_params)")
        if job.minor > max_minor:
            raise _Refused(f"has no field in v0.0.{job.minor}")
        job.set(key40, conv(s.value))
    return handle


def _h_exclusive(job: _Job, s: Setting):
    kind = s.value or "exclusive"
    if job.typed:
        # JOB_SHARED flags (parsers.c): "none" is sbatch --exclusive; v0.0.42 dropped "exclusive".
        # "topo" is a JOB_SHARED flag from v0.0.41 (parsers.c at slurm-24-05-8-1,
        # slurm-24-11-5-1, slurm-26-05-3-1); v0.0.40 has none.
        if kind == "topo" and job.minor < 41:
            raise _Refused("=topo needs v0.0.41+")
        job.set("shared", ["none" if kind == "exclusive" else kind])
    else:
        if kind == "topo":
            raise _Refused("=topo is unknown to Slurm 22.05")
        job.set("exclusive", kind)


def _h_oversubscribe(job: _Job, s: Setting):
    if job.typed:
        job.set("shared", ["oversubscribe"])
    else:
        job.set("oversubscribe", True)


def _h_requeue(flag_value: bool):
    def handle(job: _Job, s: Setting):
        job.requeue = flag_value
    return handle


def _h_signal(job: _Job, s: Setting):
    w: Signal = s.value
    # sbatch's default warning time is 60 s (src/common/proc_args.c).
    job.warning = (w.flags, "SIG" + w.signal, w.seconds if w.seconds is not None else 60)


def _h_open_mode(job: _Job, s: Setting):
    job.set("open_mode", [s.value.upper()] if job.typed else s.value)


def _h_gpus_per_node(job: _Job, s: Setting):
    if job.typed:
        job.tres_per_node.append(_gpu_tres(s.value))
    else:
        job.set("gpus_per_node", s.value_text())


def _h_gres(job: _Job, s: Setting):
    if job.typed:
        job.tres_per_node.append(",".join("gres/" + item for item in s.value))
    else:
        job.set("gres", s.value_text())


def _h_mail_type(job: _Job, s: Setting):
    if not job.typed:
        job.set("mail_type", s.value_text())
        return
    names: list[str] = []
    for item in s.value:
        names += _MAIL[item]
    job.set("mail_type", list(dict.fromkeys(names)))


def _h_job_flag(key38: str, on: str, off: str | None = None):
    """Options that are bits of ``flags`` from v0.0.40 (JOB_FLAGS in parsers.c)."""
    def handle(job: _Job, s: Setting):
        yes = s.value is None or s.value is True
        if job.typed:
            if not yes and off is None:
                raise _Refused("only 'yes' is supported")
            job.flags.append(on if yes else off)
        else:
            job.set(key38, s.value_text() if s.value is not None else True)
    return handle


def _h_wait_all_nodes(job: _Job, s: Setting):
    job.set("wait_all_nodes", s.value if job.typed else s.value_text())


def _h_nice(job: _Job, s: Setting):
    nice = 100 if s.value is None else s.value  # sbatch's --nice without a value
    job.set("nice", nice if job.typed else str(nice))


def _h_hold(job: _Job, s: Setting):
    job.set("hold", True)


def _h_no_kill(job: _Job, s: Setting):
    if job.typed:
        job.set("kill_on_node_fail", s.value is not None)
    else:
        # sbatch's own words: slurm_opt.c arg_set_data_no_kill takes null, "set", "off" or "no", and
        # refuses the boolean its openapi.json documents ("Invalid no kill specification", 22.05).
        job.set("no_kill", s.value or "set")


def _h_refuse(reason: str):
    def handle(job: _Job, s: Setting):
        raise _Refused(reason)
    return handle


def _h_cores_per_socket(job: _Job, s: Setting):
    # JOB_DESC_MSG has cores_per_socket (UINT16) in v0.0.40, none in v0.0.41-44 (parsers.c,
    # slurm-24-05-8-1 .. slurm-26-05-3-1), and has it again in v0.0.45 (slurm-26-05-3-1).
    if not job.typed:
        job.set("cores_per_socket", s.value_text())
    elif 41 <= job.minor <= 44:
        raise _Refused(f"has no field in v0.0.{job.minor}; v0.0.40 and v0.0.45+ carry it")
    else:
        job.set("cores_per_socket", s.value)


_HANDLERS: dict[str, Callable] = {
    "job-name": _plain("name"),
    "nodes": _plain("nodes"),  # "2" or "2-4": JOB_DESC_MSG_NODES takes the text too
    "ntasks": _plain("tasks", conv=_same),
    "ntasks-per-node": _plain("tasks_per_node", conv=_same),
    "cpus-per-task": _plain("cpus_per_task", conv=_same),
    "mincpus": _plain("minimum_cpus_per_node", conv=_same),
    "time": _plain("time_limit", conv=_minutes),
    "time-min": _plain("time_minimum", conv=_minutes),
    "partition": _plain("partition"),
    "account": _plain("account"),
    "qos": _plain("qos"),
    "reservation": _plain("reservation"),
    "comment": _plain("comment"),
    "wckey": _plain("wckey"),
    "licenses": _plain("licenses"),
    "dependency": _plain("dependency"),
    "array": _plain("array"),
    "prefer": _plain("prefer"),
    "constraint": _plain("constraints"),
    "cluster-constraint": _plain("cluster_constraint"),
    "mail-user": _plain("mail_user"),
    "container": _plain("container"),
    "begin": _plain("begin_time"),  # v0.0.40+: text through parse_time(), as sbatch
    "deadline": _plain("deadline"),
    "output": _plain("standard_output"),
    "error": _plain("standard_error"),
    "input": _plain("standard_input"),
    "chdir": _plain("current_working_directory"),
    "nodelist": _plain("nodelist", "required_nodes", _node_list),
    "exclude": _plain("exclude_nodes", "excluded_nodes", _node_list),
    "mem": _plain("memory_per_node", conv=_mebibytes),
    "mem-per-cpu": _plain("memory_per_cpu", conv=_mebibytes),
    "mem-per-gpu": _plain("memory_per_gpu", "memory_per_tres", lambda m: f"gres/gpu:{m.mib}"),
    "tmp": _plain("temporary_disk_per_node", conv=_mebibytes),
    "threads-per-core": _plain("threads_per_core", conv=_same),
    "sockets-per-node": _plain("sockets_per_node", conv=_same),
    "core-spec": _plain("core_specification", conv=_same),
    "thread-spec": _plain("thread_specification", conv=_same),
    "gpus": _plain("gpus", "tres_per_job", _gpu_tres),
    "gpus-per-task": _plain("gpus_per_task", "tres_per_task", _gpu_tres),
    "cpus-per-gpu": _plain("cpus_per_gpu", "cpus_per_tres", lambda n: f"gres/gpu:{n}"),
    "gpu-bind": _plain("gpu_binding", "tres_bind", lambda t: f"gres/gpu:{t}"),
    "gpus-per-node": _h_gpus_per_node,
    "gres": _h_gres,
    "signal": _h_signal,
    "open-mode": _h_open_mode,
    "exclusive": _h_exclusive,
    "oversubscribe": _h_oversubscribe,
    "requeue": _h_requeue(True),
    "no-requeue": _h_requeue(False),
    "hold": _h_hold,
    "nice": _h_nice,
    "mail-type": _h_mail_type,
    "kill-on-invalid-dep": _h_job_flag("kill_on_invalid_dependency", "KILL_INVALID_DEPENDENCY",
                                       "NO_KILL_INVALID_DEPENDENCY"),
    "spread-job": _h_job_flag("spread_job", "SPREAD_JOB"),
    "use-min-nodes": _h_job_flag("minimum_nodes", "PREFER_MINIMUM_NODE_COUNT"),
    "wait-all-nodes": _h_wait_all_nodes,
    "no-kill": _h_no_kill,
    "contiguous": _flag("contiguous", True),
    "overcommit": _flag("overcommit", True),
    "network": _only40("network", _same),
    "cores-per-socket": _h_cores_per_socket,
    "clusters": _h_refuse(_OWN_CLUSTER),
}


def rest_job_properties(
    request: SbatchRequest,
    environment: Mapping[str, str] | None = None,
    cwd: str | None = None,
    api_version: str = "v0.0.38",
) -> dict:
    """The ``job`` object of a submit request for ``api_version``, from the typed request: each
    option translated, the working directory, and the environment (``base.job_environment``:
    the request's --export less the submitter's credentials). The script's text is not read.

    An option this version cannot carry is a UsageError naming ``slurm.extra_args`` and every
    such option, raised before anything is sent."""
    minor = _minor(api_version)
    job = _Job(minor)
    job.set("current_working_directory", cwd or os.getcwd())
    refused = []
    for s in request.options:
        if s.option == "export":
            continue  # the environment, below
        try:
            job.apply(s)
        except _Refused as e:
            refused.append(f"{s.text()} ({e})" if str(e) else s.text())
    try:
        props = job.finish()
    except _Refused as e:
        refused.append(f"--signal ({e})")
        props = {}
    if refused:
        raise UsageError(
            f"slurm.extra_args: slurmrestd API {api_version} cannot take "
            + ", ".join(refused)
            + "; remove them, or submit with the 'cli' transport (sbatch, HALO_SLURM_TRANSPORT=cli)"
        )
    env = job_environment(request, os.environ if environment is None else environment)
    # slurmrestd requires an environment (v0.0.38 jobs.c "environment must be set").
    env = env or {"PATH": "/usr/bin:/bin"}
    props["environment"] = [f"{k}={v}" for k, v in env.items()] if job.typed else env
    return props


class RestTransport(Transport):
    """slurmrestd, at one of ``API_VERSIONS``.

    Endpoint: ``socket_path`` (unix socket) or ``url`` (e.g. ``http://127.0.0.1:6917``, the local
    test cluster); defaults from ``HALO_SLURMRESTD_SOCKET`` / ``HALO_SLURMRESTD_URL``. Auth: with
    ``token`` (default: ``$SLURM_JWT``, as ``scontrol token`` prints it) requests act as ``user``
    (default: the current user); without one, rest_auth/local on a unix socket, where slurmrestd
    accepts only root or its own uid and acts as its own uid. ``api_version``: default
    ``$HALO_SLURMRESTD_API``, else ``auto`` (the newest version both sides speak).

    ``environment``: what the job's environment is taken from (default: this process's), less the
    credentials ``base.job_environment`` leaves out; SLURM_JWT never goes into a job.

    Costs: ``query`` is one ``GET /jobs`` for any number of ids; ``cancel`` is one DELETE per id
    (the API has no bulk cancel). There is no accounting here (slurmdbd's API is separate):
    jobs slurmctld has forgotten are UNKNOWN. ``CLUSTER:ID`` ids are answered only for the
    cluster this slurmrestd serves (each job it lists names its cluster).
    """

    name = "rest"

    def __init__(
        self,
        url: str | None = None,
        socket_path: str | None = None,
        token: str | None = None,
        user: str | None = None,
        api_version: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        environment: Mapping[str, str] | None = None,
    ):
        token = token if token is not None else os.environ.get("SLURM_JWT")
        if not url and not socket_path:
            # With a token, the JWT endpoint; without, rest_auth/local on the unix socket.
            env_url = os.environ.get("HALO_SLURMRESTD_URL") or None
            env_socket = os.environ.get("HALO_SLURMRESTD_SOCKET") or None
            if token and env_url:
                url = env_url
            elif env_socket:
                socket_path = env_socket
            else:
                url = env_url
        if not url and not socket_path:
            raise MissingDependency(
                "the rest transport needs a slurmrestd endpoint: pass url= or socket_path= "
                "(or set HALO_SLURMRESTD_URL / HALO_SLURMRESTD_SOCKET)"
            )
        self.url = url
        self.socket_path = socket_path
        self.token = token
        self.user = user or os.environ.get("SLURM_JWT_USER") or getpass.getuser()
        if not self.token and not socket_path:
            raise MissingDependency(
                "slurmrestd over TCP needs a JWT: set SLURM_JWT (scontrol token) or pass token="
            )
        wanted = (api_version or os.environ.get(API_ENV) or "auto").strip()
        if wanted != "auto" and wanted not in API_VERSIONS:
            raise UsageError(
                f"slurmrestd API {wanted} ({API_ENV}) is not one halo-sched speaks: it speaks "
                f"{', '.join(API_VERSIONS)}; set {API_ENV}=auto or one of those"
            )
        self.api_version: str | None = None if wanted == "auto" else wanted
        self.timeout = timeout
        self.policy = SLURM_CALLS.with_(attempts=retries)
        self.environment = environment

    def __repr__(self) -> str:  # never the token
        return f"RestTransport({self._endpoint()}, api={self.api_version or 'auto'}, user={self.user})"

    # -- HTTP --------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixHTTPConnection(self.socket_path, self.timeout)
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.timeout)

    def _prefix(self) -> str:
        return "" if self.socket_path else urlsplit(self.url).path.rstrip("/")

    def _endpoint(self) -> str:
        return f"unix:{self.socket_path}" if self.socket_path else str(self.url)

    def _once(self, method: str, path: str, body: dict | None) -> dict:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["X-SLURM-USER-NAME"] = self.user
            headers["X-SLURM-USER-TOKEN"] = self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection()
        try:
            conn.request(method, self._prefix() + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise Transient(str(e)) from e
        finally:
            conn.close()
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = None
        if doc is None or not isinstance(doc, dict):
            if resp.status == 404 and self.api_version and f"/{self.api_version}/" in path:
                # slurmrestd answers a path of a version it does not load with a plain-text 404.
                raise MissingDependency(
                    f"slurmrestd at {self._endpoint()} does not offer API {self.api_version} "
                    f"({API_ENV}); halo-sched speaks {', '.join(API_VERSIONS)}: "
                    f"{_serving_advice(self.api_version)} (or leave {API_ENV} unset: the newest version "
                    "both sides speak is used), or use the cli transport"
                )
            raise SchedulerError(f"slurmrestd {method} {path}: HTTP {resp.status}: {raw[:300]!r}")
        errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
        # Some answers carry an informational "error" with a job id (e.g. a held job).
        fatal = [e for e in errors if not (path.endswith("/job/submit") and doc.get("job_id"))]
        if resp.status >= 400 or fatal:
            text = "; ".join(
                " ".join(str(e.get(k)) for k in ("error", "description") if e.get(k)) or json.dumps(e) for e in errors
            )
            raise SchedulerError(f"slurmrestd {method} {path}: HTTP {resp.status}: {text or repr(raw[:300])}")
        return doc

    def _request(self, method: str, path: str, body: dict | None = None, retry: bool = True) -> dict:
        policy = self.policy if retry else self.policy.with_(attempts=1)
        return policy.call(lambda: self._once(method, path, body), give_up=gave_up(f"slurmrestd {method} {path}"))

    def _version(self) -> str:
        """The pinned version, or the newest one slurmrestd offers and this module speaks (asked
        once, from the paths of ``GET /openapi/v3``)."""
        if self.api_version is None:
            doc = self._request("GET", "/openapi/v3")
            offered = sorted({m.group(1) for p in doc.get("paths") or {} for m in [re.match(r"^/slurm/(v[0-9.]+)/", p)] if m},
                             key=lambda v: [int(x) for x in re.findall(r"\d+", v)])
            spoken = [v for v in API_VERSIONS if v in offered]
            if not spoken:
                raise MissingDependency(
                    f"slurmrestd at {self._endpoint()} offers API {', '.join(offered) or '(none)'}; "
                    f"halo-sched speaks {', '.join(API_VERSIONS)}. Load one of those in slurmrestd "
                    f"(-s openapi/slurmctld with the data_parser plugins of Slurm 23.11+, or -s "
                    f"openapi/v0.0.38 on Slurm 22.05-23.11), or use the cli transport "
                    f"(HALO_SLURM_TRANSPORT=cli). {API_ENV} pins a version."
                )
            self.api_version = spoken[0]
        return self.api_version

    def _api(self) -> str:
        return f"/slurm/{self._version()}"

    @property
    def _typed(self) -> bool:
        return _minor(self._version()) >= 40

    # -- operations --------------------------------------------------------------------------

    def submit(self, request: SbatchRequest) -> str:
        version = self._version()
        job = rest_job_properties(request, self.environment, api_version=version)
        if _minor(version) >= 41:
            # v0.0.41+: the top-level "script" is deprecated (JOB_SUBMIT_REQ, parsers.c slurm-24-05-*).
            body = {"job": {**job, "script": request.script}}
        else:
            body = {"script": request.script, "job": job}
        try:
            doc = self._request("POST", f"{self._api()}/job/submit", body, retry=False)
        except SchedulerError as e:
            text = str(e).lower()
            if _minor(version) < 40 and "failure during parsing" in text and "unable to process key" not in text:
                # v0.0.38 builds the job with sbatch's own code (slurm_opt_create_job_desc), which
                # also checks the GRES request against this cluster's GresTypes and says why only
                # in slurmrestd's log.
                raise SchedulerError(
                    f"{e} (slurmrestd {version} logs the reason; a GPU/gres request this cluster's "
                    "GresTypes cannot satisfy is one, as sbatch would say: Invalid generic resource "
                    "(gres) specification)") from e
            raise
        job_id = doc.get("job_id")
        if job_id is None:
            raise SchedulerError(f"slurmrestd returned no job id: {str(doc)[:300]}")
        # v0.0.40+ ignore fields they do not know, with a warning: a job that lost an option
        # is not the job that was rendered.
        ignored = [str(w.get("description") or w) for w in doc.get("warnings") or []
                   if isinstance(w, dict) and "unknown field" in str(w.get("description", "")).lower()]
        if ignored:
            try:
                self.cancel([str(job_id)])
                outcome = "the job was cancelled"
            except SchedulerError as e:
                outcome = f"cancelling it failed ({e}): cancel job {job_id} by hand"
            raise SchedulerError(f"slurmrestd {version} ignored part of job {job_id} ({'; '.join(ignored)}); {outcome}")
        return str(job_id)

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        groups = by_cluster(ids)
        if not groups:
            return {}
        # v0.0.40+ bind "/slurm/{data_parser}/jobs/" (slurmctld/jobs.c, slurm-23-11-*).
        jobs = self._request("GET", f"{self._api()}/jobs" + ("/" if self._typed else "")).get("jobs") or []
        served = {str(j.get("cluster")) for j in jobs if j.get("cluster")}
        found: dict[str, JobState] = {}
        for cluster, local in groups.items():
            mine = [j for j in jobs if cluster is None or j.get("cluster") == cluster]
            states = st.select_states(list(local), [rest_job_state(j) for j in mine])
            for local_id, requested in local.items():
                state = states.get(local_id)
                if state is None:
                    why = "slurmctld does not know this job id (ended more than MinJobAge ago, or never existed)"
                    if cluster and served and cluster not in served:
                        why = f"this slurmrestd serves cluster {', '.join(sorted(served))}, not {cluster}: use the cli transport"
                    state = st.unknown_state(local_id, why)
                state.id = with_cluster(cluster, state.id)
                found.update(dict.fromkeys(requested, state))
        return {job_id: found[job_id] for job_id in unique(ids)}

    def _job(self, job_id: str) -> tuple[str, list[dict]]:
        """(local id, the job's records), checking that a ``CLUSTER:ID`` is on this cluster."""
        cluster, local = split_cluster(job_id)
        jobs = self._request("GET", f"{self._api()}/job/{quote(local)}").get("jobs") or []
        if not jobs:
            raise SchedulerError(f"slurmrestd knows no job {job_id}")
        if cluster and jobs[0].get("cluster") != cluster:
            raise SchedulerError(
                f"job {job_id} is on cluster {cluster}, and this slurmrestd serves "
                f"{jobs[0].get('cluster')}: use the cli transport (scancel/scontrol --clusters)"
            )
        return local, jobs

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        query = ""
        if signal:
            sig = signal.upper()
            sig = sig if sig.startswith("SIG") or sig.isdigit() else "SIG" + sig
            if self._typed:
                # The batch script alone, as `scancel --batch` (DELETE's flags, WARN_FLAGS in
                # parsers.c; without flags slurmrestd signals the FULL_JOB): it passes the
                # warning on to every rank.
                query = "?" + urlencode({"signal": sig, "flags": "BATCH_JOB"})
            else:
                # v0.0.38 signals every process of the job, the batch script's included (jobs.c:
                # slurm_kill_job2(..., KILL_FULL_JOB)): the signal itself would reach each rank
                # twice (directly, and from the entry). URG is what halo-sched's batch script and
                # node entries take as the warning, and every other process ignores it.
                query = "?" + urlencode({"signal": "SIG" + WARNING_CARRIER})
        for job_id in unique(ids):
            cluster, local = split_cluster(job_id)
            if cluster:
                # DELETE /job/ID acts on this cluster's job ID, whatever cluster was meant.
                self._job(job_id)
            try:
                doc = self._request("DELETE", f"{self._api()}/job/{quote(local)}{query}")
            except SchedulerError as e:
                # Like scancel: cancelling a job that already ended is not an error.
                if "already completing or completed" not in str(e).lower():
                    raise
                continue
            # Slurm 24.11+ answer with one status per job signalled (slurmctld/jobs.c
            # _signal_job, KILL_JOBS_RESP_JOB in parsers.c), errors included, at HTTP 200.
            for entry in doc.get("status") or []:
                err = entry.get("error") if isinstance(entry, dict) else None
                if not isinstance(err, dict) or not err.get("code"):
                    continue
                text = " ".join(str(err.get(k)) for k in ("string", "message") if err.get(k))
                if "already completing or completed" in text.lower():
                    continue
                raise SchedulerError(f"slurmrestd could not signal job {job_id}: {text or err}")

    def partitions(self, cluster: str | None = None) -> tuple[list[dict], list[dict]]:
        """Partitions and nodes (``GET .../partitions``, ``.../nodes``) as ``scontrol show``
        records, for the check before a submit (slurmrestd answers for its own cluster only)."""
        parts = self._request("GET", f"{self._api()}/partitions").get("partitions") or []
        nodes = self._request("GET", f"{self._api()}/nodes").get("nodes") or []
        records = [rest_partition_record(p) for p in parts if isinstance(p, dict)]
        if records and not any(r["Default"] == "YES" for r in records):
            # v0.0.40-44 dump no partition flags at all (``add_skip(flags)`` in PARTITION_INFO,
            # parsers.c at slurm-24-11-5-1 and slurm-26-05-3-1), so nothing in slurmrestd's
            # answers names the default partition; v0.0.45 dumps PARTITION_FLAGS again, DEFAULT
            # among them (slurm-26-05-3-1), and never gets here on a cluster with a default
            # partition (tests/fixtures/slurmrestd/26.05/v0.0.45/partitions.json). sinfo marks it
            # with ``*``; it is asked only where this host is a client of the same cluster (the
            # same partition names), never guessed.
            default = sinfo_default_partition({r["PartitionName"] for r in records})
            for r in records:
                if r["PartitionName"] == default:
                    r["Default"] = "YES"
        return records, [rest_node_record(n) for n in nodes if isinstance(n, dict)]

    def job_info(self, job_id: str) -> dict:
        _, jobs = self._job(job_id)
        info = rest_job_info(jobs[0])
        if len(jobs) > 1:
            info["_records"] = [rest_job_info(j) for j in jobs]
        return info


# ---------------------------------------------------------------------------------------------
# Answers (v0.0.38 and v0.0.40+ shapes)


def _limit_text(value) -> str:
    """A partition limit as scontrol prints it: the number, or UNLIMITED (v0.0.38 dumps an
    unlimited one as -1 or null; v0.0.40+ as ``{infinite: true}``)."""
    n = _num(value)
    return "UNLIMITED" if n is None or n < 0 else str(n)


def rest_partition_record(p: dict) -> dict:
    """A slurmrestd partition (v0.0.38 flat fields, v0.0.40+ ``maximums``/``nodes`` objects) ->
    the ``scontrol show partition`` fields halo_sched.backends.slurm.reasons reads. Times are
    minutes (read as such by parse_slurm_time)."""
    maxi = p.get("maximums") if isinstance(p.get("maximums"), dict) else {}
    nodes = p.get("nodes") if isinstance(p.get("nodes"), dict) else {}
    # v0.0.40+: MaxMemPerNode is maximums.partition_memory_per_node ({set, infinite, number}),
    # set only where the limit is per node (MEM_PER_NODE overload of max_mem_per_cpu in
    # parsers.c, slurm-24-11-5-1 v0.0.40-42, slurm-26-05-3-1 v0.0.42-45); a MaxMemPerCPU shows in
    # partition_memory_per_cpu instead, and is not a per-node limit.
    mem = maxi.get("partition_memory_per_node") if maxi else p.get("maximum_memory_per_node")
    flags = [str(f).upper() for f in (p.get("flags") or []) if isinstance(f, str)]
    inner = p.get("partition") if isinstance(p.get("partition"), dict) else {}
    flags += [str(f).upper() for f in (inner.get("state") or []) if isinstance(f, str)]
    return {
        "PartitionName": str(p.get("name") or ""),
        "Default": "YES" if "DEFAULT" in flags else "NO",
        "MaxNodes": _limit_text(maxi.get("nodes") if maxi else p.get("maximum_nodes_per_job")),
        "TotalNodes": _limit_text(nodes.get("total") if nodes else p.get("total_nodes")),
        "MaxTime": _limit_text(maxi.get("time") if maxi else p.get("max_time_limit")),
        "MaxCPUsPerNode": _limit_text(maxi.get("cpus_per_node") if maxi else p.get("maximum_cpus_per_node")),
        # 0 is no limit: 24.11.5 answers {set: true, number: 0} for a partition without
        # MaxMemPerNode (tests/fixtures/slurmrestd/24.11/*/partitions.json), where scontrol
        # prints MaxMemPerNode=UNLIMITED.
        "MaxMemPerNode": "UNLIMITED" if _num(mem) == 0 else _limit_text(mem),
    }


def sinfo_default_partition(names: set[str], timeout: float = 10.0) -> str | None:
    """The partition ``sinfo`` marks as the default (``debug*``), where this host's sinfo
    answers within ``timeout`` and lists exactly ``names`` (the partitions slurmrestd listed: the
    same cluster); None otherwise."""
    import shutil
    import subprocess

    if not names or shutil.which("sinfo") is None:
        return None
    try:
        proc = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    listed = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or {n.rstrip("*") for n in listed} != names:
        return None
    marked = [n[:-1] for n in listed if n.endswith("*")]
    return marked[0] if len(marked) == 1 else None


def rest_node_record(n: dict) -> dict:
    parts = n.get("partitions") or []
    return {"NodeName": str(n.get("name") or ""), "CPUTot": str(_num(n.get("cpus")) or 0),
            "RealMemory": str(_num(n.get("real_memory")) or 0),
            "Partitions": ",".join(parts) if isinstance(parts, list) else str(parts)}


def _num(value) -> int | None:
    """A number as slurmrestd dumps it: an int (v0.0.38), or ``{set, infinite, number}``
    (v0.0.40+ UINT32_NO_VAL and friends); None when unset or infinite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if value.get("set") and not value.get("infinite"):
            return _num(value.get("number"))
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _state_word(value) -> str:
    """``job_state``: a word (v0.0.38) or a list of base state and flags (v0.0.40+)."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value or "")


def _exit(value) -> tuple[int | None, int | None]:
    """``exit_code``: a raw wait status (v0.0.38) or PROCESS_EXIT_CODE_VERBOSE (v0.0.40+:
    ``{status: [...], return_code: {...}, signal: {id: {...}, name}}``)."""
    if not isinstance(value, dict):
        return st.decode_wait_status(value)
    status = [str(s).upper() for s in (value.get("status") or [])]
    if "PENDING" in status:
        return None, None
    sig = _num((value.get("signal") or {}).get("id")) if isinstance(value.get("signal"), dict) else None
    if "SIGNALED" in status and sig:
        return 0, sig
    return _num(value.get("return_code")), 0


def _rest_display_id(job: Mapping) -> str:
    job_id = str(_num(job.get("job_id")) if _num(job.get("job_id")) is not None else job.get("job_id"))
    array_job, task = _num(job.get("array_job_id")), _num(job.get("array_task_id"))
    if array_job and task is not None:
        return f"{array_job}_{task}"
    if array_job and job.get("array_task_string"):
        return f"{array_job}_[{job['array_task_string']}]"
    if _num(job.get("het_job_id")):
        return f"{_num(job.get('het_job_id'))}+{_num(job.get('het_job_offset')) or 0}"
    return job_id


def rest_job_state(job: Mapping) -> JobState:
    """A ``jobs[]`` entry of ``GET /jobs`` (any spoken version) -> JobState."""
    rc, sig = _exit(job.get("exit_code"))
    detail = {"job_id_raw": str(_num(job.get("job_id"))), "nodelist": job.get("nodes") or "",
             "cluster": job.get("cluster") or ""}
    if _num(job.get("restart_cnt")) is not None:
        detail["restarts"] = _num(job.get("restart_cnt"))
    if isinstance(job.get("requeue"), bool):
        detail["requeue"] = job["requeue"]
    return st.make_state(
        _rest_display_id(job),
        _state_word(job.get("job_state")),
        exit_rc=rc,
        exit_sig=sig,
        nodes=_num(job.get("node_count")),
        reason=str(job.get("state_reason") or ""),
        source="slurmrestd",
        detail=detail,
    )


def rest_job_info(job: Mapping) -> dict:
    """The scontrol-style fields job_info promises, from a job of any spoken version."""
    return {
        "JobId": str(_num(job.get("job_id"))),
        "JobName": job.get("name") or "",
        "JobState": _state_word(job.get("job_state")),
        "NodeList": job.get("nodes") or "",
        "BatchHost": job.get("batch_host") or "",
        "WorkDir": job.get("current_working_directory") or "",
        # v0.0.38 reports the paths as given (possibly with %j patterns) or empty for the default
        # slurm-%j.out; v0.0.40-42 expand them (parsers.c JOB_INFO_STDOUT); v0.0.43+ report them
        # as given and expanded in stdout_expanded/stderr_expanded.
        "StdOut": job.get("stdout_expanded") or job.get("standard_output") or "",
        "StdErr": job.get("stderr_expanded") or job.get("standard_error") or "",
        "NumNodes": str(_num(job.get("node_count")) or ""),
        "_raw": dict(job),
    }
