"""bench/goodput.py's arithmetic: each interruption costs exactly its terms (the work since the
last checkpoint, detection, the queue or a swap, the reload) and spares cost their idle GPUs;
dropping or doubling any term changes a figure asserted here. Fast: no simulation of 54 days
beyond one rate check."""
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
                crash_detect_s=4, hang_detect_s=30, nccl_timeout_s=600, notice_h=2)
    return g.Params(**{**base, **kw})


def _scenario(g, name):
    return next(s for s in g.SCENARIOS if s.name == name)


DAY = 86_400.0


def test_a_hardware_crash_with_a_spare_costs_rework_detection_swap_and_reload(g):
    p = _p(g)
    t = g.simulate(p, _scenario(g, "spares + hang detection"), [g.Event(70 * 60, "hardware")])
    lost = {"rework": 10 * 60, "detection": 4, "queue": 0, "swap": 6, "reload": 180}
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
    assert t.swaps == 2 and t.lost["queue"] / 16 == 20 * 60 and t.lost["swap"] / 16 == 12


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
