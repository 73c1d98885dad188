"""Webhook notifications (``notify:`` in the job file; docs/failures.md, "Notifications").

Who sends: the halo-sched process that observes the state change, through
:func:`halo_sched.core.keep_state` (``submit --wait``, ``watch``, ``status``, ``list``, and the
Python API's status). The URL is a secret: it is read by name (``notify.webhook_env``) from THAT
process's environment at that moment and goes nowhere else: not into the record, the rendered
job, a log line, a repr or an error. An observer without the variable sends nothing and marks
nothing, so a later observer that has it still sends.

Exactly once per event per job: a marker file beside the job's record (``<record>.notified-EVENT``)
is written after a delivery, under an exclusive lock taken without waiting (a second observer at
the same moment skips; the marker is looked at again under the lock). Delivery is tried at most
3 times within 10 s; a failure is one warning line and leaves no marker (a later observer tries
again); it never changes the command's exit status nor the job.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TRIES = 3
BUDGET_S = 10.0
TRY_TIMEOUT_S = 3.0
SCRUBBED = "***"
#: (job, backend, event) whose delivery failed in this process: one bounded try per process
#: (``submit --wait`` observes the final state more than once); a later process tries again.
_given_up: set[tuple[str, str, str]] = set()
#: Variables whose webhook did not answer in this process: ``list`` over many jobs waits on a dead
#: webhook once, not once per job.
_dead: set[str] = set()


def event_of(state) -> str | None:
    """The event a state is: completed, hung, failed, or None (running, cancelled, preempted)."""
    from .backends.jobstate import JobStatus

    if state.status is JobStatus.COMPLETED:
        return "completed"
    if state.status in (JobStatus.FAILED, JobStatus.NODE_FAIL, JobStatus.TIMEOUT, JobStatus.OUT_OF_MEMORY):
        cls = state.failure_class()
        return "hung" if cls is not None and cls.by == "hung" else "failed"
    return None


def _config(rec: dict) -> dict | None:
    spec = rec.get("spec")
    n = spec.get("notify") if isinstance(spec, dict) else None
    if not isinstance(n, dict) or not isinstance(n.get("webhook_env"), str) or not isinstance(n.get("on"), list):
        return None
    return n


def _marker(rec: dict, event: str) -> Path:
    from . import records

    p = records.path_for(rec["id"], rec["backend"])
    return p.with_name(f"{p.name}.notified-{event}")


def observe(rec: dict, state) -> None:
    """Send ``state``'s event for the job of ``rec`` if its job file asks for it (core.keep_state)."""
    event = event_of(state)
    if event is not None:
        send(rec, event, state.describe(), attempt=(state.restarts or 0) + 1)


def send(rec: dict, event: str, line: str, attempt: int | None = None) -> bool:
    """POST ``event`` for the job of ``rec`` once (see the module's doc); True when it was sent
    now. Never raises for a failed delivery; for ``retried``, the resubmitting code calls it."""
    n = _config(rec)
    if n is None or event not in n["on"] or not rec.get("id") or not rec.get("backend"):
        return False
    url = os.environ.get(n["webhook_env"], "")
    if not url.startswith(("http://", "https://")):
        return False  # not set here (or not a URL): a later observer that has it sends
    key = (rec["id"], rec["backend"], event)
    if key in _given_up or n["webhook_env"] in _dead:
        return False
    try:
        marker = _marker(rec, event)
        if marker.exists():
            return False
        import fcntl

        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(marker.with_name(marker.name + ".lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another observer is sending it now
            if marker.exists():
                return False
            body = _payload(rec, event, line, attempt, url)
            why = _deliver(url, body)
            if why:
                _given_up.add(key)
                _dead.add(n["webhook_env"])
                print(f"halo-sched: warning: notify: the {event} notification of {rec['id']} was not delivered to "
                      f"${n['webhook_env']}'s webhook after {TRIES} tries ({why}); a later status, watch or list "
                      f"with {n['webhook_env']} set tries again", file=sys.stderr)
                return False
            marker.write_text(f"{time.time():.3f}\n")
            return True
    except OSError as err:  # the store cannot be written: say so, never fail the command
        print(f"halo-sched: warning: notify: {rec['id']}: {type(err).__name__} ({err.strerror or 'I/O error'})",
              file=sys.stderr)
        return False


def _payload(rec: dict, event: str, line: str, attempt: int | None, url: str) -> bytes:
    secrets = [url]
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    names = list(spec.get("secret_env") or []) + [k for r in spec.get("servers") or [] for k in r.get("secret_env") or []]
    # The second layer: the nodes scrubbed their lines already (node/failure_collector.py), with
    # every value; here only what this process holds. A value too short to scrub is left as is
    # there and here (submit warned): as a substring it would mangle the line ("exit" -> "e***it").
    from .node.failure_collector import MIN_SECRET_CHARS, scrub

    secrets += [os.environ[k] for k in names if isinstance(k, str) and len(os.environ.get(k, "")) >= MIN_SECRET_CHARS]
    line = scrub(line, sorted(set(secrets), key=len, reverse=True))  # a failure line may quote a secret
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}  # a retried run's attempt (runs.py)
    number = run.get("attempt")
    data = {
        "run": run.get("id") or rec["id"], "job": rec["id"], "backend": rec["backend"], "name": rec.get("name"),
        # 1-based: the record's attempt number is 0 for a run's first
        "attempt": number + 1 if isinstance(number, int) else attempt or 1,
        "state": event, "line": line[:2000], "time": time.time(),
    }
    return json.dumps(data, sort_keys=True).encode()


def _deliver(url: str, body: bytes) -> str:
    """POST ``body``; '' once a 2xx answers, else why not (never the URL): bounded tries and time."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + BUDGET_S
    why = ""
    for i in range(TRIES):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "halo-sched"})
        try:
            with urllib.request.urlopen(req, timeout=min(TRY_TIMEOUT_S, left)) as resp:
                if 200 <= resp.status < 300:
                    return ""
                why = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            why = f"HTTP {err.code}"
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            why = type(reason).__name__ if not isinstance(reason, str) else "no connection"
        pause = min(0.5 * 2 ** i, deadline - time.monotonic())
        if i + 1 < TRIES and pause > 0:
            time.sleep(pause)
    return why or "out of time"
