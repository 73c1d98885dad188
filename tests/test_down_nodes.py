"""A NODE_FAIL job's lost node, named from SLURM's node records (halo_sched/backends/slurm/down_nodes.py):
the multi-host rig's cut test (tests/test_multihost.py) shows it on a real cluster; these check the
pieces without one."""
from __future__ import annotations

from halo_sched.backends.slurm.down_nodes import down_nodes, expand_hostlist
from halo_sched.node.failure_classes import classify_failure
from halo_sched.node.failures import FailureReport


def test_expand_hostlist_as_scontrol_show_hostnames():
    assert expand_hostlist("h[0-1]") == ["h0", "h1"]
    assert expand_hostlist("gpu[01,03-04],login1") == ["gpu01", "gpu03", "gpu04", "login1"]
    assert expand_hostlist("a[9-10]b") == ["a9b", "a10b"]
    assert expand_hostlist("") == []


class _Transport:
    def __init__(self, nodes):
        self.nodes = nodes

    def partitions(self, cluster=None):
        return [], self.nodes

    def job_info(self, job_id):
        return {"NodeList": "h[0-1]"}


def test_the_down_node_is_named_with_its_ranks_and_classified_a_node_fault(tmp_path):
    out = tmp_path / "job.out"
    out.write_text("0: [rank 0] x\n0: [rank 1] x\n1: [rank 2] x\n1: [rank 3] y\n")
    t = _Transport([{"NodeName": "h0", "State": "IDLE"},
                    {"NodeName": "h1", "State": "DOWN+NOT_RESPONDING", "Reason": "Not responding [root@2026-12-02T10:38:15]"}])
    down = down_nodes(t, "7", None, [str(out)])
    assert [(d.node, d.host, d.ranks) for d in down] == [(1, "h1", (2, 3))]
    assert down[0].error == "SLURM marked node 1 (h1) DOWN+NOT_RESPONDING (Not responding); it held ranks 2, 3"
    report = FailureReport(failures=list(down), cause=down[0])
    cls = classify_failure(report, "NODE_FAIL")
    assert (cls.kind, cls.host, cls.by) == ("node", "h1", "node-fail"), cls


def test_no_node_down_names_nobody():
    t = _Transport([{"NodeName": "h0", "State": "IDLE"}, {"NodeName": "h1", "State": "ALLOCATED"}])
    assert down_nodes(t, "7", "h[0-1]", []) == []
