"""Nomad reports a HUNG job as the other backends do: the hang monitors' lines, read from the
ended allocations' task logs through the fake API (issue 21). The lines are those the node-side
monitor writes (record_line); the whole monitor runs for real in test_hang_local/slurm."""
from __future__ import annotations

import re

from halo_sched.backends.base import JobStatus
from halo_sched.node.failure_collector import record_line
from test_nomad_failure_report import TOKEN, FakeNomad, fail, nodes, submit

T0 = 1_800_000_000.0


def hung(node, rank, waiting, where="train.py:44", code="dist.all_reduce(t)"):
    return record_line({"kind": "HUNG", "node": node, "rank": rank, "local_rank": rank % 2,
                        "host": f"gpu-{'abc'[node]}", "exit_code": None, "signal": None, "time": T0 + 300,
                        "step": 117, "last_progress": T0, "stack_read": True, "error": "",
                        "waiting_in": waiting, "where": where, "code": code, "tail": []})


def test_a_hung_job_on_nomad_names_the_rank_outside_a_collective(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        for group, node in (("node-0", 0), ("workers[0]", 1), ("workers[1]", 2)):
            lines = "".join(hung(node, r, None if r == 5 else "all_reduce",
                                 *(("train.py:57", "time.sleep(600)") if r == 5 else ()))
                            for r in (2 * node, 2 * node + 1))
            fail(fake, job_id, group, lines)
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.FAILED and st.failure.kind == "HUNG"
        want = re.compile(r"FAILED: HUNG after step 117: rank 5 \(node 2, host gpu-c, local rank 1\) made no progress "
                          r"for 300 s, in train.py:57 \(time.sleep\(600\)\) \[the only rank not inside a collective\]; "
                          r"5 ranks waiting in all_reduce")
        assert want.match(st.describe()), st.describe()
