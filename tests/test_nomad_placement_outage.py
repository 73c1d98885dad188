"""Nomad's placement guard (``submit --wait`` with ``nomad.placement_timeout_s``) waits through an
outage like every other wait (halo_sched/outage.py): whether the job placed cannot be seen while
Nomad is unreachable, so the placement timeout is judged once Nomad answers again; past the outage
budget the outcome is unknown (exit 3), never a failure (exit 1). Against the fake API: every
request answered "No cluster leader" (HTTP 500) for a while."""
from __future__ import annotations

import logging
import time

import pytest

from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad import watchdog
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from halo_sched.errors import EXIT_OUTCOME_UNKNOWN, OutcomeUnknown
from halo_sched.spec import JobSpec
from helpers import free_port, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
TOKEN = "tok-guard"


def _spec() -> JobSpec:
    return JobSpec.model_validate({
        "name": "guarded", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "train.py"},
        "rendezvous": {"port": free_port(), "timeout_s": 30},
        "nomad": {"driver": "raw_exec", "placement_timeout_s": 1},
    })


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(watchdog, "RETRY_EVERY_S", 0.5)  # ask again twice a second while Nomad is down


def _submit(fake):
    # Nodes without room for the job: it stays pending, blocked (the guard's case).
    client = NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1))
    sched = NomadScheduler(client=client)
    spec = _spec()
    return sched, spec, sched.schedule(sched.dryrun(spec))


def test_an_outage_past_the_budget_is_outcome_unknown_not_failed(quick_retries):
    nodes = [fake_api.FakeNode(n, gpus=0, cpu_mhz=1, memory_mb=1) for n in ("a", "b")]
    with fake_api.FakeNomad(nodes, token=TOKEN) as fake:
        sched, spec, job_id = _submit(fake)
        seen = []

        def on_change(state):  # the pending state is seen; then Nomad loses its leader for good
            seen.append(state)
            fake.fail_next(100_000)

        t0 = time.monotonic()
        with pytest.raises(OutcomeUnknown) as info:
            sched.guard_placement(spec, job_id, on_change=on_change, outage_s=3)
        took = time.monotonic() - t0
        assert info.value.exit_code == EXIT_OUTCOME_UNKNOWN == 3
        text = str(info.value)
        assert "outcome unknown" in text and "Nomad unreachable since" in text and "past the outage budget" in text
        assert f"halo-sched status {job_id}" in text and seen and seen[0].status is JobStatus.PENDING
        assert 2.5 <= took < 20, took
        fake._fail_queue.clear()
        assert not fake.job_record(job_id).get("Stop")  # nothing decided on a state nobody could see


def test_placement_is_judged_once_nomad_answers_again(quick_retries, caplog):
    nodes = [fake_api.FakeNode(n, gpus=0, cpu_mhz=1, memory_mb=1) for n in ("a", "b")]
    with fake_api.FakeNomad(nodes, token=TOKEN) as fake:
        sched, spec, job_id = _submit(fake)
        fired = []

        def on_change(state):  # leaderless for the next 6 requests: past the placement timeout (1 s)
            if not fired:
                fired.append(time.monotonic())
                fake.fail_next(6)

        caplog.set_level(logging.WARNING, logger="halo_sched")
        sched.guard_placement(spec, job_id, on_change=on_change, outage_s=60)
        assert time.monotonic() - fired[0] > 1  # the window outlasted the placement timeout
        assert fake.job_record(job_id)["Stop"] is True  # stopped once Nomad answered: it had not placed
        notes = [r.getMessage() for r in caplog.records]
        assert any("Nomad unreachable since" in n for n in notes) and any("answers again" in n for n in notes), notes
