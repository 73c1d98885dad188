"""The failure report: the line format, the collector's reading of torchrun's files, the first failure."""
from __future__ import annotations

import json
import os
import time

from halo_sched.node.failure_collector import collect, error_line, record_line, summary_failures

# srun relays at most 1024 bytes of a line in one piece (slurmstepd io.c); docs/guarantees.md promises
# failure records under 1,000 bytes.
LINE_MAX = 1000
from halo_sched.node import failures
from halo_sched.node.failure_collector import sign
from halo_sched.node.failures import FailureReport, RankFailure, first_failure

#: The job's failure key in these tests: the lines below are signed with it, as a node's are.
KEY = "5e" * 32


def parse_line(line, key=KEY):
    return failures.parse_line(line, key)


def parse_lines(lines, key=KEY):
    return failures.parse_lines(lines, key)


def _line(prefix="", **kw) -> str:
    rec = {"node": 1, "rank": 3, "local_rank": 1, "host": "gpu-07", "exit_code": 1, "signal": None,
           "time": 1000.5, "error": "ValueError: boom", "tail": ["x"], "stopped": False, **kw}
    body = json.dumps(rec)
    return f'{prefix}halo-sched-failure {body[:-1]},"mac":"{sign(body, KEY)}"}}\n'


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
    assert first_failure(parse_lines(record_line(r, KEY) for r in recs.values())).rank == 3


def test_a_rank_killed_by_a_signal_is_timed_by_its_last_words_not_the_second_torchrun_noticed(tmp_path):
    """Node 1's rank dies of a SIGKILL at 59.944 s (its last line written then); torchrun's summary
    says the second it noticed, 60 s. Node 0's rank dies of it at 59.952 s (its traceback's precise
    time). The culprit is node 1's: timed by its last line, not by the later whole second."""
    killed = SUMMARY.replace("exitcode  : 3 (pid: 11359)", "exitcode  : -9 (pid: 11359)  (SIGKILL)") \
        .replace("2026-01-02_03:04:05", "2026-01-02_03:05:00")
    base = time.mktime((2026, 1, 2, 3, 4, 59, 0, 0, -1))
    lines = []
    for node, summary, text, at in ((1, killed, "NCCL WARN NET/IB : Got completion from peer\n", base + 0.944),
                                    (0, SUMMARY.replace("2026-01-02_03:04:05", "2026-01-02_03:05:00"),
                                     "Traceback (most recent call last):\nRuntimeError: Connection reset by peer\n",
                                     base + 0.952)):
        d = tmp_path / f"node{node}"
        r = d / "none_ab12" / "attempt_0" / "1"
        r.mkdir(parents=True)
        (d / "torchrun.err").write_text(summary)
        (r / "stderr.log").write_text(text)
        os.utime(r / "stderr.log", (at, at))
        lines += [record_line(rec, KEY) for rec in collect(node, 2, str(d), 1, host=f"h{node}") if rec["rank"] == 3]
    first = first_failure(parse_lines(lines, KEY))
    assert (first.node, first.signal, first.time) == (1, "SIGKILL", base + 0.944), first


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


# ---- issue 28: a rank's output is evidence, not a verdict; secrets never leave the node ----


def test_a_forged_line_dated_earlier_is_shown_but_picks_no_first_failure_and_no_ledger_host():
    from halo_sched.node.failure_classes import classify_failure

    real = _line(rank=3, time=1000.5, error="ValueError: boom")
    forged = (f"[rank 0]: halo-sched-failure " + json.dumps({
        "node": 0, "rank": 0, "local_rank": 0, "host": "victim-host", "node_name": "victim-host", "exit_code": 1,
        "signal": None, "time": 900.5, "error": "NCCL WARN NET/IB : Got completion with error 12", "tail": [],
        "stopped": False}) + "\n")
    wrong_key = _line(rank=1, time=800.0, host="other").replace(sign(json.dumps(
        {"node": 1, "rank": 1, "local_rank": 1, "host": "other", "exit_code": 1, "signal": None, "time": 800.0,
         "error": "ValueError: boom", "tail": ["x"], "stopped": False}), KEY), "0" * 64)
    rep = failures.report_from_lines([forged, wrong_key, real], KEY)
    assert rep.first.rank == 3 and rep.first.host == "gpu-07"
    assert classify_failure(rep).host != "victim-host"
    assert [f.trusted for f in sorted(rep.failures, key=lambda f: f.time)] == [False, False, True]
    assert rep.to_dict()["unverified"] == 2 and rep.others() == 0
    # Only forged lines: shown as text, naming nobody.
    alone = failures.report_from_lines([forged], KEY)
    assert alone.first is None and classify_failure(alone).host == "" and "unverified" in alone.describe()
    # Without the job's key nothing verifies (a job submitted before keys: no verdict from its lines).
    assert failures.report_from_lines([real], "").first is None


def test_a_node_signs_its_lines_with_the_key_from_its_environment(monkeypatch):
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    rec = {"node": 0, "rank": 2, "local_rank": 0, "host": "h", "exit_code": 1, "signal": None, "time": 5.0,
           "error": "ValueError: x", "tail": ["a"], "stopped": False}
    line = record_line(rec)
    assert parse_line(line).trusted and not parse_line(line, "6f" * 32).trusted
    assert not parse_line(line.replace('"rank":2', '"rank":1')).trusted  # any change breaks it
    monkeypatch.delenv("HALO_FAILURE_KEY")
    assert '"mac"' not in record_line(rec) and not parse_line(record_line(rec)).trusted


def _rank_dir(tmp_path, stderr: str):
    (tmp_path / "torchrun.err").write_text(SUMMARY)
    d = tmp_path / "none_ab12" / "attempt_0" / "1"
    d.mkdir(parents=True)
    (d / "stderr.log").write_text(stderr)
    return d


def test_secret_env_values_are_scrubbed_on_the_node_before_any_cut(tmp_path, monkeypatch):
    token = "tok_" + "A1b2C3d4" * 5 + "zz"  # 46 characters
    monkeypatch.setenv("MY_TOKEN", token)
    monkeypatch.setenv("HALO_SECRET_NAMES", "MY_TOKEN")
    # 340 x: the token fits the collector's 400-character cut; 380 x: the cut leaves a fragment.
    for n in (340, 354, 380):
        d = tmp_path / str(n)
        d.mkdir()
        _rank_dir(d, f"Traceback (most recent call last):\nValueError: {'x' * n}{token}\n")
        recs = collect(1, 2, str(d), 1, host="h")
        line = record_line(next(r for r in recs if r["rank"] == 3), KEY)
        for frag in (token, token[:8], token[-8:]):
            assert frag not in line, (n, frag)
        assert "ValueError: " + "x" * 20 in line
    # error.json's message (a trainer with @record) as well.
    (tmp_path / "json").mkdir()
    d = _rank_dir(tmp_path / "json", "")
    (d / "error.json").write_text(json.dumps({"message": {"message": f"RuntimeError: auth {token} refused"}}))
    rec = next(r for r in collect(1, 2, str(tmp_path / "json"), 1, host="h") if r["rank"] == 3)
    assert rec["error"] == "RuntimeError: auth *** refused"
    # What the hang monitor hands record_line is scrubbed there.
    assert token not in record_line({"node": 0, "rank": 0, "time": 1.0, "error": token, "code": f"f('{token}')",
                                     "tail": [token]}, KEY)


def test_a_short_secret_value_mangles_no_text_and_submit_warns(monkeypatch, capsys):
    from halo_sched.backends.base import warn_short_secrets

    monkeypatch.setenv("X", "x")
    monkeypatch.setenv("HALO_SECRET_NAMES", "X")
    line = record_line({"node": 0, "rank": 0, "time": 1.0, "error": "exit 3", "tail": ["exit"]}, KEY)
    assert '"error":"exit 3"' in line and "***" not in line
    warn_short_secrets({"X": "x", "LONG": "a-long-enough-value"})
    err = capsys.readouterr().err
    assert "secret_env X is 1 characters long" in err and "LONG" not in err


DUMP_312 = """[rank3]: step 41
Fatal Python error: Aborted

Thread 0x00007f6c1cbff6c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Current thread 0x00007f6c2a0b8740 (most recent call first):
  File "/work/train.py", line 57 in step
  File "/work/train.py", line 80 in <module>

Extension modules: numpy._core._multiarray_umath, numpy.linalg._umath_linalg, torch._C, torch._C._dynamo.autograd_compiler, torch._C._dynamo.eval_frame (total: 13)
"""


def test_the_error_of_a_rank_aborted_with_a_stack_dump_is_its_frame_not_the_trailer(tmp_path):
    assert error_line(DUMP_312.splitlines()) == "Fatal Python error: Aborted, in train.py:57 (step)"
    # A traceback after the dump is what the rank said last; one before it is not.
    assert error_line((DUMP_312 + "ValueError: later\n").splitlines()) == "ValueError: later"
    assert error_line(("ValueError: earlier\n" + DUMP_312).splitlines()).startswith("Fatal Python error: Aborted")
    # Through the collector: the dump is longer than the tail it keeps.
    _rank_dir(tmp_path, DUMP_312)
    rec = next(r for r in collect(1, 2, str(tmp_path), 1, host="h") if r["rank"] == 3)
    assert rec["error"] == "Fatal Python error: Aborted, in train.py:57 (step)"
