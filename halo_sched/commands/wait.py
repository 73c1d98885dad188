"""``submit`` and ``watch``: submitting a job and waiting for its end (live progress, its logs,
a run's next attempt after a failure ``retry.on`` lists), and the exit code that end gives."""
from __future__ import annotations

import re
import sys
import threading

from . import Progress, raw, say
from ..errors import EXIT_INTERRUPTED
from .jobids import refuse_unknown, resolve_one


def cmd_submit(args, scheduler) -> int:
    from ..errors import UsageError
    from .jobfile import load_job

    if args.json and args.dry_run:
        raise UsageError("--json and --dry-run: a dry run prints the rendered job, which has no id")
    spec = load_job(args.file, args.set)
    sched = scheduler(args.backend)
    if args.dry_run:
        # What submit would refuse before sending anything, refused here too (exit 2): a
        # trainer.script that is not there (before anything is printed), an unset secret_env
        # variable (named by its field; no value is ever shown).
        from ..spec import checked_script

        for line in checked_script(spec, args.backend).notes:
            say(f"halo-sched: warning: {line}")
        dry = sched.dryrun(spec)
        raw(sys.stdout, dry.text if dry.text.endswith("\n") else dry.text + "\n")  # byte for byte
        sys.stdout.flush()
        spec.secret_values()
        return 0
    job_id = sched.submit(spec).id  # the one submit pipeline (backends/base.py), as the library's
    rc = 0
    args.current = job_id  # a run's attempt being waited on (a retry moves it on)
    args.final = None  # --wait: the state the wait ended on (of the run's last attempt)
    try:
        say(f"halo-sched: submitted {spec.name} to {args.backend} as {job_id}")
        if args.wait:
            rc = _wait_after_submit(args, spec, sched, job_id)
    except KeyboardInterrupt:
        now = args.current
        say(f"\nhalo-sched: stopped waiting; {now} keeps running (halo-sched cancel {now} --backend {args.backend})")
        rc = EXIT_INTERRUPTED
    finally:
        # The job exists whatever happened while waiting: its id is always the last line (with
        # --json, in the one JSON object that is).
        if args.json:
            from . import json_line
            from .show import state_json

            out = {"id": job_id, "backend": args.backend, "name": spec.name}
            if args.wait:  # the final state; null when the wait did not end (interrupted, an error)
                out["state"] = state_json(args.final) if args.final is not None else None
            print(json_line(out), flush=True)
        else:
            print(job_id, flush=True)
    return rc


def _wait_after_submit(args, spec, sched, job_id: str) -> int:
    from ..core import wait_after_submit

    progress = Progress(sched, job_id)
    streams = not args.quiet and sched.streams_logs
    if streams:
        progress.tty = False  # a rewritten line would garble the interleaved logs

    def log(line: str) -> None:
        sys.stderr.write(line)
        sys.stderr.flush()

    if getattr(spec, "retry", None) is not None:  # a run: the next attempt after a listed failure
        return _wait_run(args, spec, sched, job_id)
    # For a person: repeated tracebacks folded, halo-sched's failure lines left out (logs has all).
    live = LiveLog(log, job_id)
    try:
        state = wait_after_submit(
            sched, spec, job_id, timeout=args.timeout,
            on_change=None if args.quiet else progress.change, on_tick=None if args.quiet else progress.tick,
            on_log=live.line if streams else None, on_log_end=lambda err: say(f"halo-sched: log stream ended: {err}"))
    finally:
        live.close()
    args.final = state
    rc = _report_end(job_id, state, args.timeout)
    _notify_note(job_id, sched.name)
    return rc


def _notify_note(job_id: str, backend: str, wait_s: float = 1.0) -> None:
    """After the end: a notification delivered within ``wait_s`` is not mentioned; one that failed
    is said; one still on its way is said to go on in the background (never waited for longer)."""
    import time

    from ..notify import outcomes, undelivered_lines

    deadline = time.monotonic() + wait_s
    while any(state == "pending" for _, state, _, _ in outcomes(job_id, backend)) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = undelivered_lines(job_id, backend)
    for line in lines:
        say(f"halo-sched: {job_id}: {line}")
    if not lines and any(state == "pending" for _, state, _, _ in outcomes(job_id, backend)):
        say(f"halo-sched: {job_id}: notify: delivery goes on in the background (halo-sched status {job_id} shows "
            f"its outcome)")


def _wait_run(args, spec, sched, job_id: str, watching: bool = False) -> int:
    """``submit --wait`` of a job with ``retry:``: each attempt waited on as a plain job is, the
    next one submitted after a failure ``retry.on`` lists (halo_sched/runs.py); the run's
    attempts and GPU-hours at the end."""
    from ..core import wait_after_submit
    from ..runs import attempts_of, describe_rows, effective, wait_run

    submitted_here = set() if watching else {job_id}  # the attempts this process submitted

    def one(attempt_id: str) -> "object":
        progress = Progress(sched, attempt_id)

        def changed(st) -> None:
            if not args.quiet:
                progress.change(st)

        if attempt_id not in submitted_here:  # submitted earlier or elsewhere: no placement guard
            from ..core import noting

            return sched.wait(attempt_id, timeout=args.timeout, on_change=noting(sched.name, attempt_id, changed, sched),
                              on_tick=None if args.quiet else progress.tick)
        return wait_after_submit(sched, spec, attempt_id, timeout=args.timeout, on_change=changed,
                                 on_tick=None if args.quiet else progress.tick)

    def retried(old: str, state, why: str, new: str) -> None:
        args.current = new
        submitted_here.add(new)
        seen_end.add(old)
        say(f"halo-sched: {old} {state.describe()}")
        say(f"halo-sched: retrying ({why} fault) as {new}")

    from .. import records

    def followed(old: str, new: str) -> None:
        args.current = new
        last = ((records.find(old, sched.name, on_bad=None) or [{}])[0].get("last_state") or {}).get("describe")
        if isinstance(last, str) and old not in seen_end:
            say(f"halo-sched: {old} {last}")
        say(f"halo-sched: {old} was followed by {new} (the run's next attempt)")

    seen_end: set = set()  # attempts whose end this process already said

    run_id = ((records.find(job_id, sched.name) or [{}])[0].get("run") or {}).get("id") or job_id
    last_id, state = wait_run(sched, spec, job_id, one, retried, followed)
    args.final = state
    if watching:
        from ..core import note

        note(sched.name, last_id, state, sched)
    rc = _report_end(last_id, state, args.timeout)
    for line in describe_rows(attempts_of(run_id, sched.name), effective(run_id, sched.name)):
        say(f"halo-sched: {run_id}: {line.strip()}")
    _notify_note(last_id, sched.name)
    return rc


def _report_end(job_id: str, state, timeout: float | None) -> int:
    """The last word of a wait on stderr; the exit code: 0 only for a completed job."""
    from ..backends.base import JobStatus
    from ..errors import EXIT_OUTCOME_UNKNOWN

    if state.status is JobStatus.UNKNOWN:
        say(f"halo-sched: {job_id}: the scheduler no longer knows this job; its outcome is unknown ({state.reason})")
        return EXIT_OUTCOME_UNKNOWN
    if not state.status.terminal:
        say(f"halo-sched: {job_id} still {state.status.value} after --timeout {timeout:g}s")
    else:
        say(f"halo-sched: {job_id} {state.describe()}")
    return 0 if state.status is JobStatus.COMPLETED else 1


def cmd_watch(args, scheduler) -> int:
    backend = resolve_one(args.id, args.backend)
    sched = scheduler(backend)
    refuse_unknown(backend, sched, args.id)
    from ..core import noting

    spec = _run_spec(backend, args.id)
    if spec is not None:  # an attempt of a run with retry: the next attempt after a listed failure
        args.current = args.id
        try:
            return _wait_run(args, spec, sched, args.id, watching=True)
        except KeyboardInterrupt:
            say(f"\nhalo-sched: stopped watching; {args.current} (the run's current attempt) keeps running")
            return EXIT_INTERRUPTED
    progress = Progress(sched, args.id)
    try:
        state = sched.wait(args.id, timeout=args.timeout,
                           on_change=noting(backend, args.id, None if args.quiet else progress.change, sched),
                           on_tick=None if args.quiet else progress.tick)
    except KeyboardInterrupt:
        say(f"\nhalo-sched: stopped watching; {args.id} keeps running")
        return EXIT_INTERRUPTED
    return _report_end(args.id, state, args.timeout)


def _run_spec(backend: str, job_id: str):
    """The spec of a recorded job that has ``retry:`` (``watch`` then retries as ``submit --wait``
    would), with its job file and git state as recorded; None otherwise."""
    from .. import records

    rec = (records.find(job_id, backend) or [{}])[0]
    data = rec.get("spec")
    if not isinstance(data, dict) or not data.get("retry"):
        return None
    from ..spec import from_record

    return from_record(rec)


class LiveLog:
    """The job's log as ``submit --wait`` shows it live, for a person (``halo-sched logs`` and the
    job's own files keep every line):

    - the ``halo-sched-failure {...}`` lines, which are for halo-sched to read, are left out (the
      last line says who failed first, from them);
    - a traceback that another rank or node printed already, the same but for its numbers (a
      rank, a pid, a time), is folded into one line naming the first: torchrun prints one per
      node, and every rank of a bad job raises the same error.

    A traceback is held back only while it matches, line by line, one already shown, until it is
    as long as that one; anything else passes at once, and nothing that differs is ever left out.
    ``write`` gets whole lines; :meth:`close` at the end writes what is still held back."""

    #: Tracebacks remembered to fold against, and the lines of one compared (bounds on what is kept).
    MAX_SHOWN, MAX_LINES = 64, 400
    _TAGS = re.compile(r"^((?:\[[^\]\n]{1,60}\] ){0,3})(.*)$", re.S)
    _RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torch's own prefix of a rank's uncaught error
    _NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
    _START = "Traceback (most recent call last):"
    _CHAIN = ("During handling of the above exception, another exception occurred:",
              "The above exception was the direct cause of the following exception:")
    _RULE = "=" * 20  # torchrun's failure summary sits between two lines of these

    def __init__(self, write, job_id: str):
        from ..node.failure_collector import TAG

        self.write, self.job_id, self.tag = write, job_id, f"{TAG} {{"
        self.shown: list[tuple[tuple[str, ...], str]] = []  # (its lines, numbers aside; whose)
        self.open: dict[str, dict] = {}  # a source's tags -> the traceback it is printing
        self.lock = threading.Lock()  # lines come from the log's follower, close from the waiter

    def line(self, text: str) -> None:
        with self.lock:
            self._line(text)

    def _line(self, text: str) -> None:
        text = text if text.endswith("\n") else text + "\n"
        tags, message = self._TAGS.match(text[:-1]).groups()
        if self.tag in message:
            return
        message = self._RANK_PREFIX.sub("", message)
        block = self.open.get(tags)
        if block is not None and not self._continues(block, message):
            self._end(tags)
            block = None
        if block is None:
            if message.strip() != self._START:
                self.write(text)
                return
            block = self.open[tags] = {"phase": "frames", "keys": [], "held": [], "state": "matching"}
        self._add(tags, block, text, self._NUMBERS.sub("0", message).rstrip())

    def _continues(self, block: dict, message: str) -> bool:
        """Whether ``message`` (from the source of ``block``) is more of that traceback (its
        phase moves on): frames, the exception's line, a chained one, torchrun's summary."""
        phase, stripped = block["phase"], message.strip()
        if phase == "done":
            return False
        if phase == "frames":
            if message[:1] not in (" ", "\t"):
                block["phase"] = "raised"  # the exception's own line
            return True
        if phase == "raised":
            if stripped == self._START:
                block["phase"] = "frames"
            elif stripped.startswith(self._RULE):
                block["phase"] = "summary"
            elif stripped and stripped not in self._CHAIN:
                return False
            return True
        if stripped.startswith(self._RULE):
            block["phase"] = "done"
        return True

    def _candidates(self, tags: str) -> list[tuple[tuple[str, ...], str, bool]]:
        """(lines, whose, complete) of the tracebacks shown: ended, or being printed elsewhere."""
        out = [(lines, whose, True) for lines, whose in self.shown]
        for other, b in self.open.items():
            if other != tags and b["state"] == "shown":
                out.append((tuple(b["keys"]), other.strip() or "the job", b["phase"] in ("raised", "done")))
        return out

    def _add(self, tags: str, block: dict, text: str, key: str) -> None:
        if len(block["keys"]) < self.MAX_LINES:
            block["keys"].append(key)
        if block["state"] != "matching":  # shown as it comes (a repeat's lines past its fold too)
            self.write(text)
            return
        block["held"].append(text)
        keys = tuple(block["keys"])
        alike = [(lines, whose, done) for lines, whose, done in self._candidates(tags) if lines[:len(keys)] == keys]
        if not alike or len(keys) >= self.MAX_LINES:  # not a repeat: what was held back, then the rest as it comes
            block["state"] = "shown"
            for held in block["held"]:
                self.write(held)
            block["held"] = []
            return
        complete = block["phase"] in ("raised", "done")
        same = next((whose for lines, whose, done in alike if done and complete and len(lines) == len(keys)), None)
        if same is not None:
            block["state"] = "folded"
            self.write(f"{tags}(a traceback of {len(block['held'])} lines, the same as {same}'s but for its "
                       f"numbers: folded; `halo-sched logs {self.job_id}` has it)\n")
            block["held"] = []

    def _end(self, tags: str) -> None:
        block = self.open.pop(tags)
        for held in block["held"]:
            self.write(held)
        if block["state"] != "folded" and len(self.shown) < self.MAX_SHOWN:
            self.shown.append((tuple(block["keys"]), tags.strip() or "the job"))

    def close(self) -> None:
        with self.lock:
            for tags in list(self.open):
                self._end(tags)
