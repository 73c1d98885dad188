"""The only code that talks to SLURM: submit, query, cancel, job_info.

Three transports with one interface:

* ``CliTransport`` (default): sbatch/squeue/scontrol/sacct/scancel through an injectable
  ``runner(argv, input) -> CompletedProcess``. One poll costs one scheduler call for any
  number of ids (chunked only for argv length), at most 3 in the worst case.
* ``RestTransport``: slurmrestd's OpenAPI v0.0.38 (Slurm 22.05) over a unix socket or TCP, with
  JWT (``X-SLURM-USER-NAME``/``X-SLURM-USER-TOKEN``) or rest_auth/local (unix socket, no token).
* ``PyslurmTransport``: pyslurm, which must be built for the cluster's exact Slurm release.

No torch here: the CLI imports this module.
"""
from __future__ import annotations

import abc
import getpass
import http.client
import json
import os
import re
import shlex
import socket
import subprocess
from typing import Callable, Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from halo_sched.backends.base import JobState, JobStatus
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError, UsageError

Runner = Callable[[list, "str | None"], subprocess.CompletedProcess]

# Messages slurmctld clients print when the controller is busy or restarting: worth a retry for
# idempotent calls. Anything else is a real answer.
_TRANSIENT = re.compile(
    r"socket timed out|unable to contact slurm controller|resource temporarily unavailable|"
    r"connection refused|transport endpoint is not connected|slurm backup controller in standby",
    re.IGNORECASE,
)


class _Transient(Exception):
    """A call worth repeating (controller busy, timeout)."""


def default_runner(timeout: float = 60.0) -> Runner:
    def run(argv: list, input: str | None = None) -> subprocess.CompletedProcess:
        # Other users' job names in squeue/scontrol output need not be UTF-8: never fail on them.
        return subprocess.run(argv, input=input, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout, check=False)

    return run


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def _unique(ids: Iterable) -> list[str]:
    return list(dict.fromkeys(str(i).strip() for i in ids if str(i).strip()))


class Transport(abc.ABC):
    """What SlurmScheduler needs from SLURM."""

    name = ""

    @abc.abstractmethod
    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        """Submit a batch script; return the job id."""

    @abc.abstractmethod
    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """State of every id (UNKNOWN with a reason for ids SLURM does not know)."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        """Cancel jobs, or send them ``signal`` (e.g. ``"USR2"``)."""

    @abc.abstractmethod
    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` fields (StdOut, StdErr, WorkDir, NodeList, ...)."""


# ---------------------------------------------------------------------------------------------
# CLI


class CliTransport(Transport):
    """SLURM's command-line clients.

    ``accounting``: None detects once whether ``sacct`` works (and caches the answer); True/False
    forces it. ``retries``: attempts for idempotent calls when the controller is busy.
    """

    name = "cli"

    def __init__(
        self,
        runner: Runner | None = None,
        chunk_size: int = 1000,
        accounting: bool | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        retry_wait: float = 0.5,
    ):
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.runner = runner or default_runner(timeout)
        self.chunk_size = chunk_size
        self._accounting = accounting
        self.retries = max(1, retries)
        self.retry_wait = retry_wait

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, argv: list, input: str | None = None) -> subprocess.CompletedProcess:
        try:
            return self.runner(list(argv), input)
        except FileNotFoundError as e:
            raise MissingDependency(
                f"{argv[0]} not found on PATH: the SLURM client commands are needed on this host "
                "(or use the 'rest' transport)"
            ) from e
        except subprocess.TimeoutExpired as e:
            raise _Transient(f"{argv[0]} timed out after {e.timeout}s") from e
        except OSError as e:  # not executable, permission denied, ...
            raise MissingDependency(f"cannot run {argv[0]}: {e}") from e

    def _run(self, argv: list, input: str | None = None, retry: bool = True) -> subprocess.CompletedProcess:
        """One logical call. With ``retry``, transient controller errors are retried (for
        idempotent calls); without, the caller gets the failed result (a timeout as exit 124)."""
        if not retry:
            try:
                return self._call(argv, input)
            except _Transient as e:
                return subprocess.CompletedProcess(argv, 124, "", str(e))

        def attempt() -> subprocess.CompletedProcess:
            proc = self._call(argv, input)
            if proc.returncode != 0 and _TRANSIENT.search(proc.stderr or ""):
                raise _Transient((proc.stderr or "").strip())
            return proc

        try:
            for att in Retrying(
                stop=stop_after_attempt(self.retries),
                wait=wait_exponential(multiplier=self.retry_wait, max=10),
                retry=retry_if_exception_type(_Transient),
                reraise=True,
            ):
                with att:
                    return attempt()
        except _Transient as e:
            raise SchedulerError(f"{argv[0]} failed {self.retries} times: {e}") from e
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _fail(what: str, proc: subprocess.CompletedProcess) -> SchedulerError:
        msg = (proc.stderr or "").strip() or (proc.stdout or "").strip() or "(no output)"
        return SchedulerError(f"{what} failed (exit {proc.returncode}): {msg}")

    # -- submit / cancel ---------------------------------------------------------------------

    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        # Never retried: a timed-out sbatch may have queued the job, and a second one would
        # run the training twice.
        proc = self._run(["sbatch", "--parsable", *extra_args], input=script, retry=False)
        if proc.returncode == 124:
            raise SchedulerError(f"{proc.stderr}: the job may have been queued anyway; check squeue before resubmitting")
        if proc.returncode != 0:
            raise self._fail("sbatch", proc)
        lines = [ln.strip() for ln in (proc.stdout or "").splitlines() if ln.strip()]
        job_id = lines[-1].split(";", 1)[0] if lines else ""
        if not re.fullmatch(r"\d+", job_id):
            raise SchedulerError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
        return job_id

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        ids = _unique(ids)
        if not ids:
            return
        opts = [f"--signal={signal}"] if signal else []
        for chunk in _chunks(ids, self.chunk_size):
            proc = self._run(["scancel", *opts, *chunk])
            if proc.returncode != 0:
                raise self._fail("scancel", proc)

    # -- query -------------------------------------------------------------------------------

    @property
    def accounting(self) -> bool | None:
        """Whether sacct works here (None until the first query found out)."""
        return self._accounting

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """sacct (when there is accounting), else/then squeue, then scontrol for what a filtered
        squeue missed: 1 call per poll normally, never more than 3 (chunks aside)."""
        ids = _unique(ids)
        if not ids:
            return {}
        found: dict[str, JobState] = {}
        list_all = False
        sacct_note = ""
        if self._accounting is not False:
            probing = self._accounting is None
            states, sacct_note = self._sacct(ids)
            if states is not None:
                found.update(st.select_states(ids, states))
            elif probing and self._accounting is False:
                # This poll already spent a call finding out there is no accounting: list every
                # job at once, so an unknown id cannot cost a third call.
                list_all = True
        missing = [i for i in ids if i not in found]

        complete_listing = False
        if missing:
            states, complete_listing = self._squeue(missing, list_all)
            found.update(st.select_states(missing, states))
            missing = [i for i in ids if i not in found]

        # squeue --states=all shows what slurmctld holds; scontrol is the last word on jobs that
        # a filtered squeue did not report. After a full listing it cannot know more.
        if missing and not complete_listing and not self._accounting:
            found.update(st.select_states(missing, self._scontrol_all()))
            missing = [i for i in ids if i not in found]

        if self._accounting:
            why = "neither sacct nor slurmctld knows this job id"
        elif sacct_note:
            why = f"slurmctld does not know this job id, and sacct failed: {sacct_note}"
        else:
            why = (
                "slurmctld does not know this job id (it ended more than MinJobAge ago, or never "
                "existed) and this cluster has no accounting (sacct) to ask"
            )
        for job_id in missing:
            found[job_id] = st.unknown_state(job_id, why)
        return {i: found[i] for i in ids}

    def _sacct(self, ids: list[str]) -> tuple[list[JobState] | None, str]:
        """sacct's states, or (None, why) when sacct cannot answer (then squeue must)."""
        states: list[JobState] = []
        for chunk in _chunks(ids, self.chunk_size):
            # Not retried: squeue is the retry.
            proc = self._run(st.sacct_argv(chunk), retry=False)
            if proc.returncode != 0:
                if st.sacct_disabled(proc.stderr, proc.stdout):
                    self._accounting = False
                    return None, ""
                # slurmdbd down or slow: this poll goes to slurmctld; ask sacct again next time.
                return None, (proc.stderr or "").strip()[:200]
            self._accounting = True
            states += st.parse_sacct(proc.stdout)
        return states, ""

    def _squeue(self, ids: list[str], list_all: bool) -> tuple[list[JobState], bool]:
        """(states, whether this was a listing of every job)."""
        # squeue filters a multi-id --jobs list on the client after loading every job anyway, so
        # more ids than fit one argv are better served by one unfiltered listing than by chunks.
        if not list_all and len(ids) <= self.chunk_size:
            proc = self._run(st.squeue_argv(ids))
            if proc.returncode == 0:
                return st.parse_squeue(proc.stdout), False
            if not st.squeue_invalid_id(proc.stderr):
                raise self._fail("squeue", proc)
            # A single unknown id (any unknown id, in some versions) fails the whole call.
        proc = self._run(st.squeue_argv(None))
        if proc.returncode != 0:
            raise self._fail("squeue", proc)
        return st.parse_squeue(proc.stdout), True

    def _scontrol_all(self) -> list[JobState]:
        proc = self._run(st.scontrol_argv())
        if proc.returncode != 0:
            raise self._fail("scontrol show job", proc)
        return st.parse_scontrol_states(proc.stdout)

    # -- info --------------------------------------------------------------------------------

    def job_info(self, job_id: str) -> dict[str, str]:
        """Fields of ``scontrol show job ID`` (for a het/array job: the record shown as
        ``job_id``, else the first one; ``_records`` holds all)."""
        proc = self._run(st.scontrol_argv(str(job_id)))
        if proc.returncode != 0:
            if st.squeue_invalid_id(proc.stderr):
                raise SchedulerError(
                    f"job {job_id} is not known to slurmctld (finished more than MinJobAge ago?)"
                )
            raise self._fail("scontrol show job", proc)
        records = st.parse_scontrol_jobs(proc.stdout)
        if not records:
            raise SchedulerError(f"scontrol show job {job_id} printed no job")
        pick = next((r for r in records if st.scontrol_display_id(r) == str(job_id)), None)
        pick = pick or next((r for r in records if r.get("JobId") == str(job_id)), records[0])
        return {**pick, "_records": records} if len(records) > 1 else dict(pick)

    def version(self) -> str:
        """The cluster's Slurm release as the client reports it, e.g. ``22.05.8``."""
        proc = self._run(["scontrol", "--version"])
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", proc.stdout or "")
        if proc.returncode != 0 or not m:
            raise self._fail("scontrol --version", proc)
        return m.group(1)


# ---------------------------------------------------------------------------------------------
# slurmrestd


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


# sbatch option -> slurmrestd v0.0.38 job property. slurmrestd ignores #SBATCH lines in the
# script and rejects unknown keys, so every option a script uses must be translated here; the
# values are passed as text and parsed by Slurm's own option parsers ("1:00:00", "16G").
_REST_OPTIONS = {
    "job-name": "name",
    "J": "name",
    "nodes": "nodes",
    "N": "nodes",
    "ntasks": "tasks",
    "n": "tasks",
    "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task",
    "c": "cpus_per_task",
    "time": "time_limit",
    "t": "time_limit",
    "partition": "partition",
    "p": "partition",
    "output": "standard_output",
    "o": "standard_output",
    "error": "standard_error",
    "e": "standard_error",
    "input": "standard_input",
    "i": "standard_input",
    "chdir": "current_working_directory",
    "D": "current_working_directory",
    "account": "account",
    "A": "account",
    "qos": "qos",
    "q": "qos",
    "mem": "memory_per_node",
    "mem-per-cpu": "memory_per_cpu",
    "exclusive": "exclusive",
    "signal": "signal",
    "constraint": "constraints",
    "C": "constraints",
    "array": "array",
    "a": "array",
    "dependency": "dependency",
    "d": "dependency",
    "reservation": "reservation",
    "comment": "comment",
    "nice": "nice",
    "gpus": "gpus",
    "G": "gpus",
    "gpus-per-node": "gpus_per_node",
    "gpus-per-task": "gpus_per_task",
    "gres": "gres",
    "wait-all-nodes": "wait_all_nodes",
    "kill-on-invalid-dep": "kill_on_invalid_dependency",
}
# Options without a value. --no-requeue is missing on purpose: slurmrestd 22.05 accepts
# "requeue": false (or "no", 0) and ignores it (the job still shows Requeue=1), and a fixed-size
# torchrun job silently requeued is the failure the option exists to prevent.
_REST_FLAGS = {"exclusive": ("exclusive", "exclusive"), "requeue": ("requeue", "yes"), "hold": ("hold", True), "H": ("hold", True)}
_REST_REFUSED = {"no-requeue": "slurmrestd 22.05 accepts requeue=false and ignores it"}
# Short options that take a value (so "-N 2" and "-N2" both parse).
_SHORT_WITH_VALUE = set("JNntpoeiDAqCadGc")


def sbatch_options(script: str, extra_args: Sequence[str] = ()) -> list[tuple[str, str | None]]:
    """``#SBATCH`` lines (until the first command, as sbatch reads them) then ``extra_args``
    -> [(option name without dashes, value or None)]; later ones win when applied in order."""
    args: list[str] = []
    for line in script.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            break  # sbatch stops reading directives at the first command
        if s.startswith("#SBATCH") and (len(s) == 7 or s[7].isspace()):
            args += shlex.split(s[7:], comments=True)
    args += list(extra_args)
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        a = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        takes_next = nxt is not None and not nxt.startswith("-")
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if eq:
                out.append((name, value))
            elif name not in _REST_FLAGS and takes_next:
                # "--time 10"; an unknown option's value is consumed too, so that the error
                # names the option, not its value.
                out.append((name, nxt))
                i += 1
            else:
                out.append((name, None))
        elif a.startswith("-") and len(a) >= 2:
            name, rest = a[1], a[2:]
            if rest:
                out.append((name, rest.lstrip("=")))
            elif name in _SHORT_WITH_VALUE and takes_next:
                out.append((name, nxt))
                i += 1
            else:
                out.append((name, None))
        else:
            raise SchedulerError(f"cannot read sbatch argument {a!r}")
        i += 1
    return out


def rest_job_properties(
    script: str, extra_args: Sequence[str] = (), environment: Mapping[str, str] | None = None, cwd: str | None = None
) -> dict:
    """The v0.0.38 ``job`` object for a script, or SchedulerError naming the options that
    slurmrestd cannot take (so nothing is silently dropped)."""
    env = dict(os.environ if environment is None else environment)
    job: dict = {"current_working_directory": cwd or os.getcwd()}
    unsupported = []
    for name, value in sbatch_options(script, extra_args):
        if name == "export":
            # sbatch's --export: ALL (default), NONE, or NONE/ALL plus VAR[=value] items.
            items = [x for x in (value or "ALL").split(",") if x]
            keep_all = "ALL" in items
            picked = dict(env) if keep_all else {}
            for item in items:
                if item in ("ALL", "NONE"):
                    continue
                k, eq, v = item.partition("=")
                if eq:
                    picked[k] = v
                elif k in env:
                    picked[k] = env[k]
            env = picked
        elif value is None and name in _REST_FLAGS:
            key, flag_value = _REST_FLAGS[name]
            job[key] = flag_value
        elif value is not None and name in _REST_OPTIONS:
            job[_REST_OPTIONS[name]] = value
        else:
            flag = "--" + name if len(name) > 1 else "-" + name
            unsupported.append(f"{flag} ({_REST_REFUSED[name]})" if name in _REST_REFUSED else flag)
    if unsupported:
        raise SchedulerError(
            "slurmrestd (v0.0.38) cannot take "
            + ", ".join(unsupported)
            + "; submit with the 'cli' transport (sbatch) instead"
        )
    # slurmrestd requires an environment; sbatch's default is to pass the caller's (--export=ALL).
    job["environment"] = env or {"PATH": "/usr/bin:/bin"}
    return job


class RestTransport(Transport):
    """slurmrestd, OpenAPI v0.0.38 (Slurm 22.05).

    Endpoint: ``socket_path`` (unix socket) or ``url`` (e.g. ``http://127.0.0.1:6917``, the local test cluster); defaults
    from ``HALO_SLURMRESTD_SOCKET`` / ``HALO_SLURMRESTD_URL``. Auth: with ``token`` (default:
    ``$SLURM_JWT``, as ``scontrol token`` prints it) requests act as ``user`` (default: the
    current user); without one, rest_auth/local on a unix socket, where slurmrestd accepts
    only root or its own uid and acts as its own uid.

    Costs: ``query`` is one ``GET /jobs`` for any number of ids; ``cancel`` is one DELETE per id
    (the API has no bulk cancel). There is no accounting here (slurmdbd's API is separate):
    jobs slurmctld has forgotten are UNKNOWN.
    """

    name = "rest"

    def __init__(
        self,
        url: str | None = None,
        socket_path: str | None = None,
        token: str | None = None,
        user: str | None = None,
        api_version: str = "v0.0.38",
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
        self.api = f"/slurm/{api_version}"
        self.timeout = timeout
        self.retries = max(1, retries)
        self.environment = environment

    # -- HTTP --------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixHTTPConnection(self.socket_path, self.timeout)
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.timeout)

    def _prefix(self) -> str:
        return "" if self.socket_path else urlsplit(self.url).path.rstrip("/")

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
            raise _Transient(f"slurmrestd {method} {path}: {e}") from e
        finally:
            conn.close()
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = None
        if doc is None or not isinstance(doc, dict):
            raise SchedulerError(f"slurmrestd {method} {path}: HTTP {resp.status}: {raw[:300]!r}")
        errors = [e for e in doc.get("errors") or [] if isinstance(e, dict)]
        # Some answers carry an informational "error" with a job id (e.g. a held job).
        fatal = [e for e in errors if not (path.endswith("/job/submit") and doc.get("job_id"))]
        if resp.status >= 400 or fatal:
            text = "; ".join(
                " ".join(str(e.get(k)) for k in ("error", "description") if e.get(k)) or json.dumps(e) for e in errors
            )
            raise SchedulerError(f"slurmrestd {method} {path}: HTTP {resp.status}: {text or raw[:300]!r}")
        return doc

    def _request(self, method: str, path: str, body: dict | None = None, retry: bool = True) -> dict:
        attempts = self.retries if retry else 1
        try:
            for att in Retrying(
                stop=stop_after_attempt(attempts),
                wait=wait_exponential(multiplier=0.5, max=5),
                retry=retry_if_exception_type(_Transient),
                reraise=True,
            ):
                with att:
                    return self._once(method, path, body)
        except _Transient as e:
            raise SchedulerError(str(e)) from e
        raise AssertionError("unreachable")  # pragma: no cover

    # -- operations --------------------------------------------------------------------------

    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        job = rest_job_properties(script, extra_args, self.environment)
        doc = self._request("POST", f"{self.api}/job/submit", {"script": script, "job": job}, retry=False)
        job_id = doc.get("job_id")
        if job_id is None:
            raise SchedulerError(f"slurmrestd returned no job id: {doc}")
        return str(job_id)

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        ids = _unique(ids)
        if not ids:
            return {}
        doc = self._request("GET", f"{self.api}/jobs")
        found = st.select_states(ids, [rest_job_state(j) for j in doc.get("jobs") or []])
        why = "slurmctld does not know this job id (ended more than MinJobAge ago, or never existed)"
        return {i: found.get(i) or st.unknown_state(i, why) for i in ids}

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        for job_id in _unique(ids):
            query = ""
            if signal:
                sig = signal.upper()
                query = "?" + urlencode({"signal": sig if sig.startswith("SIG") else "SIG" + sig})
            try:
                self._request("DELETE", f"{self.api}/job/{quote(job_id)}{query}")
            except SchedulerError as e:
                # Like scancel: cancelling a job that already ended is not an error.
                if "already completing or completed" not in str(e).lower():
                    raise

    def job_info(self, job_id: str) -> dict:
        doc = self._request("GET", f"{self.api}/job/{quote(str(job_id))}")
        jobs = doc.get("jobs") or []
        if not jobs:
            raise SchedulerError(f"slurmrestd knows no job {job_id}")
        info = rest_job_info(jobs[0])
        if len(jobs) > 1:
            info["_records"] = [rest_job_info(j) for j in jobs]
        return info


def _rest_display_id(job: Mapping) -> str:
    job_id = str(job.get("job_id"))
    task = job.get("array_task_id")
    if job.get("array_job_id") and task is not None:
        return f"{job['array_job_id']}_{task}"
    if job.get("array_job_id") and job.get("array_task_string"):
        return f"{job['array_job_id']}_[{job['array_task_string']}]"
    if job.get("het_job_id"):
        return f"{job['het_job_id']}+{job.get('het_job_offset', 0)}"
    return job_id


def rest_job_state(job: Mapping) -> JobState:
    """A v0.0.38 ``jobs[]`` entry -> JobState. exit_code there is a raw wait status."""
    rc, sig = st.decode_wait_status(job.get("exit_code"))
    return st.make_state(
        _rest_display_id(job),
        str(job.get("job_state") or ""),
        exit_rc=rc,
        exit_sig=sig,
        nodes=job.get("node_count"),
        reason=str(job.get("state_reason") or ""),
        source="slurmrestd",
        extra={"job_id_raw": str(job.get("job_id")), "nodelist": job.get("nodes") or ""},
    )


def rest_job_info(job: Mapping) -> dict:
    """The scontrol-style fields job_info promises, from a v0.0.38 job."""
    return {
        "JobId": str(job.get("job_id")),
        "JobName": job.get("name") or "",
        "JobState": job.get("job_state") or "",
        "NodeList": job.get("nodes") or "",
        "BatchHost": job.get("batch_host") or "",
        "WorkDir": job.get("current_working_directory") or "",
        # v0.0.38 reports the paths as given (possibly with %j patterns) or empty for the
        # default slurm-%j.out; scontrol expands them.
        "StdOut": job.get("standard_output") or "",
        "StdErr": job.get("standard_error") or "",
        "NumNodes": str(job.get("node_count") or ""),
        "_raw": dict(job),
    }


# ---------------------------------------------------------------------------------------------
# pyslurm


class PyslurmTransport(Transport):
    """pyslurm's API. NOT exercised here: pyslurm must be built against the cluster's exact Slurm
    release (PyPI has 25.11 only, Debian 12 ships 22.05), so this is written against pyslurm's
    documented 23.x+ API (``pyslurm.Jobs``/``pyslurm.Job``/``pyslurm.JobSubmitDescription``)
    and refuses to run on a version mismatch."""

    name = "pyslurm"

    def __init__(self, cluster_version: str | None = None, runner: Runner | None = None):
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

    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        if extra_args:
            raise SchedulerError("the pyslurm transport takes options only as #SBATCH lines in the script")
        # sbatch's default --export=ALL; then the #SBATCH lines, as sbatch reads them.
        desc = self.pyslurm.JobSubmitDescription(script=script, environment=dict(os.environ))
        desc.load_sbatch_options()
        return str(desc.submit())

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        ids = _unique(ids)
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
            extra={"job_id_raw": job_id, "nodelist": job.allocated_nodes or ""},
        )

    def cancel(self, ids: Sequence[str], signal: str | None = None) -> None:
        for job_id in _unique(ids):
            job = self.pyslurm.Job(_raw_int_id(job_id))
            if signal:
                sig = signal.upper()
                job.send_signal(sig if sig.startswith("SIG") else "SIG" + sig)
            else:
                job.cancel()

    def job_info(self, job_id: str) -> dict:
        job = self.pyslurm.Job.load(_raw_int_id(job_id))
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


# ---------------------------------------------------------------------------------------------


def get_transport(name: str = "cli", **kw) -> Transport:
    """``cli`` (default), ``rest`` or ``pyslurm``; keyword arguments go to the class."""
    factories = {"cli": CliTransport, "rest": RestTransport, "pyslurm": PyslurmTransport}
    try:
        cls = factories[name]
    except KeyError:
        raise UsageError(f"unknown SLURM transport {name!r} (HALO_SLURM_TRANSPORT): choose one of {', '.join(factories)}") from None
    return cls(**kw)


__all__ = [
    "Transport",
    "CliTransport",
    "RestTransport",
    "PyslurmTransport",
    "get_transport",
    "default_runner",
    "sbatch_options",
    "rest_job_properties",
    "rest_job_state",
    "JobStatus",
]
