"""A small Nomad HTTP API client for halo-sched, built on python-nomad.

Why a wrapper and not python-nomad directly:

* python-nomad turns TLS verification OFF unless ``verify`` is passed and never reads
  ``NOMAD_CACERT``; here verification is on by default and the CA comes from the environment
  the same way the ``nomad`` CLI reads it.
* python-nomad has no retries. Here connection errors and HTTP 5xx are retried a bounded number
  of times with exponential backoff; 4xx never is (a bad job or a missing token does not get
  better by asking again), and neither are TLS failures.
* python-nomad raises exceptions that print a raw response; here every failure becomes a
  :class:`NomadAPIError` (a :class:`~halo_sched.errors.SchedulerError`) naming the request, the
  address, the HTTP status and Nomad's own words, with a hint for the usual causes (403: token).
* Its log call buffers the whole response, so ``follow`` could never stream; logs go through the
  same ``requests`` session directly, with ``stream=True``.

This module never imports torch.
"""
from __future__ import annotations

import codecs
import json
import os
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import quote, urlsplit

import nomad.api as nomad_api
import nomad.api.exceptions as nomad_exc
import requests
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from halo_sched.errors import OutcomeUnknown, SchedulerError, UsageError, debug

DEFAULT_ADDRESS = "http://127.0.0.1:4646"
_BODY_LIMIT = 600  # characters of Nomad's response body quoted in an error message

_TRUE = {"1", "t", "true", "yes", "y", "on"}
_FALSE = {"", "0", "f", "false", "no", "n", "off"}


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise UsageError(f"{name}={value!r} is not a boolean (use true/false or 1/0)")


def _normalize_address(address: str) -> str:
    address = address.strip().rstrip("/")
    if "://" not in address:
        # The nomad CLI accepts "host:port"; requests needs a scheme.
        address = "http://" + address
    scheme = urlsplit(address).scheme.lower()
    if scheme not in ("http", "https"):
        raise UsageError(f"NOMAD_ADDR={address!r}: only http:// and https:// addresses are supported")
    return address


_SECRET_FIELDS = ("token", "client_key")
#: Job.Meta key holding the submission token (halo_sched.exactly_once).
TOKEN_META = "halo_sched_token"
#: nomad/structs/job.go RegisterEnforceIndexErrPrefix.
ENFORCE_INDEX_ERR = "Enforcing job modify index"


@dataclass(frozen=True, repr=False)
class NomadConfig:
    """Where and how to reach Nomad. Build it with :meth:`from_env` to read ``NOMAD_*`` like the CLI."""

    address: str = DEFAULT_ADDRESS
    token: str | None = None
    namespace: str | None = None
    region: str | None = None
    cacert: str | None = None
    capath: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    skip_verify: bool = False
    timeout_s: float = 10.0
    # Retry policy for connection errors and HTTP 5xx: at most ``retry_attempts`` tries in all,
    # backoff ``retry_base_s * 2**n`` capped at ``retry_max_wait_s``, and never past ``retry_total_s``.
    retry_attempts: int = 4
    retry_base_s: float = 0.25
    retry_max_wait_s: float = 2.0
    retry_total_s: float = 15.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "NomadConfig":
        """Read NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT, NOMAD_CAPATH,
        NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and NOMAD_SKIP_VERIFY, then apply ``overrides``.

        An override whose value is None counts as "not given" (so CLI flags left unset do not wipe
        what the environment says); pass an empty string to clear a value explicitly.
        """
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value else None

        values: dict[str, Any] = {
            "address": get("NOMAD_ADDR") or DEFAULT_ADDRESS,
            "token": get("NOMAD_TOKEN"),
            "namespace": get("NOMAD_NAMESPACE"),
            "region": get("NOMAD_REGION"),
            "cacert": get("NOMAD_CACERT"),
            "capath": get("NOMAD_CAPATH"),
            "client_cert": get("NOMAD_CLIENT_CERT"),
            "client_key": get("NOMAD_CLIENT_KEY"),
            "skip_verify": _parse_bool("NOMAD_SKIP_VERIFY", env.get("NOMAD_SKIP_VERIFY", "")),
        }
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise TypeError(f"NomadConfig has no field {key!r}")
            if value is not None:
                values[key] = value if value != "" else None
        values["address"] = _normalize_address(values["address"] or DEFAULT_ADDRESS)
        if values.get("skip_verify") is None:
            values["skip_verify"] = False
        return cls(**values)

    @property
    def verify(self) -> bool | str:
        """What ``requests`` gets as ``verify``: False only when explicitly skipped, else the CA
        bundle (file or directory) when one is configured, else True (system trust store)."""
        if self.skip_verify:
            return False
        return self.cacert or self.capath or True

    @property
    def cert(self) -> tuple[str, str] | None:
        if self.client_cert and self.client_key:
            return (self.client_cert, self.client_key)
        return None

    def redacted(self) -> "NomadConfig":
        """A copy safe to print or log."""
        return replace(self, **{f: "<redacted>" for f in _SECRET_FIELDS if getattr(self, f)})

    def __repr__(self) -> str:
        # Never the token or the client key's path: configs end up in logs and tracebacks.
        shown = self.redacted()
        return f"NomadConfig({', '.join(f'{f.name}={getattr(shown, f.name)!r}' for f in fields(self))})"

    __str__ = __repr__


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


class NomadAPIError(SchedulerError):
    """A Nomad request failed. ``status`` is the HTTP status (None for connection/TLS errors)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = "", address: str = "", attempts: int = 1):
        super().__init__(message)
        self.status = status
        self.body = body
        self.address = address
        self.attempts = attempts


class _HTTPStatusError(Exception):
    """Internal: a non-2xx answer on the raw-session path (logs), shaped like python-nomad's."""

    def __init__(self, response: requests.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.nomad_resp = response


def _unwrap(exc: BaseException) -> tuple[requests.Response | None, BaseException | None]:
    """(HTTP response, transport exception) behind a python-nomad or raw-session error."""
    if isinstance(exc, (nomad_exc.BaseNomadException, _HTTPStatusError)):
        inner = exc.nomad_resp
        if isinstance(inner, requests.Response):
            return inner, None
        if isinstance(inner, BaseException):
            return None, inner
        return None, exc
    if isinstance(exc, requests.RequestException):
        return None, exc
    return None, exc


def _connect_failure(transport: BaseException | None) -> str | None:
    """Why no connection to Nomad was made, when none was (so no request was sent): "refused
    the connection", "host not found", ...; None when a request may have been sent (a read
    timeout, a connection dropped mid-answer) or for anything else."""
    import socket

    import urllib3.exceptions as u3

    if isinstance(transport, requests.exceptions.ConnectTimeout):
        return "did not accept the connection in time"
    if not isinstance(transport, requests.ConnectionError) or isinstance(
            transport, (requests.exceptions.SSLError, requests.exceptions.ProxyError)):
        return None
    reason = transport.args[0] if transport.args else None
    reason = getattr(reason, "reason", reason)  # urllib3's MaxRetryError carries the cause
    if not isinstance(reason, u3.NewConnectionError):  # includes NameResolutionError (urllib3 2)
        return None
    cause = reason.__cause__ or reason.__context__
    if isinstance(reason, getattr(u3, "NameResolutionError", ())) or isinstance(cause, socket.gaierror):
        return "could not be found (its host name does not resolve)"
    if isinstance(cause, ConnectionRefusedError):
        return "refused the connection"
    if isinstance(cause, OSError) and cause.strerror:
        return f"could not be connected to ({cause.strerror})"
    return "could not be connected to"


def _broken_answer(transport: BaseException | None) -> str:
    """A short account of a transport failure after the connection was made."""
    if isinstance(transport, requests.Timeout):
        return "did not answer in time"
    inner, seen = transport, 0
    while inner is not None and seen < 6:  # the innermost cause names it best (RemoteDisconnected, reset)
        nxt = inner.args[-1] if inner.args and isinstance(inner.args[-1], BaseException) else None
        nxt = nxt or getattr(inner, "reason", None) or inner.__cause__
        if not isinstance(nxt, BaseException):
            break
        inner, seen = nxt, seen + 1
    if isinstance(inner, ConnectionResetError):
        return "reset the connection before answering"
    return f"closed the connection before answering ({type(inner).__name__})"


def _is_transient(exc: BaseException) -> bool:
    """Retry only what can heal by itself: HTTP 5xx and failures to connect or to get an answer.

    TLS errors are ``requests.ConnectionError`` subclasses but a bad certificate does not heal, so
    they are excluded. Read timeouts are not retried either: the request may have been applied.
    """
    response, transport = _unwrap(exc)
    if response is not None:
        return response.status_code >= 500
    if isinstance(transport, requests.exceptions.SSLError):
        return False
    return isinstance(transport, requests.ConnectionError)


class NomadClient:
    """The Nomad calls halo-sched needs, each retried and mapped to :class:`NomadAPIError`.

    ``session`` may be a prepared :class:`requests.Session` (tests, proxies); its ``verify`` and
    ``cert`` are set from ``config`` either way, because python-nomad passes them per request.
    """

    def __init__(
        self,
        config: NomadConfig | None = None,
        session: requests.Session | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.config = config or NomadConfig.from_env()
        cfg = self.config
        if bool(cfg.client_cert) != bool(cfg.client_key):
            raise UsageError("NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY must be set together (mutual TLS)")
        for name, path, check in (("NOMAD_CACERT", cfg.cacert, os.path.isfile), ("NOMAD_CAPATH", cfg.capath, os.path.isdir)):
            if path and not cfg.skip_verify and not check(path):
                raise UsageError(f"{name}={path!r} does not exist")
        self._sleep = sleep
        self.session = session or requests.Session()
        self.session.verify = cfg.verify
        if cfg.cert:
            self.session.cert = cfg.cert
        # The endpoint objects are built directly rather than through ``nomad.Nomad``: its
        # constructor falls back to NOMAD_TOKEN/NOMAD_NAMESPACE/NOMAD_REGION/NOMAD_CLIENT_CERT from
        # the process environment for anything left unset, so a config that deliberately has no
        # token would still send one. The config is the single source of truth here.
        settings = dict(
            address=cfg.address,
            namespace=cfg.namespace,
            token=cfg.token,
            region=cfg.region,
            timeout=cfg.timeout_s,
            verify=cfg.verify,  # python-nomad passes this on every request, overriding the session's
            cert=cfg.cert or (),
            session=self.session,
        )
        self._job_api = nomad_api.Job(**settings)
        self._jobs_api = nomad_api.Jobs(**settings)

    # ----------------------------------------------------------------------------- plumbing

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        cfg = self.config
        retrying = Retrying(
            stop=stop_after_attempt(max(1, cfg.retry_attempts)) | stop_after_delay(cfg.retry_total_s),
            wait=wait_exponential(multiplier=cfg.retry_base_s, max=cfg.retry_max_wait_s),
            retry=retry_if_exception(_is_transient),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            # reraise=True: once attempts run out tenacity raises the last error itself.
            return retrying(fn, *args, **kwargs)
        except (requests.exceptions.InvalidJSONError, ValueError) as exc:
            raise self._not_nomad(what, exc) from exc
        except (nomad_exc.BaseNomadException, _HTTPStatusError, requests.RequestException) as exc:
            raise self._error(what, exc, retrying) from exc

    def _not_nomad(self, what: str, exc: BaseException) -> NomadAPIError:
        """A 2xx whose body is not the JSON Nomad sends (a proxy's page, a wrong port, ...)."""
        return NomadAPIError(
            f"Nomad at {self.config.address}: {what}: unexpected response ({exc}); is NOMAD_ADDR a Nomad agent?",
            address=self.config.address,
        )

    def _error(self, what: str, exc: BaseException, retrying: Retrying | None) -> NomadAPIError:
        cfg = self.config
        attempts = int(retrying.statistics.get("attempt_number", 1) or 1) if retrying else 1
        response, transport = _unwrap(exc)
        if response is not None:
            status = response.status_code
            body = (response.text or "").strip()
            shown = body if len(body) <= _BODY_LIMIT else body[:_BODY_LIMIT] + "..."
            where = f"Nomad at {cfg.address}"
            ns = self._namespace_hint()
            if status == 403:
                if cfg.token:
                    hint = (f"the ACL token (NOMAD_TOKEN) lacks permission for this request{ns}, "
                            "or it is not a valid token on this cluster")
                else:
                    hint = "no ACL token was sent: set NOMAD_TOKEN to a token allowed to submit jobs" + ns
                msg = f"{where} refused to {what}: HTTP 403 {shown!r}: {hint}"
            elif status == 404:
                msg = f"{where}: {what}: not found (HTTP 404 {shown!r}){ns}"
            elif status >= 500:
                tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}"
                msg = f"{where} failed to {what}{tries}: HTTP {status} {shown!r}"
            else:
                msg = f"{where} rejected the request to {what}: HTTP {status} {shown!r}"
            return NomadAPIError(msg, status=status, body=body, address=cfg.address, attempts=attempts)
        if isinstance(transport, requests.exceptions.SSLError):
            msg = (f"TLS verification of Nomad at {cfg.address} failed ({what}): {transport}. Set NOMAD_CACERT to "
                   "the CA bundle that signed the server certificate (NOMAD_SKIP_VERIFY=true disables the check; "
                   "insecure)")
            return NomadAPIError(msg, address=cfg.address, attempts=attempts)
        # The underlying exception (urllib3's whole chain, hundreds of characters) only with --debug.
        detail = f" [{type(transport).__name__}: {transport}]" if debug() else ""
        if isinstance(transport, requests.Timeout) and not isinstance(transport, requests.ConnectionError):
            msg = f"Nomad at {cfg.address} did not answer within {cfg.timeout_s:g}s ({what}){detail}"
            return NomadAPIError(msg, address=cfg.address, attempts=attempts)
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        why = _connect_failure(transport) or _broken_answer(transport)
        msg = f"cannot reach Nomad at {cfg.address} ({what}, {tries}): it {why}{detail}; check NOMAD_ADDR"
        return NomadAPIError(msg, address=cfg.address, attempts=attempts)

    def _namespace_hint(self) -> str:
        return f" (namespace {self.config.namespace!r})" if self.config.namespace else ""

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

    def register(self, payload: dict) -> dict:
        """Register (submit) a job. Returns Nomad's answer: EvalID, JobModifyIndex, Warnings, ..."""
        body = self._with_scope(payload)
        return self._call(f"register job {body['Job']['ID']!r}", self._jobs_api.register_job, body)

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
        from halo_sched.exactly_once import Ambiguous, run_once

        body = self._with_scope(payload)
        job_id = body["Job"]["ID"]
        if (body["Job"].get("Meta") or {}).get(TOKEN_META) != token:
            raise UsageError(f"the job payload must carry its submission token in Meta.{TOKEN_META}")
        body = {**body, "EnforceIndex": True, "JobModifyIndex": 0}
        what = f"register job {job_id!r}"

        def send() -> dict:
            try:
                return self._call_once(what, self._jobs_api.register_job, body)
            except NomadAPIError as exc:
                if exc.status == 500 and ENFORCE_INDEX_ERR in exc.body:
                    raise Ambiguous(f"Nomad says the job already exists ({exc.body.strip()})") from exc
                raise

        def lookup() -> dict | None:
            try:
                job = self._call_once(f"read job {job_id!r}", self._job_api.get_job, job_id)
            except NomadAPIError as exc:
                if exc.status == 404:
                    return None
                raise
            if (job.get("Meta") or {}).get(TOKEN_META) != token:
                raise SchedulerError(f"Nomad already has a job {job_id!r} that this submission did not create; "
                                     "nothing was submitted (submit again for a fresh id)")
            return {"EvalID": job.get("EvalID", ""), "JobModifyIndex": job.get("JobModifyIndex"), "Warnings": "",
                    "found_after_retry": True}

        return run_once(what, send, lookup, retry_s, token=token, sleep=self._sleep, on_retry=on_retry,
                        who="Nomad", not_done="the job was not submitted")

    def put_variable(self, path: str, items: dict[str, str], retry_s: float | None = None,
                     on_retry: Callable[[str], None] | None = None) -> None:
        """Write a Nomad Variable (``PUT /v1/var/:path``, nomad/variables_endpoint.go ``Apply``,
        command/agent/variable_endpoint.go), riding out outages; writing the same items twice is
        harmless. Errors name the path and the item names, never a value: on 403, the ``nomad var
        put`` command and the policy that would allow it."""
        from halo_sched.exactly_once import run_once

        cfg = self.config
        body = {"Path": path, "Items": dict(items), **({"Namespace": cfg.namespace} if cfg.namespace else {})}
        what = f"write Nomad Variable {path!r}"

        def put() -> None:
            response = self.session.put(
                f"{cfg.address}/v1/var/{quote(path, safe='/')}", params=self._scope(), json=body,
                timeout=cfg.timeout_s, headers={"X-Nomad-Token": cfg.token} if cfg.token else {},
                verify=cfg.verify, cert=cfg.cert, allow_redirects=False)
            if not response.ok:
                raise _HTTPStatusError(response)

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
            raise NomadAPIError(
                f"Nomad at {cfg.address} refused to {what}: HTTP 403 ({exc.body.strip()[:200]}). The job's secrets "
                f"(secret_env) go there and nothing was submitted. Use a NOMAD_TOKEN whose policy has "
                f'variables {{ path "nomad/jobs/*" {{ capabilities = ["write"] }} }}{" in that namespace" if ns else ""}, '
                f"or have someone allowed to run: nomad var put{ns} {path} {names}",
                status=403, body=exc.body, address=cfg.address) from exc

    def delete_variable(self, path: str) -> None:
        """Delete a Nomad Variable; a missing one is no error."""
        cfg = self.config

        def delete() -> None:
            response = self.session.delete(
                f"{cfg.address}/v1/var/{quote(path, safe='/')}", params=self._scope(), timeout=cfg.timeout_s,
                headers={"X-Nomad-Token": cfg.token} if cfg.token else {}, verify=cfg.verify, cert=cfg.cert,
                allow_redirects=False)
            if not response.ok and response.status_code != 404:
                raise _HTTPStatusError(response)

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
                 on_retry: Callable[[str], None] | None = None) -> bool:
        """Stop a job, riding out outages; idempotent. False when Nomad does not know the job.

        A deregister is safe to repeat (a second one stops a stopped job again), and for an unknown
        job Nomad answers 200 too (nomad/job_endpoint.go ``Deregister``: ``job == nil`` -> nil),
        so the job is read first: only an id Nomad knows counts as stopped."""
        from halo_sched.exactly_once import run_once

        def send() -> bool:
            self._call_once(f"stop job {job_id!r}", self._job_api.deregister_job, job_id,
                            purge=True if purge else None)
            return True

        def exists() -> bool:
            try:
                self._call_once(f"read job {job_id!r}", self._job_api.get_job, job_id)
            except NomadAPIError as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        if not run_once(f"read job {job_id!r}", exists, lambda: None, retry_s, sleep=self._sleep, on_retry=on_retry,
                        who="Nomad", not_done="the job was not stopped"):
            return False
        return run_once(f"stop job {job_id!r}", send, lambda: None, retry_s, sleep=self._sleep, on_retry=on_retry,
                        who="Nomad", not_done="the job was not stopped")

    def _call_once(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One attempt. A failure before any connection was made (refused, the host name does not
        resolve, connect timeout) raises :class:`~halo_sched.exactly_once.Transient`: nothing was
        sent. One that may follow a request the server applied (5xx, connection dropped, read
        timeout) raises :class:`~halo_sched.exactly_once.Ambiguous`; anything else a
        :class:`NomadAPIError`. Their messages are one short line."""
        from halo_sched.exactly_once import Ambiguous, Transient

        try:
            return fn(*args, **kwargs)
        except (requests.exceptions.InvalidJSONError, ValueError) as exc:
            raise self._not_nomad(what, exc) from exc
        except (nomad_exc.BaseNomadException, _HTTPStatusError, requests.RequestException) as exc:
            err = self._error(what, exc, None)
            response, transport = _unwrap(exc)
            where = f"Nomad at {self.config.address}"
            if response is not None and response.status_code >= 500:
                if err.status == 500 and ENFORCE_INDEX_ERR in err.body:
                    raise err from exc
                first = (err.body.strip().splitlines() or [""])[0][:80]
                raise Ambiguous(f"{where} answered HTTP {response.status_code}" + (f" {first!r}" if first else "")) from exc
            if response is None and not isinstance(transport, requests.exceptions.SSLError):
                # No connection was made (refused, host not found): nothing was sent.
                why = _connect_failure(transport)
                if why:
                    raise Transient(f"{where} {why}") from exc
                if isinstance(transport, (requests.ConnectionError, requests.Timeout)):
                    raise Ambiguous(f"{where} {_broken_answer(transport)}") from exc
            raise err from exc

    def plan(self, payload: dict, diff: bool = True) -> dict:
        """Dry-run the scheduler for a job: FailedTGAllocs, Annotations, Diff, Warnings."""
        body = self._with_scope(payload)
        job_id = body["Job"]["ID"]
        return self._call(f"plan job {job_id!r}", self._job_api.plan_job, job_id, body, diff=diff)

    def job(self, job_id: str) -> dict | None:
        """The job, or None when Nomad does not know it (never registered, purged, or GC'd)."""
        try:
            return self._call(f"read job {job_id!r}", self._job_api.get_job, job_id)
        except NomadAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def stop(self, job_id: str, purge: bool = False) -> dict:
        """Stop (deregister) a job; ``purge`` also deletes it so it can no longer be queried."""
        return self._call(
            f"stop job {job_id!r}", self._job_api.deregister_job, job_id, purge=True if purge else None
        )

    def jobs(self, prefix: str | None = None) -> list[dict]:
        """Job stubs whose ID starts with ``prefix`` (all jobs of the namespace when None)."""
        return self._call("list jobs", self._jobs_api.get_jobs, prefix=prefix) or []

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

    def _scope(self) -> dict[str, str]:
        params = {}
        if self.config.namespace:
            params["namespace"] = self.config.namespace
        if self.config.region:
            params["region"] = self.config.region
        return params

    def _get(self, path: str, params: dict[str, str], timeout: Any, stream: bool = False) -> requests.Response:
        """One GET on the shared session; a non-2xx answer raises (for :meth:`_call` to map)."""
        cfg = self.config
        response = self.session.get(
            f"{cfg.address}{path}", params={**self._scope(), **params}, stream=stream, timeout=timeout,
            headers={"X-Nomad-Token": cfg.token} if cfg.token else {},
            verify=cfg.verify, cert=cfg.cert, allow_redirects=False,
        )
        if not response.ok:
            try:
                response.content  # read the error body before the connection is released
            finally:
                response.close()
            raise _HTTPStatusError(response)
        return response

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
        except (_HTTPStatusError, requests.RequestException):
            return None
        return data[-nbytes:].decode("utf-8", "replace")

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
