"""Hot spares without a cluster: which failure a spare cures and which rank it takes
(halo_sched/node/spares.py), the signed swap line read back (backends/slurm/spares.py), and what
cannot work refused with exit 2 naming the field."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from halo_sched.node import spares
from halo_sched.node.failure_collector import record_line
from halo_sched.node.failures import FailureReport, RankFailure

from helpers import REPO, cli

KEY = "k" * 64
NCCL = ("h2:1:2 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<35162> "
        "with status=12 opcode=129 len=65536")
#: The node's own evidence (failure_collector.node_evidence): what makes a node's fault, never a rank's words.
XID = {"evidence": ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."]}


def _line(node: int, host: str, error: str, at: float, key: str = KEY, **kw) -> str:
    rec = {"node": node, "rank": node, "local_rank": 0, "host": "vm", "exit_code": 1, "signal": None, "time": at,
           "error": error, "tail": [], "stopped": False, "node_name": host, **kw}
    return f"{node}: " + record_line(rec, key=key, secrets=[])


def _report(*lines, since=0.0):
    return spares.step_failures(list(lines), KEY, since)


def test_a_node_fault_gives_that_rank_to_the_first_free_spare_and_the_others_keep_theirs():
    now = time.time()
    report = _report(_line(1, "n2", NCCL, now, **XID), _line(0, "n1", "Connection closed by peer", now + 1, stopped=True))
    swaps, why = spares.decide(["n1", "n2", "n3"], ["n1", "n2", "n3", "n4", "n5"], report)
    assert swaps == [(1, "n2", "n4", "GPU Xid error; the rank reported an NCCL network error", "xid")] and why == ""
    # A spare already used (swapped out before) is never taken again; the next one is.
    swaps, _ = spares.decide(["n1", "n2", "n3"], ["n1", "n2", "n3", "n4", "n5"], report, used=["n4"])
    assert swaps[0][2] == "n5"


def test_the_job_s_own_fault_an_unknown_cause_and_a_forged_line_are_not_swapped():
    now = time.time()
    assert spares.decide(["n1", "n2"], ["n1", "n2", "n3"], _report(_line(1, "n2", "ValueError: bad lr", now)))[0] == []
    # An NCCL line in the rank's own output, signed but with no node-side evidence: not a node's fault.
    swaps, why = spares.decide(["n1", "n2"], ["n1", "n2", "n3"], _report(_line(1, "n2", NCCL, now)))
    assert swaps == [] and "not a node's fault (unknown cause: the rank reported an NCCL network error" in why, why
    assert "cause unknown" in spares.decide(["n1", "n2"], ["n1", "n2", "n3"], None)[1]
    # A rank can print a line that looks like a node fault; unsigned, it decides nothing.
    assert _report(_line(1, "n2", NCCL, now, key="")) is None
    # A line from an earlier step (before this one began) is not this step's.
    assert _report(_line(1, "n2", NCCL, now - 60), since=now) is None
    # A node's fault on a host that runs no rank (a spare's own line) moves nobody.
    _, why = spares.decide(["n1", "n2"], ["n1", "n2", "n3"], _report(_line(1, "n3", NCCL, now, **XID)))
    assert "runs no rank" in why


def test_a_node_that_left_the_allocation_is_swapped_and_no_spare_left_ends_as_without_spares():
    # slurmctld excised n2 (--no-kill: job_mgr.c excise_node_from_job): its rank goes to n3.
    swaps, _ = spares.decide(["n1", "n2"], ["n1", "n3"], None)
    assert swaps == [(1, "n2", "n3", "node left the allocation (SLURM marked it down)", "node-fail")]
    now = time.time()
    swaps, why = spares.decide(["n1", "n3"], ["n1", "n2", "n3"], _report(_line(1, "n3", NCCL, now, **XID)), used=["n2"])
    assert swaps == [] and "no spares left" in why


def test_a_hang_blames_the_culprit_s_node():
    now = time.time()
    hung = RankFailure(node=1, rank=1, local_rank=0, host="vm", exit_code=None, signal=None, time=now, kind="HUNG",
                       node_name="n2", step=3, last_progress=now - 300, stack_read=True, waiting_in=None)
    waiting = RankFailure(node=0, rank=0, local_rank=0, host="vm", exit_code=None, signal=None, time=now, kind="HUNG",
                          node_name="n1", step=4, last_progress=now - 290, stack_read=True, waiting_in="all_reduce")
    swaps, _ = spares.decide(["n1", "n2"], ["n1", "n2", "n3"], FailureReport([hung, waiting]))
    assert swaps == [(1, "n2", "n3", "hung (this node was the culprit)", "hung")]


def test_the_swap_line_is_read_back_only_when_signed_with_the_job_s_key(tmp_path):
    from halo_sched.jobstate import _describe_spares as describe
    from halo_sched.backends.slurm.spares import parse_swap, spares_state, swaps_in

    rec = {"job": "7", "rank": 1, "bad": "n2", "spare": "n3", "reason": "NCCL network error", "by": "nccl-ib",
           "time": 1796219512.2, "restart": 1, "spares_left": 0}
    good = spares.swap_line(rec, KEY)
    forged = spares.swap_line(rec, "")
    other = spares.swap_line({**rec, "bad": "n1"}, "x" * 64)
    hostile = spares.swap_line({**rec, "bad": "n2 --exclude=all"}, KEY)
    out = tmp_path / "job.out"
    out.write_text("\n".join(["0: " + forged, other, hostile, good, good]) + "\n")
    swaps = swaps_in([out, tmp_path / "missing"], KEY)
    assert [(s["rank"], s["bad"], s["spare"]) for s in swaps] == [(1, "n2", "n3")]
    assert parse_swap(good, "") is None
    state = spares_state(1, swaps)
    assert describe(state) == "0 of 1 spare left (n2 -> n3: NCCL network error)"
    assert describe(spares_state(2, [])) == "2 spares left"


def test_a_running_job_s_swaps_come_from_the_small_file_beside_its_output(tmp_path):
    from halo_sched.backends.slurm.spares import swaps_of

    rec = {"job": "7", "rank": 0, "bad": "n1", "spare": "n3", "reason": "GPU Xid error", "by": "xid", "time": 1.0e9,
           "restart": 1, "spares_left": 0}
    out = tmp_path / "job.out"
    out.write_text(spares.swap_line(rec, KEY) + "\n")
    # Running: the output (maybe gigabytes) is not read; the side file is.
    assert swaps_of([out], KEY, ended=False) == []
    assert [s["bad"] for s in swaps_of([out], KEY, ended=True)] == ["n1"]
    (tmp_path / "job.out.swaps").write_text(spares.swap_line({**rec, "bad": "n2"}, KEY) + "\n")
    assert [s["bad"] for s in swaps_of([out], KEY, ended=False)] == ["n2"]


def test_a_run_s_gpu_hours_count_its_spares():
    from halo_sched.runs import row_of

    rec = {"id": "7", "backend": "slurm", "nodes": 2, "spec": {"nodes": 2, "gpus_per_node": 8, "slurm": {"spare_nodes": 1}},
           "last_state": {"status": "COMPLETED", "started_at": 0.0, "ended_at": 3600.0}, "run": {"attempt": 0}}
    row = row_of(rec)
    assert row.nodes == 3 and row.gpu_hours == pytest.approx(24.0)


def _job(tmp_path, **slurm):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "s", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"},
                                "slurm": slurm}))
    return path


@pytest.mark.parametrize("slurm, backend, words", [
    ({"spare_nodes": 1}, "slurm", "slurm.spare_nodes (line 1): hot spares need exclusive: true"),
    ({"spare_nodes": 1, "exclusive": True}, "local", "slurm.spare_nodes: hot spares are SLURM's"),
    ({"spare_nodes": 1, "exclusive": True}, "nomad", "slurm.spare_nodes: hot spares are SLURM's"),
    ({"spare_nodes": 65, "exclusive": True}, "slurm", "slurm.spare_nodes"),
])
def test_what_cannot_work_is_refused_with_exit_2_naming_the_field(tmp_path, slurm, backend, words):
    r = cli("render", str(_job(tmp_path, **slurm)), "--backend", backend, cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_more_spares_than_the_partition_has_are_refused_at_submit(tmp_path):
    import halo_sched
    from halo_sched.backends.slurm.checks import partition_problems

    class ThreeNodes:
        def partitions(self, cluster=None):
            return ([{"PartitionName": "debug", "Default": "YES", "TotalNodes": "3", "MaxNodes": "UNLIMITED",
                      "MaxTime": "UNLIMITED"}],
                    [{"NodeName": f"n{i}", "Partitions": "debug", "CPUTot": "2", "RealMemory": "2048"} for i in (1, 2, 3)])

    spec = halo_sched.load(_job(tmp_path, spare_nodes=2, exclusive=True))
    problems, _ = partition_problems(ThreeNodes(), spec, None)
    assert [f for f, _ in problems] == ["slurm.spare_nodes (with nodes)"] and "4 but partition debug" in problems[0][1]
    ok = halo_sched.load(_job(tmp_path, spare_nodes=1, exclusive=True))
    assert partition_problems(ThreeNodes(), ok, None)[0] == []


def test_the_hook_is_rendered_only_with_spares(tmp_path):
    r = cli("render", str(_job(tmp_path, spare_nodes=1, exclusive=True)), "--backend", "slurm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=3\n" in r.stdout and "#SBATCH --no-kill\n" in r.stdout
    assert '--nodelist="$halo_ranks"' in r.stdout and "\nhalo_batch() {" in r.stdout
    assert r.stdout.count("# halo-sched node runtime ") == 1  # the batch shell runs spares.py from the one copy
    plain = cli("render", str(REPO / "examples" / "ddp-cpu.yaml"), "--backend", "slurm").stdout
    assert "halo_ranks" not in plain and "--no-kill" not in plain and "halo_batch() {" not in plain


# ---- issue 43 item 10: a fault on the spare itself; a submit directory with spaces ---------------


def test_a_second_fault_on_the_spare_is_the_spare_s_not_the_swapped_out_node_s():
    """Step 1: n2 (node rank 1) failed and n3 took its rank; step 2, started a second later, n3
    failed too. The step's lines are those its rank map ran: n2's line of step 1, dated within
    the clock slack of step 2's start, is not step 2's (it was taken for the first failure: "a
    node's fault on n2, which runs no rank"). With no spare left, n3 is named."""
    now = time.time()
    lines = [_line(1, "n2", NCCL, now, **XID), _line(1, "n3", NCCL, now + 3, **XID)]
    report = spares.step_failures(lines, KEY, since=now + 1, ranks=["n1", "n3"])
    assert [f.node_name for f in report.failures] == ["n3"]
    swaps, why = spares.decide(["n1", "n3"], ["n1", "n2", "n3"], report, used=["n2"])
    assert swaps == [] and why.startswith("n3 failed (GPU Xid error") and "no spares left" in why, why
    # A line without the scheduler's node name is the host that ran its node rank in this step.
    bare = spares.step_failures([_line(1, "", NCCL, now + 3, **XID)], KEY, since=now + 1, ranks=["n1", "n3"])
    assert bare.first.node_name == "n3"


def test_the_job_s_failure_is_its_last_step_s_after_swaps():
    """What the submitter classifies (the job's culprit, the node ledger, the run's next attempt):
    the failure of the last step, not the host swapped out in an earlier one."""
    from halo_sched.backends.slurm.spares import last_step
    from halo_sched.node.failure_classes import classify_failure
    from halo_sched.node.failures import report_from_lines

    now = time.time()
    report = report_from_lines([_line(1, "n2", NCCL, now, **XID), _line(0, "n1", "Connection reset by peer", now + 0.2),
                                _line(1, "n3", NCCL, now + 5, **XID)], KEY)
    assert classify_failure(report).host == "n2"
    swaps = [{"rank": 1, "bad": "n2", "spare": "n3", "time": now + 1}]
    last = last_step(report, swaps)
    assert [f.node_name for f in last.trusted] == ["n3"] and classify_failure(last).host == "n3"
    # No line after the last swap (its clock ahead of theirs): all but the swapped-out host's.
    last = last_step(report, [{**swaps[0], "time": now + 60}])
    assert [f.node_name for f in last.trusted] == ["n1", "n3"]


def test_the_swap_reads_the_output_file_of_a_submit_directory_with_spaces_quotes_and_equals(tmp_path, monkeypatch):
    """`python -m halo_sched.node.restart` with stand-in scontrol printing SLURM's own layout: the
    output file of a job submitted from "it's A=b x" is read, and the spare swapped in (it was cut
    at its first space: "no spare swap: cannot read the job's state")."""
    from helpers import scontrol_show_job

    out_dir = tmp_path / "it's \"q\" A=b x"
    out_dir.mkdir()
    out = out_dir / "halo-job-7.out"
    now = time.time()
    out.write_text(_line(1, "n2", NCCL, now + 1, **XID) + "\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "show_job").write_text(scontrol_show_job("7", str(out), nodelist="n[1-3]"))
    (bin_ / "scontrol").write_text(
        '#!/bin/sh\ncase "$*" in\n  "show job 7") cat "$(dirname "$0")/show_job" ;;\n'
        '  "show hostnames n[1-3]") printf "n1\\nn2\\nn3\\n" ;;\n'
        '  "-o show node "*) echo "NodeName=$4 NodeAddr=10.0.0.${4#n}" ;;\n  *) exit 2 ;;\nesac\n')
    (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    args = ["--job", "7", "--ranks", "n1,n2", "--since", str(now), "--spares", "1", "--restart", "1",
            "--master", "10.0.0.1"]
    r = subprocess.run([sys.executable, "-m", "halo_sched.node.restart", *args], capture_output=True, text=True,
                       timeout=60, env=os.environ)
    assert r.returncode == 0, r.stderr
    action, ranks, master, seen, end, swapped = r.stdout.split()
    assert (action, ranks, master, swapped) == ("swap", "n1,n3", "10.0.0.1", "n2") and len(seen) == 16, r.stdout
    assert int(end) == len(_line(1, "n2", NCCL, now + 1, **XID).encode()) + 1  # where the next step's lines begin
    assert "node rank 1: n2 failed" in r.stderr and (out_dir / ("halo-job-7.out" + spares.SIDE_FILE)).exists()
