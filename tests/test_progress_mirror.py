"""The hang monitor's copy of the ranks' progress files where the submitter can read them (SLURM:
beside the job's output file; halo_sched/node/hang_monitor.py ``Mirror``): the layout the readers
of a local job read, atomic copies of the ring, bounded copies of the history, and a directory
that cannot be written said once without ending anything. No torch, no cluster."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import halo_sched
from halo_sched import timeline
from halo_sched.backends.slurm.progress import mirror_root, mirror_shell, stragglers_line
from halo_sched.node import hang_monitor, progress, stragglers
from helpers import REPO

SLOTS, WIDTH = progress.SLOTS, progress.WIDTH


def ring(path: Path, reports: list[tuple[int, float]]) -> None:
    """A rank's ring as progress.report() leaves it: the last SLOTS reports, in place."""
    buf = bytearray(SLOTS * WIDTH)
    for i, (step, t) in enumerate(reports):
        at = (i % SLOTS) * WIDTH
        buf[at:at + WIDTH] = b"%13d %17.3f\n" % (step, t)
    path.write_bytes(bytes(buf))


def reports_of(rank: int, steps: int, t0: float = 1.7e9) -> list[tuple[int, float]]:
    """Rank 1 reports 0.5 s after the others each step (0.6 s a step)."""
    return [(s, t0 + 0.6 * s + (0.5 if rank == 1 else 0.0)) for s in range(steps)]


def node_dir(tmp_path: Path, ranks: range) -> Path:
    src = tmp_path / "node" / "progress"
    src.mkdir(parents=True)
    for r in ranks:
        ring(src / f"rank-{r}", reports_of(r, 60))
        (src / f"rank-{r}.history").write_bytes(b"".join(b"%d %.3f\n" % p for p in reports_of(r, 60)[::2]))
        (src / f"rank-{r}.stack").write_text("not copied")
    return src


def test_the_copy_reads_as_a_local_jobs_log_root(tmp_path):
    dst = tmp_path / "out" / ".halo-progress" / "42"
    for node, ranks in ((0, range(0, 2)), (1, range(2, 4))):
        src = node_dir(tmp_path / f"n{node}", ranks)
        hang_monitor.Mirror(str(src), str(dst), node).copy()
    assert sorted(p.name for p in (dst / "node-1" / "progress").iterdir()) == [
        "rank-2", "rank-2.history", "rank-3", "rank-3.history"]
    s = stragglers.summary(stragglers.read(dst))
    assert s["slowest"]["rank"] == 1 and s["slowest"]["node"] == 0, s
    files = timeline.progress_files(dst)
    assert sorted(files) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    got = timeline._reports(files[(0, 1)], [float("inf")])
    assert got[0] == reports_of(1, 60)[0] and got[-1] == reports_of(1, 60)[-1]
    # The submitter's side finds it beside the output file, by the job's number.
    assert mirror_root([str(tmp_path / "out" / "halo-t-42.out")], "42") == dst
    assert mirror_root([str(tmp_path / "out" / "halo-t-42.out")], "other:42") == dst
    line = stragglers_line([str(tmp_path / "out" / "halo-t-42.out")], "42")
    assert "slowest: rank 1 (node 0), 0.50 s behind the median rank each step" in line, line


def test_the_ring_is_replaced_whole_never_rewritten_in_place(tmp_path):
    src = node_dir(tmp_path, range(1))
    dst = tmp_path / "m"
    m = hang_monitor.Mirror(str(src), str(dst), 0)
    m.copy()
    copy = dst / "node-0" / "progress" / "rank-0"
    before = copy.read_bytes()
    with open(copy, "rb") as reader:  # a reader that opened the old copy
        ring(src / "rank-0", reports_of(0, 200))
        m.copy()
        assert reader.read() == before  # it reads the old copy whole: the new one is another file
    assert copy.read_bytes() == (src / "rank-0").read_bytes()
    assert not [p for p in copy.parent.iterdir() if p.name.startswith(".")]  # no temporary file left
    # Unchanged: not written again.
    ino = copy.stat().st_ino
    m.copy()
    assert copy.stat().st_ino == ino


def test_a_copy_that_fails_halfway_leaves_the_old_copy_and_no_temporary_file(tmp_path, monkeypatch):
    src = node_dir(tmp_path, range(1))
    dst = tmp_path / "m"
    m = hang_monitor.Mirror(str(src), str(dst), 0)
    m.copy()
    copy = dst / "node-0" / "progress" / "rank-0"
    before = copy.read_bytes()
    ring(src / "rank-0", reports_of(0, 90))

    def no_rename(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hang_monitor.os, "replace", no_rename)
    m.copy()
    assert copy.read_bytes() == before
    assert not [p for p in copy.parent.iterdir() if p.name.startswith(".")]


def _counting(monkeypatch) -> list[int]:
    """The sizes of the writes the mirror makes."""
    written: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, data):
            written.append(len(data))
            return self.f.write(data)

    def spy(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return Counting(f) if "w" in mode or "a" in mode else f

    monkeypatch.setattr(hang_monitor, "open", spy, raising=False)
    return written


def test_a_long_history_is_copied_a_line_a_copy(tmp_path, monkeypatch):
    """A history past 8 KiB (about two minutes of a rank's) grows the copy by its newest line at
    each copy, whatever its length: the copy stays small, and each copy reads 64 KiB at most."""
    src = tmp_path / "p"
    src.mkdir()
    hist = src / "rank-0.history"
    lines = [b"%d %.3f\n" % (s, 1.7e9 + s) for s in range(20000)]  # about 400 KB: a long job
    hist.write_bytes(b"".join(lines))
    dst = tmp_path / "m"
    m = hang_monitor.Mirror(str(src), str(dst), 0)
    written = _counting(monkeypatch)
    copy = dst / "node-0" / "progress" / "rank-0.history"
    m.copy()
    assert copy.read_bytes() == lines[0] + lines[-1] and sum(written) == len(lines[0] + lines[-1])
    written.clear()
    m.copy()
    assert written == []  # nothing new: nothing written
    new = [b"20000 1700020000.000\n", b"20001 1700020001.000\n"]
    with open(hist, "ab") as f:
        f.write(b"".join(new) + b"20002 17000")  # the last line half written: not copied yet
    m.copy()
    assert written == [len(new[1])] and copy.read_bytes() == lines[0] + lines[-1] + new[1]
    with open(hist, "ab") as f:
        f.write(b"20020.000\n")
    m.copy()
    assert copy.read_bytes().endswith(new[1] + b"20002 1700020020.000\n")
    # The rank restarted: its history starts afresh, and so does the copy.
    hist.write_bytes(b"0 1700030000.000\n")
    m.copy()
    assert copy.read_bytes() == b"0 1700030000.000\n"
    # What the timeline reads of it: the first and the newest steps.
    assert timeline.read_rank(copy) == [(0, 1700030000.0)]


def test_a_short_history_is_copied_whole_then_grows_by_a_line(tmp_path):
    src = tmp_path / "p"
    src.mkdir()
    hist = src / "rank-0.history"
    lines = [b"%d %.3f\n" % (s, 1.7e9 + s) for s in range(100)]
    hist.write_bytes(b"".join(lines))
    m = hang_monitor.Mirror(str(src), str(tmp_path / "m"), 0)
    m.copy()
    copy = tmp_path / "m" / "node-0" / "progress" / "rank-0.history"
    assert copy.read_bytes() == b"".join(lines)
    more = [b"%d %.3f\n" % (s, 1.7e9 + s) for s in range(100, 1000)]
    with open(hist, "ab") as f:
        f.write(b"".join(more))
    m.copy()
    assert copy.read_bytes() == b"".join(lines) + more[-1]


def test_a_trainers_own_long_file_is_copied_as_its_last_lines_and_a_history(tmp_path, monkeypatch):
    """Lines a trainer appends, one a step (no helper): the copy is the file's last 8 KiB of whole
    lines, enough for the stragglers' window; a history of a line a copy goes beside it."""
    src = tmp_path / "p"
    src.mkdir()
    own = src / "rank-0"
    lines = [b"%d %.3f\n" % (s, 1.7e9 + s) for s in range(5000)]
    own.write_bytes(b"".join(lines))
    dst = tmp_path / "m"
    written = _counting(monkeypatch)
    hang_monitor.Mirror(str(src), str(dst), 0).copy()
    copy = dst / "node-0" / "progress" / "rank-0"
    assert len(copy.read_bytes()) <= 8192 and copy.read_bytes().endswith(lines[-1])
    assert copy.read_bytes().startswith(lines[-len(copy.read_bytes().splitlines())])
    assert (dst / "node-0" / "progress" / "rank-0.history").read_bytes() == lines[0] + lines[-1]
    assert sum(written) <= 8192 + 100
    assert len(stragglers.read(dst)[(0, 0)]) == stragglers.WINDOW + 1


def test_a_directory_that_cannot_be_written_is_said_once_and_the_monitor_goes_on(tmp_path):
    """The monitor as the entry script starts it, beside a stand-in torchrun that runs 6 s: a
    mirror under a file (no directory can be made there, whoever runs this) is said once on its
    stderr; it keeps watching and ends 0 when torchrun does. A writable one gets the copies."""
    src = node_dir(tmp_path, range(2))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for mirror, writable in ((blocked / "m", False), (tmp_path / "m", True)):
        torchrun = subprocess.Popen(["sleep", "6"])
        try:
            r = subprocess.run(
                [sys.executable, "-m", "halo_sched.node.hang_monitor", "0", str(torchrun.pid), str(src),
                 str(tmp_path), "2", "60", "60", "0", str(mirror)],
                capture_output=True, text=True, timeout=60, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)})
        finally:
            torchrun.kill()
            torchrun.wait()
        assert r.returncode == 0, r.stderr
        said = [ln for ln in r.stderr.splitlines() if "cannot copy the ranks' progress" in ln]
        if writable:
            assert not said, r.stderr
            # The ring's slots not written yet (zeros) are not copied.
            assert (mirror / "node-0" / "progress" / "rank-1").read_bytes() == (src / "rank-1").read_bytes().rstrip(b"\0")
        else:
            assert len(said) == 1, r.stderr  # polled several times, said once
            assert str(blocked) in said[0] and "the job goes on" in said[0], said


def test_the_sbatch_script_sets_the_mirror_beside_the_output_file_only_with_a_monitor():
    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    text = halo_sched.render(spec, "slurm")
    assert 'export HALO_PROGRESS_MIRROR="$PWD"/.halo-progress/"$SLURM_JOB_ID"\n' in text
    # The monitor (started by the node runtime's halo_hang_start, which the entry arms with
    # halo_hang) gets the mirror as an argument and the job's key on its stdin.
    assert "\nhalo_hang 300 600\n" in text
    entry_functions = (REPO / "halo_sched" / "node" / "entry.sh").read_text()
    assert '"${HALO_PROGRESS_MIRROR:-}" <<< "$halo_failure_key" &' in entry_functions
    off = type(spec).model_validate({**spec.model_dump(exclude_unset=True), "hang": None})
    assert "HALO_PROGRESS_MIRROR=" not in halo_sched.render(off, "slurm")
    # A directory in the output path is quoted as a value; one with %-codes gets no mirror.
    assert mirror_shell("/shared/it's logs/halo-%x-%j.out") == "'/shared/it'\\''s logs'/.halo-progress"
    assert mirror_shell("logs/halo-%j.out") == '"$PWD"/logs/.halo-progress'
    assert mirror_shell("logs-%u/halo-%j.out") is None


def test_a_fresh_job_without_copies_reads_as_nothing(tmp_path):
    assert stragglers_line([str(tmp_path / "halo-t-7.out")], "7") == ""
    assert stragglers_line([], "7") == ""
    assert mirror_root([str(tmp_path / "x.out")], "../7") is None


def test_watch_line_of_a_running_slurm_job_carries_the_stragglers():
    from halo_sched.backends.base import JobState, JobStatus
    from halo_sched.backends.slurm import SlurmScheduler

    sched = SlurmScheduler.__new__(SlurmScheduler)  # progress() asks no scheduler for a running job
    st = JobState("9", JobStatus.RUNNING, "RUNNING", nodes_total=2, nodes_running=2,
                  progress="node 0: step 3; slowest: rank 1 (node 0)")
    assert sched.progress(st) == "RUNNING on 2 nodes (node 0: step 3; slowest: rank 1 (node 0))"
    st.progress = ""
    assert sched.progress(st) == "RUNNING on 2 nodes"


def test_a_new_step_keeps_the_earlier_steps_copy_beside_its_own(tmp_path):
    """A restart inside the job (a spare swap, a restart in place): the new step's monitor moves
    the earlier step's copy to ``progress.1`` before writing its own, so the reports before the
    restart stay readable (halo_sched/ettr.py measures the restart from them); the checkpoints a
    rank reported are copied too. Readers of the current step read ``progress/`` only."""
    from halo_sched import ettr

    dst = tmp_path / "m"
    first = tmp_path / "step0"
    first.mkdir()
    (first / "rank-0").write_bytes(b"".join(b"%d %.3f\n" % (s, 1.7e9 + s) for s in range(1, 11)))
    (first / "rank-0.checkpoints").write_bytes(b"6 1700000006.000 4.5\n")
    hang_monitor.Mirror(str(first), str(dst), 0).copy()
    again = tmp_path / "step1"
    again.mkdir()
    (again / "rank-0").write_bytes(b"".join(b"%d %.3f\n" % (s, 1.7e9 + 30 + s) for s in range(7, 12)))
    later = hang_monitor.Mirror(str(again), str(dst), 0)
    later.copy()
    later.copy()  # its own copy is never moved aside
    node = dst / "node-0"
    assert sorted(p.name for p in node.iterdir()) == ["progress", "progress.1"]
    assert (node / "progress.1" / "rank-0").read_bytes().startswith(b"1 1700000001.000\n")
    assert (node / "progress.1" / "rank-0.checkpoints").read_bytes() == b"6 1700000006.000 4.5\n"
    assert (node / "progress" / "rank-0").read_bytes().startswith(b"7 1700000037.000\n")
    assert timeline.read_rank(timeline.progress_files(dst)[(0, 0)])[0] == (7, 1700000037.0)
    segs = ettr._segments([[ettr.source(p) for p in (node / "progress.1" / "rank-0", node / "progress" / "rank-0")]],
                          [])
    assert [(s.first, s.last) for s in segs] == [((1.7e9 + 1, 1), (1.7e9 + 10, 10)), ((1.7e9 + 37, 7), (1.7e9 + 41, 11))]


def test_the_checkpoint_report_is_one_appended_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    progress.checkpoint(120, 41.25)
    progress.checkpoint(240, 40.5)
    lines = (tmp_path / "rank-3.checkpoints").read_text().splitlines()
    assert [ln.split()[0::2] for ln in lines] == [["120", "41.250"], ["240", "40.500"]]
    from halo_sched import ettr

    assert [(s, c) for _, s, c in ettr.read_checkpoints(tmp_path / "rank-3.checkpoints")] == [(120, 41.25), (240, 40.5)]
    monkeypatch.delenv("HALO_PROGRESS_DIR")
    progress.checkpoint(360, 1.0)  # outside halo-sched: nothing, no error
