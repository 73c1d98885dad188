"""halo_sched/node/successor.py, the next attempt a failed SLURM attempt submits from its batch
script, against stand-in ``scontrol``/``squeue``/``sbatch`` on PATH (the cluster test is
tests/test_recovery_slurm.py): exactly one successor per failed attempt when the batch script runs
twice (a requeued job) or twice at once; none for a job's own fault or when the attempts are used
up; the culprit excluded on top of the script's own exclusions; the chain's marker read back as
hostile input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from halo_sched.node import successor
from halo_sched.node.failure_collector import record_line

KEY = "k" * 64
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
        "unhandled system error")


def _line(error: str, host: str = "node2", tail=(), **kw) -> str:
    body = {"node": 1, "rank": 1, "local_rank": 0, "host": host, "exit_code": 1, "signal": None, "time": 100.0,
            "error": error, "tail": list(tail) or [error], "stopped": False, "node_name": host, **kw}
    return "1: " + record_line(body, KEY, [])


def _fault() -> str:
    """A node's fault as the node's collector signs it: the rank's NCCL error, and the node's own
    evidence (the kernel's Xid log)."""
    return _line(NCCL, evidence=["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."])


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A directory of stand-in SLURM commands: scontrol names the output file, sbatch logs its
    argv and environment and answers a new id after a pause (so that racing callers overlap)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    out = tmp_path / "halo-job-7.out"
    (bin_ / "scontrol").write_text(f"#!/bin/sh\necho 'JobId=7 JobName=job StdOut={out} StdErr={out}'\n")
    (bin_ / "squeue").write_text("#!/bin/sh\ncat \"$(dirname \"$0\")/queue\" 2> /dev/null\n")
    (bin_ / "sbatch").write_text(
        "#!/bin/sh\nsleep 0.3\nd=$(dirname \"$0\")\n"
        "echo \"$* | run=$HALO_RUN_ID attempt=$HALO_RUN_ATTEMPT excluded=$HALO_RUN_EXCLUDED slurm=${SLURM_JOB_ID:-}\" >> \"$d/calls\"\n"
        "n=$(wc -l < \"$d/calls\"); echo $((100 + n))\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    script = tmp_path / "slurm_script"
    # A header that lies: the job's own exclusions come from its typed request (KEPT_OFF), never
    # from the script's text.
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --exclude=liar\nset -eu\n")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    return {"bin": bin_, "out": out, "script": str(script), "dir": tmp_path}


def _main(c, rc="1", attempts="3", on="node", run="7", attempt="0", excluded="", kept_off="bad1,bad2"):
    return successor.main([rc, "7", c["script"], attempts, on, run, attempt, excluded, kept_off])


def _calls(c) -> list[str]:
    p = c["bin"] / "calls"
    return p.read_text().splitlines() if p.exists() else []


def test_a_node_fault_submits_one_successor_excluding_the_culprit(cluster):
    cluster["out"].write_text(_fault())
    assert _main(cluster, excluded="node9") == 0
    calls = _calls(cluster)
    assert len(calls) == 1, calls
    argv, _, env = calls[0].partition(" | ")
    assert "--dependency=afterany:7" in argv and "--comment=halo-run:7.1" in argv, argv
    # the job's own --exclude (sbatch keeps only the command line's), earlier attempts', the culprit
    assert "--exclude=bad1,bad2,node9,node2 " in argv and argv.endswith(cluster["script"]), argv
    assert env == "run=7 attempt=1 excluded=node9,node2 slurm=", env  # no SLURM_* of this job leaks in
    marker = successor.read_marker(successor.marker_path(str(cluster["dir"]), "7", 1), KEY)
    assert marker["job"] == "101" and marker["culprit"] == "node2" and marker["excluded"] == ["node9", "node2"]


def test_a_requeued_batch_script_running_again_submits_nothing_more(cluster):
    cluster["out"].write_text(_fault())
    assert _main(cluster) == 0
    assert _main(cluster) == 0  # the same batch script, run again under the same job id
    assert len(_calls(cluster)) == 1


def test_two_runs_at_once_submit_one(cluster):
    cluster["out"].write_text(_fault())
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _main(cluster), range(4)))
    assert len(_calls(cluster)) == 1, _calls(cluster)


def test_a_claim_whose_writer_died_is_taken_over_unless_the_queue_has_the_attempt(cluster):
    cluster["out"].write_text(_fault())
    path = successor.marker_path(str(cluster["dir"]), "7", 1)
    Path(path).write_text(successor._signed({"run": "7", "attempt": 1, "job": None}, KEY))
    os.utime(path, (1, 1))  # older than STALE_S
    (cluster["bin"] / "queue").write_text("55|halo-run:7.1\n")
    assert _main(cluster) == 0
    assert _calls(cluster) == [] and successor.read_marker(path, KEY)["job"] == "55"
    (cluster["bin"] / "queue").write_text("")
    Path(path).write_text(successor._signed({"run": "7", "attempt": 1, "job": None}, KEY))
    os.utime(path, (1, 1))
    assert _main(cluster) == 0
    assert len(_calls(cluster)) == 1


@pytest.mark.parametrize("lines, kw, why", [
    (_line("ValueError: bad learning rate"), {}, "job fault"),
    (_fault(), {"attempt": "2"}, "all 3 attempts used"),
    (_fault(), {"on": "hang"}, "not retried"),
    # Issue 43: the rank's own NCCL line, signed by the collector but with no node-side evidence.
    (_line(NCCL), {}, "not retried: unknown cause: the rank reported an NCCL network error"),
    ("1: halo-sched-failure " + json.dumps({"node": 1, "error": NCCL, "host": "node2"}) + "\n", {}, "not retried"),
])
def test_nothing_is_submitted_for_what_retry_does_not_name(cluster, capsys, lines, kw, why):
    cluster["out"].write_text(lines)  # the last one: a rank's forged, unsigned line
    assert _main(cluster, **kw) == 0
    assert _calls(cluster) == [] and why in capsys.readouterr().err


def test_a_rank_cannot_forge_the_successor(cluster):
    """A rank writes a marker naming a job of its choice before the batch shell gets there: it is
    not signed with the job's key (which no rank can read), so it is replaced, never followed."""
    cluster["out"].write_text(_fault())
    path = successor.marker_path(str(cluster["dir"]), "7", 1)
    Path(path).write_text(json.dumps({"run": "7", "attempt": 1, "job": "666", "excluded": []}))
    os.utime(path, (1, 1))
    assert successor.read_marker(path, KEY) is None
    assert _main(cluster) == 0
    assert len(_calls(cluster)) == 1 and successor.read_marker(path, KEY)["job"] == "101"


def test_a_marker_is_read_as_hostile_input(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(successor._signed({"run": "7", "job": "1; rm -rf /", "excluded": ["ok", "bad host", 3, "-x"]}, KEY))
    m = successor.read_marker(str(p), KEY)
    assert m["job"] is None and m["excluded"] == ["ok"]
    assert successor.read_marker(str(p), "another key") is None and successor.read_marker(str(p), "") is None
    p.write_text("[1]")
    assert successor.read_marker(str(p), KEY) is None
    p.write_bytes(b"\xff" * 10)
    assert successor.read_marker(str(p), KEY) is None


def test_the_module_runs_from_the_carried_zip(tmp_path):
    from halo_sched.node_runtime import runtime

    z = tmp_path / "node.zip"
    z.write_bytes(runtime().zip_bytes)
    code = ("import runpy, sys; sys.path[:0] = [sys.argv.pop(1)]; "
            "import halo_sched.node.successor as s; print(s.__file__)")
    r = subprocess.run([sys.executable, "-I", "-c", code, str(z)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and str(z) in r.stdout, r.stderr
