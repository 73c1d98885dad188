"""Webhook notifications (``notify:`` in the job file; docs/failures.md, "Notifications").

Two steps, so that no command ever waits on a webhook:

1. **Queued once.** The halo-sched process that observes a state change (:func:`halo_sched.core.
   keep_state`: ``submit --wait``, ``watch``, ``status``, ``list``, the Python API) puts its event
   into the store's outbox (halo_sched/db.py): one row per (job, event), ``INSERT OR IGNORE`` in
   one transaction, so however many processes observe it, the event is queued exactly once. The
   row holds the payload (scrubbed of every ``secret_env`` value the observer knows, and of the
   URL) and the NAME of the variable holding the URL, never the URL.
2. **Delivered by an actor, in the background.** Queueing is recording, and any observer does
   it; delivering is acting, and only an actor does it: a process that waits on the job
   (``submit --wait``, ``watch``, ``Run.wait()``: :func:`halo_sched.core.note`) or ``halo-sched
   notify`` (:func:`deliver_pending` in the foreground, for a job nobody waits on). Reads
   (``status``, ``list``, ``logs``, ``timeline``, ``Job.status()``) never send. A waiting actor
   whose environment has that variable starts one detached delivery process (``python -m
   halo_sched.notify``) when a deliverable row waits and no delivery holds it; it returns at once. The delivery claims a row for :data:`LEASE_S` seconds
   (so two never send the same row at once), POSTs it with ONE deadline for the whole delivery
   (name lookup, connect, TLS, send, read: :data:`TRY_S`), at most :data:`TRIES` tries within
   :data:`BUDGET_S` seconds, and records the outcome on the row. A row not delivered stays
   pending (``status`` says so, with why, and how it gets delivered), and the next actor with the
   variable tries again, up to :data:`MAX_TRIES` tries in all, after which the row is ``given-up`` (``status`` says
   that too). Nothing is lost silently.

The URL is a secret: it is read by name (``notify.webhook_env``) from the delivering process's
environment and goes nowhere else: not into the store, the rendered job, a log line, a repr or an
error. Redirects are followed only when they keep the POST and its body (307, 308), to http(s)
only, at most :data:`MAX_REDIRECTS`; user:password in the URL becomes a Basic Authorization
header. A delivery failure never changes a command's exit status nor the job.
"""
from __future__ import annotations

import os
import sys
import time

TRIES = 3
#: One delivery run's time for one row, all tries and pauses included.
BUDGET_S = 10.0
#: One try's deadline: resolve, connect, TLS, send, read, together.
TRY_S = 3.0
#: How long a delivery process holds a row it claimed (more than one run's budget).
LEASE_S = 30.0
#: Tries in all, over every delivery run, before a row is given up (and ``status`` says so).
MAX_TRIES = 30
MAX_REDIRECTS = 3
MAX_LINE = 2000
SCRUBBED = "***"
#: Secret values shorter than this are not scrubbed as substrings (a value ``x`` would turn
#: ``exit`` into ``e***it``); submit warns about them. The nodes' rule (node/failure_collector.py).
from .node.failure_collector import MIN_SECRET_CHARS as MIN_SCRUB_CHARS  # noqa: E402
from .node.failure_classes import COMPLETED, FAILED  # noqa: E402


def event_of(state) -> str | None:
    """The event a state is: completed, or its failure class's event (failed, hung:
    node/failure_classes.py), or None (running, cancelled, preempted)."""
    from .backends.jobstate import JobStatus

    if state.status is JobStatus.COMPLETED:
        return COMPLETED
    if state.status in (JobStatus.FAILED, JobStatus.NODE_FAIL, JobStatus.TIMEOUT, JobStatus.OUT_OF_MEMORY):
        cls = state.failure_class()
        return cls.failure.event if cls is not None else FAILED
    return None


def _config(rec: dict) -> dict | None:
    spec = rec.get("spec")
    n = spec.get("notify") if isinstance(spec, dict) else None
    if not isinstance(n, dict) or not isinstance(n.get("webhook_env"), str) or not isinstance(n.get("on"), list):
        return None
    return n


def observe(rec: dict, state) -> None:
    """Queue ``state``'s event for the job of ``rec`` if its job file asks for it (core.keep_state):
    recording only, whoever observed it (a read too); delivering is the actors' (core.note)."""
    event = event_of(state)
    if event is not None:
        send(rec, event, state.describe(), attempt=(state.restarts or 0) + 1, start=False)


def send(rec: dict, event: str, line: str, attempt: int | None = None, start: bool = True) -> bool:
    """Queue ``event`` for the job of ``rec`` (once per job and event, whoever asks) and, with
    ``start``, start a background delivery when this process can deliver it; True when this call
    queued it. Never raises for the store or the webhook: a warning line at most."""
    n = _config(rec)
    if n is None or event not in n["on"] or not rec.get("id") or not rec.get("backend"):
        return False
    from . import db

    try:
        payload = _payload(rec, event, line, attempt)
        with db.write() as con:
            queued = con.execute(
                "INSERT OR IGNORE INTO outbox (job, backend, event, webhook_env, payload, created) "
                "VALUES (?, ?, ?, ?, ?, ?)", (rec["id"], rec["backend"], event, n["webhook_env"], payload,
                                              time.time())).rowcount == 1
        if start:
            start_delivery()
        return queued
    except db.ReadOnlyStore:  # a read of a store this user cannot write (said once when it opened)
        return False
    except (OSError, db.StoreError) as err:  # the store cannot be written: say so, never fail the command
        print(f"halo-sched: warning: notify: {rec['id']}: {err}", file=sys.stderr)
        return False


def _secret_values(rec: dict) -> list[str]:
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    names = list(spec.get("secret_env") or [])
    names += [k for r in spec.get("servers") or [] if isinstance(r, dict) for k in r.get("secret_env") or []]
    return [os.environ[k] for k in names if isinstance(k, str) and len(os.environ.get(k, "")) >= MIN_SCRUB_CHARS]


def _payload(rec: dict, event: str, line: str, attempt: int | None) -> str:
    # The second layer: the nodes scrubbed their lines already (node/failure_collector.py), with
    # every value; here only what this process holds. A value too short to scrub is left as is
    # there and here (submit warned): as a substring it would mangle the line ("exit" -> "e***it").
    from . import db
    from .node.failure_collector import scrub

    n = _config(rec) or {}
    url = os.environ.get(n.get("webhook_env") or "", "")
    secrets = _secret_values(rec) + ([url] if len(url) >= MIN_SCRUB_CHARS else [])
    line = scrub(line, sorted(set(secrets), key=len, reverse=True))  # a failure line may quote a secret
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}  # a retried run's attempt (runs.py)
    number = run.get("attempt")
    data = {
        "run": run.get("id") or rec["id"], "job": rec["id"], "backend": rec["backend"], "name": rec.get("name"),
        # 1-based: the record's attempt number is 0 for a run's first
        "attempt": number + 1 if isinstance(number, int) and not isinstance(number, bool) else attempt or 1,
        "state": event, "line": line[:MAX_LINE], "time": time.time(),
    }
    return db.dumps(data)


# ---- the outcome, for status ------------------------------------------------------------------


def outcomes(job_id: str, backend: str) -> list[tuple[str, str, int, str]]:
    """(event, state, tries, last error) of each notification of a job (none without a store)."""
    from . import db

    if not db.exists():
        return []
    return [tuple(r) for r in db.read("SELECT event, state, tries, last_error FROM outbox WHERE job = ? AND backend = ? "
                                      "ORDER BY created", (job_id, backend))]


#: How a queued notification gets delivered, as ``status`` says it.
HOW_DELIVERED = ("`halo-sched notify` (or a waiting submit --wait or watch) with its webhook variable set "
                 "delivers it")


def undelivered_lines(job_id: str, backend: str) -> list[str]:
    """One line per notification of the job that a delivery tried and failed (pending or given up)."""
    out = []
    for event, state, tries, error in outcomes(job_id, backend):
        if state == "given-up":
            out.append(f"notify: the {event} notification was given up after {tries} tries ({error})")
        elif state == "pending" and tries:
            out.append(f"notify: the {event} notification is not delivered yet ({tries} tries: {error}); "
                       f"{HOW_DELIVERED}")
    return out


def queued_lines(job_id: str, backend: str) -> list[str]:
    """One line per notification of the job queued and not tried yet (a read queued it: only an
    actor delivers), saying how it gets delivered."""
    return [f"notify: the {event} notification is queued, not sent; {HOW_DELIVERED}"
            for event, state, tries, _ in outcomes(job_id, backend) if state == "pending" and not tries]


# ---- delivery -----------------------------------------------------------------------------------


def _deliverable_envs() -> list[str]:
    from . import db

    if not db.exists():
        return []
    names = [r[0] for r in db.read("SELECT DISTINCT webhook_env FROM outbox WHERE state = 'pending' AND claimed_until < ?",
                                   (time.time(),))]
    return [n for n in names if os.environ.get(n)]


def start_delivery() -> bool:
    """Start one detached delivery process when a pending row this process can deliver is not
    held by one already; never waits for it. True when one was started."""
    try:
        if not _deliverable_envs():
            return False
        from . import db

        if db.read_only():  # a store this user cannot write: nothing could be marked delivered
            return False
        import subprocess

        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        subprocess.Popen([sys.executable, "-m", "halo_sched.notify"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                         start_new_session=True, env=env)
        return True
    except Exception as err:  # noqa: BLE001 - a notification never fails the command that observed
        print(f"halo-sched: warning: notify: could not start the delivery ({type(err).__name__})", file=sys.stderr)
        return False


def _claim(con, tried: set[int]) -> tuple | None:
    """One pending row this process can deliver and has not tried yet, claimed for LEASE_S (in
    one transaction)."""
    envs = [n for n in {r[0] for r in con.execute("SELECT DISTINCT webhook_env FROM outbox WHERE state = 'pending'")}
            if os.environ.get(n)]
    if not envs:
        return None
    now = time.time()
    marks = ",".join("?" * len(envs))
    con.execute("BEGIN IMMEDIATE")
    try:
        skip = ",".join(str(int(i)) for i in tried) or "-1"
        row = con.execute(f"SELECT rowid, job, backend, event, webhook_env, payload, tries FROM outbox WHERE state = 'pending' "
                          f"AND claimed_until < ? AND webhook_env IN ({marks}) AND rowid NOT IN ({skip}) "
                          f"ORDER BY created LIMIT 1", (now, *envs)).fetchone()
        if row is not None:
            con.execute("UPDATE outbox SET claimed_until = ? WHERE rowid = ?", (now + LEASE_S, row[0]))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return row


def deliver_pending(max_rows: int = 100) -> int:
    """Deliver the pending rows this process's environment can (each claimed, sent, its outcome
    recorded); how many were delivered. What ``python -m halo_sched.notify`` runs."""
    from . import db

    con = db.connection()
    done = 0
    tried: set[int] = set()
    for _ in range(max_rows):
        row = _claim(con, tried)
        if row is None:
            break
        rowid, _job, _backend, _event, env_name, payload, tries = row
        tried.add(rowid)
        why, used = _deliver(os.environ.get(env_name, ""), payload.encode())
        tries += used
        with db.write() as c:
            if not why:
                c.execute("UPDATE outbox SET state = 'delivered', tries = ?, last_error = '', done_at = ?, "
                          "claimed_until = 0 WHERE rowid = ?", (tries, time.time(), rowid))
                done += 1
            else:
                c.execute("UPDATE outbox SET state = ?, tries = ?, last_error = ?, claimed_until = 0 WHERE rowid = ?",
                          ("given-up" if tries >= MAX_TRIES else "pending", tries, why[:200], rowid))
    return done


def _deliver(url: str, body: bytes) -> tuple[str, int]:
    """POST ``body``: ('' once a 2xx answers, else why not, never the URL; the tries used), at
    most TRIES tries within BUDGET_S, each within TRY_S whatever the server or DNS does."""
    deadline = time.monotonic() + BUDGET_S
    why = ""
    used = 0
    for i in range(TRIES):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        used += 1
        why = _within(min(TRY_S, left), lambda t: _post(url, body, t))
        if not why or why.startswith("refused:"):
            break  # delivered, or a URL no retry can fix
        pause = min(0.5 * 2 ** i, deadline - time.monotonic())
        if i + 1 < TRIES and pause > 0:
            time.sleep(pause)
    return why.removeprefix("refused: ") if why else "", used


def _within(seconds: float, call) -> str:
    """``call(seconds)`` in a thread, given up after ``seconds`` whatever it is blocked in (a
    name lookup has no timeout of its own): the deadline of one try."""
    import threading

    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(_safe(call, seconds)), daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else f"no answer within {seconds:.2g} s"


def _safe(call, seconds: float) -> str:
    try:
        return call(seconds)
    except Exception as err:  # noqa: BLE001 - any failure of one try is a reason, never the URL
        reason = getattr(err, "reason", None)
        return type(reason).__name__ if isinstance(reason, BaseException) else type(err).__name__


def target(url: str) -> tuple[str, str, int, str, dict] | str:
    """(scheme, host, port, path, extra headers) of a webhook URL, or why it cannot be one. The
    scheme is matched without case; user:password becomes a Basic Authorization header."""
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return "not a valid URL"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return "not an http:// or https:// URL"
    headers = {}
    if parts.username is not None or parts.password is not None:
        import base64

        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80), path, headers


def _post(url: str, body: bytes, timeout: float) -> str:
    import http.client
    from urllib.parse import urljoin

    deadline = time.monotonic() + timeout
    for _hop in range(MAX_REDIRECTS + 1):
        t = target(url)
        if isinstance(t, str):
            return f"refused: {t}"
        scheme, host, port, path, headers = t
        left = max(0.1, deadline - time.monotonic())
        if scheme == "https":
            import ssl

            conn = http.client.HTTPSConnection(host, port, timeout=left, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=left)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                           "User-Agent": "halo-sched", **headers})
            resp = conn.getresponse()
            resp.read(64 << 10)
            code, location = resp.status, resp.getheader("Location")
        finally:
            conn.close()
        if 200 <= code < 300:
            return ""
        if code in (307, 308) and location:  # the POST and its body are kept: safe to follow
            url = urljoin(url, location)
            continue
        if 300 <= code < 400:
            return f"refused: HTTP {code} redirect not followed (a POST is only re-sent on 307 or 308)"
        return f"HTTP {code}"
    return f"refused: more than {MAX_REDIRECTS} redirects"


def main() -> int:
    """``python -m halo_sched.notify``: deliver what this environment can, then end."""
    try:
        deliver_pending()
    except Exception:  # noqa: BLE001 - rows stay pending; a later actor starts another delivery
        pass
    sys.stdout.flush()
    os._exit(0)  # a try given up may leave its thread blocked (a name lookup): end regardless


if __name__ == "__main__":
    main()


__all__ = ["BUDGET_S", "LEASE_S", "MAX_TRIES", "MIN_SCRUB_CHARS", "TRIES", "TRY_S", "deliver_pending", "event_of",
           "observe", "outcomes", "queued_lines", "send", "start_delivery", "target", "undelivered_lines"]
