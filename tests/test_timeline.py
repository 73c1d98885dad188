"""``halo-sched timeline``: layout, drawing and escaping from parsed records (halo_sched/timeline.py),
and the command's answers for an unknown job and a job without progress. No torch, no scheduler."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halo_sched import timeline as T
from halo_sched.node.failures import FailureReport, RankFailure
from helpers import REPO, cli

EXAMPLES = int(os.environ.get("HALO_HYPOTHESIS_EXAMPLES", "100"))
SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = '</text><script>alert(1)</script><text>&amp;"\'\x1b[31m'


def _hung(node, rank, step, last, at, waiting="all_reduce", host="h1", error=""):
    return RankFailure(node=node, rank=rank, local_rank=rank % 2, host=host, exit_code=None, signal=None,
                       time=at, error=error, kind="HUNG", step=step, last_progress=last,
                       where_in="" if waiting else "hang.py:43", code="" if waiting else "time.sleep(3600)",
                       waiting_in=waiting, stack_read=True)


def _hang_job(name="ddp", host="h1", error="", state="FAILED") -> T.Timeline:
    """2 nodes x 2 ranks step once a second from t=1000; rank 3 stops after step 29 (t=1029.5), the
    others after step 29 too (they wait in the next all_reduce); the monitors fire at 1045."""
    progress = {}
    for rank in range(4):
        progress[(rank // 2, rank)] = [(s, 1000.5 + s) for s in range(30)]
    hung = [_hung(r // 2, r, 29, 1029.5, 1045.0, waiting=None if r == 3 else "all_reduce", host=host,
                  error=error) for r in range(4)]
    return T.Timeline("ddp-1", name=name, backend="local", state=state, start=1000.0, end=1060.0, now=2000.0,
                      progress=progress, report=FailureReport(hung), hosts={0: host, 1: host},
                      ranks={(r // 2, r) for r in range(4)})


def test_layout_marks_progress_the_stall_the_hang_and_the_culprit():
    lay = T.layout(_hang_job(), 60)  # one column = 1 s
    assert [(r.node, r.rank) for r in lay.rows] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert [r.culprit for r in lay.rows] == [False, False, False, True]
    for r in lay.rows:
        cells = "".join(r.cells)
        # Start-up (no report yet), 30 s of steps, the stall, the hang at t=1045, then nothing.
        assert cells == T.QUIET * 0 + T.STEP * 30 + T.QUIET * 15 + T.HUNG + T.NONE * 14, cells
    assert lay.rows[3].note == "CULPRIT: HUNG, step 29"
    assert lay.rows[0].note == "HUNG in all_reduce, step 29"
    assert "rank 3" in lay.failure and "hang.py:43" in lay.failure


def test_layout_of_a_rank_that_failed_first_and_one_stopped_after_it():
    t0 = 1000.0
    progress = {(0, 0): [(s, t0 + s) for s in range(20)], (0, 1): [(s, t0 + s) for s in range(10)]}
    fails = [RankFailure(0, 1, 1, "h", 1, None, t0 + 10.5, error="boom"),
             RankFailure(0, 0, 0, "h", None, "SIGTERM", t0 + 12.5, stopped=True)]
    lay = T.layout(T.Timeline("j", start=t0, end=t0 + 20, progress=progress, report=FailureReport(fails)), 20)
    r0, r1 = lay.rows
    assert r1.culprit and not r0.culprit
    assert "".join(r1.cells) == T.STEP * 10 + T.EXIT + T.NONE * 9
    assert "".join(r0.cells) == T.STEP * 12 + T.STOPPED + T.NONE * 7
    assert "exit 1" in r1.note and "stopped" in r0.note


def test_steps_longer_than_a_column_draw_as_steady_progress_and_a_long_pause_does_not():
    # A step every 5 s over 200 s, 100 columns of 2 s; a 60 s checkpoint pause after step 20.
    t0 = 1000.0
    pts = [(s, t0 + 5 * s) for s in range(21)] + [(s, t0 + 60 + 5 * s) for s in range(21, 29)]
    lay = T.layout(T.Timeline("j", start=t0, end=t0 + 200, progress={(0, 0): pts}), 100)
    cells = "".join(lay.rows[0].cells)
    assert cells[:51] == T.STEP * 51, cells  # steps 0..20 at 1000..1100: no gaps between reports
    assert cells[51:82] == T.QUIET * 31, cells  # the pause: 1100 -> 1165
    assert T.STEP in cells[82:]


def test_the_helpers_history_draws_as_steady_progress_and_a_stall_in_it_does_not():
    # progress.report()'s history: a line every 0.5 s of 0.01 s steps, then the ring's last 128
    # steps; 100 columns of 0.2 s over 20 s, a 5 s stall (one step) at 12 s.
    t0 = 1000.0
    history = [(50 * i, t0 + 0.5 * i) for i in range(25)] + [(1201 + 50 * i, t0 + 17.5 + 0.5 * i) for i in range(2)]
    ring = [(s, t0 + 17.5 + 0.01 * (s - 1201)) for s in range(1201, 1329)]
    lay = T.layout(T.Timeline("j", start=t0, end=t0 + 20, progress={(0, 0): sorted(set(history + ring), key=lambda p: p[1])}), 100)
    cells = "".join(lay.rows[0].cells)
    assert cells[:61] == T.STEP * 61, cells  # 0 .. 12 s: 50 steps every 0.5 s
    assert set(cells[62:87]) == {T.QUIET}, cells  # 12 -> 17.5 s: one step in 5.5 s
    assert cells[87:94] == T.STEP * 7, cells


def test_a_running_job_ends_now_and_says_so():
    t0 = time.time() - 30
    tl = T.Timeline("j", start=t0, end=None, now=t0 + 30, progress={(0, 0): [(s, t0 + s) for s in range(25)]})
    lay = T.layout(tl, 30)
    assert lay.running and "".join(lay.rows[0].cells).endswith(T.QUIET * 5)
    text = T.render_text(lay, unicode=False)
    assert "now" in text and "job running" in text


def test_slurm_rows_without_history_show_the_last_progress_from_the_failure_lines():
    tl = _hang_job()
    tl.progress, tl.history, tl.note = {}, False, "history stays on the nodes"
    lay = T.layout(tl, 60)
    cells = "".join(lay.rows[3].cells)
    assert cells == T.UNSEEN * 30 + T.QUIET * 15 + T.HUNG + T.NONE * 14, cells
    assert "stays on the nodes" in T.render_text(lay)


@pytest.mark.parametrize("width", [40, 80, 100, 173])
@pytest.mark.parametrize("unicode", [True, False])
def test_text_fits_the_width_in_plain_characters(width, unicode):
    lay = T.layout(_hang_job(), T.columns_for(width, T.layout(_hang_job(), 10).rows))
    text = T.render_text(lay, unicode=unicode, width=width)
    assert "\x1b" not in text  # no colour, no escape sequence: NO_COLOR or not
    rows = [ln for ln in text.splitlines() if re.match(r" .rank \d", ln)]
    assert len(rows) == 4
    assert all(len(ln) <= max(width, 40) for ln in rows), [len(ln) for ln in rows]
    if not unicode:
        assert all(ord(c) < 128 for c in text)
    assert ("▶rank 3" if unicode else ">rank 3") in text
    assert "H" in rows[3] and "CULPRIT" in rows[3]


def test_hostile_text_cannot_drive_the_terminal():
    text = T.render_text(T.layout(_hang_job(name=HOSTILE, host=HOSTILE, error=HOSTILE, state=HOSTILE), 40))
    assert "\x1b" not in text
    assert "node 0 (host </text><script>" in text  # shown as text, the escape as ?


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg"
    return ["".join(e.itertext()) for e in root.iter() if e.tag in (f"{SVG}text", f"{SVG}title")]


def test_svg_escapes_hostile_names_hosts_and_errors():
    svg = T.render_svg(T.layout(_hang_job(name=HOSTILE, host=HOSTILE, error=HOSTILE, state=HOSTILE), 60))
    root = ET.fromstring(svg.encode())
    tags = {e.tag.split("}")[-1] for e in root.iter()}
    assert tags <= {"svg", "title", "rect", "text", "line"}, tags  # no script, no foreignObject, no link
    assert not [e for e in root.iter() for k in e.attrib if k.startswith("on") or "href" in k]
    texts = _texts(svg)
    shown = HOSTILE.replace("\x1b", "\ufffd")
    assert any(t == f"job ddp-1 ({shown}) on local" for t in texts), texts
    assert any(t == f"node 0 (host {shown})" for t in texts), texts
    assert any(t == shown for t in texts), texts  # the state line
    assert "<script>" not in svg and "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(max_size=40), host=st.text(max_size=40), error=st.text(max_size=80))
def test_svg_holds_any_text_as_text(name, host, error):
    tl = _hang_job(name=name, host=host, error=error, state=error)
    tl.job_id = f"j-{name}"
    svg = T.render_svg(T.layout(tl, 20))
    texts = _texts(svg)  # parses: nothing in the text closed an element or broke the document
    def clean(s: str) -> str:  # what XML cannot hold at all, and line breaks as spaces
        return re.sub("[\t\n\r]", " ", re.sub("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]", "\ufffd", s))

    assert f"node 0 (host {clean(host)})" in texts if host else "node 0" in texts
    if error:
        assert clean(error) in texts
    root = ET.fromstring(svg.encode())
    assert {e.tag.split("}")[-1] for e in root.iter()} <= {"svg", "title", "rect", "text", "line"}


def test_a_large_progress_file_is_read_at_the_column_edges_only(tmp_path):
    # 150,000 steps at 10 a second, a 3,000 s stall after step 100,000: ~3 MB, more than WHOLE_BYTES.
    lines, t = [], 1_000_000.0
    for s in range(150_000):
        t += 0.1 + (3000.0 if s == 100_000 else 0.0)
        lines.append(f"{s} {t:.3f}\n")
    p = tmp_path / "rank-0"
    p.write_text("".join(lines))
    assert p.stat().st_size > T.WHOLE_BYTES
    full = [(int(a), float(b)) for a, b in (ln.split() for ln in lines)]
    t0, t1, cols = 1_000_000.0, t + 1, 120
    edges = T.edges_of(t0, t1, cols)
    got = T.read_rank(p, edges)
    assert len(got) <= cols + 3  # a few hundred reads, not 150,000 lines
    want = T.layout(T.Timeline("j", start=t0, end=t1, progress={(0, 0): full}), cols).rows[0].cells
    have = T.layout(T.Timeline("j", start=t0, end=t1, progress={(0, 0): got}), cols).rows[0].cells
    assert have == want
    assert T.QUIET * 5 in "".join(have)  # the stall shows


def test_cli_never_imports_torch_for_a_timeline():
    code = ("import sys, halo_sched.cli, halo_sched.timeline; from halo_sched.cli import build_parser; "
            "build_parser('timeline'); print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.stdout.strip() == "False", r.stderr


def test_unknown_job_is_exit_2_naming_it():
    r = cli("timeline", "no-such-job-123", "--backend", "local", timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "no job 'no-such-job-123' on local" in r.stderr and "Traceback" not in r.stderr


def test_a_job_without_progress_yet_says_so(tmp_path):
    d = tmp_path / "halo-home" / "local" / "fresh-1"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"state": "PENDING", "submitted": time.time()}))
    (d / "job.json").write_text(json.dumps({"nodes": 2}))
    r = cli("timeline", "fresh-1", "--backend", "local", "--svg", str(tmp_path / "t.svg"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("job fresh-1: no progress reported yet (PENDING"), r.stdout
    assert not (tmp_path / "t.svg").exists()


def test_width_must_be_positive():
    r = cli("timeline", "x", "--width", "0", timeout=60)
    assert r.returncode == 2 and "--width" in r.stderr


def test_a_node_whose_torchrun_failed_without_naming_a_rank_marks_its_ranks():
    t0 = 1000.0
    progress = {(n, r): [(s, t0 + s) for s in range(10)] for n, r in ((0, 0), (1, 1))}
    fails = [RankFailure(1, None, None, "h2", 1, None, t0 + 12.5, error="torchrun: rendezvous failed")]
    lay = T.layout(T.Timeline("j", start=t0, end=t0 + 20, progress=progress, report=FailureReport(fails)), 20)
    r0, r1 = lay.rows
    assert "".join(r1.cells) == T.STEP * 10 + T.QUIET * 2 + T.EXIT + T.NONE * 7 and r1.culprit
    assert "".join(r0.cells) == T.STEP * 10 + T.QUIET * 10 and not r0.culprit
    assert lay.hosts[1] == "h2"


def test_a_line_the_rank_is_still_writing_is_not_read(tmp_path):
    p = tmp_path / "rank-0"
    p.write_bytes(b"0 1000.0\n1 1001.0\n2 10")  # "2 10": the rest of the line not written yet
    assert T.read_rank(p) == [(0, 1000.0), (1, 1001.0)]


def test_a_cancelled_job_names_no_culprit():
    """A cancel stops every rank with SIGTERM; the collector reports each (``SignalException ...
    signal: 15``). Those ends are the cancel's: no rank is a culprit, and none is drawn as failed."""
    t0 = 1000.0
    progress = {(0, r): [(s, t0 + s) for s in range(10)] for r in range(2)}
    fails = [RankFailure(0, r, r, "h", 1, None, t0 + 10.5 + r,
                         error="torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15")
             for r in range(2)]
    tl = T.Timeline("j", state="CANCELLED", start=t0, end=t0 + 20, progress=progress, report=FailureReport(fails),
                    cancelled=True)
    lay = T.layout(tl, 20)
    assert not any(r.culprit for r in lay.rows) and lay.failure == ""
    assert all(T.EXIT not in r.cells and T.STOPPED in r.cells for r in lay.rows)
    text = T.render_text(lay, width=100)
    assert "culprit" not in text.lower() and "SignalException" not in text, text
    assert all("stopped by the cancel" in r.note for r in lay.rows)


@pytest.mark.parametrize("args, env", [(["--width", "100000000"], {}), ([], {"COLUMNS": "100000000"})])
def test_a_huge_width_is_bounded(tmp_path, args, env):
    """``--width`` past the bound is exit 2 naming the option; $COLUMNS is bounded the same way.
    The child runs under 1 GiB of address space: a timeline 10^8 cells wide would not fit."""
    import resource

    d = tmp_path / "halo-home" / "local" / "wide-1"
    (d / "ranks" / "node-0" / "progress").mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"state": "FAILED", "submitted": 1000.0}))
    (d / "job.json").write_text(json.dumps({"nodes": 1, "nproc_per_node": 1}))
    (d / "ranks" / "node-0" / "progress" / "rank-0").write_text("".join(f"{s} {1000 + s}.0\n" for s in range(20)))

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "timeline", "wide-1", "--backend", "local", *args],
                       cwd=REPO, capture_output=True, text=True, timeout=60, preexec_fn=limited,
                       env={**os.environ, **env})
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    if args:
        assert r.returncode == 2 and "argument --width: 100000000: at most 1000" in r.stderr, r.stderr
    else:
        assert r.returncode == 0 and "rank 0" in r.stdout, (r.stdout, r.stderr)
        assert max(len(line) for line in r.stdout.splitlines()) <= 1000, r.stderr


def test_times_from_a_job_beyond_any_clock_are_not_read(tmp_path):
    """A progress file or a failure line is the job's: a time of 1e300 (``localtime`` overflows)
    or 1e20 is no report."""
    from halo_sched.node.failures import parse_line

    p = tmp_path / "rank-0"
    p.write_bytes(b"0 1000.0\n1 1e300\n2 1e20\n3 1003.0\n")
    assert T.read_rank(p) == [(0, 1000.0), (3, 1003.0)]
    for t in ("1e300", "1e20", "-5", "Infinity", "NaN", "1" + "0" * 400):
        assert parse_line('halo-sched-failure {"node": 0, "rank": 0, "time": %s}' % t) is None, t


@pytest.mark.parametrize("submitted", [1e300, float("inf")])
def test_a_record_time_beyond_any_clock_is_not_the_start(tmp_path, submitted):
    """The job record is a file: ``submitted`` 1e300 overflowed ``localtime`` (internal error)."""
    from halo_sched import records

    d = tmp_path / "halo-home" / "local" / "odd-1"
    (d / "ranks" / "node-0" / "progress").mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"state": "FAILED"}))
    (d / "job.json").write_text(json.dumps({"nodes": 1, "nproc_per_node": 1}))
    (d / "ranks" / "node-0" / "progress" / "rank-0").write_text("".join(f"{s} {1000 + s}.0\n" for s in range(5)))
    records.write({"version": 1, "id": "odd-1", "backend": "local", "name": "odd", "submitted": submitted,
                   "spec": {"slurm": {}}, "outputs": [], "scheduler": {}, "nodes": 1, "nproc_per_node": 1})
    r = cli("timeline", "odd-1", "--width", "80", timeout=60)
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    assert "rank 0" in r.stdout
