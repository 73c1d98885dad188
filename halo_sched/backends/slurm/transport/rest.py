"""The slurmrestd transport: Slurm's REST API over a unix socket or TCP.

It speaks the API versions in ``API_VERSIONS`` only (v0.0.38, Slurm 22.05): each version renames
and reshapes fields, and the parsers below read v0.0.38's. By default the first request asks
slurmrestd which versions it offers (``GET /openapi/v3``) and takes the newest one spoken here;
``HALO_SLURMRESTD_API`` (or ``api_version=``) pins one. A slurmrestd that offers none of them,
or a pinned version not spoken here, is refused with an error that names both.

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
from typing import Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from halo_sched.backends.base import JobState
from halo_sched.backends.slurm import status as st
from halo_sched.errors import MissingDependency, SchedulerError, UsageError

from .base import WARNING_CARRIER, Transient, Transport, by_cluster, retrying, sbatch_options, split_cluster, unique, with_cluster

# The slurmrestd OpenAPI versions this module's requests and parsers are written for, newest first.
# Verified against a real slurmrestd 22.05.8 (tests/test_slurm_transport_cluster.py).
API_VERSIONS = ("v0.0.38",)
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
# Options without a value (also in base.NO_VALUE). --no-requeue is missing on purpose:
# slurmrestd 22.05 accepts "requeue": false (or "no", 0) and ignores it (the job still shows
# Requeue=1), and a fixed-size torchrun job silently requeued is the failure the option exists
# to prevent.
_REST_FLAGS = {"exclusive": ("exclusive", "exclusive"), "requeue": ("requeue", "yes"), "hold": ("hold", True), "H": ("hold", True)}
_OWN_CLUSTER = "a slurmrestd submits to its own cluster only"
_REST_REFUSED = {
    "no-requeue": "slurmrestd 22.05 accepts requeue=false and ignores it",
    "clusters": _OWN_CLUSTER,
    "cluster": _OWN_CLUSTER,
    "M": _OWN_CLUSTER,
}


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
    """slurmrestd, at one of ``API_VERSIONS``.

    Endpoint: ``socket_path`` (unix socket) or ``url`` (e.g. ``http://127.0.0.1:6917``, the local
    test cluster); defaults from ``HALO_SLURMRESTD_SOCKET`` / ``HALO_SLURMRESTD_URL``. Auth: with
    ``token`` (default: ``$SLURM_JWT``, as ``scontrol token`` prints it) requests act as ``user``
    (default: the current user); without one, rest_auth/local on a unix socket, where slurmrestd
    accepts only root or its own uid and acts as its own uid. ``api_version``: default
    ``$HALO_SLURMRESTD_API``, else ``auto`` (the newest version both sides speak).

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
                f"{', '.join(API_VERSIONS)} (Slurm 22.05); set {API_ENV}=auto or one of those"
            )
        self.api_version: str | None = None if wanted == "auto" else wanted
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
                    f"({API_ENV}); halo-sched speaks {', '.join(API_VERSIONS)}: run slurmrestd with "
                    f"-s openapi/{self.api_version}, or use the cli transport"
                )
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
        return retrying(lambda: self._once(method, path, body), self.retries if retry else 1, 0.5,
                        f"slurmrestd {method} {path}")

    def _api(self) -> str:
        """``/slurm/vX``: the pinned version, or the newest one slurmrestd offers and this module
        speaks (asked once)."""
        if self.api_version is None:
            doc = self._request("GET", "/openapi/v3")
            offered = sorted({m.group(1) for p in doc.get("paths") or {} for m in [re.match(r"^/slurm/(v[0-9.]+)/", p)] if m})
            spoken = [v for v in API_VERSIONS if v in offered]
            if not spoken:
                raise MissingDependency(
                    f"slurmrestd at {self._endpoint()} offers API {', '.join(offered) or '(none)'}; "
                    f"halo-sched speaks only {', '.join(API_VERSIONS)} (Slurm 22.05). Run slurmrestd with "
                    f"-s openapi/{API_VERSIONS[0]} if its Slurm still has that plugin, or use the cli "
                    f"transport (HALO_SLURM_TRANSPORT=cli). {API_ENV} pins a version."
                )
            self.api_version = spoken[0]
        return f"/slurm/{self.api_version}"

    # -- operations --------------------------------------------------------------------------

    def submit(self, script: str, extra_args: Sequence[str] = ()) -> str:
        job = rest_job_properties(script, extra_args, self.environment)
        doc = self._request("POST", f"{self._api()}/job/submit", {"script": script, "job": job}, retry=False)
        job_id = doc.get("job_id")
        if job_id is None:
            raise SchedulerError(f"slurmrestd returned no job id: {doc}")
        return str(job_id)

    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        groups = by_cluster(ids)
        if not groups:
            return {}
        jobs = self._request("GET", f"{self._api()}/jobs").get("jobs") or []
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
            # The warning. slurmrestd signals every process of the job, the batch script's
            # included (v0.0.38 jobs.c: slurm_kill_job2(..., KILL_FULL_JOB)): the signal itself
            # would reach each rank twice (directly, and from the entry). URG is what halo-sched's
            # batch script and node entries take as the warning, and every other process ignores it.
            query = "?" + urlencode({"signal": "SIG" + WARNING_CARRIER})
        for job_id in unique(ids):
            cluster, local = split_cluster(job_id)
            if cluster:
                # DELETE /job/ID acts on this cluster's job ID, whatever cluster was meant.
                self._job(job_id)
            try:
                self._request("DELETE", f"{self._api()}/job/{quote(local)}{query}")
            except SchedulerError as e:
                # Like scancel: cancelling a job that already ended is not an error.
                if "already completing or completed" not in str(e).lower():
                    raise

    def job_info(self, job_id: str) -> dict:
        _, jobs = self._job(job_id)
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
        extra={"job_id_raw": str(job.get("job_id")), "nodelist": job.get("nodes") or "", "cluster": job.get("cluster") or ""},
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


