"""The one retry policy (halo_sched.retry): its attempt limit, its time budget, what it retries."""
from __future__ import annotations

import pytest

from halo_sched.retry import NOMAD_CALLS, SLURM_CALLS, Ambiguous, RetryPolicy, Transient, submission


class Clock:
    """A clock that moves only when the policy sleeps, or when an attempt takes time."""

    def __init__(self, attempt_s: float = 0.0):
        self.t = 0.0
        self.attempt_s = attempt_s
        self.sleeps: list[float] = []
        self.starts: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s

    def failing(self, error: BaseException):
        def attempt():
            if len(self.starts) >= 1000:  # bounded even when the policy never stops
                raise AssertionError("the policy did not stop")
            self.starts.append(self.t)
            self.t += self.attempt_s
            raise error
        return attempt


def test_the_budget_is_honoured():
    clock = Clock(attempt_s=0.3)
    policy = RetryPolicy(attempts=None, budget_s=10.0, first_wait_s=0.5, max_wait_s=2.0)
    with pytest.raises(Transient, match="down"):
        policy.call(clock.failing(Transient("down")), sleep=clock.sleep, clock=clock)
    # No attempt starts once the budget is spent, and no pause runs past it.
    assert all(t <= 10.0 for t in clock.starts) and len(clock.starts) >= 5
    assert clock.t <= 10.0 + 0.3
    assert clock.sleeps[:3] == [0.5, 1.0, 2.0] and max(clock.sleeps) == 2.0


def test_the_attempt_limit_is_honoured_and_give_up_hears_the_count():
    clock = Clock()
    policy = RetryPolicy(attempts=3, first_wait_s=0.25, max_wait_s=10.0)
    seen = []
    with pytest.raises(RuntimeError, match="gave up after 3") as info:
        policy.call(clock.failing(Transient("busy")), sleep=clock.sleep, clock=clock,
                    before_retry=lambda err, n, pause, left: seen.append((str(err), n, pause, left)),
                    give_up=lambda last, n: RuntimeError(f"gave up after {n}: {last}"))
    assert len(clock.starts) == 3 and clock.sleeps == [0.25, 0.5]
    assert seen == [("busy", 1, 0.25, None), ("busy", 2, 0.5, None)]
    assert isinstance(info.value.__cause__, Transient)


@pytest.mark.parametrize("error", [ValueError("HTTP 400: invalid job"), Ambiguous("sent, then no answer")])
def test_what_is_not_transient_is_not_retried(error):
    clock = Clock()
    for policy in (SLURM_CALLS, NOMAD_CALLS, RetryPolicy(attempts=None, budget_s=60)):
        clock.starts.clear()
        with pytest.raises(type(error)):
            policy.call(clock.failing(error), sleep=clock.sleep, clock=clock)
        assert len(clock.starts) == 1 and clock.sleeps == []


def test_a_success_after_transient_failures_is_returned():
    answers = [Transient("a"), Transient("b"), "ok"]

    def attempt():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert SLURM_CALLS.with_(first_wait_s=0).call(attempt) == "ok" and not answers


def test_the_backends_settings(monkeypatch):
    # The figures the transports had before they shared one policy.
    assert (SLURM_CALLS.attempts, SLURM_CALLS.budget_s, SLURM_CALLS.first_wait_s, SLURM_CALLS.max_wait_s) == (3, None, 0.5, 10)
    assert (NOMAD_CALLS.attempts, NOMAD_CALLS.budget_s, NOMAD_CALLS.first_wait_s, NOMAD_CALLS.max_wait_s) == (4, 15, 0.25, 2)
    monkeypatch.setenv("HALO_SUBMIT_RETRY_S", "45")
    sub = submission()
    assert (sub.attempts, sub.budget_s, sub.first_wait_s, sub.max_wait_s) == (None, 45, 0.5, 8)
    assert submission(5).budget_s == 5
    assert SLURM_CALLS.with_(attempts=0).attempts == 1
    with pytest.raises(ValueError):
        RetryPolicy(attempts=None, budget_s=None)


def test_each_backend_hands_its_settings_to_the_policy():
    from halo_sched.backends.nomad.transport import NomadConfig
    from halo_sched.backends.slurm.transport import CliTransport, RestTransport

    assert NomadConfig().policy == NOMAD_CALLS
    cfg = NomadConfig(retry_attempts=7, retry_total_s=3.0, retry_base_s=0.1, retry_max_wait_s=0.4)
    assert cfg.policy == RetryPolicy(attempts=7, budget_s=3.0, first_wait_s=0.1, max_wait_s=0.4)
    assert CliTransport().policy == SLURM_CALLS
    assert CliTransport(retries=5, retry_wait=0.0).policy == SLURM_CALLS.with_(attempts=5, first_wait_s=0.0)
    assert RestTransport(url="http://127.0.0.1:1", token="t", retries=2).policy == SLURM_CALLS.with_(attempts=2)
