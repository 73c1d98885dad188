"""A run's effective training time, measured from the run itself (halo_sched/ettr.py): runs with
injected faults written as the backends leave them (job records, the ranks' progress files, signed
failure and swap lines), every figure checked against the arithmetic written beside it. No
scheduler, no torch: ``status`` reads the local backend's job directories; the SLURM run is read
from its records and the hang monitor's copies beside its output file."""
from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from halo_sched import ettr, records
from halo_sched.node.failure_collector import record_line
from helpers import cli

T = 1_800_000_000.0  # the runs' clock: every time below is T + seconds
KEY = "k" * 64


def _progress(root: Path, node: int, rank: int, reports, step_dir: str = "progress") -> None:
    d = root / f"node-{node}" / step_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank-{rank}").write_text("".join(f"{s} {T + t:.3f}\n" for s, t in reports))


def _failure_line(node: int, rank: int, at: float, host: str = "n2") -> str:
    return record_line({"node": node, "rank": rank, "local_rank": 0, "host": host, "node_name": host,
                        "exit_code": None, "signal": "SIGKILL", "time": T + at, "error": "killed", "tail": []},
                       KEY, secrets=[])


def _local_attempt(home: Path, job: str, n: int, state: str, submitted: float, started: float, ended: float,
                   failure_at: float | None = None) -> dict:
    """A local job's directory (its supervisor's state, its output) and its record."""
    d = home / "local" / job
    old = os.umask(0o077)  # as halo-sched keeps its home: private to its owner
    try:
        d.mkdir(parents=True)
    finally:
        os.umask(old)
    (d / "job.json").write_text(json.dumps({"nodes": 2}))
    (d / "state.json").write_text(json.dumps({"state": state, "started": T + started, "ended": T + ended,
                                              "exit_code": 0 if state == "COMPLETED" else 1, "nodes_running": 0,
                                              "reason": "", "submitted": T + submitted}))
    (d / "job.log").write_text("")
    (d / "node-0.log").write_text("")
    (d / "node-1.log").write_text(_failure_line(1, 1, failure_at) if failure_at is not None else "")
    fails = ([{"node": 1, "rank": 1, "time": T + failure_at, "trusted": True}] if failure_at is not None else [])
    return {"id": job, "backend": "local", "name": "ettr", "submitted": T + submitted, "nodes": 2,
            "nproc_per_node": 1, "spec": {"name": "ettr", "nodes": 2, "nproc_per_node": 1, "gpus_per_node": 8,
                                      "trainer": {"script": "train.py"}, "retry": {"attempts": 2}, "slurm": {}},
            "outputs": [str(d / "job.log"), str(d / "node-0.log"), str(d / "node-1.log")],
            "scheduler": {"job_dir": str(d)}, "failure_key": KEY,
            "run": {"id": "r1", "attempt": n, "excluded": []},
            "last_state": {"status": state, "describe": state, "started_at": T + started, "ended_at": T + ended,
                           **({"failure": {"failures": fails}} if fails else {})}}


@pytest.fixture
def queued_run(tmp_path):
    """Two attempts on the local backend, 2 nodes x 1 rank each:

    attempt 1 (r1): submitted at -5, runs 0..60. Rank 0 reports steps 1-10 at 10, 14, .., 46;
    rank 1 the same steps half a second later (10.5 .. 46.5). Node 1's rank dies at 52 (its signed
    failure line); the attempt ends FAILED at 60.
    attempt 2 (r2): submitted at 61, runs 100..200. It resumes from the checkpoint of step 6:
    rank 0 reports steps 7-20 at 130, 134, .., 182 (rank 1: +0.5 s); COMPLETED at 200."""
    home = Path(os.environ["HALO_SCHED_HOME"])
    a1 = _local_attempt(home, "r1", 0, "FAILED", -5, 0, 60, failure_at=52)
    a2 = _local_attempt(home, "r2", 1, "COMPLETED", 61, 100, 200)
    for job, first, steps in (("r1", 10, range(1, 11)), ("r2", 130, range(7, 21))):
        root = home / "local" / job / "ranks"
        for rank, late in ((0, 0.0), (1, 0.5)):
            _progress(root, rank, rank, [(s, first + 4 * (s - steps[0]) + late) for s in steps])
    records.write(a1)
    records.write(a2)
    return home


# The queued run's figures, by hand (seconds):
#   startup   = first report 10 - start 0 = 10; plus the finish: end 200 - last report 182.5 = 17.5 -> 27.5
#   train     = attempt 1: 46.5 - 10 = 36.5; attempt 2, from step 10 again (134 + 4 x 2 = 142) to 182.5: 40.5
#               -> 77.0
#   detection = the last report 46.5 to the failure line at 52 -> 5.5
#   restart   = 52 to the successor's submission at 61 (the failed attempt ended at 60): 9; then its
#               start 100 to its first report 130: 30 -> 39.0
#   queue     = submitted 61 to started 100 -> 39.0
#   rework    = the first report after the restart (step 7 at 130) to step 10 reported again (142) -> 12.0
#   span      = 0 .. 200 = 200 = 27.5 + 77 + 5.5 + 39 + 39 + 12; ettr = 77 / 200 = 0.385
QUEUED = {"startup": 27.5, "detection": 5.5, "restart": 39.0, "queue": 39.0, "rework": 12.0, "maintenance": 0.0, "spares_idle": 0.0}


def test_a_node_fault_through_the_queue_costs_what_the_arithmetic_says(queued_run, tmp_path):
    r = cli("status", "r1", "--backend", "local", "--json", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["run"]["totals"]
    assert t["lost_s"] == pytest.approx(QUEUED) and t["train_s"] == pytest.approx(77.0)
    assert t["span_s"] == pytest.approx(200.0) and t["held_s"] == pytest.approx(200.0)
    assert t["ettr"] == pytest.approx(77.0 / 200.0) and t["failures"] == 1
    assert math.isclose(sum(t["lost_s"].values()) + t["train_s"], t["held_s"])
    # GPU-hours as before: 2 nodes x 8 GPUs x (60 s + 100 s)
    assert t["gpu_hours"] == pytest.approx(16 * 160 / 3600, abs=1e-6) and t["attempts"] == 2

    text = cli("status", "r1", "--backend", "local", cwd=tmp_path, timeout=60).stdout
    line = next(ln for ln in text.splitlines() if "effective training time" in ln)
    assert ("effective training time 38.5%: 77.0 s trained of 3.3 min held; lost: startup 27.5 s, detection "
            "5.5 s, restart 39.0 s, queue 39.0 s, rework 12.0 s, spares idle 0.0 s") in line, text

    import halo_sched

    assert halo_sched.run("r1", backend="local").totals()["ettr"] == pytest.approx(0.385)
    # Kept in the run's first record once every attempt ended: export carries it, and it is read
    # from there when the files it came from are gone.
    exported = [json.loads(ln) for ln in cli("export", cwd=tmp_path, timeout=60).stdout.splitlines()]
    first = next(x for x in exported if x.get("kind") == "job" and x["id"] == "r1")
    assert first["ettr"]["ettr"] == pytest.approx(0.385) and first["ettr"]["attempts"] == ["r1", "r2"]
    assert first["ettr"]["lost_s"] == pytest.approx(QUEUED)
    import shutil

    for job in ("r1", "r2"):
        shutil.rmtree(queued_run / "local" / job / "ranks")
    assert ettr.of_run("r1", "local")["lost_s"] == pytest.approx(QUEUED)


def test_the_run_timeline_draws_each_attempt_with_the_lost_time_coloured_by_cause(queued_run, tmp_path):
    svg = tmp_path / "run.svg"
    r = cli("timeline", "r1", "--backend", "local", "--svg", str(svg), "--width", "120", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "run r1: 2 attempts" in r.stdout and "attempt 2 " in r.stdout, r.stdout
    assert "w steps done twice" in r.stdout and "q successor pending" in r.stdout, r.stdout
    doc = ET.fromstring(svg.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    rects = [(e.get("fill"), e.findtext(f"{ns}title")) for e in doc.iter(f"{ns}rect") if e.findtext(f"{ns}title")]
    from halo_sched.timeline import RUN_COLOURS

    titles = {t for f, t in rects if f == RUN_COLOURS["queue"]}
    assert titles == {"successor pending: 39 s"}, rects
    assert {t for f, t in rects if f == RUN_COLOURS["rework"]} == {"steps done twice: 12 s"}, rects
    assert {t for f, t in rects if f == RUN_COLOURS["detection"]} == {"last step to the failure known: 5.5 s"}


def _slurm_attempt(out: Path, job: str, n: int, state: str, submitted: float, started: float, ended: float,
                   swaps=(), failures=()) -> dict:
    return {"id": job, "backend": "slurm", "name": "ettr", "submitted": T + submitted, "nodes": 2,
            "nproc_per_node": 1, "spec": {"nodes": 2, "gpus_per_node": 8, "slurm": {"spare_nodes": 1}},
            "outputs": [str(out / f"halo-ettr-{job}.out")], "failure_key": KEY,
            "run": {"id": "101", "attempt": n, "excluded": []},
            "last_state": {"status": state, "describe": state, "started_at": T + started, "ended_at": T + ended,
                           "spares": {"total": 1, "left": 1 - len(swaps),
                                      "swaps": [{"rank": 1, "bad": "n2", "spare": "n3", "time": T + s} for s in swaps]},
                           "failure": {"failures": [{"time": T + f, "trusted": True} for f in failures]}}}


@pytest.fixture
def swapped_run(tmp_path):
    """A SLURM run of 2 nodes and 1 hot spare, 2 attempts:

    attempt 1 (101): runs 0..150. Steps 1-10, 4 s apart from 10 (rank 1 half a second after rank
    0); node 1 dies at 52 (a signed failure line in the output); the batch script swaps the spare in
    at 58 (the signed swap line); the new step resumes from the checkpoint of step 6: steps 7-23
    from 75, 4 s apart (last: 139 and 139.5). Node 1 (now the spare) dies at 143.5; no spare left:
    the attempt fails at 150, having submitted its successor at 148.
    attempt 2 (102): runs 170..310; resumes from step 20's checkpoint: steps 21-44 from 200, 4 s
    apart (last 292, 292.5); COMPLETED at 310.
    Rank 0 reported checkpoints costing 4, 6 and 5 s at 30, 100 and 230."""
    out = tmp_path / "out"
    mirror = out / ".halo-progress"
    out.mkdir()
    (out / "halo-ettr-101.out").write_text("training...\n" + _failure_line(1, 1, 52) + "more\n"
                                           + _failure_line(1, 1, 143.5, host="n3"))
    (out / "halo-ettr-102.out").write_text("")
    for rank, late in ((0, 0.0), (1, 0.5)):
        _progress(mirror / "101", rank, rank, [(s, 10 + 4 * (s - 1) + late) for s in range(1, 11)], "progress.1")
        _progress(mirror / "101", rank, rank, [(s, 75 + 4 * (s - 7) + late) for s in range(7, 24)])
        _progress(mirror / "102", rank, rank, [(s, 200 + 4 * (s - 21) + late) for s in range(21, 45)])
    (mirror / "101" / "node-0" / "progress.1" / "rank-0.checkpoints").write_text(
        f"6 {T + 30:.3f} 4.0\n12 {T + 100:.3f} 6.0\n")
    (mirror / "102" / "node-0" / "progress" / "rank-0.checkpoints").write_text(f"30 {T + 230:.3f} 5.0\n")
    records.write(_slurm_attempt(out, "101", 0, "FAILED", -3, 0, 150, swaps=[58], failures=[143.5]))
    records.write(_slurm_attempt(out, "102", 1, "COMPLETED", 148, 170, 310))
    return out


# The swapped run's figures, by hand (seconds):
#   startup   = 10 - 0 = 10; the finish 310 - 292.5 = 17.5 -> 27.5
#   train     = 46.5 - 10 = 36.5; from step 10 again (75 + 4 x 3 = 87) to 139.5: 52.5; from step 23
#               again (200 + 4 x 2 = 208) to 292.5: 84.5 -> 173.5
#   detection = 46.5 -> 52 (the failure line before the swap): 5.5; 139.5 -> 143.5: 4 -> 9.5
#   restart   = 52 -> 75, the first step after the swap: 23; 143.5 -> 150, the attempt's end (its
#               successor was submitted before it, at 148): 6.5; 170 -> 200: 30 -> 59.5
#   queue     = from the later of the end (150) and the submission (148) to the start 170 -> 20
#   rework    = 75 -> 87 and 200 -> 208 -> 20
#   span 310 = 27.5 + 173.5 + 9.5 + 59.5 + 20 + 20;
#   spares_idle = 1 spare / 2 nodes x (150 + 140) = 145; held = 310 + 145 = 455; ettr = 173.5 / 455
#   failures: the swap, the attempt's end -> 2; MTBF = 290 s up / 2 = 145; checkpoints: median cost
#   5 s, median interval (70 s: 30 -> 100) 70; Young/Daly sqrt(2 x 5 x 145) = 38.08 s
SWAPPED = {"startup": 27.5, "detection": 9.5, "restart": 59.5, "queue": 20.0, "rework": 20.0, "maintenance": 0.0, "spares_idle": 145.0}


def test_a_spare_swap_inside_an_attempt_is_a_restart_gap_and_the_checkpoint_interval_is_sized(swapped_run):
    f = ettr.of_run("101", "slurm")
    assert f["lost_s"] == pytest.approx(SWAPPED) and f["train_s"] == pytest.approx(173.5)
    assert f["held_s"] == pytest.approx(455.0) and f["ettr"] == pytest.approx(173.5 / 455.0)
    assert f["failures"] == 2
    cp = f["checkpoint"]
    assert cp["cost_s"] == 5.0 and cp["interval_s"] == 70.0 and cp["mtbf_s"] == 145.0
    assert cp["best_interval_s"] == pytest.approx(math.sqrt(2 * 5 * 145), abs=1e-3)
    lines = ettr.describe(f)
    assert lines[1] == ("checkpoints: 5.0 s each (median of 3), every 70.0 s; with this run's 2 failures (one per "
                        "2.4 min up), every 38.1 s would have lost least (Young/Daly: sqrt(2 x cost x MTBF))"), lines


def test_without_the_swap_line_the_steps_going_back_still_mark_the_restart(swapped_run):
    """A restart that no line announced (a requeue of the same job): the second copy's steps fall
    back; the failure line dates the detection, the rest up to the first step is restart."""
    recs = ettr.run_records("101", "slurm")
    recs[0]["last_state"]["spares"] = {}
    acc = ettr.of_records(recs)
    assert acc.lost_s["detection"] == pytest.approx(9.5) and acc.lost_s["restart"] == pytest.approx(59.5)
    assert acc.failures == 2


def test_a_long_history_read_by_binary_search_gives_the_same_figures(swapped_run, monkeypatch):
    whole = ettr.of_run("101", "slurm", keep=False)
    monkeypatch.setattr(ettr, "WHOLE_BYTES", 64)  # every file here is larger: binary searches only
    assert isinstance(ettr.source(next((swapped_run / ".halo-progress" / "101").rglob("rank-0"))), ettr.BigFile)
    assert ettr.of_run("101", "slurm", keep=False)["lost_s"] == pytest.approx(whole["lost_s"])


def test_a_successor_still_pending_counts_as_queue_until_now():
    """Pure accounting: the first attempt failed at 60 (its last report 40, the failure known at
    45), the second was submitted at 62 and waits: at 100, 38 s of queue (62 -> 100), 17 s of
    restart (45 -> 62), 5 s of detection; 10 s of start-up (0 -> 10), 30 s trained."""
    a1 = ettr.Attempt("1", "FAILED", 0, 0, 60, failures=[45.0], world=2,
                      segments=[ettr.Segment((10.0, 1), (40.0, 4), 4, lambda m: None)])
    a2 = ettr.Attempt("2", "PENDING", 62, None, None, world=2)
    acc = ettr.account([a1, a2], now=100)
    assert acc.running and acc.span_s == 100
    assert acc.lost_s == pytest.approx({"startup": 10, "detection": 5, "restart": 17, "queue": 38, "rework": 0,
                                        "maintenance": 0, "spares_idle": 0})
    assert acc.train_s == 30 and acc.ettr == pytest.approx(0.3)


def test_hostile_progress_files_cost_nothing_and_break_nothing(queued_run, tmp_path):
    """Whatever a job leaves in its progress directory: lines that are no reports, a step of 10**30,
    a time of 1e300, a FIFO at a rank's path (never waited on), a directory instead of a file."""
    root = queued_run / "local" / "r2" / "ranks"
    (root / "node-0" / "progress" / "rank-0").write_bytes(
        b"garbage\n\x00\xff\n" + b"9" * 30 + b" 1.8e9\n7 1e300\n-4 1800000000\n"
        + (root / "node-0" / "progress" / "rank-0").read_bytes())
    os.mkfifo(root / "node-1" / "progress" / "rank-1.history")
    (root / "node-1" / "progress" / "rank-1.checkpoints").mkdir()
    f = ettr.of_run("r1", "local", keep=False)
    assert f["lost_s"] == pytest.approx(QUEUED) and f["ettr"] == pytest.approx(0.385)


def test_without_progress_reports_the_figure_is_unknown_not_zero(tmp_path):
    home = Path(os.environ["HALO_SCHED_HOME"])
    records.write(_local_attempt(home, "r1", 0, "COMPLETED", -5, 0, 60))
    f = ettr.of_run("r1", "local")
    assert f["ettr"] is None and f["note"] == "no progress reports found"
    assert ettr.describe(f)[0].startswith("effective training time: unknown (no progress reports found")


def test_figures_kept_in_a_hand_edited_record_are_used_only_when_well_formed(queued_run):
    """The run's first record keeps its figures once it ended; a record is a file: what a hand
    edit left there is never shown as a figure (nor breaks ``status``)."""
    import shutil

    assert ettr.of_run("r1", "local")["ettr"] == pytest.approx(0.385)  # measured and kept
    for job in ("r1", "r2"):
        shutil.rmtree(queued_run / "local" / job / "ranks")
    kept = records.find("r1", "local")[0]["ettr"]
    assert ettr.of_run("r1", "local")["lost_s"] == pytest.approx(QUEUED)  # read back from the record

    def earlier(rec):  # kept by a release before the maintenance cause: read back, that cause 0
        rec["ettr"] = {**kept, "lost_s": {k: v for k, v in kept["lost_s"].items() if k != "maintenance"}}
        return True

    records.update("r1", "local", earlier)
    assert ettr.of_run("r1", "local")["lost_s"] == pytest.approx(QUEUED)
    for bad in ({"ettr": "high"}, {"lost_s": {"queue": 1e308}}, {"failures": True}, {"checkpoint": {"cost_s": -1}}):
        def edit(rec, bad=bad):
            rec["ettr"] = {**kept, **bad}
            return True

        records.update("r1", "local", edit)
        f = ettr.of_run("r1", "local")
        assert f["ettr"] is None and f["note"] == "no progress reports found", (bad, f)
        assert ettr.describe(f)[0].startswith("effective training time: unknown")


def test_a_restart_in_place_is_read_from_the_record_as_a_restart_gap(swapped_run):
    """A restart in place (no spare) announced in ``last_state.in_place_restarts`` (its signed
    line's time, 58) and no failure line before it: the detection runs from the last report
    (46.5) to the restart's decision (58): 11.5 s, the restart from there to the first step after
    (75): 17 s. Without the entry the failure's moment is unknown: all 28.5 s are restart."""
    (swapped_run / "halo-ettr-101.out").write_text("")
    recs = ettr.run_records("101", "slurm")
    recs[0]["last_state"]["spares"] = {}
    recs[0]["last_state"]["failure"] = {}
    recs[0]["last_state"]["in_place_restarts"] = [{"time": T + 58, "restart": 1}]
    acc = ettr.of_records(recs)
    # detection: 11.5 before the restart; the attempt's end (150) with no failure line after the last
    # report (139.5) is the failure known: 10.5 more -> 22.0
    assert acc.lost_s["detection"] == pytest.approx(11.5 + 10.5)
    assert [(round(lo - T, 3), round(hi - T, 3)) for _, lo, hi, c in acc.spans if c == "restart"][:1] == [(58.0, 75.0)]
    recs[0]["last_state"]["in_place_restarts"] = []
    acc = ettr.of_records(recs)
    assert [(round(lo - T, 3), round(hi - T, 3)) for _, lo, hi, c in acc.spans if c == "restart"][:1] == [(46.5, 75.0)]


def test_a_planned_swap_is_maintenance_not_a_failure(swapped_run):
    """The swap at 58 planned (a node drained for maintenance: the swap line says ``planned``, no
    failure line before it): its gap, the last report (46.5) to the first step after (75), is
    ``maintenance`` (28.5 s), not detection (5.5) and restart (23); rework after it stays rework
    (75 -> 87); and it is no failure: 1 left (the attempt's end), not 2. The run's timeline draws it."""
    (swapped_run / "halo-ettr-101.out").write_text("training...\n" + _failure_line(1, 1, 143.5, host="n3"))
    recs = ettr.run_records("101", "slurm")
    recs[0]["last_state"]["spares"]["swaps"][0].update(planned=True, warned=T + 47)
    recs[0]["last_state"]["failure"] = {"failures": [{"time": T + 143.5, "trusted": True}]}
    acc = ettr.of_records(recs)
    assert acc.lost_s["maintenance"] == pytest.approx(28.5)
    assert acc.lost_s["detection"] == pytest.approx(4.0) and acc.lost_s["restart"] == pytest.approx(6.5 + 30)
    assert acc.lost_s["rework"] == pytest.approx(20.0) and acc.failures == 1
    assert [(round(lo - T, 3), round(hi - T, 3)) for _, lo, hi, c in acc.spans if c == "maintenance"] == [(46.5, 75.0)]
    assert "maintenance 28.5 s" in ettr.describe(acc.to_dict())[0]
    recs[0]["last_state"]["spares"]["swaps"][0]["planned"] = "yes"  # only a true planned flag counts
    assert ettr.of_records(recs).lost_s["maintenance"] == 0.0


def test_one_long_file_across_a_restart_is_searched_within_each_stretch(tmp_path):
    """A trainer's own appended lines, one file across a restart at 5,000 (steps 0-2,999 at 0..2,999,
    then 1,500-3,999 from 6,000): binary searches find each stretch's first, last and the first
    report of step 2,999 again (at 6,000 + 1,499) as a whole read does."""
    lines = [f"{s} {T + s:.3f}\n" for s in range(3000)] + [f"{s} {T + 6000 + s - 1500:.3f}\n" for s in range(1500, 4000)]
    path = tmp_path / "rank-0"
    path.write_text("".join(lines))
    big = ettr.BigFile(path, path.stat().st_size)
    whole = ettr.source(path)
    assert isinstance(whole, ettr.Points)
    for src in (big, whole):
        segs = ettr._segments([[src]], [T + 5000])
        assert [(s.first, s.last, s.max_step) for s in segs] == [
            ((T, 0), (T + 2999, 2999), 2999), ((T + 6000, 1500), (T + 8499, 3999), 3999)]
        assert segs[1].reach(2999) == T + 6000 + 1499 and segs[0].reach(2999) == T + 2999
        assert segs[0].reach(3500) is None
