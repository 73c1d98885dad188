"""Whose fault a failure is: every pattern of halo_sched/node/failure_classes.py with the real
message it carries, the scheduler's own word (NODE_FAIL, a lost Nomad allocation), a hang with a
culprit, and unknown as a class of its own."""
from __future__ import annotations

import types

import pytest

from halo_sched.backends.jobstate import JobState, JobStatus
from halo_sched.node import failure_classes as fc
from halo_sched.node.failure_classes import classify_failure
from halo_sched.node.failures import FailureReport, RankFailure

T0 = 1_800_000_000.0


def rank(error="", tail=(), host="h2", t=T0, rank=3, **kw):
    return RankFailure(node=1, rank=rank, local_rank=1, host=host, exit_code=1, signal=None, time=t, error=error,
                       tail=tuple(tail), **kw)


@pytest.mark.parametrize("pattern", fc.PATTERNS, ids=lambda p: p.name)
def test_each_pattern_matches_its_real_message_and_decides(pattern):
    # In the error line, as the collector writes it, and in the output's tail alone.
    for f in (rank(error=pattern.example), rank(error="exit 1", tail=["some line", pattern.example])):
        c = classify_failure(FailureReport([f]))
        assert (c.kind, c.by) == (pattern.kind, pattern.name), (pattern.example, c)
        assert c.host == ("h2" if pattern.kind == fc.NODE else "")
    assert pattern.kind in (fc.NODE, fc.JOB) and pattern.source


def test_the_nccl_part_of_a_python_exception_decides():
    # torch raises NCCL errors as Python exceptions; the network fault is what matters.
    f = rank(error="torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                   "ProcessGroupNCCL.cpp:3780, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                   "NCCL version 2.28.9",
             tail=["Traceback (most recent call last):", "NCCL WARN NET/IB : Got completion from peer"])
    c = classify_failure(FailureReport([f]))
    assert c.node and c.reason == "NCCL network error" and c.host == "h2", c


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
    c = classify_failure(FailureReport([rank(error="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
                                     host="h3")]), JobStatus.NODE_FAIL)
    assert c.node and c.by == "node-fail" and c.host == "h3"
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
    assert text.startswith("FAILED (node fault: host h2, NCCL network error): torch.distributed.DistBackendError"), text
    text = JobState("7", JobStatus.FAILED, failure=FailureReport([rank(error="ValueError: boom")])).describe()
    assert text.startswith("FAILED: ValueError: boom ["), text


def test_the_schedulers_node_name_is_blamed_over_torchruns_fqdn():
    """sbatch refuses an --exclude naming a node it does not know: the ledger takes SLURM's name
    (SLURMD_NODENAME, written by the collector), not torchrun's host."""
    import json

    from halo_sched.node import failure_collector
    from halo_sched.node.failures import parse_line

    rec = {"node": 1, "rank": 1, "local_rank": 0, "host": "node2.cluster.example", "exit_code": 1, "signal": None,
           "time": T0, "error": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", "tail": [],
           "stopped": False, "node_name": "node2"}
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
