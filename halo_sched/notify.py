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
   halo_sched.notify``) when a deliverable row is due and no delivery holds it; it returns at
   once. The delivery claims a row for :data:`LEASE_S` seconds under its own name (host, pid: two
   runs never send one row at once, and a run finds a row another live run holds is in flight,
   not failed; a lease whose run died on this host is taken over at once), POSTs it with ONE
   deadline for each try (name lookup, connect, TLS, send, read: :data:`TRY_S`), at most
   :data:`TRIES` tries within :data:`BUDGET_S` seconds for failures answered at once (a try that
   got no answer in time is not repeated in the same run), and records the outcome on the row. A
   row not delivered stays pending and waits :func:`backoff_s` (the row keeps its tries and the
   time of its next try) before the next actor with the variable tries again, up to
   :data:`MAX_TRIES` tries in all, after which the row is ``given-up``. ``status`` says which,
   with why. Nothing is lost silently.

**At least once.** A receiver may get an event more than once (a 2xx lost on its way back, an
answer after the try's deadline, a delivery killed between the POST and recording it). Each
event carries one delivery id, the same in every try by every run (``delivery_id`` in the body,
the ``Idempotency-Key`` and ``X-Halo-Delivery`` headers): a receiver drops the second one by it.

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

#: Tries of one row in one delivery run, for a failure the receiver answered at once (a refused
#: connection, an HTTP 5xx); a try that got no answer in time is not repeated in the same run.
TRIES = 3
#: One delivery run's time for one row, all tries and pauses included.
BUDGET_S = 30.0
#: One try's deadline: resolve, connect, TLS, send, read, together. A receiver that answers
#: within it is delivered, however slowly; one that answers later is tried again by a later run.
TRY_S = 15.0
#: How long a delivery run holds a row it claimed (more than one run's budget for the row).
LEASE_S = 60.0
#: After a run that did not deliver a row, its next try waits BACKOFF_S, doubling with each try
#: made, at most BACKOFF_MAX_S (``halo-sched notify --now`` tries it at once).
BACKOFF_S = 30.0
BACKOFF_MAX_S = 3600.0
#: Tries in all, over every delivery run, before a row is given up (and ``status`` says so).
MAX_TRIES = 30
#: The start of the reason a try got no answer within its deadline.
NO_ANSWER = "no answer within"
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
    from .jobstate import JobStatus

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
        # The same in every try of this event, whichever run sends it (the row keeps the payload
        # queued first): the receiver's key to drop a second delivery (also the Idempotency-Key
        # and X-Halo-Delivery headers).
        "delivery_id": _new_delivery_id(),
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


def _in(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{(seconds + 30) // 60} min"
    return f"{seconds // 3600} h {(seconds % 3600 + 30) // 60} min"


def tries_words(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


def next_try_words(next_try: float, now: float | None = None) -> str:
    """When a row's next try is due, in words: "the next try is due in 4 min" (or "due now")."""
    left = next_try - (time.time() if now is None else now)
    return f"the next try is due in {_in(left)}" if left >= 0.5 else "the next try is due now"


def undelivered_lines(job_id: str, backend: str) -> list[str]:
    """One line per notification of the job that a delivery tried and failed (pending or given up)."""
    from . import db

    if not db.exists():
        return []
    out = []
    for event, state, tries, error, next_try in db.read(
            "SELECT event, state, tries, last_error, next_try FROM outbox WHERE job = ? AND backend = ? ORDER BY created",
            (job_id, backend)):
        if state == "given-up":
            out.append(f"notify: the {event} notification was given up after {tries} tries ({error})")
        elif state == "pending" and tries:
            out.append(f"notify: the {event} notification is not delivered yet ({tries_words(tries)}: {error}); "
                       f"{next_try_words(next_try)}; {HOW_DELIVERED}")
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
    now = time.time()
    names = [r[0] for r in db.read("SELECT DISTINCT webhook_env FROM outbox WHERE state = 'pending' AND claimed_until < ? "
                                   "AND next_try <= ?", (now, now))]
    return [n for n in names if os.environ.get(n)]


def start_delivery() -> bool:
    """Start one detached delivery process when a pending row this process can deliver is due
    (its backoff over) and not held by one already; never waits for it. True when one was started."""
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


def backoff_s(tries: int) -> float:
    """How long a row waits after a delivery run that failed it, ``tries`` tries in all so far:
    BACKOFF_S doubling with each try, at most BACKOFF_MAX_S."""
    return min(BACKOFF_S * 2 ** max(0, min(tries, 32) - 1), BACKOFF_MAX_S)


def _claim_token() -> str:
    """Who holds a lease: this host, this process, and a nonce (a pid is reused)."""
    import socket
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def held_elsewhere(claimed_until: float, claimed_by: str, now: float, mine: str = "") -> bool:
    """Whether a row's lease is held by another delivery run that may still be sending it: the
    lease has not expired, and its holder is not a process of this host known to be gone (a run
    that died is not waited for until its lease expires)."""
    if claimed_until < now or not claimed_by or claimed_by == mine:
        return False
    import socket

    host, _, rest = claimed_by.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another host's run: its lease stands until it expires
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _claim(con, tried: set[int], token: str, due_only: bool = True) -> tuple | None:
    """One pending row this process can deliver, has not tried yet, that no other live run holds
    and (``due_only``) whose backoff is over: claimed for LEASE_S under ``token``, in one
    transaction. A row queued before rows had their delivery id gets it here, kept in the row."""
    envs = [n for n in {r[0] for r in con.execute("SELECT DISTINCT webhook_env FROM outbox WHERE state = 'pending'")}
            if os.environ.get(n)]
    if not envs:
        return None
    now = time.time()
    marks = ",".join("?" * len(envs))
    con.execute("BEGIN IMMEDIATE")
    try:
        skip = ",".join(str(int(i)) for i in tried) or "-1"
        found = None
        for row in con.execute(
                f"SELECT rowid, job, backend, event, webhook_env, payload, tries, claimed_until, claimed_by FROM outbox "
                f"WHERE state = 'pending' AND webhook_env IN ({marks}) AND rowid NOT IN ({skip}) "
                f"AND (next_try <= ? OR ?) ORDER BY created", (*envs, now, int(not due_only))).fetchall():
            if not held_elsewhere(row[7], row[8], now, token):
                found = row
                break
        if found is not None:
            payload = _with_delivery_id(found[5])
            con.execute("UPDATE outbox SET claimed_until = ?, claimed_by = ?, payload = ? WHERE rowid = ?",
                        (now + LEASE_S, token, payload, found[0]))
            found = (*found[:5], payload, found[6])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return found


def _with_delivery_id(payload: str) -> str:
    import json

    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    if isinstance(data, dict) and not isinstance(data.get("delivery_id"), str):
        from . import db

        data["delivery_id"] = _new_delivery_id()
        return db.dumps(data)
    return payload


def _new_delivery_id() -> str:
    import uuid

    return uuid.uuid4().hex


def _delivery_id(payload: str) -> str:
    import json

    try:
        value = json.loads(payload).get("delivery_id")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


class Delivery:
    """What one delivery run did: how many rows it delivered, and the rows it tried and did not
    deliver, each (job, backend, event, tries, why, state, next_try)."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed: list[tuple[str, str, str, int, str, str, float]] = []


def deliver(max_rows: int = 100, due_only: bool = True) -> Delivery:
    """Deliver the pending rows this process's environment can: each claimed (a row another live
    run holds is left to it), sent, its outcome recorded. A row not delivered waits
    :func:`backoff_s` before the next run tries it (``due_only=False``: try the waiting rows now)."""
    from . import db

    con = db.connection()
    out = Delivery()
    tried: set[int] = set()
    token = _claim_token()
    for _ in range(max_rows):
        row = _claim(con, tried, token, due_only)
        if row is None:
            break
        rowid, job, backend, event, env_name, payload, tries = row
        tried.add(rowid)
        why, used = _deliver(os.environ.get(env_name, ""), payload.encode(), _delivery_id(payload))
        tries += used
        with db.write() as c:
            if not why:  # delivered is true whoever holds the lease now
                c.execute("UPDATE outbox SET state = 'delivered', tries = ?, last_error = '', done_at = ?, "
                          "claimed_until = 0, claimed_by = '' WHERE rowid = ?", (tries, time.time(), rowid))
                out.delivered += 1
                continue
            state = "given-up" if tries >= MAX_TRIES else "pending"
            next_try = time.time() + backoff_s(tries)
            # Recorded only while this run still holds the row: one whose lease ran out and
            # another run took is that run's to record.
            if c.execute("UPDATE outbox SET state = ?, tries = ?, last_error = ?, next_try = ?, claimed_until = 0, "
                         "claimed_by = '' WHERE rowid = ? AND claimed_by = ? AND state = 'pending'",
                         (state, tries, why[:200], next_try, rowid, token)).rowcount:
                out.failed.append((job, backend, event, tries, why[:200], state, next_try))
    return out


def deliver_pending(max_rows: int = 100) -> int:
    """Deliver the pending rows this process's environment can and whose backoff is over; how many
    were delivered. What ``python -m halo_sched.notify`` runs."""
    return deliver(max_rows).delivered


def _deliver(url: str, body: bytes, delivery_id: str = "") -> tuple[str, int]:
    """POST ``body``: ('' once a 2xx answers, else why not, never the URL; the tries used), each
    try within TRY_S whatever the server or DNS does, at most TRIES tries within BUDGET_S. A try
    that got no answer within its deadline is not repeated in this run: the receiver may still be
    working on it (a slow success), and a repeat at once would only pile up duplicates; the next
    run, after the backoff, tries again."""
    deadline = time.monotonic() + BUDGET_S
    headers = {"Idempotency-Key": delivery_id, "X-Halo-Delivery": delivery_id} if delivery_id else {}
    why = ""
    used = 0
    for i in range(TRIES):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        used += 1
        why = _within(min(TRY_S, left), lambda t: _post(url, body, t, headers))
        if not why or why.startswith("refused:") or why.startswith(NO_ANSWER):
            break  # delivered, a URL no retry can fix, or a receiver that may still be at work
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
    return box[0] if box else f"{NO_ANSWER} {seconds:.2g} s"


def _safe(call, seconds: float) -> str:
    try:
        return call(seconds)
    except TimeoutError:  # the socket's own deadline (the same as the try's)
        return f"{NO_ANSWER} {seconds:.2g} s"
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


def _post(url: str, body: bytes, timeout: float, extra: dict | None = None) -> str:
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
                                                           "User-Agent": "halo-sched", **(extra or {}), **headers})
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


__all__ = ["BACKOFF_MAX_S", "BACKOFF_S", "BUDGET_S", "Delivery", "LEASE_S", "MAX_TRIES", "MIN_SCRUB_CHARS", "TRIES",
           "TRY_S", "backoff_s", "deliver", "deliver_pending", "event_of", "held_elsewhere", "next_try_words",
           "observe", "outcomes", "queued_lines", "send", "start_delivery", "target", "undelivered_lines"]
