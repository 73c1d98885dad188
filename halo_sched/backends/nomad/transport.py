"""How halo-sched talks to Nomad's HTTP API: where and how to reach it, one request, its retries,
and what a failure means.

Every call goes through :meth:`NomadHTTP.send` on one ``requests`` session:

* TLS verification is on by default and the CA comes from ``NOMAD_CACERT``/``NOMAD_CAPATH`` the
  way the ``nomad`` CLI reads it; the token, namespace and region come from the
  :class:`NomadConfig` alone, never from the process environment behind its back;
* :meth:`NomadHTTP.call` retries what can heal by itself (connection errors, HTTP 5xx) under the
  one retry policy (:data:`halo_sched.retry.NOMAD_CALLS`, set by ``NomadConfig.retry_*``); 4xx
  never is (a bad job or a missing token does not get better by asking again), and neither are
  TLS failures or read timeouts;
* :meth:`NomadHTTP.call_once` makes one attempt and says whether a failed request may have taken
  effect (:class:`~halo_sched.retry.Ambiguous`) or certainly did not
  (:class:`~halo_sched.retry.Transient`), for the exactly-once submit (:mod:`halo_sched.exactly_once`);
* every failure becomes a :class:`NomadAPIError` (a :class:`~halo_sched.errors.SchedulerError`)
  naming the request, the address, the HTTP status and Nomad's own words.

This module never imports torch.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable
from urllib.parse import urlsplit

import requests

from halo_sched.errors import SchedulerError, UsageError, debug
from halo_sched.retry import NOMAD_CALLS, Ambiguous, RetryPolicy, Transient

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
    # The retry policy for connection errors and HTTP 5xx (halo_sched.retry.NOMAD_CALLS): at most
    # ``retry_attempts`` tries in all, backoff ``retry_base_s * 2**n`` capped at
    # ``retry_max_wait_s``, and no try started past ``retry_total_s``.
    retry_attempts: int = NOMAD_CALLS.attempts or 4
    retry_base_s: float = NOMAD_CALLS.first_wait_s
    retry_max_wait_s: float = NOMAD_CALLS.max_wait_s
    retry_total_s: float = NOMAD_CALLS.budget_s or 15.0

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

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy of idempotent requests, from the ``retry_*`` fields."""
        return NOMAD_CALLS.with_(attempts=self.retry_attempts, budget_s=self.retry_total_s,
                                 first_wait_s=self.retry_base_s, max_wait_s=self.retry_max_wait_s)

    def redacted(self) -> "NomadConfig":
        """A copy safe to print or log."""
        return replace(self, **{f: "<redacted>" for f in _SECRET_FIELDS if getattr(self, f)})

    def __repr__(self) -> str:
        # Never the token or the client key's path: configs end up in logs and tracebacks.
        shown = self.redacted()
        return f"NomadConfig({', '.join(f'{f.name}={getattr(shown, f.name)!r}' for f in fields(self))})"

    __str__ = __repr__


#: nomad/structs/job.go RegisterEnforceIndexErrPrefix: a create-only register met an existing job.
ENFORCE_INDEX_ERR = "Enforcing job modify index"


class NomadAPIError(SchedulerError):
    """A Nomad request failed. ``status`` is the HTTP status (None for connection/TLS errors)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = "", address: str = "", attempts: int = 1):
        super().__init__(message)
        self.status = status
        self.body = body
        self.address = address
        self.attempts = attempts


class HTTPStatusError(Exception):
    """A non-2xx answer (its body already read), before it is mapped to a NomadAPIError."""

    def __init__(self, response: requests.Response):
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _unwrap(exc: BaseException) -> tuple[requests.Response | None, BaseException | None]:
    """(HTTP response, transport exception) behind a failed request."""
    if isinstance(exc, HTTPStatusError):
        return exc.response, None
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


class NomadHTTP:
    """Requests to one Nomad agent, as :class:`NomadConfig` says: one session, the token header,
    the namespace and region, TLS, timeouts, retries and error mapping.

    ``session`` may be a prepared :class:`requests.Session` (tests, proxies); its ``verify`` and
    ``cert`` are set from ``config`` either way."""

    def __init__(self, config: NomadConfig, session: requests.Session | None = None, *,
                 sleep: Callable[[float], None] = time.sleep):
        cfg = self.config = config
        if bool(cfg.client_cert) != bool(cfg.client_key):
            raise UsageError("NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY must be set together (mutual TLS)")
        for name, path, check in (("NOMAD_CACERT", cfg.cacert, os.path.isfile), ("NOMAD_CAPATH", cfg.capath, os.path.isdir)):
            if path and not cfg.skip_verify and not check(path):
                raise UsageError(f"{name}={path!r} does not exist")
        self.sleep = sleep
        self.session = session or requests.Session()
        self.session.verify = cfg.verify
        if cfg.cert:
            self.session.cert = cfg.cert

    def scope(self) -> dict[str, str]:
        """The namespace and region query parameters every request carries."""
        params = {}
        if self.config.namespace:
            params["namespace"] = self.config.namespace
        if self.config.region:
            params["region"] = self.config.region
        return params

    def send(self, method: str, path: str, *, params: dict[str, str] | None = None, json: Any = None,
             timeout: Any = None, stream: bool = False) -> requests.Response:
        """One request (no retry); a non-2xx answer raises :class:`HTTPStatusError`, its body read.
        Redirects are not followed: the token header would go with them."""
        cfg = self.config
        response = self.session.request(
            method, f"{cfg.address}{path}", params={**self.scope(), **(params or {})}, json=json, stream=stream,
            timeout=cfg.timeout_s if timeout is None else timeout,
            headers={"X-Nomad-Token": cfg.token} if cfg.token else {},
            verify=cfg.verify, cert=cfg.cert, allow_redirects=False,
        )
        if not response.ok:
            try:
                response.content  # read the error body before the connection is released
            finally:
                response.close()
            raise HTTPStatusError(response)
        return response

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`send`, then the answer's JSON."""
        return self.send(method, path, **kw).json()

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (requests through :meth:`send`) under the config's retry
        policy: connection errors and HTTP 5xx are retried; any failure ends as a NomadAPIError."""
        tries = 0

        def attempt() -> Any:
            nonlocal tries
            tries += 1
            try:
                return fn(*args, **kwargs)
            except (HTTPStatusError, requests.RequestException) as exc:
                if _is_transient(exc):
                    raise Transient(str(exc)) from exc
                raise

        try:
            return self.config.policy.call(attempt, sleep=self.sleep)
        except Transient as last:
            exc = last.__cause__
            raise self.error(what, exc, tries) from exc
        except (requests.exceptions.InvalidJSONError, ValueError) as exc:
            raise self.not_nomad(what, exc) from exc
        except (HTTPStatusError, requests.RequestException) as exc:
            raise self.error(what, exc, tries) from exc

    def call_once(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One attempt. A failure before any connection was made (refused, the host name does not
        resolve, connect timeout) raises :class:`~halo_sched.retry.Transient`: nothing was sent.
        One that may follow a request the server applied (5xx, connection dropped, read timeout)
        raises :class:`~halo_sched.retry.Ambiguous`; anything else a :class:`NomadAPIError`. Their
        messages are one short line."""
        try:
            return fn(*args, **kwargs)
        except (requests.exceptions.InvalidJSONError, ValueError) as exc:
            raise self.not_nomad(what, exc) from exc
        except (HTTPStatusError, requests.RequestException) as exc:
            err = self.error(what, exc)
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

    def not_nomad(self, what: str, exc: BaseException) -> NomadAPIError:
        """A 2xx whose body is not the JSON Nomad sends (a proxy's page, a wrong port, ...)."""
        return NomadAPIError(
            f"Nomad at {self.config.address}: {what}: unexpected response ({exc}); is NOMAD_ADDR a Nomad agent?",
            address=self.config.address,
        )

    def error(self, what: str, exc: BaseException, attempts: int = 1) -> NomadAPIError:
        """The NomadAPIError for a failed request: the request, the address, the HTTP status and
        Nomad's words, with a hint for the usual causes (403: the token; TLS: NOMAD_CACERT)."""
        cfg = self.config
        response, transport = _unwrap(exc)
        if response is not None:
            status = response.status_code
            body = (response.text or "").strip()
            shown = body if len(body) <= _BODY_LIMIT else body[:_BODY_LIMIT] + "..."
            where = f"Nomad at {cfg.address}"
            ns = self.namespace_hint()
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

    def namespace_hint(self) -> str:
        return f" (namespace {self.config.namespace!r})" if self.config.namespace else ""
