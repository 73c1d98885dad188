"""The Nomad calls halo-sched makes, each one request through :mod:`.transport` (which holds the
connection settings, the retries and the error mapping).

Reads and lists are retried under the one retry policy; submit, stop and the secrets' Variable
ride out outages exactly once (:mod:`halo_sched.exactly_once`). The HTTP API is spoken directly,
with ``requests``: see docs/nomad.md for why not python-nomad.

This module never imports torch.
"""
from __future__ import annotations

import codecs
import json
import time
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import quote

import requests

from halo_sched.errors import OutcomeUnknown, SchedulerError, UsageError
from halo_sched.exactly_once import run_once
from halo_sched.retry import Ambiguous
from halo_sched.node.nomad_names import NOMAD_TOKEN_META
from halo_sched.node_runtime import SERVER_ITEM

from .transport import ENFORCE_INDEX_ERR, HTTPStatusError, NomadAPIError, NomadConfig, NomadHTTP

#: Job.Meta key holding the submission token (halo_sched.exactly_once).
TOKEN_META = NOMAD_TOKEN_META

_FILTER_CHARS = 4000  # per request: URLs stay well under what proxies accept (~8 kB)


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for i in ids:
        if chunk and size + len(i) + 16 > _FILTER_CHARS:
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += len(i) + 16
    if chunk:
        yield chunk


class NomadClient:
    """The Nomad calls halo-sched needs, each retried (or made exactly once) and mapped to
    :class:`NomadAPIError`.

    ``session`` may be a prepared :class:`requests.Session` (tests, proxies); its ``verify`` and
    ``cert`` are set from ``config`` either way.
    """

    def __init__(
        self,
        config: NomadConfig | None = None,
        session: requests.Session | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._http = NomadHTTP(config or NomadConfig.from_env(), session, sleep=sleep)
        self.config = self._http.config
        self.session = self._http.session
        self._sleep = sleep

    # ----------------------------------------------------------------------------- plumbing

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._http.call(what, fn, *args, **kwargs)

    def _call_once(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._http.call_once(what, fn, *args, **kwargs)

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        """One request through the transport; the answer's JSON."""
        return self._http.json(method, path, **kw)

    def _read_job(self, job_id: str) -> dict:
        """``GET /v1/job/:id`` (for :meth:`_call_once`): the whole job; a 404 when Nomad does not know it."""
        return self._request("GET", _job_path(job_id))

    def _with_scope(self, payload: dict) -> dict:
        """Check ``{"Job": ...}`` and fill Namespace/Region from the config, without mutating it.

        A job that names a namespace or region different from the configured one is an error:
        Nomad would silently pick the job's, and every later status call (which uses the config's)
        would then not find the job. ``Namespace: "default"`` counts as unset, as Nomad itself lets
        the request's namespace override it.
        """
        if not isinstance(payload, dict) or not isinstance(payload.get("Job"), dict):
            raise UsageError('a Nomad job payload must be {"Job": {...}} (the JSON API form)')
        job = payload["Job"]
        if not job.get("ID"):
            raise UsageError("the Nomad job payload has no Job.ID")
        out = dict(payload)
        out["Job"] = job = dict(job)
        for key, configured in (("Namespace", self.config.namespace), ("Region", self.config.region)):
            given = job.get(key)
            if key == "Namespace" and given == "default" and configured:
                given = None
            if given and configured and given != configured:
                raise UsageError(
                    f"the job says {key}={given!r} but the client is configured for {configured!r} "
                    f"(NOMAD_{key.upper()}); make them agree"
                )
            if not given and configured:
                job[key] = configured
        return out

    # ----------------------------------------------------------------------------- API

    def submit_job(self, payload: dict, token: str, retry_s: float | None = None,
                   on_retry: Callable[[str], None] | None = None) -> dict:
        """Create a NEW job, exactly once, riding out outages for ``retry_s`` seconds
        (:mod:`halo_sched.exactly_once`; ``HALO_SUBMIT_RETRY_S``, default 120).

        ``token`` is in ``Job.Meta[halo_sched_token]``. The register is create-only:
        ``EnforceIndex`` with ``JobModifyIndex`` 0 makes Nomad refuse it when the job already exists
        (nomad/structs/job.go ``Job.EnforceIndex``: "Enforcing job modify index 0: job already
        exists", an HTTP 500 since it is not a coded error, command/agent/http.go ``wrap``). After
        any failure that may have reached the server (a 5xx, a dropped connection, a read timeout)
        the job is read back: the job with our token means the earlier attempt took effect.
        A 4xx fails at once with Nomad's words.
        """
        return self._register_once(payload, token, 0, retry_s, on_retry)

    def read_job(self, job_id: str) -> dict:
        """The whole job (``GET /v1/job/:id``): Version, JobModifyIndex, Meta."""
        return self._call(f"read job {job_id!r}", self._read_job, job_id)

    def job_versions(self, job_id: str) -> list[dict]:
        """The versions Nomad keeps of a job, newest first (``GET /v1/job/:id/versions``:
        command/agent/job_endpoint.go ``jobVersions`` -> nomad/job_endpoint.go ``GetJobVersions``,
        state_store.go ``jobVersionByID`` sorts them highest first; v2.0.5). A stop is a version of
        its own. Nomad keeps a bounded number of them (``JobTrackedVersions``, 6 by default)."""
        data = self._call(f"read the versions of job {job_id!r}", self._request, "GET", _job_path(job_id) + "/versions")
        versions = data.get("Versions") if isinstance(data, dict) else None
        return [v for v in versions or [] if isinstance(v, dict)]

    def reregister_job(self, payload: dict, token: str, job_modify_index: int, retry_s: float | None = None,
                       on_retry: Callable[[str], None] | None = None) -> dict:
        """Register a NEW VERSION of an existing job, exactly once: check-and-set on the job's
        ``JobModifyIndex`` as read before (``EnforceIndex``; nomad/state/state_store.go
        ``upsertJobImpl`` v2.0.5 checks it inside the write, nomad/structs/job.go ``Job.EnforceIndex``:
        "Enforcing job modify index N: job exists with conflicting job modify index: M" when the
        job was registered again since). ``token`` is in ``Job.Meta[halo_sched_token]``: after a
        failure that may have reached Nomad, or a conflict, the job is read back; our token in it
        means our register took effect (the job's new version); another's means another process
        registered a version since, and this one registers nothing (a SchedulerError)."""
        if not isinstance(job_modify_index, int) or job_modify_index <= 0:
            raise UsageError("a new version is registered against the job's JobModifyIndex (> 0)")
        return self._register_once(payload, token, job_modify_index, retry_s, on_retry)

    def _register_once(self, payload: dict, token: str, index: int, retry_s: float | None,
                       on_retry: Callable[[str], None] | None) -> dict:
        """One register, exactly once (submit_job: ``index`` 0, create only; reregister_job: the
        job's JobModifyIndex as read before, a new version). After a failure that may have reached
        Nomad, or Nomad's EnforceIndex refusal, the job is read back and its token decides."""
        body = self._with_scope(payload)
        job_id = body["Job"]["ID"]
        if (body["Job"].get("Meta") or {}).get(TOKEN_META) != token:
            raise UsageError(f"the job payload must carry its submission token in Meta.{TOKEN_META}")
        body = {**body, "EnforceIndex": True, "JobModifyIndex": index}
        what = f"register job {job_id!r}" if index == 0 else f"register a new version of job {job_id!r}"
        path = "/v1/jobs" if index == 0 else _job_path(job_id)

        def send() -> dict:
            try:
                return self._call_once(what, self._request, "POST", path, json=body)
            except NomadAPIError as exc:
                if exc.status == 500 and ENFORCE_INDEX_ERR in exc.body:
                    # Ours, sent before and answered too late, or another's: the read-back tells.
                    raise Ambiguous(f"Nomad refused the register ({exc.body.strip()})") from exc
                raise

        def lookup() -> dict | None:
            try:
                job = self._call_once(f"read job {job_id!r}", self._read_job, job_id)
            except NomadAPIError as exc:
                if exc.status != 404:
                    raise
                if index == 0:
                    return None  # not there: send it
                raise SchedulerError(f"Nomad no longer has job {job_id!r}; no new version was registered") from exc
            if (job.get("Meta") or {}).get(TOKEN_META) == token:
                return {"EvalID": job.get("EvalID", ""), "JobModifyIndex": job.get("JobModifyIndex"),
                        "Version": job.get("Version"), "Warnings": "", "found_after_retry": True}
            if index == 0:
                raise SchedulerError(f"Nomad already has a job {job_id!r} that this submission did not create; "
                                     "nothing was submitted (submit again for a fresh id)")
            if job.get("JobModifyIndex") != index:
                raise SchedulerError(f"job {job_id!r} was registered again by another process since it was read "
                                     f"(JobModifyIndex {index} -> {job.get('JobModifyIndex')}, version "
                                     f"{job.get('Version')}); this one registered nothing")
            return None

        return run_once(what, send, lookup, retry_s, token=token, sleep=self._sleep, on_retry=on_retry, who="Nomad",
                        not_done="the job was not submitted" if index == 0 else "no new version was registered")

    def put_variable(self, path: str, items: dict[str, str], retry_s: float | None = None,
                     on_retry: Callable[[str], None] | None = None) -> None:
        """Write a Nomad Variable (``PUT /v1/var/:path``, nomad/variables_endpoint.go ``Apply``,
        command/agent/variable_endpoint.go), riding out outages; writing the same items twice is
        harmless. Errors name the path and the item names, never a value: on 403, the ``nomad var
        put`` command and the policy that would allow it."""
        cfg = self.config
        body = {"Path": path, "Items": dict(items), **({"Namespace": cfg.namespace} if cfg.namespace else {})}
        what = f"write Nomad Variable {path!r}"

        def put() -> None:
            self._http.send("PUT", f"/v1/var/{quote(path, safe='/')}", json=body)

        try:
            run_once(what, lambda: self._call_once(what, put), lambda: None, retry_s, sleep=self._sleep,
                     on_retry=on_retry, who="Nomad", not_done="the job was not submitted")
        except OutcomeUnknown as exc:
            # Whether the Variable was written is unknown; the job certainly was not submitted.
            raise NomadAPIError(f"{exc}; the job was not submitted", address=cfg.address) from exc
        except NomadAPIError as exc:
            if exc.status != 403:
                raise
            ns = f" -namespace={cfg.namespace}" if cfg.namespace else ""
            names = " ".join(f'{k}="${k}"' for k in items)
            what_goes = "secrets (secret_env)" + (" and its servers' shell" if SERVER_ITEM in items else "")
            raise NomadAPIError(
                f"Nomad at {cfg.address} refused to {what}: HTTP 403 ({exc.body.strip()[:200]}). The job's {what_goes} "
                f"go there and nothing was submitted. Use a NOMAD_TOKEN whose policy has "
                f'variables {{ path "nomad/jobs/*" {{ capabilities = ["write"] }} }}{" in that namespace" if ns else ""}, '
                f"or have someone allowed to run: nomad var put{ns} {path} {names}",
                status=403, body=exc.body, address=cfg.address) from exc

    def get_variable(self, path: str) -> dict[str, str] | None:
        """A Variable's items (``GET /v1/var/:path``, command/agent/variable_endpoint.go
        variableQuery, v2.0.5), None when there is none (404)."""
        def get() -> dict | None:
            try:
                return self._http.json("GET", f"/v1/var/{quote(path, safe='/')}")
            except HTTPStatusError as exc:
                if exc.response.status_code == 404:
                    return None
                raise

        var = self._call(f"read Nomad Variable {path!r}", get)
        items = (var or {}).get("Items") if isinstance(var, dict) else None
        return {str(k): str(v) for k, v in items.items()} if isinstance(items, dict) else None

    def delete_variable(self, path: str) -> None:
        """Delete a Nomad Variable; a missing one is no error."""
        def delete() -> None:
            try:
                self._http.send("DELETE", f"/v1/var/{quote(path, safe='/')}")
            except HTTPStatusError as exc:
                if exc.response.status_code != 404:
                    raise

        self._call(f"delete Nomad Variable {path!r}", delete)

    def nodes(self) -> list[dict]:
        """Every client node with its drivers (detected, healthy, fingerprint attributes) and
        resources: ``GET /v1/nodes?resources=true`` (command/agent/node_endpoint.go NodesRequest;
        NodeListStub, nomad/structs/structs.go:2337-2357@v2.0.5). Needs node:read."""
        data, _ = self._get_json("list Nomad client nodes", "/v1/nodes", {"resources": "true"})
        return [n for n in data or [] if isinstance(n, dict)]

    def variable_paths(self, prefix: str) -> set[str]:
        """The paths of the Variables under ``prefix`` in this client's namespace: ``GET
        /v1/vars?prefix=`` (command/agent/variable_endpoint.go ``VariablesListRequest``, v2.0.5)
        answers metadata only (Path, Namespace, indexes), never Items: no value is read."""
        data, _ = self._get_json(f"list Nomad Variables under {prefix!r}", "/v1/vars", {"prefix": prefix})
        return {v.get("Path") for v in data or [] if isinstance(v, dict) and v.get("Path")}

    def stop_job(self, job_id: str, purge: bool = False, retry_s: float | None = None,
                 on_retry: Callable[[str], None] | None = None, unless_dead: bool = False) -> bool | None:
        """Stop a job, riding out outages; idempotent. False when Nomad does not know the job;
        None (nothing sent) when ``unless_dead`` and the job is already dead (ended).

        A deregister is safe to repeat (a second one stops a stopped job again), and for an unknown
        job Nomad answers 200 too (nomad/job_endpoint.go ``Deregister``: ``job == nil`` -> nil),
        so the job is read first: only an id Nomad knows counts as stopped."""
        def send() -> bool:
            self._call_once(f"stop job {job_id!r}", self._deregister, job_id, purge)
            return True

        def read() -> dict | bool:
            try:
                return self._call_once(f"read job {job_id!r}", self._read_job, job_id) or {}
            except NomadAPIError as exc:
                if exc.status == 404:
                    return False
                raise

        job = run_once(f"read job {job_id!r}", read, lambda: None, retry_s, sleep=self._sleep, on_retry=on_retry,
                       who="Nomad", not_done="the job was not stopped")
        if job is False:
            return False
        if unless_dead and isinstance(job, dict) and job.get("Status") == "dead":
            return None  # nomad/structs/structs.go JobStatusDead: every allocation ended
        return run_once(f"stop job {job_id!r}", send, lambda: None, retry_s, sleep=self._sleep, on_retry=on_retry,
                        who="Nomad", not_done="the job was not stopped")

    def plan(self, payload: dict, diff: bool = True) -> dict:
        """Dry-run the scheduler for a job: FailedTGAllocs, Annotations, Diff, Warnings."""
        body = self._with_scope(payload)
        job_id = body["Job"]["ID"]
        return self._call(f"plan job {job_id!r}", self._request, "POST", f"{_job_path(job_id)}/plan",
                          json={**body, "Diff": diff, "PolicyOverride": False})

    def stop(self, job_id: str, purge: bool = False) -> dict:
        """Stop (deregister) a job; ``purge`` also deletes it so it can no longer be queried."""
        return self._call(f"stop job {job_id!r}", self._deregister, job_id, purge)

    def _deregister(self, job_id: str, purge: bool) -> dict:
        """``DELETE /v1/job/:id`` (nomad/job_endpoint.go ``Deregister``); ``purge`` deletes it too."""
        return self._request("DELETE", _job_path(job_id), params={"purge": "true"} if purge else None)

    # Status of many jobs in a few calls: the list endpoints take a go-bexpr ``filter`` (Nomad
    # 1.2+) and answer with stubs, never the whole job (nomad/job_endpoint.go Job.List,
    # nomad/alloc_endpoint.go Alloc.List, nomad/eval_endpoint.go Eval.List).

    def job_stubs(self, job_ids: Sequence[str]) -> list[dict]:
        """JobListStubs (with Meta and JobSummary) of these jobs; unknown ids are simply absent.
        One id also goes as ``prefix``, so the server walks its ID index, not every job."""
        extra = {"meta": "true", **({"prefix": job_ids[0]} if len(job_ids) == 1 else {})}
        return self._list("/v1/jobs", "list jobs", "ID", job_ids, extra)

    def allocation_stubs(self, job_ids: Sequence[str]) -> list[dict]:
        """AllocListStubs (with TaskStates) of every allocation of these jobs."""
        return self._list("/v1/allocations", "list allocations", "JobID", job_ids)

    def placement_evaluations(self, job_ids: Sequence[str]) -> list[dict]:
        """The evaluations of these jobs that record placement failures (FailedTGAllocs)."""
        return self._list("/v1/evaluations", "list evaluations", "JobID", job_ids, where="FailedTGAllocs is not empty")

    def job_allocations(self, job_id: str, index: int = 0, wait_s: float | None = None) -> tuple[list[dict], int]:
        """One job's allocation stubs and the X-Nomad-Index. With ``index`` > 0 this is a blocking
        query: Nomad answers once that job's allocations change past ``index``, or after
        ``wait_s`` (nomad/blocking.go; at most 10 minutes, plus up to 1/16 jitter)."""
        return self._get_json(f"list allocations of job {job_id!r}", f"/v1/job/{quote(job_id, safe='')}/allocations",
                              index=index, wait_s=wait_s)

    def server_version(self) -> str | None:
        """The oldest live server's version (servers decode and keep the job), from
        ``/v1/agent/members`` (needs node:read; each server's Tags["build"], nomad/server.go), else
        the agent's own from ``/v1/agent/self`` (needs agent:read; config.Version). None when the
        token may read neither."""
        from .plan import parse_version

        try:
            members, _ = self._get_json("list servers", "/v1/agent/members")
            builds = [m.get("Tags", {}).get("build") for m in (members or {}).get("Members") or []
                      if m.get("Status") == "alive"]
            builds = [b for b in builds if parse_version(b)]
            if builds:
                return min(builds, key=parse_version)
        except NomadAPIError as exc:
            if exc.status not in (403, 404):
                raise
        try:
            agent, _ = self._get_json("read the agent's version", "/v1/agent/self")
        except NomadAPIError as exc:
            if exc.status in (403, 404):
                return None
            raise
        version = ((agent or {}).get("config") or {}).get("Version") or {}
        return version.get("Version") or ((agent or {}).get("member") or {}).get("Tags", {}).get("build") or None

    def _list(self, path: str, what: str, key: str, ids: Sequence[str], extra: dict | None = None,
              where: str | None = None) -> list[dict]:
        out: list[dict] = []
        for chunk in _chunks(list(dict.fromkeys(ids))):
            expr = " or ".join(f"{key} == {json.dumps(i)}" for i in chunk)
            if where:
                expr = f"{where} and ({expr})"
            data, _ = self._get_json(what, path, {**(extra or {}), "filter": expr})
            out += data or []
        return out

    def _get(self, path: str, params: dict[str, str], timeout: Any, stream: bool = False) -> requests.Response:
        """One GET; a non-2xx answer raises (for :meth:`_call` to map)."""
        return self._http.send("GET", path, params=params, timeout=timeout, stream=stream)

    def _get_json(self, what: str, path: str, params: dict[str, str] | None = None, *, index: int = 0,
                  wait_s: float | None = None) -> tuple[Any, int]:
        params = dict(params or {})
        timeout: Any = self.config.timeout_s
        if index:
            wait_s = min(max(wait_s or 300.0, 0.001), 600.0)
            params.update(index=str(index), wait=f"{int(wait_s * 1000)}ms")
            # Nomad holds the answer up to the wait plus 1/16 of it (jitter) before replying.
            timeout = (self.config.timeout_s, self.config.timeout_s + wait_s * 17 / 16)

        def get() -> tuple[Any, int]:
            response = self._get(path, params, timeout)
            return response.json(), int(response.headers.get("X-Nomad-Index") or 0)

        return self._call(what, get)

    def logs(
        self,
        alloc_id: str,
        task: str,
        type: str = "stdout",  # noqa: A002 - Nomad's own parameter name
        follow: bool = False,
        origin: str = "start",
        offset: int = 0,
    ) -> Iterator[str]:
        """Text chunks of a task's stdout or stderr (``plain=true``: no framing).

        With ``follow`` the stream stays open while the task runs (Nomad closes it when the task
        is dead). Only opening the stream is retried; a stream that breaks midway raises, because
        resuming would repeat or lose output.
        """
        if type not in ("stdout", "stderr"):
            raise UsageError(f"log type must be 'stdout' or 'stderr', not {type!r}")
        cfg = self.config
        params: dict[str, str] = {
            "task": task,
            "type": type,
            "plain": "true",
            "follow": "true" if follow else "false",
            "origin": origin,
            "offset": str(offset),
        }
        # No read timeout while following: a quiet training job may print nothing for minutes.
        timeout = (cfg.timeout_s, None) if follow else cfg.timeout_s
        what = f"read {type} of task {task!r} in allocation {alloc_id!r}"
        response = self._call(what, self._get, f"/v1/client/fs/logs/{alloc_id}", params, timeout, stream=True)
        return self._iter_text(response, what)

    def log_tail(self, alloc_id: str, task: str, type: str = "stderr", nbytes: int = 65536) -> str | None:  # noqa: A002
        """The last ``nbytes`` bytes of a task's stdout or stderr, or None when they cannot be read.

        ``origin=end&offset=N`` makes the client start N bytes before the end of the newest log
        file, stepping back through rotated files (client/fs_endpoint.go ``logsImpl``/``findClosest``);
        without ``follow`` it stops at the end. One attempt, no retries: a lost node (the server
        cannot reach its client: 500), a task that never started or an allocation the client
        garbage-collected (404), a token without read-logs (403) all mean "no logs", not an error.
        """
        cfg = self.config
        params = {"task": task, "type": type, "plain": "true", "follow": "false", "origin": "end",
                  "offset": str(int(nbytes))}
        try:
            response = self._get(f"/v1/client/fs/logs/{quote(alloc_id, safe='')}", params, cfg.timeout_s, stream=True)
            try:
                data = b""
                for chunk in response.iter_content(chunk_size=None):
                    data += chunk
                    if len(data) > 4 * nbytes:  # a server that ignored origin=end: keep the end
                        data = data[-nbytes:]
            finally:
                response.close()
        except (HTTPStatusError, requests.RequestException):
            return None
        return data[-nbytes:].decode("utf-8", "replace")

    def fs_list(self, alloc_id: str, path: str, timeout_s: float = 2.0) -> list[dict] | None:
        """The entries (AllocFileInfo: Name, IsDir, Size...) of a directory of an allocation,
        ``path`` relative to the allocation directory (``GET /v1/client/fs/ls/:alloc_id``,
        command/agent/fs_endpoint.go, v2.0.5; needs read-fs). One attempt within ``timeout_s``;
        None on any failure (404 no such directory, 403, a client the servers cannot reach)."""
        try:
            response = self._get(f"/v1/client/fs/ls/{quote(alloc_id, safe='')}", {"path": path},
                                 min(self.config.timeout_s, timeout_s))
            entries = response.json()
        except (HTTPStatusError, requests.RequestException, ValueError):
            return None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else None

    def fs_cat(self, alloc_id: str, path: str, max_bytes: int = 65536, timeout_s: float = 2.0) -> bytes | None:
        """The first ``max_bytes`` bytes of a file of an allocation (``GET /v1/client/fs/cat``:
        the whole file, streamed; the rest is not read). One attempt; None on any failure (the
        client answers 400 for a missing file, client/fs_endpoint.go stream, v2.0.5)."""
        deadline = time.monotonic() + timeout_s
        try:
            response = self._get(f"/v1/client/fs/cat/{quote(alloc_id, safe='')}", {"path": path},
                                 min(self.config.timeout_s, timeout_s), stream=True)
            try:
                data = b""
                for chunk in response.iter_content(chunk_size=16384):
                    data += chunk
                    if len(data) >= max_bytes or time.monotonic() > deadline:
                        break
            finally:
                response.close()
        except (HTTPStatusError, requests.RequestException):
            return None
        return data[:max_bytes]

    def _iter_text(self, response: requests.Response, what: str) -> Iterator[str]:
        # Decode incrementally: a multi-byte UTF-8 character can straddle two network chunks.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in response.iter_content(chunk_size=None):
                if chunk:
                    text = decoder.decode(chunk)
                    if text:
                        yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
        except requests.RequestException as exc:
            raise NomadAPIError(
                f"log stream from Nomad at {self.config.address} broke ({what}): {exc}",
                address=self.config.address,
            ) from exc
        finally:
            response.close()


def _job_path(job_id: str) -> str:
    return f"/v1/job/{quote(job_id, safe='')}"
