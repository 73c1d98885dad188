"""Submit and cancel exactly once through scheduler outages.

A request to a scheduler can fail three ways, and each needs its own answer:

* it certainly did not happen (connection refused, controller unreachable before the request
  was sent, HTTP 503 from a proxy): retry after a backoff;
* it may have happened (the connection dropped or timed out after the request was sent, an HTTP
  5xx from the server itself): AMBIGUOUS. Resending could make a second job. Every submission
  therefore carries a unique token, and after an ambiguous failure the token is looked up first;
  only a lookup that answers "not there" allows a resend. While the lookup itself cannot reach the
  scheduler, nothing is resent;
* it can never succeed (a bad partition, HTTP 4xx, an invalid job): fail at once with the
  scheduler's own words.

All retrying stops after ``retry_s`` seconds (``HALO_SUBMIT_RETRY_S``, default 120: longer than a
controller restart or a failover), with the last error and what is known: nothing reached the
scheduler (exit 1), or the outcome is unknown (exit 3) with the token to look for. Each retry is
one short line; the exception behind it only with ``--debug``. The pauses and the window are
:func:`halo_sched.retry.submission`, the one retry policy's setting for submissions; the errors
:class:`~halo_sched.retry.Transient` and :class:`~halo_sched.retry.Ambiguous` come from there too.
This module knows no scheduler; the SLURM transport and the Nomad client call it.
"""
from __future__ import annotations

import math
import re
import secrets
import time
from typing import Callable, TypeVar

from .errors import OutcomeUnknown, SchedulerError, cause_chain, debug
from .retry import Ambiguous, Transient, submission

T = TypeVar("T")

#: What a submission token looks like inside a SLURM comment or Nomad meta value.
TOKEN_PREFIX = "halo-token:"


def new_token() -> str:
    """A submission token: unique per submission, safe in a SLURM comment and a Nomad meta value."""
    return secrets.token_hex(12)


def _short(err: BaseException, limit: int = 160) -> str:
    """One line of at most ``limit`` characters: a retry line or the last error of a message."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_once(
    what: str,
    send: Callable[[], T],
    lookup: Callable[[], T | None],
    retry_s: float | None = None,
    *,
    token: str = "",
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[str], None] | None = None,
    who: str = "the scheduler",
    not_done: str = "it did not take effect",
) -> T:
    """``send()`` until it succeeds, never twice in effect.

    ``send`` raises :class:`Transient` or :class:`Ambiguous` for failures worth retrying (anything
    else propagates at once). ``lookup`` answers whether an earlier ``send`` took effect: the
    result (as ``send`` would have returned it) or None; it raises Transient/Ambiguous while it
    cannot tell. ``on_retry`` gets one short line per retry (for stderr; the exception behind it
    too with ``--debug``).

    When the window closes the error says what is known: ``who`` never got a request (every
    failure was Transient: ``not_done``, a SchedulerError, exit 1), or an ambiguous attempt was
    looked up and not found (``not_done`` too), or it may have taken effect
    (:class:`~halo_sched.errors.OutcomeUnknown`, exit 3, naming the token to look for).
    """
    policy = submission(retry_s)
    window = policy.budget_s
    must_look = False  # an ambiguous failure happened and no lookup has answered since
    reached = False  # some attempt may have reached the scheduler
    last: Exception | None = None
    attempts = 0

    def attempt() -> T:
        nonlocal must_look, reached, last, attempts
        try:
            if must_look:
                attempts += 1
                found = lookup()
                must_look = False
                if found is not None:
                    return found
            attempts += 1
            return send()
        except Ambiguous as err:
            must_look = reached = True
            last = err
        except Transient as err:
            last = err
        raise Transient(str(last))  # for the policy; the messages name ``last`` itself

    def announce(_err: BaseException, _tries: int, pause: float, left: float | None) -> None:
        if on_retry is None:
            return
        step = "looking it up, then retrying" if must_look else "retrying"
        pause_text = f"{pause:.0f}" if pause >= 1 else f"{pause:.1f}"
        line = f"{what}: {_short(last)} (attempt {attempts}; {step} in {pause_text} s, {math.ceil(left or 0)} s left)"
        if debug() and cause_chain(last):
            line += f"\n  {cause_chain(last)}"
        on_retry(line)

    try:
        return policy.call(attempt, sleep=sleep, clock=clock, before_retry=announce)
    except Transient:
        pass
    # One short line each (LINE_LIMIT with the CLI's "halo-sched: " before it): what happened,
    # the token where it matters, what to do; the last error only in a few words (its whole text
    # and the exceptions behind it are the error's cause: ``--debug``).
    span = f"{window:g} s"
    if must_look:
        raise OutcomeUnknown(
            f"{what}: outcome unknown (may have reached {who}): "
            + (f"look for token {token}" if token else f"ask {who} once it answers")) from last
    todo = f"; {not_done}: retry once {who} answers"
    if not reached:
        raise SchedulerError(_fit(f"{what}: nothing reached {who}", _cause(last, who), f" for {span}", todo)) from last
    raise SchedulerError(_fit(f"{what}: {who} never got it", "then " + _cause(last, who),
                              f" for {span}", todo)) from last


#: The longest final line of :func:`run_once` (the CLI puts "halo-sched: " before it: 160 in all).
LINE_LIMIT = 148


def _cause(err: BaseException | None, who: str) -> str:
    """The last error in a few words: without the client's ``sbatch: error:`` prefixes and the
    ``Nomad at ADDRESS:`` the retry lines already named."""
    text = " ".join(str(err).split()) if err is not None else ""
    text = re.sub(r"^(?:[a-z]+: (?:error: )?)+(?:Batch job submission failed: )?", "", text)
    text = re.sub(rf"^{re.escape(who)} at \S+?:? (?=\S)", "", text)
    return text.rstrip(".")


def _fit(head: str, cause: str, span: str, tail: str, limit: int = LINE_LIMIT) -> str:
    """``head (cause for span)tail`` within ``limit`` characters: head and tail are whole (what
    happened, what to do); the span goes first when room is short, then the cause is cut, and the
    parenthesis is left out when no room is left for it."""
    room = limit - len(head) - len(tail) - 3
    if len(cause) + len(span) <= room:
        return f"{head} ({cause}{span}){tail}"
    if room < 12:
        return head + tail
    if len(cause) > room:
        cause = cause[:room - 3].rstrip() + "..."
    return f"{head} ({cause}){tail}"
