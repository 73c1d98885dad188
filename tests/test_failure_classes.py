"""Whose fault a failure is: every pattern of halo_sched/node/failure_classes.py with the real
message it carries, the scheduler's own word (NODE_FAIL, a lost Nomad allocation), a hang with a
culprit, and unknown as a class of its own."""
from __future__ import annotations

import types

import pytest

from halo_sched.jobstate import JobState, JobStatus
from halo_sched.node import failure_classes as fc
from halo_sched.node.failure_classes import classify_failure
from halo_sched.node.failures import FailureReport, RankFailure

T0 = 1_800_000_000.0


def rank(error="", tail=(), host="h2", t=T0, rank=3, **kw):
    kw = {"exit_code": 1, "signal": None, **kw}
    return RankFailure(node=1, rank=rank, local_rank=1, host=host, time=t, error=error, tail=tuple(tail), **kw)


@pytest.mark.parametrize("pattern", fc.PATTERNS, ids=lambda p: p.name)
def test_each_pattern_matches_its_real_message_and_decides_as_node_evidence(pattern):
    # In the node's own evidence (what halo-sched's node code read of the node): it decides.
    c = classify_failure(FailureReport([rank(error="exit 1", evidence=(pattern.example,))]))
    assert (c.kind, c.by) == (pattern.kind, pattern.name), (pattern.example, c)
    assert c.host == ("h2" if pattern.kind == fc.NODE else "") and not c.said
    assert pattern.kind in (fc.NODE, fc.JOB) and pattern.source


@pytest.mark.parametrize("pattern", fc.PATTERNS, ids=lambda p: p.name)
def test_in_the_ranks_own_words_a_job_pattern_decides_and_a_node_pattern_only_labels(pattern):
    """Issue 43: a rank that printed an Xid or NCCL line and exited 1 was a node fault (retried,
    its host fenced off). Its words alone now label the failure: unknown cause, no host blamed;
    its host is only a suspect (the ledger's repeated rule)."""
    for f in (rank(error=pattern.example), rank(error="exit 1", tail=["some line", pattern.example])):
        c = classify_failure(FailureReport([f]))
        if pattern.kind == fc.JOB:
            assert (c.kind, c.by, c.host, c.said) == (fc.JOB, pattern.name, "", False), (pattern.example, c)
            continue
        assert (c.kind, c.by, c.host, c.said, c.suspect) == (fc.UNKNOWN, pattern.name, "", True, "h2"), c
        assert not c.node and not c.failure.retried_by(["node", "hang", "preflight"])
        assert c.describe() == f"unknown cause: the rank reported {fc._a(pattern.reason)} (its own output; no node-side evidence)"


def test_the_nccl_part_of_a_python_exception_labels_it():
    # torch raises NCCL errors as Python exceptions: not the job's own fault, and on the rank's
    # word alone not the node's either.
    f = rank(error="torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                   "ProcessGroupNCCL.cpp:3780, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                   "NCCL version 2.28.9",
             tail=["Traceback (most recent call last):", "NCCL WARN NET/IB : Got completion from peer"])
    c = classify_failure(FailureReport([f]))
    assert c.kind == fc.UNKNOWN and c.said and "NCCL network error" in c.reason and c.host == "", c


def test_node_side_evidence_decides_and_the_ranks_words_add_the_label():
    xid = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    f = rank(error="torch.distributed.DistBackendError: NCCL error in: x, unhandled system error", evidence=(xid,))
    c = classify_failure(FailureReport([f]))
    assert (c.kind, c.by, c.host) == (fc.NODE, "xid", "h2") and c.failure.retried_by(["node"]), c
    assert c.reason == "GPU Xid error; the rank reported an NCCL network error", c


def test_a_signal_nothing_in_the_job_sent_is_the_nodes_evidence():
    killed = rank(error="killed by SIGKILL", signal="SIGKILL", exit_code=137)
    c = classify_failure(FailureReport([killed]))
    assert (c.kind, c.by, c.host) == (fc.NODE, "signal", "h2"), c
    assert c.reason == "killed by SIGKILL (nothing in the job sent it)"
    assert classify_failure(FailureReport([rank(signal="SIGBUS", exit_code=135)])).by == "signal"
    # Stopped by the scheduler or torchrun, or by a signal the job sends (SIGTERM, SIGABRT): not the node's.
    assert classify_failure(FailureReport([rank(signal="SIGKILL", stopped=True)])).kind == fc.UNKNOWN
    assert classify_failure(FailureReport([rank(signal="SIGABRT")])).kind == fc.UNKNOWN
    # The kernel's out-of-memory killer sends SIGKILL too: the node's cgroup says so, and it is the job's.
    oom = rank(signal="SIGKILL", evidence=("cgroup: oom-kill: the kernel's out-of-memory killer ended 1 process "
                                           "of this node's cgroup while torchrun ran",))
    assert (classify_failure(FailureReport([oom])).kind, classify_failure(FailureReport([oom])).by) == (fc.JOB, "host-oom")
    assert classify_failure(FailureReport([killed]), "OUT_OF_MEMORY").kind == fc.JOB  # SLURM's word too


def test_evidence_or_a_signal_on_a_line_a_rank_printed_decides_nothing():
    xid = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    forged = rank(error="exit 1", evidence=(xid,), signal="SIGKILL", trusted=False)
    assert classify_failure(forged).kind == fc.UNKNOWN  # a lone failure, as successor/spares may pass it
    assert classify_failure(FailureReport([forged])).kind == fc.UNKNOWN


def test_only_the_first_failure_counts_not_its_victims():
    cause = rank(error="ValueError: bad shard 7", host="h1", t=T0, rank=0)
    victim = rank(error="RuntimeError: Connection reset by peer", host="h2", t=T0 + 2)
    c = classify_failure(FailureReport([victim, cause]))
    assert (c.kind, c.by) == (fc.JOB, "python-exception"), c


def test_job_faults_bad_argument_and_oom():
    assert classify_failure(FailureReport([rank(error="train.py: error: the following arguments are required: --data")])).by \
        == "bad-argument"
    assert classify_failure(None, JobStatus.OUT_OF_MEMORY).kind == fc.JOB
    assert classify_failure(FailureReport([rank(error="")]), "OUT_OF_MEMORY").reason == "out of memory (the process)"


def test_unknown_is_its_own_class():
    c = classify_failure(FailureReport([rank(error="exit 1")]))
    assert c.kind == fc.UNKNOWN and not c.node and c.describe() == "unknown cause"
    assert classify_failure(None, JobStatus.FAILED).kind == fc.UNKNOWN


def test_slurm_node_fail_is_the_nodes_fault():
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    c = classify_failure(FailureReport([rank(error="exit 1", evidence=(f"kernel: {xid}",), host="h3")]), JobStatus.NODE_FAIL)
    assert c.node and c.by == "node-fail" and c.host == "h3"
    # The same words from the rank alone blame no host (the class is SLURM's: node).
    c = classify_failure(FailureReport([rank(error=xid, host="h3")]), JobStatus.NODE_FAIL)
    assert c.node and c.by == "node-fail" and c.host == "", c
    # A peer that crashed on a Python exception is a victim, not the failed node: no host blamed.
    c = classify_failure(FailureReport([rank(error="ValueError: store timeout", host="h1")]), JobStatus.NODE_FAIL)
    assert c.node and c.host == "" and c.describe() == "node fault: node failed (NODE_FAIL)"
    assert classify_failure(None, "NODE_FAIL").node


def test_nomad_lost_allocation_is_the_nodes_fault():
    from halo_sched.backends.nomad.failure_logs import AllocFailure

    lost = AllocFailure(node=1, rank=None, local_rank=None, host="gpu-b", exit_code=None, signal=None, time=T0,
                        label="node 1 (Nomad node gpu-b)", verb="lost", error="allocation 1234abcd lost: node down")
    c = classify_failure(FailureReport([lost], cause=lost), JobStatus.NODE_FAIL)
    assert c.node and c.host == "gpu-b"
    c = classify_failure(FailureReport([lost], cause=lost), JobStatus.FAILED)
    assert c.node and c.by == "node-lost" and c.host == "gpu-b", c


def test_a_hang_without_the_culprits_stack_blames_no_node():
    # What a hang report without a readable stack says: hung, no node to blame.
    c = classify_failure(types.SimpleNamespace(kind="HUNG", host="h1", error="", tail=()))
    assert c.failure is fc.HUNG_NO_CULPRIT and c.kind == fc.UNKNOWN and c.host == "", c


def test_status_line_leads_with_a_node_fault_and_keeps_a_job_fault_as_it_was():
    nccl = rank(error="torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                      "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details)")
    text = JobState("7", JobStatus.FAILED, failure=FailureReport([nccl])).describe()
    assert text.startswith("FAILED (unknown cause: the rank reported an NCCL network error (its own output; no "
                           "node-side evidence)): torch.distributed.DistBackendError"), text
    lost = rank(error=nccl.error, evidence=("nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: "
                                            "GPU is lost.",))
    text = JobState("7", JobStatus.FAILED, failure=FailureReport([lost])).describe()
    assert text.startswith("FAILED (node fault: host h2, GPU lost; the rank reported an NCCL network error): "
                           "torch.distributed.DistBackendError"), text
    text = JobState("7", JobStatus.FAILED, failure=FailureReport([rank(error="ValueError: boom")])).describe()
    assert text.startswith("FAILED: ValueError: boom ["), text


def test_the_schedulers_node_name_is_blamed_over_torchruns_fqdn():
    """sbatch refuses an --exclude naming a node it does not know: the ledger takes SLURM's name
    (SLURMD_NODENAME, written by the collector), not torchrun's host."""
    import json

    from halo_sched.node import failure_collector
    from halo_sched.node.failures import parse_line

    rec = {"node": 1, "rank": 1, "local_rank": 0, "host": "node2.cluster.example", "exit_code": 1, "signal": None,
           "time": T0, "error": "exit 1", "tail": [], "stopped": False, "node_name": "node2",
           "evidence": ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."]}
    key = "2c" * 32  # the job's failure key: the collector's lines are signed with it
    f = parse_line(failure_collector.record_line(rec, key), key)
    assert f.node_name == "node2" and classify_failure(FailureReport([f])).host == "node2"
    # The same line printed by a rank (unsigned) blames no host.
    forged = parse_line(failure_collector.TAG + " " + json.dumps(rec), key)
    assert classify_failure(FailureReport([forged])).host == ""


def test_the_collector_writes_slurms_node_name(tmp_path, monkeypatch):
    from halo_sched.node import failure_collector

    (tmp_path / "torchrun.err").write_text("")
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    (rec,) = failure_collector.collect(1, 1, str(tmp_path), 1, host="node3.example")
    assert rec["node_name"] == "node3" and rec["host"] == "node3.example"


def test_a_preflight_failure_kind_is_that_nodes_fault():
    gate = types.SimpleNamespace(kind="PREFLIGHT", host="h4", node_name="", error="no interface ib0", tail=())
    c = classify_failure(gate)
    assert c.node and c.host == "h4" and c.by == "preflight", c


def test_a_hang_reports_culprit_outside_a_collective_is_its_nodes_fault():
    # As node/hang_monitor.py writes it: the report's first failure is the culprit its rule chose.
    from halo_sched.node.failures import RankFailure

    def hung(waiting_in, stack_read=True):
        return RankFailure(node=1, rank=3, local_rank=1, host="vm", exit_code=None, signal=None, time=1.0,
                           error="no progress", node_name="node2", kind="HUNG", step=4, last_progress=0.5,
                           where_in="hang.py:43", code="time.sleep(3600)", waiting_in=waiting_in,
                           stack_read=stack_read)

    c = classify_failure(FailureReport([hung(None)]))
    assert c.node and c.host == "node2" and c.by == "hung", c
    # Inside a collective, or its stack unread: no evidence against its node.
    assert classify_failure(FailureReport([hung("all_reduce")])).kind == fc.UNKNOWN
    assert classify_failure(FailureReport([hung(None, stack_read=False)])).kind == fc.UNKNOWN


def test_the_job_files_words_are_the_vocabularys():
    """retry.on and notify.on take exactly the words node/failure_classes.py defines, and every
    failure class names one of them (its retry word, its event)."""
    from halo_sched.models import Notify, Retry

    assert Retry.model_json_schema()["properties"]["on"]["items"]["enum"] == list(fc.RETRY_ON)
    assert Notify.model_json_schema()["properties"]["on"]["items"]["enum"] == list(fc.NOTIFY_EVENTS)
    assert len({c.name for c in fc.CLASSES}) == len(fc.CLASSES)
    for c in fc.CLASSES:
        assert c.fault in fc.FAULTS and c.event in fc.NOTIFY_EVENTS and c.retry_on in (*fc.RETRY_ON, None), c
    assert {p.failure for p in fc.PATTERNS} <= set(fc.CLASSES)


# ---- the node's evidence, as failure_collector.py reads it on the node ----------------------------


def test_the_kernels_xid_lines_since_torchrun_started_are_read_where_the_log_is_readable(tmp_path):
    from halo_sched.node import failure_collector as fcol

    kmsg = tmp_path / "kmsg"  # /dev/kmsg's records: PRIORITY,SEQ,MICROSECONDS_SINCE_BOOT,FLAGS;MESSAGE
    kmsg.write_text("4,1,1000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"  # before
                    "6,2,5000000,-;usb 1-1: new device\n"
                    "4,3,9000000,-;NVRM: Xid (PCI:0000:5e:00): 48, pid=2, DBE (double bit error).\n")
    assert fcol.kernel_xids(since=1005.0, path=str(kmsg), boot=1000.0) == [
        "NVRM: Xid (PCI:0000:5e:00): 48, pid=2, DBE (double bit error)."]
    assert fcol.kernel_xids(since=0, path=str(tmp_path / "unreadable"), boot=1000.0) == []


def test_nvidia_smi_on_a_lost_gpu_or_an_uncorrectable_ecc_count_is_evidence(tmp_path):
    from halo_sched.node import failure_collector as fcol

    tool = tmp_path / "nvidia-smi"
    env = {"PATH": str(tmp_path)}
    tool.write_text("#!/bin/sh\necho 'Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  "
                    "Reboot the system to recover this GPU' >&2\nexit 15\n")
    tool.chmod(0o755)
    (line,) = fcol.gpu_health(env)
    assert line.startswith("nvidia-smi: Unable to determine the device handle") and "GPU is lost" in line
    assert classify_failure(FailureReport([rank(evidence=(line,))])).by == "gpu-lost"
    tool.write_text("#!/bin/sh\necho '00000000:3B:00.0, 0'\necho '00000000:5E:00.0, 2'\n")
    (line,) = fcol.gpu_health(env)
    assert classify_failure(FailureReport([rank(evidence=(line,))])).by == "ecc", line
    assert fcol.gpu_health({**env, "CUDA_VISIBLE_DEVICES": ""}) == []  # a job without GPUs asks nothing
    tool.write_text("#!/bin/sh\nsleep 30\n")
    assert fcol.gpu_health(env, timeout=1) == []  # no answer in time: nothing said
    assert fcol.gpu_health({"PATH": str(tmp_path / "none")}) == []


def test_the_cgroups_oom_kills_are_read_from_cgroup_v2_and_v1(tmp_path):
    from halo_sched.node import failure_collector as fcol

    (tmp_path / "proc").write_text("0::/user.slice/job7\n")
    (tmp_path / "cg" / "user.slice" / "job7").mkdir(parents=True)
    (tmp_path / "cg" / "user.slice" / "job7" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert fcol.oom_kills(str(tmp_path / "proc"), str(tmp_path / "cg")) == 2
    (tmp_path / "proc").write_text("4:memory:/process_api/x\n0::/\n")
    (tmp_path / "cg" / "memory" / "process_api" / "x").mkdir(parents=True)
    (tmp_path / "cg" / "memory" / "process_api" / "x" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert fcol.oom_kills(str(tmp_path / "proc"), str(tmp_path / "cg")) == 5
    assert fcol.oom_kills(str(tmp_path / "nothing"), str(tmp_path / "cg")) is None


def test_the_collector_signs_the_nodes_evidence_with_a_killed_rank(tmp_path, monkeypatch):
    """torchrun's summary says rank 1 was killed by SIGKILL; the cgroup counts one more OOM kill
    than before torchrun started: the line carries that, signed, and it is the job's own fault."""
    import json

    from halo_sched.node import failure_collector as fcol
    from halo_sched.node.failures import parse_line

    (tmp_path / "torchrun.err").write_text(
        "[1]:\n  time      : 2026-12-06_06:00:00\n  host      : h2\n  rank      : 1 (local_rank: 0)\n"
        "  exitcode  : -9 (pid: 12)\n  error_file: <N/A>\n")
    monkeypatch.setattr(fcol, "kernel_xids", lambda since: [])
    monkeypatch.setattr(fcol, "gpu_health", lambda environ=None: [])
    monkeypatch.setattr(fcol, "oom_kills", lambda: 4)
    (rec,) = fcol.collect(1, 1, str(tmp_path), 1, host="h2", oom_before=3)
    assert rec["signal"] == "SIGKILL" and rec["evidence"][0].startswith("cgroup: oom-kill: "), rec
    key = "3d" * 32
    f = parse_line(fcol.record_line(rec, key, secrets=[]), key)
    assert f.trusted and f.evidence == tuple(rec["evidence"])
    assert (classify_failure(FailureReport([f])).kind, classify_failure(FailureReport([f])).by) == (fc.JOB, "host-oom")
    # No OOM kill while torchrun ran: the SIGKILL is the node's evidence.
    (rec,) = fcol.collect(1, 1, str(tmp_path), 1, host="h2", oom_before=4)
    assert "evidence" not in rec
    c = classify_failure(FailureReport([parse_line(fcol.record_line(rec, key, secrets=[]), key)]))
    assert (c.kind, c.by, c.host) == (fc.NODE, "signal", "h2"), c
    # The evidence is in the signed body: a rank that prints the same line with evidence of its
    # own (no key) is not trusted, and its evidence decides nothing.
    forged = parse_line(fcol.TAG + " " + json.dumps({**rec, "evidence": ["kernel: NVRM: Xid (PCI:0): 79"]}), key)
    assert not forged.trusted and classify_failure(FailureReport([forged])).kind == fc.UNKNOWN


def test_a_gate_failure_carries_its_check_as_the_nodes_evidence(tmp_path, monkeypatch, capsys):
    from halo_sched.node.failures import parse_line
    from halo_sched.node.trainers import preflight_bw

    monkeypatch.setattr(preflight_bw, "host_identity", lambda: ("h4", ""))
    monkeypatch.setattr(preflight_bw, "node_checks", lambda args: [preflight_bw._check(
        "interface", False, "no interface ib9 on this node", "set network.interface", fatal=True)])
    key = "5e" * 32
    monkeypatch.setenv("HALO_FAILURE_KEY", key)
    assert preflight_bw.gate(["--node", "1"]) == 1
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("halo-sched-failure ")][0]
    f = parse_line(line, key)
    assert f.trusted and f.tail == () and len(line) < 1000
    c = classify_failure(FailureReport([f]))
    assert (c.kind, c.by, c.host) == (fc.NODE, "preflight", "h4"), c
