"""Hang detection without torch: the job file's `hang` section, the HUNG lines and the culprit rule,
the monitor's stack parsing, and the progress helper (issue 21)."""
from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from helpers import entry_script
from halo_sched.node import hang_monitor, progress
from halo_sched.node.failure_collector import record_line
from halo_sched.node.failures import report_from_lines
from halo_sched.spec import from_dict, validated
from helpers import cli

BASE = "name: t\nnodes: 2\nnproc_per_node: 2\ntrainer: {script: x.py}\n"


@pytest.mark.parametrize("extra, field, words", [
    ("hang: {timeout_s: 0}\n", "hang.timeout_s", "greater than or equal to 10"),
    ("hang: {timeout_s: -5}\n", "hang.timeout_s", "greater than or equal to 10"),
    ("hang: {timeout_s: abc}\n", "hang.timeout_s", "valid integer"),
    ("hang: {timeout_s: 2.5}\n", "hang.timeout_s", "valid integer"),
    ("hang: {timeout_s: 3600}\nslurm: {time: '01:00:00'}\n", "hang.timeout_s", "beyond the job's time limit, slurm.time"),
    ("hang: {timeout_s: 60}\nnomad: {max_run_duration: 30s}\n", "hang.timeout_s", "beyond the job's time limit, nomad.max_run_duration"),
    ("hang: {timeout_s: 60, first_step_s: 4000}\nslurm: {time: '60'}\n", "hang.first_step_s", "beyond the job's time limit"),
    ("hang: {timeout: 60}\n", "hang.timeout", "unknown key"),
])
def test_bad_hang_values_exit_2_naming_the_field(tmp_path, extra, field, words):
    p = tmp_path / "job.yaml"
    p.write_text(BASE + extra)
    r = cli("validate", str(p))
    assert r.returncode == 2, r
    assert f"  {field} (line" in r.stderr and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_default_hang_is_not_held_against_a_short_time_limit():
    # A 2-minute job that does not mention hang: valid (it ends at its limit before the default
    # 300 s could pass); the same limit with hang set explicitly is refused (above).
    short = from_dict({"name": "t", "nodes": 1, "nproc_per_node": 1, "trainer": {"script": "x.py"},
                       "slurm": {"time": "2"}})
    assert short.hang.timeout_s == 300
    # Every path a rendered job takes validates the spec again (spec.validated): the default stays a
    # default there too.
    assert validated(short).hang.timeout_s == 300
    assert "hang" not in validated(short).model_fields_set


def test_a_short_job_without_hang_renders(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: t\nnodes: 2\nnproc_per_node: 1\ntrainer: {script: x.py}\nimage: python:3.11\n"
                 "slurm: {time: '2'}\nnomad: {max_run_duration: 2m}\n")
    for backend in ("slurm", "nomad"):
        r = cli("render", str(p), "--backend", backend)
        assert r.returncode == 0, r.stderr
    p.write_text(p.read_text() + "hang: {timeout_s: 300}\n")
    r = cli("render", str(p), "--backend", "slurm")
    assert r.returncode == 2 and "hang.timeout_s (line 8): 300 s is beyond" in r.stderr, r.stderr


def test_hang_is_on_by_default_and_off_with_null():
    on = from_dict({"name": "t", "nodes": 2, "nproc_per_node": 2, "trainer": {"script": "x.py"}})
    assert on.hang.timeout_s == 300 and on.hang.first_step_limit == 600
    script = entry_script(on)
    # The monitor and its settings are the node runtime's (halo_hang in halo_sched/node/entry.sh);
    # the entry calls it with the job's bounds, and "nccl" (the flight recorder) for GPU jobs only.
    assert "\nhalo_hang 300 600\n" in script  # gloo: no flight recorder
    gpu = from_dict({"name": "t", "nodes": 2, "nproc_per_node": 2, "gpus_per_node": 2, "trainer": {"script": "x.py"}})
    assert "\nhalo_hang 300 600 nccl\n" in entry_script(gpu)
    off = from_dict({"name": "t", "nodes": 2, "nproc_per_node": 2, "trainer": {"script": "x.py"}, "hang": None})
    assert "halo_hang " not in entry_script(off)


KEY = "4b" * 32  # the job's failure key: these lines are signed as a node's monitor signs them


def _hung(rank, node, step, last, waiting, read=True, where="train.py:44", code="dist.all_reduce(t)"):
    return record_line(key=KEY, rec={"kind": "HUNG", "node": node, "rank": rank, "local_rank": rank % 2, "host": f"h{node}",
                        "exit_code": None, "signal": None, "time": 1000.0, "step": step, "last_progress": last,
                        "stack_read": read, "error": "" if read else "the rank had already ended",
                        "waiting_in": waiting, "where": where, "code": code, "tail": []})


def test_the_culprit_is_the_only_rank_outside_a_collective_across_nodes():
    lines = [_hung(r, r // 2, 117, 700.0, "all_reduce") for r in (0, 1, 2)]
    lines.append(_hung(3, 1, 117, 700.0, None, where="train.py:57", code="time.sleep(600)"))
    # A victim's exit line (torchrun stopped it after the monitor ended the node) changes nothing.
    lines.append('halo-sched-failure {"node":1,"rank":2,"host":"h1","exit_code":1,"signal":"SIGTERM","time":1001.0}')
    rep = report_from_lines(lines, KEY)
    assert rep.kind == "HUNG" and rep.first.rank == 3
    assert rep.describe() == ("HUNG after step 117: rank 3 (node 1, host h1, local rank 1) made no progress for 300 s, "
                              "in train.py:57 (time.sleep(600)) [the only rank not inside a collective]; "
                              "3 ranks waiting in all_reduce")
    assert rep.to_dict()["kind"] == "HUNG" and rep.to_dict()["first"]["rank"] == 3


def test_without_a_free_rank_the_lowest_step_then_the_oldest_progress():
    rep = report_from_lines(key=KEY, lines=[_hung(0, 0, 50, 700.0, "all_reduce"), _hung(1, 0, 49, 690.0, "all_reduce"),
                             _hung(2, 1, 49, 680.0, "all_reduce", read=False), _hung(3, 1, 50, 600.0, "barrier")])
    assert rep.first.rank == 2  # step 49 and the older progress of the two at 49
    text = rep.describe()
    assert "rank 2 (node 1" in text and "stack not read (the rank had already ended)" in text, text
    assert "the oldest last progress" in text or "the lowest step" in text


def test_stack_parsing_finds_the_main_thread_and_its_collective(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("\n" * 56 + "        time.sleep(600)  # stuck\n")
    dump = (f"[rank3]: Fatal Python error: Aborted\n\nThread 0x00007f01 (most recent call first):\n"
            f'  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
            f'  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap\n\n'
            f"Current thread 0x00007f00 (most recent call first):\n"
            f'  File "{src}", line 57 in main\n  File "{src}", line 80 in <module>\n')
    threads = hang_monitor.parse_stacks(dump)
    main = hang_monitor.main_thread(threads)
    assert main[0][1:] == (57, "main")
    assert hang_monitor.classify_stack(main) == {"waiting_in": None, "where": "train.py:57", "code": "time.sleep(600)"}
    waiting = [("/x/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
               ("/x/site-packages/torch/distributed/c10d_logger.py", 83, "wrapper"), (str(src), 44, "main")]
    assert hang_monitor.classify_stack(waiting)["waiting_in"] == "all_reduce"


@pytest.fixture
def fresh_progress(monkeypatch):
    """progress.py as a new process finds it (its file is opened on the first report)."""
    for name, value in (("_fd", None), ("_ring", None), ("_count", 0), ("_history", None), ("_next_history", 0.0),
                        ("_mask", 0), ("_prev", -2), ("_written", (-2, 0.0)), ("_looking", False),
                        ("_left", None), ("_left_count", 0)):
        monkeypatch.setattr(progress, name, value, raising=False)
    yield progress
    for fd in (progress._fd, progress._history):
        if fd is not None:
            os.close(fd)


def test_progress_helper_writes_step_lines_and_registers_the_stack_signal(tmp_path, monkeypatch, fresh_progress):
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("HALO_STACK_SIGNAL", str(signal.SIGRTMIN + 5))
    progress.report(1)
    progress.report(2)
    got = hang_monitor.read_reports(str(tmp_path / "rank-5"), 10)
    assert [s for s, _ in got] == [1, 2] and got[-1][1] > 1.7e9
    assert hang_monitor.last_report(str(tmp_path / "rank-5"))[0] == 2
    assert hang_monitor._handles(os.getpid(), signal.SIGRTMIN + 5)
    import faulthandler
    faulthandler.unregister(signal.SIGRTMIN + 5)


def test_a_report_makes_no_system_call_and_keeps_the_last_slots(tmp_path, monkeypatch, fresh_progress):
    # A report is a copy into mapped memory: no write(), no update of the file's times, per step.
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("HALO_STACK_SIGNAL", raising=False)
    clock = iter(1.8e9 + 0.05 * i for i in range(10_000))  # 50 ms steps: each one written
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    progress.report(0)
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(fd) or real_write(fd, data))
    for step in range(1, 300):
        progress.report(step)
    assert progress._fd not in writes  # the history's line every 0.5 s is the only write
    got = hang_monitor.read_reports(str(tmp_path / "rank-0"), 1000)
    assert [s for s, _ in got] == list(range(300 - progress.SLOTS, 300))  # the ring wrapped, oldest first
    assert (tmp_path / "rank-0").stat().st_size == progress.SLOTS * progress.WIDTH
    # The stragglers' window fits in the ring.
    from halo_sched.node import stragglers
    assert stragglers.WINDOW + 1 <= progress.SLOTS


def test_left_says_when_a_written_step_left_its_collective_and_tries_its_file_once(tmp_path, monkeypatch, fresh_progress):
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.delenv("HALO_STACK_SIGNAL", raising=False)
    clock = iter(1.8e9 + 0.05 * i for i in range(10_000))
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    for step in range(3):
        progress.report(step)
        progress.left(step)
    progress.left(7)  # a step never reported (not written): nothing
    got = hang_monitor.read_reports(str(tmp_path / "rank-2.left"), 10)
    assert [s for s, _ in got] == [0, 1, 2] and all(t > 1.8e9 for _, t in got)
    # A .left that cannot be mapped: the rank goes on, and its file is not opened again each step.
    import mmap

    monkeypatch.setattr(progress, "_left", None)
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: (_ for _ in ()).throw(OSError("no mapping here")))
    fds = len(os.listdir("/proc/self/fd"))
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    for step in range(3, 200):
        progress.report(step)
        progress.left(step)
    assert len(opened) == 1 and len(os.listdir("/proc/self/fd")) == fds


def test_fast_steps_are_written_about_every_gap_s_the_same_steps_on_every_rank(tmp_path, monkeypatch, fresh_progress):
    # Issue 28: after its collective a rank runs cold, and a written line cost 10-15 us a 0.6 ms step.
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("HALO_STACK_SIGNAL", raising=False)
    now = [1.8e9]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    started = []
    monkeypatch.setattr(progress, "_look_start", lambda: started.append(1), raising=False)
    for step in range(3000):
        now[0] += 0.0006
        progress.report(step)
    got = [s for s, _ in hang_monitor.read_reports(str(tmp_path / "rank-0"), 1000)]
    # 0.6 ms steps: a stride of 32 (19 ms); every written step a multiple of it, so that a rank
    # whose stride came out 16 or 64 still shares every other or every one of its steps.
    assert got[-1] == 2976 and all(s % 32 == 0 for s in got[-80:]) and started
    # A step reported again (an evaluation between two steps) and a jump are written at once.
    progress.report(2999)
    progress.report(5000)
    assert [s for s, _ in hang_monitor.read_reports(str(tmp_path / "rank-0"), 2)] == [2999, 5000]
    # Steps that slow down: the look, a second after the last written one, makes the next written.
    for step in range(5001, 5010):
        now[0] += 0.3
        progress.look(now[0])
        progress.report(step)
    step, when = hang_monitor.last_report(str(tmp_path / "rank-0"))
    assert step == 5009 and abs(when - now[0]) < 0.001


def test_the_history_keeps_a_line_every_half_second_and_the_timeline_reads_both(tmp_path, monkeypatch, fresh_progress):
    from halo_sched import timeline

    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "4")
    clock = iter(1.8e9 + 0.1 * i for i in range(10_000))
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    for step in range(600):  # 60 s of 0.1 s steps
        progress.report(step)
    history = hang_monitor.read_reports(str(tmp_path / "rank-4.history"), 10_000)
    assert len(history) == 120 and history[0][0] == 0 and all(b[0] - a[0] == 5 for a, b in zip(history, history[1:]))
    both = timeline._reports(tmp_path / "rank-4", [float("inf")])
    assert [s for s, _ in both if s < 472] == list(range(0, 472, 5)) and [s for s, _ in both][-128:] == list(range(472, 600))


def test_a_new_process_starts_its_reports_afresh(tmp_path, monkeypatch, fresh_progress):
    # torchrun restarted the rank: the new process's reports are its own, not mixed with the old.
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "rank-1").write_text("".join(f"{s} {1.8e9 + s:.3f}\n" for s in range(500)))
    progress.report(40)
    assert hang_monitor.read_reports(str(tmp_path / "rank-1"), 10)[-1][0] == 40
    assert len(hang_monitor.read_reports(str(tmp_path / "rank-1"), 10)) == 1


def test_appended_lines_and_torn_or_empty_slots_read_as_the_protocol_says(tmp_path):
    # The one-line protocol (a trainer without the helper) appends; only the tail of a long file is read.
    appended = tmp_path / "rank-2"
    appended.write_text("".join(f"{s} {1.7e9 + s * 0.5}\n" for s in range(20000)))
    got = hang_monitor.read_reports(str(appended), 51)
    assert [s for s, _ in got] == list(range(19949, 20000))
    # A slot never written (zeros) or cut mid-rewrite reads as nothing; the rest by time.
    ring = tmp_path / "rank-3"
    ring.write_bytes(b"%13d %17.3f\n" % (7, 1.7e9 + 7) + b"%13d 17\n" % 12 + b"%13d %17.3f\n" % (6, 1.7e9 + 6)
                     + b"%13d\0" % 8 + b"\0" * 64)
    assert hang_monitor.read_reports(str(ring), 10) == [(12, 17.0), (6, 1.7e9 + 6), (7, 1.7e9 + 7)]
    assert hang_monitor.read_reports(str(tmp_path / "none"), 10) == [] and hang_monitor.last_report(str(tmp_path / "none")) is None


def test_the_monitor_reads_the_time_a_rank_wrote_not_the_files_mtime(tmp_path):
    # The ring is rewritten in memory: its mtime says little. An old report in a just-touched file is old.
    mon = hang_monitor.Monitor(0, os.getpid(), str(tmp_path), str(tmp_path), 1, 60, 600, 0, host="h")
    (tmp_path / "rank-0").write_bytes(b"%13d %17.3f\n" % (3, 1000.0))
    last, limit, reports = mon.activity({"rank": 0, "local_rank": 0, "seen": 0.0, "out": [], "cwd": None})
    assert (last, limit, reports) == (1000.0, 60, True)


def test_the_settle_wait_ends_settle_s_after_the_stall_began_not_after_this_node_saw_it(tmp_path, monkeypatch):
    """Every node of one stall sends its SIGABRTs at nearly the same instant: a node whose poll saw
    the stall 0.7 s late waits 0.7 s less (counted from its own detection, it lost its ranks to the
    first node's aborts before it could take their stacks: a CI run of test_hang_slurm)."""
    import subprocess
    import time

    rank = subprocess.Popen(["sleep", "30"])
    try:
        mon = hang_monitor.Monitor(0, os.getpid(), str(tmp_path), str(tmp_path), 1, 20, 40, 0, host="h")
        mon.ranks[rank.pid] = {"rank": 0, "local_rank": 0, "seen": 0.0, "out": [], "cwd": None}
        (tmp_path / "rank-0").write_bytes(b"%13d %17.3f\n" % (4, time.time() - 20 - 0.7))
        waits = []

        class Stop(Exception):
            pass

        def settle(seconds):
            waits.append(seconds)
            raise Stop

        monkeypatch.setattr(mon, "_sleep_while_running", settle)
        with pytest.raises(Stop):
            mon.fire()
        assert hang_monitor.SETTLE_S - 0.7 - 0.5 < waits[0] < hang_monitor.SETTLE_S - 0.7 + 0.1, waits
    finally:
        rank.kill()
        rank.wait()


RANK_PY = """import sys


def wait_for_peer():
    return sys.stdin.read()  # the collective: returns when the peer is gone


if not wait_for_peer():
    raise RuntimeError("Connection closed by peer")
"""


def test_a_late_node_still_dumps_its_ranks_in_their_collective_when_another_node_aborts_first(tmp_path, monkeypatch, capsys):
    """Two nodes of one stall, one rank each, each waiting on the other (a pipe here, a socket in
    gloo); node 1's monitor wakes 0.5 s after node 0's. Once its peer is gone a rank leaves its
    wait and ends with an error, and a dump then no longer says where it waited (a CI run of
    test_hang_slurm: node 1's rank 3 was dumped inside torch's excepthook). Both ranks must be
    dumped in their wait, and neither node may end before the other's report is written."""
    import subprocess
    import threading
    import time

    for name, value in (("SETTLE_S", 1.0), ("STOP_SYNC_S", 1.0), ("LINGER_S", 0.5)):
        monkeypatch.setattr(hang_monitor, name, value)
    (tmp_path / "rank.py").write_text(RANK_PY)
    to_0, to_1 = os.pipe(), os.pipe()
    stalled = time.time() + 0.5
    procs, monitors, ended = [], [], {}
    try:
        for node, (inbox, outbox) in enumerate([(to_0, to_1), (to_1, to_0)]):
            logs = tmp_path / f"n{node}" / "x" / "attempt_0" / "0"
            logs.mkdir(parents=True)
            torchrun = subprocess.Popen(["sleep", "60"])
            with open(logs / "stderr.log", "wb") as err:
                rank = subprocess.Popen([sys.executable, "rank.py"], cwd=tmp_path, stdin=inbox[0], stderr=err,
                                        pass_fds=(outbox[1],), env={**os.environ, "PYTHONFAULTHANDLER": "1"})
            procs += [rank, torchrun]
            (tmp_path / f"p{node}").mkdir()
            (tmp_path / f"p{node}" / f"rank-{node}").write_bytes(b"%13d %17.3f\n" % (4, stalled - 10))
            mon = hang_monitor.Monitor(node, torchrun.pid, str(tmp_path / f"p{node}"), str(tmp_path / f"n{node}"),
                                       1, 10, 60, 0, host="h")
            mon.ranks[rank.pid] = {"rank": node, "local_rank": 0, "seen": 0.0, "out": [], "cwd": str(tmp_path)}
            monitors.append(mon)
        for fd in (*to_0, *to_1):
            os.close(fd)
        late, calls = monitors[1]._sleep_while_running, []

        def sleep(seconds):
            calls.append(seconds)
            late(seconds + (0.5 if len(calls) == 1 else 0.0))

        monkeypatch.setattr(monitors[1], "_sleep_while_running", sleep)

        def run(mon):
            mon.fire()
            ended[mon.node] = time.time()

        threads = [threading.Thread(target=run, args=(m,)) for m in monitors]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        recs = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().err.splitlines()
                if line.startswith("halo-sched-failure ")]
        assert sorted(r["rank"] for r in recs) == [0, 1], recs
        for r in recs:
            assert (r["stack_read"], r["error"], r["where"], r["code"]) == (True, "", "rank.py:5", "return sys.stdin.read()"), r
        # A node's end ends the others' step: each stays until the last abort plus LINGER_S.
        assert min(ended.values()) >= stalled + 1.0 + 1.0 + 0.5, (ended, stalled)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_rank_that_ended_before_its_dump_is_placed_by_its_traceback():
    # A peer's end breaks the all_reduce a rank waits in before this node's monitor signals it:
    # its traceback says where it was (as hang_monitor reads it; a dump's format is not there).
    from halo_sched.node.hang_monitor import classify_stack as where, parse_stacks, parse_traceback

    text = """[rank2]: Traceback (most recent call last):
[rank2]:   File "/tmp/hs/hang.py", line 55, in <module>
[rank2]:     main()
[rank2]:   File "/tmp/hs/hang.py", line 40, in main
[rank2]:     dist.all_reduce(t)
[rank2]:   File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
[rank2]:     work = group.allreduce([tensor], opts)
[rank2]: RuntimeError: Connection closed by peer [127.0.0.1]:29500
"""
    assert parse_stacks(text) == []
    frames = parse_traceback(text)
    assert frames[0][2] == "all_reduce" and frames[-1] == ("/tmp/hs/hang.py", 55, "<module>")
    assert where(frames, "/tmp/hs")["waiting_in"] == "all_reduce"

