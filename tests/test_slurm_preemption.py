"""The preemption lifecycle on the real local SLURM cluster (tests/cluster/, task/affinity):
the warning reaches every rank while torchrun stays up, the ranks checkpoint, the job ends as
their exit codes say; with requeue, the job runs again under the same id and resumes.

The trainer is examples/train_ddp.py (gloo, 2 nodes x 2 ranks) with --step-time, so that it is
still training when the warning comes. The warning is only sent once rank 0 has logged its first
step: every rank has then installed its handler (a rank still starting ignores the warning). A job
of a few steps holds its first run at step HOLD until warned (--hold-at): beside the whole suite the
warning once came after a 60-step first run had ended (15 s of steps), and nothing was saved.

Receipt is proven by each rank itself: its signal handler appends one line per signal to
``warned/rank<R>.warned`` (--warning-dir). A rank's ``stopped`` flag proves nothing of the kind
(it comes from an all_reduce, so one warned rank stops them all), nor does the entry script's
"SIGUSR2 to rank R" line (the sender's word).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, slurm_jwt

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

TRAINER = str(REPO / "examples" / "train_ddp.py")
#: The step a requeued job's first run waits at until warned, and its steps in all.
HOLD, STEPS = 10, 30


_submitted: list[str] = []


@pytest.fixture
def env(slurm_cluster):
    e = slurm_env(slurm_cluster)
    yield e
    # These trainers run until warned: a failed test must not leave one holding the nodes.
    if _submitted:
        cli("cancel", *_submitted, "--backend", "slurm", env=e)
        _submitted.clear()


def _job(tmp_path, args, **overrides) -> Path:
    trainer = {"script": TRAINER, "args": ["--report-dir", str(tmp_path / "reports"), "--warning-dir",
                                           str(tmp_path / "warned"), "--checkpoint-dir", str(tmp_path / "ckpt"), *args]}
    return example_job(tmp_path, free_port(), trainer=trainer, **overrides)


def _status(job_id, env) -> dict:
    return json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)


def _output(tmp_path, job_id) -> str:
    path = tmp_path / f"halo-ddp-cpu-{job_id}.out"  # the default --output, in the submit directory
    return path.read_text() if path.exists() else ""


def _wait_for_training(tmp_path, job_id, env, timeout=180) -> None:  # pending time included
    deadline = time.monotonic() + timeout
    # srun --label "0: ", then maybe torchrun's "[rank 0] " line prefix.
    while not re.search(r"^0: (\[rank 0\] )?step +0 ", _output(tmp_path, job_id), re.M):
        assert time.monotonic() < deadline, f"no step logged in {timeout}s:\n{_output(tmp_path, job_id)}"
        assert _status(job_id, env)["status"] in ("PENDING", "RUNNING"), _output(tmp_path, job_id)
        time.sleep(0.5)


def _wait_for_end(job_id, env, timeout=120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(job_id, env)
        if st["status"] not in ("PENDING", "RUNNING"):
            return st
        assert time.monotonic() < deadline, st
        time.sleep(1)


def _reports(tmp_path, suffix="") -> list[dict]:
    return [json.loads((tmp_path / "reports" / f"rank{r}{suffix}.json").read_text()) for r in range(4)]


def _receipts(tmp_path, restart: int = 0) -> dict[int, list[tuple[float, int]]]:
    """rank -> (time, pid) of each warning the rank's own handler recorded, in run ``restart``."""
    suffix = f"-restart{restart}" if restart else ""
    out = {}
    for r in range(4):
        path = tmp_path / "warned" / f"rank{r}{suffix}.warned"
        lines = path.read_text().splitlines() if path.exists() else []
        out[r] = [(float(t), int(p)) for t, p in (line.split() for line in lines)]
    return out


def _assert_each_rank_got_it_once(tmp_path, out: str, restart: int = 0, after: float | None = None) -> dict:
    got = _receipts(tmp_path, restart)
    assert all(len(v) == 1 for v in got.values()), (got, out[-3000:])
    # Written by the rank's own process (its report's pid), not by a worker or a bystander.
    reports = _reports(tmp_path, f"-restart{restart}" if restart else "")
    assert all(got[x["rank"]][0][1] == x["pid"] for x in reports), (got, [x["pid"] for x in reports])
    if after is not None:
        assert all(v[0][0] >= after for v in got.values()), (after, got)
    return got


def _submit(job, tmp_path, env) -> str:
    r = cli("submit", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    _submitted.append(r.stdout.strip().splitlines()[-1])
    return _submitted[-1]


def test_cancel_signal_is_a_warning_every_rank_saves_and_the_job_completes(tmp_path, env):
    """`cancel --signal USR2` is a warning: every rank saves and the job completes. Long: a real 2x2 torchrun on
    SLURM must be training before the warning, then every rank checkpoints and the step ends."""
    job = _job(tmp_path, ["--steps", "100000", "--step-time", "0.2"], slurm={"cpus_per_task": 2})
    job_id = _submit(job, tmp_path, env)
    _wait_for_training(tmp_path, job_id, env)
    sent = time.time()
    r = cli("cancel", job_id, "--backend", "slurm", "--signal", "USR2", env=env)
    assert r.returncode == 0, r.stderr
    st = _wait_for_end(job_id, env)
    out = _output(tmp_path, job_id)
    # Exit 0 after the checkpoint: COMPLETED, not FAILED exit 140 (torchrun killed by USR2).
    assert st["status"] == "COMPLETED" and st["exit_code"] == 0, (st, out)
    ranks = _reports(tmp_path)
    # Every rank stopped at the agreed step, and every rank's own handler got the signal, once.
    assert all(x["stopped"] for x in ranks), ranks
    _assert_each_rank_got_it_once(tmp_path, out, after=sent - 1)
    assert all(f"SIGUSR2 to rank {r} (pid" in out for r in range(4)), out
    # One step for all, a checkpoint on disk, and the world still whole after the signal (the
    # reports are written after an all_reduce over all 4 ranks): torchrun stayed up on both nodes.
    assert len({x["saved_step"] for x in ranks}) == 1 and ranks[0]["saved_step"] >= 0
    assert (tmp_path / "ckpt" / "checkpoint.pt").exists()
    assert all(x["ok"] and x["world_size"] == 4 for x in ranks)
    assert "death signal" not in out and "SIGUSR2 at" in out
    # slurm.cpus_per_task: 2 reaches srun: under task/affinity each node's ranks get both CPUs.
    assert all(len(x["cpu_affinity"]) == 2 for x in ranks), [x["cpu_affinity"] for x in ranks]
    print(f"signal -> last rank's checkpoint: {max(x['saved_at'] for x in ranks) - sent:.2f}s; "
          f"affinity per rank: {[x['cpu_affinity'] for x in ranks]}")


def test_requeue_resumes_from_the_checkpoint_and_wait_follows_to_the_end(tmp_path, env):
    """A warned job checkpoints, requeues and resumes from its step; `submit --wait` follows it to the end. Long: two real
    2x2 torchrun starts on SLURM, the requeue between them (cred_expire + 1 s), and 30 steps of 0.25 s."""
    # exclusive: the job holds both CPUs of each node, and srun passes them on without
    # slurm.cpus_per_task (from SLURM_JOB_CPUS_PER_NODE).
    job = _job(tmp_path, ["--steps", str(STEPS), "--step-time", "0.25", "--hold-at", str(HOLD)],
               slurm={"requeue": True, "exclusive": True})
    waiter = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "submit", str(job), "--backend", "slurm", "--wait"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        job_id = None
        while job_id is None:
            assert time.monotonic() < deadline and waiter.poll() is None
            line = waiter.stderr.readline()
            m = re.search(r"submitted .* as (\d+)", line)
            job_id = m.group(1) if m else None
        _submitted.append(job_id)
        _wait_for_training(tmp_path, job_id, env)
        assert cli("cancel", job_id, "--backend", "slurm", "--signal", "USR2", env=env).returncode == 0
        stdout, stderr = waiter.communicate(timeout=180)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    out = _output(tmp_path, job_id)
    assert waiter.returncode == 0, (stderr, out)
    assert stdout.strip().splitlines()[-1] == job_id  # the same job id throughout
    assert "run 2" in stderr and "COMPLETED" in stderr, stderr
    first, second = _reports(tmp_path), _reports(tmp_path, "-restart1")
    assert all(x["restart_count"] == 0 and x["saved_step"] is not None for x in first), (first, out)
    _assert_each_rank_got_it_once(tmp_path, out)
    assert not any(_receipts(tmp_path, restart=1).values()), "run 2 was never warned"
    saved = first[0]["saved_step"]
    assert saved < HOLD, first
    assert all(x["restart_count"] == 1 and x["resumed_from"] == saved and x["last_step"] == STEPS - 1
               for x in second), second
    # Both runs in one output file (--open-mode=append).
    assert "requeueing for run 2" in out and f"run 2: resumed from the checkpoint of step {saved}" in out
    assert all(len(x["cpu_affinity"]) == 2 for x in first + second), [x["cpu_affinity"] for x in first]
    st = _status(job_id, env)
    assert st["status"] == "COMPLETED" and st.get("restarts") == 1, st


def test_a_warning_through_slurmrestd_reaches_each_rank_once_and_requeues(tmp_path, env):
    """A warning sent through slurmrestd reaches each rank once and the job requeues and completes. Long: two real
    2x2 torchrun starts on SLURM with a requeue between them, and 30 steps of 0.25 s."""
    # slurmrestd signals every process of the job (KILL_FULL_JOB); halo-sched sends URG, which the
    # batch script takes as the warning (so it requeues) and every node's entry hands on once.
    from halo_sched.backends.slurm.transport import RestTransport

    job = _job(tmp_path, ["--steps", str(STEPS), "--step-time", "0.25", "--hold-at", str(HOLD)],
               slurm={"requeue": True, "cpus_per_task": 2})
    job_id = _submit(job, tmp_path, env)
    _wait_for_training(tmp_path, job_id, env)
    rest = RestTransport(url=env["HALO_SLURMRESTD_URL"], token=slurm_jwt(env=env), user="root")
    rest.cancel([job_id], signal="USR2")
    deadline = time.monotonic() + 180
    while not ((tmp_path / "reports" / "rank3-restart1.json").exists() and _status(job_id, env)["status"] == "COMPLETED"):
        assert time.monotonic() < deadline and _status(job_id, env)["status"] not in ("FAILED", "CANCELLED"), \
            _output(tmp_path, job_id)
        time.sleep(1)
    out = _output(tmp_path, job_id)
    first, second = _reports(tmp_path), _reports(tmp_path, "-restart1")
    assert all(x["stopped"] and x["saved_step"] is not None for x in first), (first, out)
    # URG went to every process of the job; each rank still got SIGUSR2 exactly once.
    _assert_each_rank_got_it_once(tmp_path, out)
    assert not any(_receipts(tmp_path, restart=1).values()), "run 2 was never warned"
    assert all(f"SIGUSR2 to rank {r} (pid" in out for r in range(4)), out
    assert all(x["restart_count"] == 1 and x["last_step"] == STEPS - 1 for x in second), second
    assert "requeueing for run 2" in out


def test_time_limit_warning_through_slurm_signal(tmp_path, env):
    """SLURM's own time-limit warning (--signal=USR2@120) reaches every rank once and the job completes. Long:
    slurmctld checks time limits every 30 s, so the warning comes 30-60 s after the start of a 3-minute job."""
    # time=3 minutes, warning 120 s before: slurmctld looks at time limits every 30 s (PERIODIC_TIMEOUT)
    # and sends the warning once the end is at most warn_time + 30 s away (job_mgr.c
    # send_job_warn_signal), so 30-60 s after the start, maybe before every rank has installed its
    # handler on this loaded machine: the entry holds it until each has. That leaves the ranks 120 s
    # to save and stop (60 s, with a 2-minute job, was once too little beside the whole suite: TIMEOUT).
    # The trainer would run for hours otherwise.
    job = _job(tmp_path, ["--steps", "100000", "--step-time", "0.2"],
               slurm={"time": "3", "signal": "USR2@120", "cpus_per_task": 2})
    job_id = _submit(job, tmp_path, env)
    st = _wait_for_end(job_id, env, timeout=270)
    out = _output(tmp_path, job_id)
    assert st["status"] == "COMPLETED" and st["exit_code"] == 0, (st, out)
    ranks = _reports(tmp_path)
    assert all(x["stopped"] and x["saved_step"] == ranks[0]["saved_step"] for x in ranks), ranks
    _assert_each_rank_got_it_once(tmp_path, out)
    assert all(f"SIGUSR2 to rank {r} (pid" in out for r in range(4)), out


def test_a_warning_before_the_trainers_handle_it_is_held_until_they_do(tmp_path, env):
    """A warning that comes before the ranks handle it is held until they do. Long: the ranks install their
    handler 20 s late on purpose, after a real 2x2 torchrun start on SLURM."""
    # The ranks install their handler 20 s late; the warning comes as soon as the job runs, while
    # setup, torchrun or the ranks still start (it used to be ignored there, and the run was lost
    # at the deadline).
    job = _job(tmp_path, ["--steps", "100000", "--step-time", "0.2", "--handler-after", "20"],
               slurm={"cpus_per_task": 2})
    job_id = _submit(job, tmp_path, env)
    deadline = time.monotonic() + 90
    while "halo-sched: job" not in _output(tmp_path, job_id):  # the batch script runs
        assert time.monotonic() < deadline and _status(job_id, env)["status"] in ("PENDING", "RUNNING")
        time.sleep(0.2)
    sent = time.time()
    assert cli("cancel", job_id, "--backend", "slurm", "--signal", "USR2", env=env).returncode == 0
    st = _wait_for_end(job_id, env)
    out = _output(tmp_path, job_id)
    assert st["status"] == "COMPLETED" and st["exit_code"] == 0, (st, out)
    ranks = _reports(tmp_path)
    # Each rank got it once its handler was in place, 20 s after the rank started: held that long.
    held = {int(r): int(s) for r, s in re.findall(r"SIGUSR2 to rank (\d+) \(pid \d+\), (\d+) s after the warning", out)}
    assert sorted(held) == [0, 1, 2, 3] and min(held.values()) >= 15, (held, out)
    # Each rank's own handler got it once, after the 20 s it took to install it.
    _assert_each_rank_got_it_once(tmp_path, out, after=sent + 15)
    assert all(x["stopped"] and x["ok"] for x in ranks), ranks
    assert len({x["saved_step"] for x in ranks}) == 1, ranks
    print(f"held: the entry handed the warning on {sorted(held.values())} s after it came")


def test_a_rank_failing_after_the_warning_fails_the_job_and_is_not_requeued(tmp_path, env):
    """A rank that fails after the warning fails the job, which is not requeued. Long: a real 2x2 torchrun on SLURM
    trains first, then the failure must go through torchrun and srun's --kill-on-bad-exit to the job's end."""
    job = _job(tmp_path, ["--steps", "100000", "--step-time", "0.2", "--fail-on-warning", "2"],
               slurm={"requeue": True, "cpus_per_task": 2})
    job_id = _submit(job, tmp_path, env)
    _wait_for_training(tmp_path, job_id, env)
    assert cli("cancel", job_id, "--backend", "slurm", "--signal", "USR2", env=env).returncode == 0
    st = _wait_for_end(job_id, env)
    out = _output(tmp_path, job_id)
    assert st["status"] == "FAILED" and st["exit_code"] not in (None, 0), (st, out)
    assert not st.get("restarts") and "requeueing" not in out, out
