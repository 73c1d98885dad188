"""Exactly-once submit and cancel through scheduler outages (halo_sched.exactly_once).

The retry loop on its own (a scripted scheduler), then the Nomad backend against the fake API with
injected faults: 5xx and dropped connections before the request is applied (a plain retry) and
after it (ambiguous: the job is looked up by its token, never registered twice). The SLURM half
runs on the real cluster: tests/test_slurm_exactly_once.py.
"""
from __future__ import annotations

import os

import pytest
import yaml

from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import TOKEN_META, NomadClient, NomadConfig
from halo_sched.errors import OutcomeUnknown, SchedulerError, UsageError
from halo_sched.exactly_once import run_once
from halo_sched.retry import Ambiguous, Transient, retry_window
from halo_sched.spec import loads
from helpers import REPO, cli, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "acl-token-for-tests"
TOKEN_META = "halo_sched_token"  # docs/guarantees.md's Meta.halo_sched_token

#: Faults injected by this file and served to halo-sched (every one reached a request: the
#: ``fake`` fixture checks that no injected fault was left unused). docs/guarantees.md says "16 faults";
#: the module's last teardown asserts that figure when every test of the file ran.
FAULTS = {"count": 0}
README_FAULTS = 16


# ---- the loop ------------------------------------------------------------------------------


class Script:
    """A scheduler that fails as told: each entry of ``sends`` is "ok", "transient", "lost" (applied,
    answer lost), "dropped" (not applied, answer lost) or "refused"; ``lookups`` likewise "down"
    (cannot tell) or "answer"."""

    def __init__(self, sends, lookups=()):
        self.sends, self.lookups = list(sends), list(lookups)
        self.applied = 0
        self.sent = 0
        self.looked = 0
        self.t = 0.0

    def send(self):
        self.sent += 1
        what = self.sends.pop(0)
        if what == "transient":
            raise Transient("controller unreachable")
        if what == "refused":
            raise SchedulerError("invalid partition specified: nope")
        if what == "dropped":  # sent, not applied, answer lost: the lookup finds nothing
            raise Ambiguous("connection dropped before an answer")
        self.applied += 1
        if what == "lost":
            raise Ambiguous("connection dropped after the request was sent")
        return f"job-{self.applied}"

    def lookup(self):
        self.looked += 1
        if self.lookups and self.lookups.pop(0) == "down":
            raise Transient("still unreachable")
        return f"job-{self.applied}" if self.applied else None

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s


def run(script, retry_s=60.0):
    return run_once("submit", script.send, script.lookup, retry_s, token="tok", sleep=script.sleep, clock=script.clock)


def test_transient_failures_are_retried_until_one_job_exists():
    s = Script(["transient"] * 5 + ["ok"])
    assert run(s) == "job-1"
    assert s.applied == 1 and s.sent == 6 and s.looked == 0


def test_an_applied_request_whose_answer_was_lost_is_found_not_resent():
    s = Script(["lost", "ok"])
    assert run(s) == "job-1"
    assert s.applied == 1 and s.sent == 1 and s.looked == 1


def test_nothing_is_resent_while_the_lookup_cannot_tell():
    # The answer was lost and the scheduler then went away: resending could duplicate, so the
    # loop only looks until the lookup answers (here: the job is there).
    s = Script(["lost", "ok"], lookups=["down", "down", "down", "answer"])
    assert run(s) == "job-1"
    assert s.sent == 1 and s.applied == 1 and s.looked == 4


def test_unknown_outcome_at_the_deadline_names_the_token():
    s = Script(["lost"], lookups=["down"] * 100)
    with pytest.raises(OutcomeUnknown, match=r"outcome unknown \(may have reached the scheduler\): look for token tok") as info:
        run(s, retry_s=10)
    assert s.sent == 1 and s.t <= 10
    assert info.value.exit_code == 3  # outcome unknown: neither success (0) nor "nothing was done" (1)


def test_what_cannot_succeed_fails_at_once():
    s = Script(["refused", "ok"])
    with pytest.raises(SchedulerError, match="invalid partition"):
        run(s)
    assert s.sent == 1 and s.t == 0


def test_retries_stop_at_the_window():
    s = Script(["transient"] * 1000)
    with pytest.raises(SchedulerError, match=r"^submit: nothing reached the scheduler \(controller unreachable for 30 s\); "
                                             r"it did not take effect: retry once the scheduler answers$") as info:
        run(s, retry_s=30)
    assert 29.9 <= s.t <= 30.0 and s.applied == 0
    assert not isinstance(info.value, OutcomeUnknown) and info.value.exit_code == 1
    assert "unknown" not in str(info.value)


def test_an_attempt_looked_up_and_not_found_then_unreachable_did_not_take_effect():
    # Lost (ambiguous), looked up: not there; then the scheduler is unreachable to the end. The
    # earlier attempt is known not to have taken effect: no "unknown", exit 1.
    s = Script(["dropped"] + ["transient"] * 1000)
    with pytest.raises(SchedulerError, match=r"never got it \(then controller unreachable for 20 s\); it did not take effect") as info:
        run(s, retry_s=20)
    assert not isinstance(info.value, OutcomeUnknown) and s.looked == 1


# What the real clients say, at their longest: a Nomad job id of a long name and a long
# address, sbatch's whole refusal. The final line stays one short line with the CLI's prefix.
LONG_WHAT = "register job 'ddp-pretrain-20261201-130455-ab12cd'"
NOMAD_REFUSED = "Nomad at https://nomad-server-1.cluster.example.internal:4646: connection refused"
SBATCH_DOWN = ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
               "(connect failure)")


@pytest.mark.parametrize("what,who,err,kind", [
    (LONG_WHAT, "Nomad", NOMAD_REFUSED, "unreached"), (LONG_WHAT, "Nomad", NOMAD_REFUSED, "unknown"),
    (LONG_WHAT, "Nomad", NOMAD_REFUSED, "not-there"), ("sbatch", "SLURM", SBATCH_DOWN, "unreached"),
    ("sbatch", "SLURM", SBATCH_DOWN, "unknown"), ("scancel", "SLURM", SBATCH_DOWN, "unreached")])
def test_the_final_line_is_short_keeps_the_token_and_says_what_to_do(what, who, err, kind, monkeypatch):
    from halo_sched import errors

    monkeypatch.setattr(errors, "_debug", False)
    token = ("halo-token:" if who == "SLURM" else "") + "0123456789abcdef01234567"
    sends = {"unreached": ["transient"] * 1000, "unknown": ["lost"],
             "not-there": ["dropped"] + ["transient"] * 1000}[kind]
    s = Script(sends, lookups=["answer"] if kind == "not-there" else ["down"] * 1000)

    def send():
        try:
            return s.send()
        except Transient:
            raise Transient(err) from OSError("urllib3 story " * 40)

    t = [0.0]
    with pytest.raises(SchedulerError) as info:
        run_once(what, send, s.lookup, 120, token=token, who=who, not_done="nothing was submitted",
                 sleep=lambda d: t.__setitem__(0, t[0] + d), clock=lambda: t[0])
    line = "halo-sched: " + str(info.value)
    assert "\n" not in line and len(line) <= 160, (len(line), line)
    assert line.startswith(f"halo-sched: {what}: ") and "urllib3" not in line
    if kind == "unknown":
        assert isinstance(info.value, OutcomeUnknown) and info.value.exit_code == 3
        assert f"outcome unknown (may have reached {who}): look for token {token}" in line and f"look for token {token}" in line
    else:
        assert not isinstance(info.value, OutcomeUnknown) and "unknown" not in line
        assert f"nothing was submitted: retry once {who} answers" in line
        assert ("connection refused)" if who == "Nomad" else "Unable to contact slurm controller") in line
        assert ("nothing reached " + who) in line if kind == "unreached" else "never got it (then " in line
    if kind != "unknown" and who == "SLURM":
        assert "(Unable to contact slurm controller (connect failure) for 120 s)" in line  # room for the span


def test_each_retry_is_one_short_line_and_the_cause_only_with_debug(monkeypatch):
    from halo_sched import errors

    def failing():
        try:
            raise OSError("x" * 500)  # a transport's whole story
        except OSError as exc:
            raise Transient("the scheduler refused the connection") from exc

    for on in (False, True):
        monkeypatch.setattr(errors, "_debug", on)
        lines, t = [], [0.0]
        with pytest.raises(SchedulerError):
            run_once("submit", failing, lambda: None, 20, sleep=lambda s: t.__setitem__(0, t[0] + s),
                     clock=lambda: t[0], on_retry=lines.append)
        assert len(lines) >= 4
        for line in lines:
            first, *rest = line.split("\n")
            assert len(first) < 200 and "refused the connection (attempt " in first and "retrying in" in first
            assert bool(rest) == on and ("x" * 500 in line) == on


def test_retry_window_setting(monkeypatch):
    monkeypatch.delenv("HALO_SUBMIT_RETRY_S", raising=False)
    assert retry_window() >= 60
    monkeypatch.setenv("HALO_SUBMIT_RETRY_S", "15")
    assert retry_window() == 15 and retry_window(3) == 3
    monkeypatch.setenv("HALO_SUBMIT_RETRY_S", "soon")
    with pytest.raises(UsageError, match="HALO_SUBMIT_RETRY_S"):
        retry_window()
    with pytest.raises(UsageError, match="retry_s"):
        retry_window(-1)


# ---- Nomad, against the fake API ------------------------------------------------------------


def spec():
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=8, nproc_per_node=8)
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None)
    return loads(yaml.safe_dump(data))


@pytest.fixture
def fake():
    with FakeNomad([FakeNode("gpu-a"), FakeNode("gpu-b")], token=TOKEN) as f:
        injected = {"n": 0}
        for name in ("fail_next", "drop_next", "drop_after_next"):
            def counted(n, *a, _inject=getattr(f, name), **kw):
                injected["n"] += n
                return _inject(n, *a, **kw)
            setattr(f, name, counted)
        yield f
        # A fault no request ever met tested nothing: each one must have been served.
        left = len(f._fail_queue) + len(f._drop_queue) + len(f._drop_after_queue)
        assert left == 0, f"{left} of {injected['n']} injected faults were never served"
        FAULTS["count"] += injected["n"]


@pytest.fixture(scope="module", autouse=True)
def _faults_total(request):
    yield
    ours = [i for i in request.session.items if i.module is request.module]
    ran = {r for r in getattr(request.session, "_halo_ran", set()) if r in {i.nodeid for i in ours}}
    if len(ran) == len(ours):
        assert FAULTS["count"] == README_FAULTS, f"{FAULTS['count']} faults served, docs/guarantees.md says {README_FAULTS}"


@pytest.fixture(autouse=True)
def _ran(request):
    yield
    if not hasattr(request.session, "_halo_ran"):
        request.session._halo_ran = set()
    request.session._halo_ran.add(request.node.nodeid)


def scheduler(fake) -> NomadScheduler:
    cfg = NomadConfig.from_env(env={}, address=fake.address, token=TOKEN, retry_base_s=0.01, retry_max_wait_s=0.05)
    return NomadScheduler(client=NomadClient(cfg, sleep=lambda s: None), retry_s=30)


def jobs_named(fake, name):
    return [j for (ns, jid), j in fake._jobs.items() if j["Name"] == name]


@pytest.mark.parametrize("fault", ["5xx-before", "drop-before", "drop-after", "5xx-after", "mixed"])
def test_nomad_register_faults_make_exactly_one_job(fake, fault):
    s = spec()
    sched = scheduler(fake)
    n = 3
    if fault == "5xx-before":
        fake.fail_next(n, status=500, body="No cluster leader", path_contains="/v1/jobs")
    elif fault == "drop-before":
        fake.drop_next(n, path_contains="/v1/jobs")
    elif fault == "drop-after":
        fake.drop_after_next(1, path_contains="/v1/jobs", method="POST")
    elif fault == "5xx-after":
        fake.drop_after_next(1, path_contains="/v1/jobs", method="POST", status=500)
    else:  # applied and lost, then the lookups fail too, then a 503
        fake.drop_after_next(1, path_contains="/v1/jobs", method="POST")
        fake.fail_next(2, status=503, body="No cluster leader", path_contains="/v1/job/")
    job = sched.submit(s)
    registered = jobs_named(fake, s.name)
    assert len(registered) == 1, registered
    assert registered[0]["ID"] == job.id.rsplit("/", 1)[-1]
    assert registered[0]["Meta"][TOKEN_META]
    # Every register carried the create-only guard.
    regs = [r for r in fake.requests if r.path == "/v1/jobs" and r.method in ("PUT", "POST")]
    assert regs and all(r.body["EnforceIndex"] is True and r.body["JobModifyIndex"] == 0 for r in regs)
    if "after" in fault or fault == "mixed":
        assert len(regs) == 1  # found by its token, never sent twice
    else:
        assert len(regs) == n + 1


def test_nomad_register_4xx_fails_at_once_with_nomads_words(fake):
    sched = scheduler(fake)
    fake.fail_next(1, status=400, body="1 error occurred:\n\t* Task group trainer has no tasks", path_contains="/v1/jobs")
    with pytest.raises(SchedulerError, match="rejected the request.*has no tasks"):
        sched.submit(spec())
    assert len([r for r in fake.requests if r.path == "/v1/jobs"]) == 1


def test_nomad_id_taken_by_another_submission_is_not_adopted(fake):
    s = spec()
    sched = scheduler(fake)
    dry = sched.dryrun(s)
    other = {"Job": {**dry.payload["Job"], "Meta": {**dry.payload["Job"]["Meta"], TOKEN_META: "someone-else"}}}
    load_nomad_helper("sample_job").register(sched._client, other)
    with pytest.raises(SchedulerError, match="did not create"):
        sched.schedule(dry)


def test_nomad_cancel_is_idempotent_and_rides_out_faults(fake):
    sched = scheduler(fake)
    fake.auto_run = False  # pending, not dead: a job that already ended is left alone (test_ended_jobs.py)
    job = sched.submit(spec())
    name = job.id
    fake.drop_after_next(1, path_contains=f"/v1/job/{name}", method="DELETE")
    fake.fail_next(2, status=502, body="Bad Gateway", path_contains=f"/v1/job/{name}")
    sched.cancel([job.id])
    assert fake.job_record(name)["Stop"] is True
    sched.cancel([job.id])  # already stopped: still success
    with pytest.raises(SchedulerError, match="no Nomad job 'never-was'"):
        sched.cancel(["never-was"])


def test_nomad_submit_through_the_cli_with_a_lost_answer(fake, tmp_path):
    f = tmp_path / "job.yaml"
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data.update(nodes=2, gpus_per_node=8, nproc_per_node=8)
    data["nomad"].update(memory=65536, shm_size="8GiB", namespace=None)
    f.write_text(yaml.safe_dump(data))
    fake.drop_after_next(1, path_contains="/v1/jobs", method="POST")  # a register is a POST
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SUBMIT_RETRY_S="20")
    r = cli("submit", str(f), "--backend", "nomad", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "registered by an earlier attempt" in r.stderr
    assert len(jobs_named(fake, data["name"])) == 1
    assert r.stdout.strip().splitlines()[-1] in {jid for (_, jid) in fake._jobs}
    assert TOKEN not in r.stderr + r.stdout
