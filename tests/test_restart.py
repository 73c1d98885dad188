"""Restart in place first (issue 39 item 1): what a SLURM batch script decides after a failed step
(halo_sched/node/restart.py), the signed restart lines read back by ``status``, the budget and the
restart count handed to a successor, and the rendered step loop run by bash with stand-in
srun/scontrol/torchrun: a job fault restarts in place, the same failure at the same step twice
ends the run (a crash loop) with no successor. The cluster test, with real torchrun, is
tests/test_spares_slurm.py."""
from __future__ import annotations

import json
import os
import subprocess
import time

import halo_sched
from halo_sched.node import restart
from halo_sched.node.failure_classes import JOB_FAULT, UNKNOWN_CAUSE
from halo_sched.node.failure_collector import record_line
from halo_sched.node.failures import FailureReport, RankFailure, parse_line
from halo_sched.node.spares import step_failures
from helpers import REPO, example_job, fake_bin, scontrol_show_job, write_tool

KEY = "k" * 64
NCCL = ("h2:1:2 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<35162> "
        "with status=12 opcode=129 len=65536")
XID = {"evidence": ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."]}
RANKS, ALLOC = ["n1", "n2"], ["n1", "n2", "n3"]


def _line(node: int, host: str, error: str, at: float, key: str = KEY, **kw) -> str:
    rec = {"node": node, "rank": node, "local_rank": 0, "host": "vm", "exit_code": 1, "signal": None, "time": at,
           "error": error, "tail": [], "stopped": False, "node_name": host, **kw}
    return f"{node}: " + record_line(rec, key=key, secrets=[])


def _report(*lines):
    return step_failures(list(lines), KEY, 0.0, RANKS)


def _decide(report, **kw):
    kw.setdefault("on", ["job"])
    kw.setdefault("attempts", 3)
    return restart.decide(RANKS, ALLOC, report, **kw)


def test_a_failure_retry_on_lists_that_is_no_node_s_restarts_in_place():
    now = time.time()
    job = _report(_line(1, "n2", "ValueError: bad batch", now, step=12))
    d = _decide(job)
    assert (d.action, d.step, d.cls.failure) == (restart.IN_PLACE, 12, JOB_FAULT) and d.swaps == ()
    assert d.why == "job fault: Python exception at step 12", d.why
    # job and unknown are opt-in: the default [node] leaves the run's usual path to it.
    d = _decide(job, on=["node"])
    assert d.action == restart.END and "job is not in retry.on" in d.why, d.why
    unknown = _report(_line(1, "n2", NCCL, now))  # the rank's words alone: unknown cause, labelled
    assert _decide(unknown, on=["unknown"]).action == restart.IN_PLACE
    assert _decide(unknown, on=["job"]).action == restart.END
    assert _decide(None, on=["unknown"]).cls.failure is UNKNOWN_CAUSE  # no signed line at all
    # A hang with no culprit node (inside a collective): retry.on's hang restarts it in place.
    hung = RankFailure(node=1, rank=1, local_rank=0, host="vm", exit_code=None, signal=None, time=now, kind="HUNG",
                       node_name="n2", step=3, last_progress=now - 300, stack_read=True, waiting_in="all_reduce")
    d = _decide(FailureReport([hung]), on=["hang"])
    assert d.action == restart.IN_PLACE and d.step == 3
    # No retry: in the job file (spares alone): the loop ends.
    assert _decide(job, on=None, spares=1).action == restart.END


def test_a_node_s_fault_goes_to_a_spare_or_back_to_the_queue_never_in_place():
    now = time.time()
    node = _report(_line(1, "n2", NCCL, now, **XID))
    d = _decide(node, on=["node", "job"], spares=1)
    assert d.action == restart.SWAP and [s[:3] for s in d.swaps] == [(1, "n2", "n3")]
    d = _decide(node, on=["node", "job"], spares=1, swapped=["n3"])  # the spare used up
    assert d.action == restart.END and d.why.startswith("no spare swap:"), d.why
    d = _decide(node, on=["node", "job"])  # no spares: the successor's queue, keeping off n2
    assert d.action == restart.END and "no spare" in d.why
    # A host of the rank map gone from the allocation: a node's fault too.
    assert restart.decide(RANKS, ["n1", "n3"], None, on=["unknown"], attempts=3, spares=1).action == restart.SWAP


def test_a_peer_s_victim_dated_first_yields_to_the_crash_it_saw():
    """A crash is dated by its exit (torchrun's whole second for a SIGKILL; a traceback's process
    closes its sockets only once torch has torn down, seconds under load), its victim by the
    "Connection closed by peer" its socket's close raised: the victim can read earlier. Within
    spares.VICTIM_S the crash is the step's cause, for the restart and the swap alike."""
    now = time.time()
    victim = _line(0, "n1", "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1",
                   now)
    d = _decide(_report(victim, _line(1, "n2", "ValueError: bad batch", now + 1.5, step=7)))
    assert (d.action, d.cls.failure, d.step) == (restart.IN_PLACE, JOB_FAULT, 7), d
    killed = _line(1, "n2", "killed by SIGKILL", now + 0.9, signal="SIGKILL")
    d = _decide(_report(victim, killed), on=["node"], spares=1)
    assert d.action == restart.SWAP and d.swaps[0][1] == "n2", d
    # Later than that, or a victim alone: the victim's words stand (unknown cause, labelled).
    assert _decide(_report(victim, _line(1, "n2", "ValueError: x", now + 9))).cls.failure is UNKNOWN_CAUSE
    assert _decide(_report(victim)).cls.failure is UNKNOWN_CAUSE


def test_restarts_in_place_use_the_attempts_of_retry_attempts():
    job = _report(_line(1, "n2", "ValueError: bad batch", time.time(), step=12))
    assert _decide(job, attempts=3, used=1).action == restart.IN_PLACE
    d = _decide(job, attempts=3, used=2)
    assert d.action == restart.END and "all 3 attempts of retry.attempts used" in d.why, d.why
    assert _decide(job, attempts=1).action == restart.END


def test_the_same_failure_at_the_same_step_twice_is_a_crash_loop():
    now = time.time()
    at12 = _decide(_report(_line(1, "n2", "ValueError: bad batch", now, step=12)))
    again = _decide(_report(_line(1, "n2", "ValueError: other words", now + 9, step=12)), seen=[at12.sig])
    assert again.action == restart.STOP, again
    assert again.why == "crash loop: job fault: Python exception at step 12 twice; not restarting", again.why
    # Not the last failure but an earlier one of this job, at the same step: a loop too.
    other = _decide(_report(_line(1, "n2", "ValueError: x", now, step=40))).sig
    assert _decide(_report(_line(1, "n2", "ValueError: x", now, step=12)), seen=[at12.sig, other]).action == restart.STOP
    # Another step, or another class at the same step: progress, restarted.
    assert _decide(_report(_line(1, "n2", "ValueError: x", now, step=13)), seen=[at12.sig]).action == restart.IN_PLACE
    oom = _decide(_report(_line(1, "n2", "torch.OutOfMemoryError: CUDA out of memory.", now, step=12)), seen=[at12.sig])
    assert oom.action == restart.IN_PLACE


def test_with_no_step_known_the_same_failure_twice_in_a_row_is_the_loop():
    now = time.time()
    first = _decide(_report(_line(1, "n2", "ValueError: bad batch", now)))
    assert first.step is None and first.action == restart.IN_PLACE
    d = _decide(_report(_line(1, "n2", "ValueError: bad batch", now + 5)), seen=[first.sig])
    assert d.action == restart.STOP and d.why.endswith("twice in a row with no progress between; not restarting"), d.why
    # Something else failed between: not in a row.
    between = _decide(_report(_line(1, "n2", "ValueError: x", now, step=3))).sig
    assert _decide(_report(_line(1, "n2", "ValueError: bad batch", now)), seen=[first.sig, between]).action \
        == restart.IN_PLACE


def test_the_step_s_lines_begin_where_the_step_before_was_decided(tmp_path):
    """A restart in place runs on the same hosts: the line of the step before, dated within the
    clock's slack of this step's start, would pass the time and host filters; the output file's
    offset at the decision before keeps it out."""
    out = tmp_path / "halo-job-7.out"
    now = time.time()
    out.write_text("noise\n" + _line(1, "n2", "ValueError: x", now, step=12) + "\n")
    lines, end = restart.failure_lines(str(out), 0)
    assert len(lines) == 1 and end == out.stat().st_size
    with open(out, "a") as f:
        f.write(_line(1, "n2", "torch.OutOfMemoryError: CUDA out of memory.", now + 1, step=13) + "\n")
    since = now + 0.5  # within spares.CLOCK_SLACK_S of the first line
    assert step_failures(restart.failure_lines(str(out), 0)[0], KEY, since, RANKS).first.step == 12
    assert step_failures(restart.failure_lines(str(out), end)[0], KEY, since, RANKS).first.step == 13
    assert restart.failure_lines(str(out), 10 ** 9)[0] == restart.failure_lines(str(out), 0)[0]  # a shorter file


def test_the_step_travels_in_the_signed_failure_line(tmp_path, monkeypatch):
    from halo_sched.node import failure_collector as fcol

    (tmp_path / "rank-3").write_text("40 1700000000.0\n41 1700000001.5\n")
    assert fcol.reported_step(3, str(tmp_path)) == 41
    assert fcol.reported_step(4, str(tmp_path)) is None and fcol.reported_step(3, "") is None
    f = parse_line(_line(1, "n2", "ValueError: x", time.time(), step=41), KEY)
    assert f.step == 41 and f.to_dict()["step"] == 41
    assert parse_line(_line(1, "n2", "ValueError: x", time.time(), step="41"), KEY).step is None  # not a number


def test_the_restart_line_is_read_back_only_when_signed_and_status_counts_it(tmp_path):
    from halo_sched.jobstate import JobState, JobStatus
    from halo_sched.backends.slurm.spares import restarts_of

    now = time.time()
    rec = {"job": "7", "class": "job", "fault": "job", "reason": "job fault: Python exception", "step": 12,
           "time": now, "action": "inplace", "restart": 1, "attempt": 1}
    out = tmp_path / "halo-job-7.out"
    out.write_text("\n".join([restart.restart_line(rec, KEY), restart.restart_line({**rec, "restart": 9}, ""),
                              restart.restart_line({**rec, "step": 77}, "x" * 64),  # another job's key
                              "0: " + restart.restart_line({**rec, "action": "stop"}, KEY)]) + "\n")
    got = restarts_of([out], KEY, ended=True)
    assert [(r["action"], r["restart"], r["step"]) for r in got] == [("inplace", 1, 12), ("stop", 1, 12)], got
    assert restarts_of([out], KEY, ended=False) == []  # while it runs, only the small file beside it is read
    from halo_sched.jobstate import in_place_fields
    from halo_sched.commands.show import state_json

    st = JobState("7", JobStatus.FAILED, in_place=got)
    # status --json and the record: the restarts (whose times a run's ETTR cuts at) apart from the crash loop.
    assert in_place_fields(got) == {"in_place_restarts": [got[0]], "crash_loop": got[1]} and in_place_fields(None) == {}
    assert state_json(st)["in_place_restarts"] == [got[0]] and state_json(st)["crash_loop"] == got[1]
    assert st.describe().endswith("; 1 restart in place (job fault: Python exception at step 12); crash loop: "
                                  "job fault: Python exception at step 12 twice, not restarted"), st.describe()


def test_the_last_step_s_failure_is_the_job_s_after_a_restart_in_place():
    """What status classifies after a restart in place is the step that failed last, not the first."""
    from halo_sched.backends.slurm.spares import last_step
    from halo_sched.node.failure_classes import classify_failure
    from halo_sched.node.failures import report_from_lines

    now = time.time()
    report = report_from_lines([_line(1, "n2", "ValueError: bad batch", now), _line(0, "n1", NCCL, now + 5, **XID)], KEY)
    assert classify_failure(report).kind == "job"
    last = last_step(report, [], [{"action": "inplace", "time": now + 1}])
    assert classify_failure(last).node and classify_failure(last).host == "n1"


# ---- the step loop as bash runs it, with stand-in srun/scontrol/sbatch and a torchrun that fails ----

FAILING_TORCHRUN = r'''#!{python}
"""Node rank 1 fails at the step FAIL_STEPS names for its HALO_RESTART_COUNT (a Python exception;
"-": no step reported; "kill": killed by SIGKILL, a node's fault; "": it succeeds), as torchrun
would leave it: the rank's stderr.log, torchrun's failure summary."""
import os, sys, time
args = sys.argv[1:]
node = int([a.split("=", 1)[1] for a in args if a.startswith("--node_rank=")][0])
log_dir = [a.split("=", 1)[1] for a in args if a.startswith("--log-dir=")][0]
count = int(os.environ["HALO_RESTART_COUNT"])
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"{{count}} {{node}}\n")
steps = os.environ["FAIL_STEPS"].split(",")
step = steps[count] if count < len(steps) else ""
if node != 1 or not step:
    sys.exit(0)
if step not in ("-", "kill"):
    with open(os.path.join(os.environ["HALO_PROGRESS_DIR"], "rank-1"), "a") as f:
        f.write(f"{{step}} {{time.time()}}\n")
d = os.path.join(log_dir, "run_x", "attempt_0", "0")
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "stderr.log"), "w") as f:
    f.write('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nValueError: bad batch\n')
sys.stderr.write("[1]:\n  time      : " + time.strftime("%Y-%m-%d_%H:%M:%S") + "\n  host      : vm\n"
                 "  rank      : 1 (local_rank: 0)\n  exitcode  : " + ("-9" if step == "kill" else "1") +
                 " (pid: 4242)\n  error_file: <N/A>\n")
sys.exit(1)
'''


def _run_loop(tmp_path, fail_steps: str, retry: dict, before: str = "", **env_extra) -> tuple[int, str, list[str], list[str]]:
    """The rendered batch script of a 2-node job with ``retry``, run by bash as the batch step
    (its output file holding ``before``, as a requeued job's does): (exit status, its output file,
    the counts each node's torchrun saw, the sbatch calls)."""
    tmp_path.mkdir(exist_ok=True)
    spec = halo_sched.load(example_job(tmp_path, 29500, retry=retry))
    script = tmp_path / "job.sbatch"
    script.write_text(halo_sched.render(spec, "slurm"))
    bindir = fake_bin(tmp_path)
    write_tool(bindir, "torchrun", FAILING_TORCHRUN)
    out = tmp_path / "halo-job-7.out"
    out.write_text(before)
    (bindir / "show_job").write_text(scontrol_show_job("7", str(out)))
    os.rename(bindir / "scontrol", bindir / "scontrol.fake")
    (bindir / "scontrol").write_text('#!/bin/sh\nd=$(dirname "$0")\n[ "$*" = "show job 7" ] && exec cat "$d/show_job"\n'
                                     'exec "$d/scontrol.fake" "$@"\n')
    (bindir / "sbatch").write_text('#!/bin/sh\necho "$* used=$HALO_RUN_USED restarts=$HALO_RUN_RESTARTS" >> '
                                   '"$(dirname "$0")/sbatch.calls"\necho 8\n')
    for name in ("scontrol", "sbatch"):
        (bindir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALO_", "SLURM_"))}
    env.update(PATH=f"{bindir}:{env['PATH']}", PYTHONPATH=str(REPO), FAKE_SLURM_NODES="node1,node2",
               SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_ID="7", SLURM_JOB_CPUS_PER_NODE="4(x2)",
               HALO_FAILURE_KEY=KEY, FAKE_LOG=str(tmp_path / "counts.log"), FAIL_STEPS=fail_steps,
               FAKE_TORCHRUN_DIR=str(tmp_path), **env_extra)
    with open(out, "a") as f:
        rc = subprocess.run(["bash", str(script)], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path,
                            timeout=180).returncode
    calls = bindir / "sbatch.calls"
    return (rc, out.read_text(), (tmp_path / "counts.log").read_text().split("\n")[:-1],
            # the successors' sbatch calls (each is followed by its guardian's: docs/recovery.md)
            [c for c in calls.read_text().splitlines() if "--dependency=afternotok:" not in c] if calls.exists() else [])


def test_the_batch_loop_restarts_in_place_then_a_crash_loop_ends_the_run_with_no_successor(tmp_path):
    """Step 1 fails at step 12 (a Python exception): restarted in place, HALO_RESTART_COUNT 1; step
    2 fails the same way at step 12: a crash loop, the run ends there (exit 1, no sbatch)."""
    rc, text, counts, calls = _run_loop(tmp_path, "12,12,", {"attempts": 5, "on": ["job"]})
    assert rc == 1, text[-3000:]
    assert sorted(counts) == ["0 0", "0 1", "1 0", "1 1"], counts
    assert "halo-sched: job 7: job fault: Python exception at step 12; restarting in place on node1,node2: " \
           "restart 1, attempt 2 of 5 (retry.attempts)" in text, text[-3000:]
    assert "halo-sched: job 7: crash loop: job fault: Python exception at step 12 twice; not restarting" in text
    assert calls == [] and "next attempt" not in text, (calls, text[-2000:])
    assert [json.loads(ln.partition(" ")[2])["action"] for ln in text.splitlines()
            if ln.startswith(restart.TAG + " ")] == ["inplace", "stop"]


def test_the_batch_loop_hands_its_budget_and_count_to_the_successor(tmp_path):
    """The attempts used up in place (2 of 2 after one restart): the loop ends, and the successor,
    told what the run used, submits nothing either. A node's fault after a restart in place (no
    spare): the successor goes on from the run's attempts and restarts so far."""
    rc, text, counts, calls = _run_loop(tmp_path / "a", "12,13,", {"attempts": 2, "on": ["job"]})
    assert rc == 1 and sorted(counts) == ["0 0", "0 1", "1 0", "1 1"], text[-3000:]
    assert "job fault: Python exception at step 13: all 2 attempts of retry.attempts used" in text, text[-3000:]
    assert calls == [] and "not retried: all 2 attempts used" in text, text[-3000:]
    rc, text, counts, calls = _run_loop(tmp_path / "b", "12,kill,", {"attempts": 3, "on": ["node", "job"]})
    assert rc == 1 and sorted(counts) == ["0 0", "0 1", "1 0", "1 1"], text[-3000:]
    assert "a node's fault, and no spare (slurm.spare_nodes) to take its rank" in text, text[-3000:]
    assert len(calls) == 1 and "--exclude=node2 " in calls[0] and calls[0].endswith(" used=2 restarts=2"), calls


def test_a_requeued_batch_script_counts_on_from_this_job_s_restarts_before(tmp_path):
    """SLURM requeued the job (SLURM_RESTART_COUNT 1) after one restart in place and one swap,
    its signed lines in the output file it appends to: the count goes on from 1 (the requeue) + 2,
    and the restart in place used an attempt (2 of 2 now: a job fault is not restarted again).
    Another job's line and a line no key signed count nothing."""
    now = time.time()
    rec = {"job": "7", "class": "job", "fault": "job", "reason": "job fault: Python exception", "step": 3,
           "time": now, "action": "inplace", "restart": 1, "attempt": 1}
    swap = {"job": "7", "rank": 1, "bad": "node2", "spare": "node3", "reason": "x", "by": "xid", "time": now,
            "restart": 2, "spares_left": 0}
    from halo_sched.node.spares import swap_line

    before = "\n".join([restart.restart_line(rec, KEY), swap_line(swap, KEY), restart.restart_line({**rec, "job": "6"}, KEY),
                        restart.restart_line({**rec, "step": 4}, "")]) + "\n"
    rc, text, counts, calls = _run_loop(tmp_path, ",,,12", {"attempts": 2, "on": ["job"]}, before,
                                        SLURM_RESTART_COUNT="1")
    assert sorted(counts) == ["3 0", "3 1"], (counts, text[-3000:])
    assert rc == 1 and "at step 12: all 2 attempts of retry.attempts used" in text, text[-3000:]
