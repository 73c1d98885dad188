"""The failure report: the line format, the collector's reading of torchrun's files, the first failure."""
from __future__ import annotations

import json
import os
import time

from halo_sched.node.failure_collector import collect, error_line, record_line, summary_failures

# srun relays at most 1024 bytes of a line in one piece (slurmstepd io.c); docs/guarantees.md promises
# failure records under 1,000 bytes.
LINE_MAX = 1000
from halo_sched.node.failures import FailureReport, RankFailure, first_failure, parse_line, parse_lines


def _line(prefix="", **kw) -> str:
    rec = {"node": 1, "rank": 3, "local_rank": 1, "host": "gpu-07", "exit_code": 1, "signal": None,
           "time": 1000.5, "error": "ValueError: boom", "tail": ["x"], "stopped": False, **kw}
    return f"{prefix}halo-sched-failure {json.dumps(rec)}\n"


def test_parse_line_ignores_any_prefix_and_rejects_partial_records():
    for prefix in ("", "[node 1] ", "1: ", "  1: "):
        f = parse_line(_line(prefix))
        assert f == RankFailure(node=1, rank=3, local_rank=1, host="gpu-07", exit_code=1, signal=None,
                                time=1000.5, error="ValueError: boom", tail=("x",))
    assert parse_line("halo-sched-failure {\"node\": 1, \"time\": 1") is None  # torn line
    assert parse_line(_line().replace('"time": 1000.5', '"time": "soon"')) is None
    assert parse_line(_line().replace('"node": 1', '"node": null')) is None
    assert parse_line("a user printing halo-sched-failure text") is None


def test_the_same_failure_read_twice_counts_once():
    assert len(parse_lines([_line("[node 1] "), _line("1: ")])) == 1


def test_first_failure_is_earliest_not_lowest_rank():
    fs = parse_lines([_line(rank=0, node=0, time=1002.0), _line(rank=5, time=1001.25), _line(rank=3, time=1001.5)])
    assert first_failure(fs).rank == 5
    rep = FailureReport(fs)
    # The rank's own words lead; where and how follow.
    assert rep.describe().startswith("ValueError: boom [rank 5 (node 1, host gpu-07, local rank 1) exit 1 at ")
    assert rep.describe().endswith("]; 2 other ranks ended after it")


def test_a_rank_stopped_by_the_scheduler_never_wins():
    # The victim's stop time can precede the real failure's report (clocks, whole seconds).
    fs = parse_lines([_line(rank=None, node=0, time=999.0, stopped=True, error="SignalException"),
                      _line(rank=3, time=1000.0)])
    assert first_failure(fs).rank == 3


def test_on_a_tie_a_named_rank_beats_a_whole_node():
    fs = parse_lines([_line(rank=None, node=0, time=1000.0), _line(rank=3, time=1000.0)])
    assert first_failure(fs).rank == 3


def test_describe_names_a_signal_and_a_node_level_failure():
    f = parse_line(_line(exit_code=137, signal="SIGKILL", error="killed by SIGKILL"))
    assert "killed by SIGKILL (exit 137)" in f.describe()
    n = parse_line(_line(rank=None, local_rank=None, error="DistStoreError: timed out"))
    assert n.describe().startswith("DistStoreError: timed out [node 1 (host gpu-07) torchrun exit 1 at ")


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-02_03:04:07
  host      : gpu-07
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 11357)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 11357
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-02_03:04:05
  host      : gpu-07
  rank      : 3 (local_rank: 1)
  exitcode  : 3 (pid: 11359)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchrun_summary_gives_each_ranks_exit_and_signal():
    s = summary_failures(SUMMARY)
    assert s[3]["exit_code"] == 3 and s[3]["signal"] is None and s[3]["local_rank"] == 1
    assert s[2]["exit_code"] == 143 and s[2]["signal"] == "SIGTERM"
    assert s[3]["time"] == time.mktime((2026, 1, 2, 3, 4, 5, 0, 0, -1))


def test_error_line_skips_torch_rank_prefix_and_finds_the_exception():
    assert error_line(["[rank3]: Traceback (most recent call last):", "[rank3]: ValueError: boom", "done"]) == "ValueError: boom"
    assert error_line(["just text"]) == "just text"


def test_collector_reads_torchruns_files(tmp_path):
    """The layout torchrun makes with --log-dir (DefaultLogsSpecs.reify): RUN_x/attempt_0/<local rank>/."""
    (tmp_path / "torchrun.err").write_text(SUMMARY)
    r1 = tmp_path / "none_ab12" / "attempt_0" / "1"
    r1.mkdir(parents=True)
    (r1 / "stderr.log").write_text("Traceback (most recent call last):\nValueError: rank 3 fails\n")
    t = time.mktime((2026, 1, 2, 3, 4, 4, 0, 0, -1)) + 0.25  # just before torchrun noticed
    os.utime(r1 / "stderr.log", (t, t))
    r0 = tmp_path / "none_ab12" / "attempt_0" / "0"
    r0.mkdir()
    (r0 / "error.json").write_text(json.dumps({"message": {"message": "RuntimeError: peer gone",
                                                           "extraInfo": {"timestamp": "1"}}}))
    recs = {r["rank"]: r for r in collect(1, 2, str(tmp_path), 1, host="h")}
    assert recs[3]["error"] == "ValueError: rank 3 fails" and recs[3]["time"] == t  # mtime, not whole seconds
    assert recs[2]["error"] == "RuntimeError: peer gone" and recs[2]["signal"] == "SIGTERM"
    # torchrun SIGTERMed rank 2 after rank 3 failed: a victim, even where its whole-second summary
    # time (or, here, its error file) reads earlier than rank 3's precise one.
    assert recs[2]["stopped"] and not recs[3]["stopped"]
    assert first_failure(parse_lines(record_line(r) for r in recs.values())).rank == 3


def test_a_node_whose_ranks_were_all_sigtermed_keeps_them_as_causes(tmp_path):
    # SIGTERM from outside (a cancel, the scheduler) with no rank failing on its own: nobody on
    # this node is torchrun's victim.
    only_term = SUMMARY.replace("exitcode  : 3 (pid: 11359)", "exitcode  : -15 (pid: 11359)  (SIGTERM)")
    (tmp_path / "torchrun.err").write_text(only_term)
    recs = collect(1, 2, str(tmp_path), 1, host="h")
    assert recs and all(r["signal"] == "SIGTERM" and not r["stopped"] for r in recs)


def test_collector_reports_the_node_when_torchrun_named_no_rank(tmp_path):
    (tmp_path / "torchrun.err").write_text("torch.distributed.DistStoreError: Timed out after 31 seconds\n")
    [rec] = collect(0, 2, str(tmp_path), 1, host="h", now=5.0)
    assert rec["rank"] is None and rec["node"] == 0 and rec["error"].startswith("torch.distributed.DistStoreError")
    [rec] = collect(0, 2, str(tmp_path), 143, stopped_at=4.0, host="h")
    assert rec["stopped"] and rec["signal"] == "SIGTERM" and rec["time"] == 4.0


def test_a_record_line_fits_in_one_srun_piece_and_keeps_the_newest_tail():
    # srun cuts a task's line of 1024 bytes or more in two (SLURM_IO_MAX_MSG_LEN): such a record
    # was lost on SLURM (seen: a rendezvous timeout's traceback tail).
    tail = [f"line {i} " + "x" * 390 for i in range(12)]
    rec = {"node": 0, "rank": None, "local_rank": None, "host": "vm", "exit_code": 1, "signal": None,
           "time": 1000.5, "error": "torch.distributed.DistStoreError: Timed out", "tail": tail, "stopped": False}
    line = record_line(rec)
    assert len(line.encode()) <= LINE_MAX < 1024 and line.endswith("\n")
    f = parse_line("0: " + line)
    assert f is not None and f.error == rec["error"] and f.tail and f.tail[-1] == tail[-1]
    # An error too long alone (non-ASCII escapes six-fold) is cut rather than the record lost.
    huge = record_line({**rec, "tail": [], "error": "é" * 400})
    assert len(huge.encode()) <= LINE_MAX and parse_line(huge).error.startswith("é")
    short = record_line({**rec, "tail": ["a"]})
    assert parse_line(short).tail == ("a",)  # nothing dropped when it fits


def test_a_missing_script_leads_with_the_one_useful_line():
    # What Python writes when torchrun hands it a script that is not there (the rank's stderr).
    said = "/opt/venv/bin/python3.11: can't open file '/x/train.py': [Errno 2] No such file or directory"
    f = parse_line(_line(rank=0, node=0, local_rank=0, exit_code=2, error=said))
    text = FailureReport([f]).describe()
    assert text.startswith("can't open file '/x/train.py': No such file or directory [rank 0 (node 0, "), text
    assert "python3.11" not in text and "Errno" not in text
