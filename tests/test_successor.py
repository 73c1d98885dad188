"""halo_sched/node/successor.py, the next attempt a failed SLURM attempt submits from its batch
script, against stand-in ``scontrol``/``squeue``/``sbatch`` on PATH (the cluster test is
tests/test_recovery_slurm.py): exactly one successor per failed attempt when the batch script runs
twice (a requeued job) or twice at once; none for a job's own fault or when the attempts are used
up; the culprit excluded on top of the script's own exclusions; the chain's marker read back as
hostile input."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from pathlib import Path

import pytest

from halo_sched.node import successor
from halo_sched.node.failure_collector import record_line
from helpers import scontrol_show_job

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


def _cluster(tmp_path, monkeypatch, outdir):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    outdir.mkdir(parents=True, exist_ok=True)
    out = outdir / "halo-job-7.out"
    # scontrol show job 7 in SLURM's own layout (tests/helpers.py scontrol_show_job: as 22.05 prints it).
    (bin_ / "show_job").write_text(scontrol_show_job("7", str(out)))
    (bin_ / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show job 7" ] || exit 2\ncat "$(dirname "$0")/show_job"\n')
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
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    return {"bin": bin_, "out": out, "script": str(script), "dir": outdir}


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A directory of stand-in SLURM commands: scontrol names the output file, sbatch logs its
    argv and environment and answers a new id after a pause (so that racing callers overlap)."""
    return _cluster(tmp_path, monkeypatch, tmp_path)


def _main(c, rc="1", attempts="3", on="node", run="7", attempt="0", excluded="", kept_off="bad1,bad2"):
    return successor.main([rc, "7", c["script"], attempts, on, run, attempt, excluded, kept_off])


def _all_calls(c) -> list[str]:
    p = c["bin"] / "calls"
    return p.read_text().splitlines() if p.exists() else []


def _calls(c) -> list[str]:
    """The sbatch calls that submitted an attempt (each is followed by its guardian's)."""
    return [x for x in _all_calls(c) if "--dependency=afternotok:" not in x]


def _guardians(c) -> list[str]:
    return [x for x in _all_calls(c) if "--dependency=afternotok:" in x]


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


# ---- issue 43 item 10: what the batch shell reads, a requeue mid-submit, hostile files -----------


@pytest.mark.parametrize("name", ["my runs", "it's \"quoted\"", "a=b c", "Runs X=1/B=2 c"])
def test_a_submit_directory_with_spaces_quotes_and_equals_is_read_whole(tmp_path, monkeypatch, name):
    """The output file's path from `scontrol show job` whatever the submit directory's name: its
    failure lines are read, the successor submitted, the marker beside it (the whitespace split
    of the one-line layout cut StdOut at the first space: "not retried: unknown cause")."""
    c = _cluster(tmp_path, monkeypatch, tmp_path / name)
    c["out"].write_text(_fault())
    assert _main(c) == 0
    assert len(_calls(c)) == 1, _calls(c)
    assert successor.read_marker(successor.marker_path(str(c["dir"]), "7", 1), KEY)["job"] == "101"


def _claimed_by(c, from_run: int, job=None, **extra) -> str:
    """The claim an earlier run of job 7 made (``from_run``: its requeue count), whose batch
    script was killed inside sbatch: signed, fresh (well within STALE_S), no job id."""
    path = successor.marker_path(str(c["dir"]), "7", 1)
    Path(path).write_text(successor._signed({"run": "7", "attempt": 1, "from_job": "7", "from_run": from_run,
                                             "excluded": [], "job": job, **extra}, KEY))
    return path


def test_a_requeued_run_finishes_the_claim_its_earlier_run_left_without_a_job(cluster, monkeypatch, capsys):
    """`scontrol requeue` killed the batch script inside the successor's sbatch: the requeued run
    (SLURM_RESTART_COUNT 1) finds the claim of run 0 of the same job, asks squeue, and submits
    (it said "being submitted by another run of this script" and the run was lost)."""
    cluster["out"].write_text(_fault())
    path = _claimed_by(cluster, 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert _main(cluster) == 0
    assert len(_calls(cluster)) == 1, capsys.readouterr().err
    marker = successor.read_marker(path, KEY)
    assert marker["job"] == "101" and marker["from_run"] == 1
    # The killed run's sbatch had gone through: squeue has the attempt, nothing is submitted again.
    _claimed_by(cluster, 1)
    (cluster["bin"] / "queue").write_text("55|halo-run:7.1\n")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert _main(cluster) == 0
    assert len(_calls(cluster)) == 1 and successor.read_marker(path, KEY)["job"] == "55"


def test_a_claim_of_the_same_run_or_of_another_job_still_holds(cluster, monkeypatch, capsys):
    cluster["out"].write_text(_fault())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _claimed_by(cluster, 1)  # this very run, twice at once
    assert _main(cluster) == 0
    _claimed_by(cluster, 0, from_job="8")  # another job's claim on the same attempt
    assert _main(cluster) == 0
    assert _calls(cluster) == []
    assert "being submitted by another run of this script (job 8, requeue 0)" in capsys.readouterr().err


def _bounded(fn, timeout: float = 20.0):
    """``fn()`` in a thread, failing the test (not hanging it) past ``timeout``."""
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(fn)
        try:
            return fut.result(timeout=timeout)
        except TimeoutError:
            # Unblock the reader so the thread can end: open the FIFOs' other ends.
            for fifo in Path(fn.__dict__.get("dir", "/nonexistent")).glob("*"):
                if stat.S_ISFIFO(fifo.lstat().st_mode):
                    os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
            pytest.fail(f"blocked for {timeout} s")


def test_a_fifo_at_the_marker_s_path_never_blocks_and_is_replaced(cluster):
    """A FIFO where the marker goes (anyone who writes the output directory can make one): the
    batch shell opened it and waited for a writer forever, holding the nodes; `status`/`watch`
    (which read markers to follow the run) hung the same way. It is no marker: removed, the claim
    made, the successor submitted; readers pass it by at once."""
    cluster["out"].write_text(_fault())
    path = successor.marker_path(str(cluster["dir"]), "7", 1)
    os.mkfifo(path)
    read = lambda: successor.read_marker(path, KEY)  # noqa: E731
    read.dir = str(cluster["dir"])
    assert _bounded(read) is None
    run = lambda: _main(cluster)  # noqa: E731
    run.dir = str(cluster["dir"])
    assert _bounded(run) == 0
    assert len(_calls(cluster)) == 1 and successor.read_marker(path, KEY)["job"] == "101"


def test_fifos_at_the_output_s_and_the_swaps_paths_never_block_a_reader(tmp_path):
    from halo_sched.backends.slurm.spares import SIDE_FILE, swaps_of
    from halo_sched.node.failures import report_from_files

    out = tmp_path / "halo-job-7.out"
    os.mkfifo(out)
    os.mkfifo(str(out) + SIDE_FILE)
    read = lambda: (report_from_files([out], KEY), swaps_of([out], KEY, True))  # noqa: E731
    read.dir = str(tmp_path)
    assert _bounded(read) == (None, [])


def test_an_output_directory_it_cannot_write_ends_with_a_reason_line(cluster, monkeypatch, capsys):
    """The output directory made read-only while the job ran (EROFS, as a read-only mount gives;
    root passes a chmod): the claim cannot be made, and the batch shell says so in one line
    (it ended with a traceback and no reason)."""
    import errno

    cluster["out"].write_text(_fault())
    real = os.open

    def read_only(path, flags, *a, **kw):
        if flags & os.O_CREAT and os.fspath(path).startswith(str(cluster["dir"])):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", read_only)
    assert _main(cluster) == 1
    err = capsys.readouterr().err
    assert _calls(cluster) == [] and "Traceback" not in err
    assert "attempt 2 of run 7 not submitted: cannot write its claim beside the output file" in err, err
    assert "Read-only file system" in err and "must stay writable" in err, err


def test_with_spares_the_last_step_decides_and_swapped_hosts_are_kept_off(cluster):
    """Hot spares: node2 failed in step 1 (rank 1) and node3 took its rank; node3 failed too in
    step 2, within the clock slack of its start, and no spare was left. The successor blames node3
    (the last step's, by its rank map) and keeps both off (it blamed node2 again, from the whole
    output, and the spare was neither excluded nor ledgered)."""
    xid = ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."]
    cluster["out"].write_text(_line(NCCL, host="node2", evidence=xid).rstrip("\n") + "\n"
                              + _line(NCCL, host="node3", time=101.0, evidence=xid))
    rc = successor.main(["1", "7", cluster["script"], "3", "node", "7", "0", "", "", "node1,node3", "100.5", "node2"])
    assert rc == 0
    argv, _, env = _calls(cluster)[0].partition(" | ")
    assert "--exclude=node2,node3 " in argv and "excluded=node2,node3 " in env, _calls(cluster)
    assert successor.read_marker(successor.marker_path(str(cluster["dir"]), "7", 1), KEY)["culprit"] == "node3"
