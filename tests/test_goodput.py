"""bench/goodput.py's arithmetic: each interruption costs exactly its terms (the work since the
last checkpoint, detection, the queue or a restart: a swap, a restart in place, an expedited
requeue, the guardian; the reload) and spares cost their idle GPUs; dropping or doubling any term
changes a figure asserted here. Fast: no simulation of 54 days beyond one rate check."""
from __future__ import annotations

import importlib.util
import random
import sys

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def g():
    spec = importlib.util.spec_from_file_location("bench_goodput", REPO / "bench" / "goodput.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _p(g, **kw):
    # 2 nodes of 8 GPUs, one day, one spare; round figures.
    base = dict(gpus=16, days=1, spare_every=128, checkpoint_min=30, reload_min=3, queue_min=20, swap_s=6,
                crash_detect_s=4, hang_detect_s=30, nccl_timeout_s=600, notice_h=2, inplace_s=9, resubmit_s=11,
                guardian_s=40, node_down_s=300, planned_s=7)
    return g.Params(**{**base, **kw})


def _scenario(g, name):
    return next(s for s in g.SCENARIOS if s.name == name)


DAY = 86_400.0


def test_a_hardware_crash_with_a_spare_costs_rework_detection_swap_and_reload(g):
    p = _p(g)
    t = g.simulate(p, _scenario(g, "spares + hang detection"), [g.Event(70 * 60, "hardware")])
    lost = {"rework": 10 * 60, "detection": 4, "queue": 0, "restart": 6, "reload": 180}
    assert {k: t.lost[k] / 16 for k in lost} == pytest.approx(lost)
    assert t.lost["spares idle"] == 8 * DAY
    assert t.held == (16 + 8) * DAY
    assert t.goodput == pytest.approx(1 - (16 * (600 + 4 + 6 + 180) + 8 * DAY) / (24 * DAY))
    assert t.swaps == 1


def test_without_spares_a_hang_waits_for_nccl_and_the_queue(g):
    p = _p(g)
    ev = [g.Event(3600 + 5 * 60, "software", hangs=True)]
    t = g.simulate(p, _scenario(g, "retry through the queue"), ev)
    assert t.lost["detection"] / 16 == 600 and t.lost["queue"] / 16 == 20 * 60 and t.lost["rework"] / 16 == 5 * 60
    assert t.lost["spares idle"] == 0 and t.held == 16 * DAY
    assert t.goodput == pytest.approx(1 - (5 * 60 + 600 + 20 * 60 + 180) / DAY)
    hd = g.simulate(p, _scenario(g, "retry + hang detection"), ev)
    assert hd.lost["detection"] / 16 == 30
    manual = g.simulate(p, _scenario(g, "manual (a person resubmits)"), ev)
    assert manual.lost["detection"] / 16 == 2 * 3600


def test_a_planned_stop_loses_no_work_and_spares_run_out_until_the_next_allocation(g):
    p = _p(g)
    s = _scenario(g, "spares + hang detection")
    planned = g.simulate(p, s, [g.Event(45 * 60, "planned")])
    assert planned.lost["rework"] == 0 and planned.lost["detection"] == 0
    assert planned.lost["queue"] / 16 == 20 * 60 and planned.lost["reload"] / 16 == 180
    # One spare: the first hardware fault is swapped, the second goes through the queue (and the
    # new allocation brings its spare), the third is swapped again.
    evs = [g.Event(h * 3600.0, "hardware") for h in (2, 4, 6)]
    t = g.simulate(p, s, evs)
    assert t.swaps == 2 and t.lost["queue"] / 16 == 20 * 60 and t.lost["restart"] / 16 == 12


def test_an_interruption_while_down_costs_nothing_more_and_the_run_end_cuts_the_last_outage(g):
    p = _p(g)
    s = _scenario(g, "retry through the queue")
    one = g.simulate(p, s, [g.Event(3600, "software")])
    two = g.simulate(p, s, [g.Event(3600, "software"), g.Event(3600 + 60, "hardware")])
    assert two.lost == one.lost and two.interruptions == 1
    late = g.simulate(p, s, [g.Event(DAY - 100, "planned")])  # 100 s of a 23-minute outage fall in the run
    assert sum(late.lost.values()) / 16 == pytest.approx(100)


def test_the_rate_is_meta_s_scaled_by_gpu_count(g):
    for gpus, want in ((16_384, 466), (1024, 466 / 16)):
        p = g.Params(gpus=gpus)
        n = [len(g.events(p, random.Random(i))) for i in range(40)]
        assert sum(n) / len(n) == pytest.approx(want, rel=0.08)
        hw = sum(e.kind == "hardware" for i in range(40) for e in g.events(p, random.Random(i)))
        un = sum(e.kind != "planned" for i in range(40) for e in g.events(p, random.Random(i)))
        assert hw / un == pytest.approx(0.78, abs=0.05 if gpus > 2000 else 0.1)


def test_the_job_s_fault_restarts_in_place_and_a_node_s_fault_without_a_spare_is_requeued_at_once(g):
    p = _p(g)
    inplace = g.simulate(p, _scenario(g, "+ the job's faults restarted in place"), [g.Event(40 * 60, "software")])
    # 10 min since the last checkpoint (at 30), a crash found in 4 s, restarted in place in 9 s, reloaded
    assert {k: v / 16 for k, v in inplace.lost.items()} == pytest.approx(
        {"rework": 600, "detection": 4, "queue": 0, "restart": 9, "reload": 180, "spares idle": 8 * DAY / 16})
    # One spare: the first hardware fault takes it; the second, without a spare, is requeued at once
    # on the held nodes (11 s), its spare with it, so the third is swapped again: no queue at all.
    s = _scenario(g, "+ no client: Slurm 25.11's expedited requeue")
    t = g.simulate(p, s, [g.Event(h * 3600.0, "hardware") for h in (2, 4, 6)])
    assert t.swaps == 2 and t.lost["queue"] == 0 and t.lost["restart"] / 16 == 6 + 11 + 6


@pytest.mark.parametrize("path, detection, restart, queue", [
    # a waiting client resubmits once Slurm marked the host down (300 s): the queue
    ("spares + hang detection", 300, 0, 20 * 60),
    # nobody waits and nothing else acts: a person notices (2 h) and resubmits
    ("+ the job's faults restarted in place", 300, 0, 20 * 60),
    # the guardian starts (40 s) and submits the successor, which waits in the queue
    ("+ no client: the guardian submits after a lost batch host", 300, 40, 20 * 60),
    # Slurm 25.11 requeues it at once (11 s) on its held nodes
    ("+ no client: Slurm 25.11's expedited requeue", 300, 11, 0),
])
def test_a_lost_batch_host_costs_what_its_path_says(g, path, detection, restart, queue):
    p = _p(g)
    t = g.simulate(p, _scenario(g, path), [g.Event(3600 + 5 * 60, "hardware", batch_host=True)])
    assert t.lost["rework"] / 16 == 5 * 60 and t.lost["reload"] / 16 == 180
    assert (t.lost["detection"] / 16, t.lost["restart"] / 16, t.lost["queue"] / 16) == (detection, restart, queue)
    assert t.swaps == 0  # the batch script died with its host: no spare can be swapped in


def test_with_no_client_and_no_guardian_a_lost_batch_host_waits_for_a_person(g):
    s = g.replace(_scenario(g, "+ the job's faults restarted in place"), client=False)
    t = g.simulate(_p(g), s, [g.Event(3600 + 5 * 60, "hardware", batch_host=True)])
    assert t.lost["detection"] / 16 == 300 + 2 * 3600 and t.lost["queue"] / 16 == 20 * 60


def test_a_planned_stop_moves_onto_a_spare_at_its_checkpoint_while_one_is_left(g):
    p = _p(g)
    s = _scenario(g, "+ planned stops onto a spare at a checkpoint")
    t = g.simulate(p, s, [g.Event(2 * 3600.0, "planned"), g.Event(4 * 3600.0, "planned")])
    # the first: a planned swap (planned_s, 7 s: measured from the warning, not the fault swap's
    # 6 s) and the reload, nothing redone, nothing to detect; the second, no spare left and no
    # node fault to requeue on: the queue, and the new allocation's spare
    assert t.lost["rework"] == 0 and t.lost["detection"] == 0 and t.swaps == 1
    assert t.lost["restart"] / 16 == 7 and t.lost["queue"] / 16 == 20 * 60 and t.lost["reload"] / 16 == 2 * 180
    # the tool's share: detection + restart + queue + the spare's idle GPUs, of the GPU-hours held
    assert t.tool == pytest.approx((16 * (7 + 20 * 60) + 8 * DAY) / (24 * DAY))
    # a hardware fault on the same path still costs the fault swap's time
    hw = g.simulate(p, s, [g.Event(2 * 3600.0, "hardware")])
    assert hw.lost["restart"] / 16 == 6


def test_the_lost_batch_host_stream_leaves_the_interruptions_as_they_were(g):
    """Which faults lose the batch host is drawn from a stream of its own: the interruptions (and
    so every older path's figures) do not move with node_lost_share."""
    a = g.events(g.Params(gpus=16_384), random.Random(7))
    b = g.events(g.Params(gpus=16_384, node_lost_share=0.0), random.Random(7))
    assert [(e.at, e.kind, e.hangs) for e in a] == [(e.at, e.kind, e.hangs) for e in b]
    assert not any(e.batch_host for e in b)
    many = [e for i in range(30) for e in g.events(g.Params(gpus=64, node_lost_share=1.0), random.Random(i))]
    hw = [e for e in many if e.kind == "hardware"]
    assert 0 < sum(e.batch_host for e in hw) / len(hw) < 0.4  # one node of 8, every fault losing its host


def test_the_measured_inputs_come_from_bench_measured_json_and_the_unmeasured_one_says_so(g, capsys):
    import json

    data = json.loads((REPO / "bench" / "measured.json").read_text())
    p = g.Params()
    names = ("swap_s", "resubmit_s", "inplace_s", "planned_s")
    assert tuple(getattr(p, n) for n in names) == tuple(data[n]["value"] for n in names)
    assert all(data[n]["by"] == "bench/spares.py" for n in names) and data["swap_s"]["measured"]
    text = g._inputs(p)
    assert f"planned swap (warning -> training) {p.planned_s:g} s (bench/measured.json" in text, text
    for name in names:
        said = f"{getattr(p, name):g} s (bench/measured.json, by {data[name]['by']}: NOT MEASURED YET" in text
        assert said is (data[name]["measured"] is None), (name, text)
    assert g.main(["--json", "--gpus", "16", "--reps", "2", "--days", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["path"] for r in out["rows"]] == [s.name for s in g.SCENARIOS]
    assert out["terms"] == list(g.TERMS) and out["tool_terms"] == ["detection", "restart", "queue", "spares idle"]
    r = out["rows"][-1]
    assert set(r) == {"gpus", "path", "spares", "goodput", "lost", "tool"} and set(r["lost"]) == set(g.TERMS)
    assert r["goodput"] == pytest.approx(1 - sum(r["lost"].values()))
    assert r["tool"] == pytest.approx(sum(r["lost"][k] for k in out["tool_terms"]))
