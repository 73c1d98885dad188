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

from halo_sched.errors import SchedulerError, UsageError
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
    # How long to wait for the TCP (and TLS) connection itself; None: ``timeout_s``. ``list`` sets
    # it short (a Nomad that is down must not hold it up).
    connect_timeout_s: float | None = None
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
    """A Nomad request failed. ``status`` is the HTTP status (None when no answer came from Nomad:
    connection and TLS failures, a server that is not a Nomad agent). ``kind`` says which: one of
    :data:`KINDS`. ``short`` is the condition alone, without the advice (for a note in ``list``)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = "", address: str = "",
                 attempts: int = 1, kind: str = "http", short: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body
        self.address = address
        self.attempts = attempts
        self.kind = kind
        self._short = short or message

    @property
    def short(self) -> str:
        return self._short


#: ``NomadAPIError.kind``: nothing reached the server (refused, no such host, connect timeout);
#: TLS failed (plain HTTP server, untrusted certificate, ...); the server at NOMAD_ADDR is not a
#: Nomad agent's API; Nomad refused the token (403); the connection broke after the request was
#: sent; any other HTTP answer.
KINDS = ("unreachable", "tls", "not_nomad", "forbidden", "broken", "http")


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


#: Addresses that answered (any HTTP answer) in this process: a host name that stops resolving
#: after that is an outage (DNS during a failover); one that never resolved is a typo.
_ANSWERED: set[str] = set()


def never_resolved(err: BaseException) -> bool:
    """Whether ``err`` says NOMAD_ADDR's host name does not resolve and that address never
    answered in this process (a misspelt NOMAD_ADDR, not an outage to wait through)."""
    return (isinstance(err, NomadAPIError) and err.kind == "unreachable"
            and err.short.endswith("its host name does not resolve") and err.address not in _ANSWERED)


def _host_port(address: str) -> str:
    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _causes(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions inside it (urllib3 nests them in ``args``, ``reason`` and the
    cause chain), outermost first."""
    out: list[BaseException] = []
    todo = [exc]
    while todo and len(out) < 12:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or any(e is o for o in out):
            continue
        out.append(e)
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
        todo += [getattr(e, "reason", None), e.__cause__, e.__context__]
    return out


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


def _unreachable(transport: BaseException | None, address: str, connect_s: float) -> str | None:
    """The condition, in a few words, when no connection was made (nothing was sent)."""
    why = _connect_failure(transport)
    if why is None:
        return None
    if why.startswith("refused"):
        return "connection refused"
    if why.startswith("could not be found"):
        return "its host name does not resolve"
    if why.startswith("did not accept"):
        return f"no connection within {connect_s:g}s (host down, or a firewall drops it)"
    return "no connection" + (why[len("could not be connected to"):] or "")


# OpenSSL's reasons when the server's first bytes are not a TLS record (a plain-HTTP server).
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL",
            "HTTP_REQUEST", "NO_PROTOCOLS_AVAILABLE")
# ... when the server wants a client certificate (mutual TLS).
_WANTS_CERT = ("CERTIFICATE_REQUIRED", "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
               "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_HANDSHAKE_FAILURE")


def _tls_failure(transport: BaseException | None, cfg: "NomadConfig") -> tuple[str, str]:
    """(the condition, what to do) for a TLS failure."""
    import ssl

    errs = [e for e in _causes(transport) if isinstance(e, ssl.SSLError)]
    err = errs[-1] if errs else None
    reason = (getattr(err, "reason", None) or "").upper()
    where = _host_port(cfg.address)
    if reason in _NOT_TLS or "WRONG VERSION NUMBER" in str(err).upper():
        return (f"the server at {where} does not speak TLS", f"use NOMAD_ADDR=http://{where}")
    if isinstance(err, ssl.SSLCertVerificationError) or reason == "CERTIFICATE_VERIFY_FAILED":
        told = " ".join(str(getattr(err, "verify_message", "") or "").split())[:80]
        if "hostname mismatch" in told.lower() or "ip address mismatch" in told.lower():
            return (f"the TLS certificate at {where} does not name {urlsplit(cfg.address).hostname!r}",
                    "put a host name the certificate names in NOMAD_ADDR")
        if "expired" in told.lower():
            return (f"the TLS certificate at {where} has expired", "the server needs a new certificate")
        ca = f"NOMAD_CACERT={cfg.cacert} did not sign it" if cfg.cacert else "set NOMAD_CACERT to the CA that signed it"
        return (f"the TLS certificate at {where} is not trusted ({told or 'verify failed'})", ca)
    if reason in _WANTS_CERT:
        if cfg.cert:
            return (f"the server at {where} refused the client certificate ({reason.lower()})",
                    "check NOMAD_CLIENT_CERT/NOMAD_CLIENT_KEY")
        return (f"the server at {where} wants a client certificate ({reason.lower()})",
                "set NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY")
    told = reason.lower() or " ".join(str(err or transport).split())[:60]
    return (f"TLS with {where} failed ({told})", "check NOMAD_ADDR and NOMAD_CACERT")


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


def _looks_like_nomad(response: requests.Response) -> bool:
    """Whether an error answer is Nomad's own: Nomad writes its errors as one plain-text message
    (command/agent/http.go ``wrap``, v2.0.5); an HTML page (a web server, a proxy's error page) or
    an empty 404 (Nomad's own fallthrough for a path it has no API at, http.go
    ``handleRootFallthrough``) means NOMAD_ADDR does not point at the API."""
    body = (response.text or "").lstrip()
    ctype = (response.headers.get("Content-Type") or "").lower()
    if not body or body.startswith("<") or "html" in ctype:
        return False
    return True


def _first_line(text: str, limit: int = 100) -> str:
    line = " ".join((text.strip().splitlines() or [""])[0].split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def needed_capability(method: str, path: str) -> str:
    """The ACL capability a request needs (Nomad v2.0.5: nomad/job_endpoint.go ``List`` list-jobs,
    ``GetJob``/``Allocations`` read-job, ``Register``/``Deregister``/``Plan`` submit-job;
    alloc_endpoint.go and eval_endpoint.go ``List`` read-job; client_fs_endpoint.go logs
    read-logs; status_endpoint.go ``Members`` and node_endpoint.go ``List`` node:read;
    command/agent/agent_endpoint.go ``AgentSelfRequest`` agent:read; Variables by path)."""
    method = method.upper()
    path = path.split("?", 1)[0]
    if path.startswith("/v1/var/"):
        cap = {"GET": "read", "DELETE": "destroy"}.get(method, "write")
        return f'variables "{cap}" on {path[len("/v1/var/"):]}'
    if path == "/v1/vars":
        return 'variables "list" on nomad/jobs/*'
    if path == "/v1/agent/members" or path.startswith("/v1/node"):
        return "node:read"
    if path == "/v1/agent/self":
        return "agent:read"
    if path.startswith("/v1/client/fs/logs/"):
        return "the read-logs capability"
    if path == "/v1/jobs" and method == "GET":
        return "the list-jobs capability"
    if method in ("POST", "PUT", "DELETE"):
        return "the submit-job capability"
    return "the read-job capability"


def _is_transient(exc: BaseException) -> bool:
    """Retry only what can heal by itself: HTTP 5xx and failures to connect or to get an answer.

    TLS errors are ``requests.ConnectionError`` subclasses but a bad certificate does not heal, so
    they are excluded. Read timeouts are not retried either: the request may have been applied.
    """
    response, transport = _unwrap(exc)
    if response is not None:
        return response.status_code >= 500 and response.status_code != 501  # 501: not implemented, never heals
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
        timeout = cfg.timeout_s if timeout is None else timeout
        if cfg.connect_timeout_s is not None:
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            timeout = (min(cfg.connect_timeout_s, connect or cfg.connect_timeout_s), read)
        response = self.session.request(
            method, f"{cfg.address}{path}", params={**self.scope(), **(params or {})}, json=json, stream=stream,
            timeout=timeout,
            headers={"X-Nomad-Token": cfg.token} if cfg.token else {},
            verify=cfg.verify, cert=cfg.cert, allow_redirects=False,
        )
        _ANSWERED.add(cfg.address)
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
                why = _unreachable(transport, self.config.address, self.connect_timeout)
                if why:
                    raise Transient(f"{where}: {why}") from exc
                if isinstance(transport, (requests.ConnectionError, requests.Timeout)):
                    raise Ambiguous(f"{where} {_broken_answer(transport)}") from exc
            raise err from exc

    def not_nomad(self, what: str, exc: BaseException) -> NomadAPIError:
        """A 2xx whose body is not the JSON Nomad sends (a proxy's page, a wrong port, ...)."""
        short = f"{self.config.address} answered with something other than Nomad's JSON ({what})"
        return NomadAPIError(f"{short}: is NOMAD_ADDR a Nomad agent?", address=self.config.address,
                             kind="not_nomad", short=short)

    def error(self, what: str, exc: BaseException, attempts: int = 1) -> NomadAPIError:
        """The NomadAPIError for a failed request: one short line saying what happened (nothing
        reached Nomad, TLS failed and why, not a Nomad agent, no permission and which, Nomad's own
        words) and what to do. The underlying exception is only the error's ``__cause__`` (the
        CLI shows it with ``--debug``)."""
        cfg = self.config
        response, transport = _unwrap(exc)
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        if response is not None:
            return self._http_error(what, response, tries, attempts)
        if isinstance(transport, requests.exceptions.SSLError):
            short, todo = _tls_failure(transport, cfg)
            return NomadAPIError(f"{short}: {todo}", address=cfg.address, attempts=attempts, kind="tls", short=short)
        connect_s = self.connect_timeout
        unreachable = _unreachable(transport, cfg.address, connect_s)
        if unreachable:
            short = f"nothing reached Nomad at {cfg.address}: {unreachable}"
            todo = "check NOMAD_ADDR" + (" or start the agent" if "refused" in unreachable else "")
            tried = f" ({tries})" if attempts > 1 else ""
            return NomadAPIError(f"{short}{tried}; {todo}", address=cfg.address, attempts=attempts,
                                 kind="unreachable", short=short)
        if isinstance(transport, requests.Timeout):
            short = f"Nomad at {cfg.address} did not answer within {self.read_timeout:g}s"
            return NomadAPIError(f"{short} ({what})", address=cfg.address, attempts=attempts, kind="broken",
                                 short=short)
        short = f"Nomad at {cfg.address} {_broken_answer(transport)}"
        hint = ""
        if urlsplit(cfg.address).scheme == "http" and "before answering" in short:
            hint = "; if it serves HTTPS only, use https://"
        return NomadAPIError(f"{short} ({what}, {tries}){hint}", address=cfg.address, attempts=attempts,
                             kind="broken", short=short)

    def _http_error(self, what: str, response: requests.Response, tries: str, attempts: int) -> NomadAPIError:
        cfg = self.config
        status = response.status_code
        body = (response.text or "").strip()
        where = f"Nomad at {cfg.address}"
        ns = self.namespace_hint()
        request = getattr(response, "request", None)
        method = getattr(request, "method", None) or "GET"
        path = urlsplit(getattr(request, "url", None) or "").path or "?"
        path_shown = path if len(path) <= 40 else path[:37] + "..."
        err = dict(status=status, body=body, address=cfg.address, attempts=attempts)
        if not _looks_like_nomad(response):
            if status == 400 and "https" in body.lower():
                # Go's TLS server answers plain HTTP so: "Client sent an HTTP request to an HTTPS server."
                short = f"the server at {_host_port(cfg.address)} speaks TLS"
                return NomadAPIError(f"{short}: use NOMAD_ADDR=https://{_host_port(cfg.address)}", kind="tls",
                                     short=short, **err)
            page = "an HTML" if body.lstrip().startswith("<") else ("an empty" if not body else "a non-Nomad")
            short = f"{cfg.address} is not a Nomad agent's API: {method} {path_shown} got {page} HTTP {status}"
            # status None: no answer came from Nomad (a 404 here is not "no such job").
            return NomadAPIError(f"{short}; check NOMAD_ADDR (host, port, no path)", kind="not_nomad",
                                 short=short, **{**err, "status": None})
        said = _first_line(body)
        if status == 403:
            # Nomad's address is not in question here (it answered): the token is.
            need = needed_capability(method, path)
            if "token not found" in body.lower():
                short = f"Nomad at {cfg.address} does not know the ACL token in NOMAD_TOKEN (HTTP 403 {said!r})"
                todo = "use a token of this cluster"
            elif cfg.token:
                short = f"Nomad refused to {what} (HTTP 403 {said!r})"
                todo = f"NOMAD_TOKEN lacks {need}{ns}"
            else:
                short = f"Nomad refused to {what} (HTTP 403, no ACL token sent)"
                todo = f"set NOMAD_TOKEN to a token with {need}{ns}"
            return NomadAPIError(f"{short}: {todo}", kind="forbidden", short=short, **err)
        if status == 404:
            short = f"{where}: {what}: {said} (HTTP 404)"
            return NomadAPIError(f"{short}{ns}", short=short, **err)
        if status >= 500:
            short = f"{where} failed to {what} after {tries}: HTTP {status} {said!r}"
            return NomadAPIError(short, short=short, **err)
        # Nomad's own words in full: a rejected job lists every problem.
        shown = body if len(body) <= _BODY_LIMIT else body[:_BODY_LIMIT] + "..."
        return NomadAPIError(f"{where} rejected the request to {what}: HTTP {status} {shown!r}",
                             short=f"{where} rejected the request to {what}: HTTP {status} {said!r}", **err)

    @property
    def connect_timeout(self) -> float:
        t = self.config.timeout_s
        return self.config.connect_timeout_s or (t[0] if isinstance(t, tuple) else t)

    @property
    def read_timeout(self) -> float:
        t = self.config.timeout_s
        return t[1] if isinstance(t, tuple) else t

    def namespace_hint(self) -> str:
        return f" (namespace {self.config.namespace!r})" if self.config.namespace else ""
