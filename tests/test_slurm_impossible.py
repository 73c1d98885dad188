"""Jobs that can never start are named and ended; reasons that may clear are shown in words.

Unit tests read real output of the local cluster (Slurm 22.05.8), recorded in
tests/fixtures/slurm/22.05/reasons/: ``squeue -O`` rows of jobs pending for PartitionNodeLimit
(``-N5`` on 3 nodes), PartitionConfig (``-c8`` on 2-CPU nodes), DependencyNeverSatisfied
(``afterok`` on a job that exited 3), Resources and Dependency (queued behind a running job);
``scontrol -o show job/partition/node`` of the same; a launch failure (output directory missing).
The tests marked ``slurm`` run on the cluster itself.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo_sched.jobstate import JobState, JobStatus, SlurmDetail
from halo_sched.backends.slurm import SlurmScheduler, output_problems, reasons
from halo_sched.backends.slurm import status as st
from halo_sched.backends.slurm.transport.cli import clean_scancel
from halo_sched.backends.watcher import wait_loop
from halo_sched.errors import SpecError

FIX = Path(__file__).parent / "fixtures" / "slurm" / "22.05" / "reasons"
REPO = Path(__file__).resolve().parents[1]


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def records(name: str) -> list[dict]:
    return [st.parse_scontrol_record(ln) for ln in fixture(name).splitlines() if "=" in ln]


def by_id(states) -> dict[str, JobState]:
    return {s.id: s for s in states}


# ---- the reason table, on real squeue output -----------------------------------------------------


def test_reasons_from_real_squeue_output():
    impossible = by_id(st.parse_squeue(fixture("squeue_impossible.txt")))
    assert {i: s.reason for i, s in impossible.items()} == {
        "612": "PartitionNodeLimit", "613": "PartitionConfig", "615": "DependencyNeverSatisfied"}
    assert all(s.status is JobStatus.PENDING and reasons.never_clears(s.reason) for s in impossible.values())
    assert impossible["615"].slurm.dependency == "afterok:614(failed)"
    assert impossible["612"].slurm.submitted == "2026-12-01T12:25:13"
    queued = by_id(st.parse_squeue(fixture("squeue_queued.txt")))
    assert queued["621"].reason == "Resources" and queued["622"].reason == "Dependency"
    assert not any(reasons.never_clears(s.reason) for s in queued.values())
    assert queued["622"].slurm.dependency == "afterany:620(unfulfilled)"
    assert queued["621"].slurm.expected_start is None  # N/A: the backfill scheduler had no estimate yet


@pytest.mark.parametrize("reason, never", [
    ("PartitionNodeLimit", True), ("PartitionTimeLimit", True), ("PartitionConfig", True),
    ("DependencyNeverSatisfied", True), ("InvalidAccount", True), ("InvalidQOS", True),
    ("QOSMaxNodePerJobLimit", True), ("QOSMaxWallDurationPerJobLimit", True), ("AssocMaxCpuPerJobLimit", True),
    ("AssocMaxMemPerNode", True), ("QOSMinCpuNotSatisfied", True), ("MaxMemPerLimit", True),
    ("Resources", False), ("Priority", False), ("Dependency", False), ("BeginTime", False),
    ("ReqNodeNotAvail, UnavailableNodes:node[1-2]", False), ("JobHeldUser", False), ("AssocGrpCpuLimit", False),
    ("QOSMaxJobsPerUserLimit", False), ("AssocMaxJobsLimit", False), ("QOSGrpNodeLimit", False), ("None", False),
    ("", False),
])
def test_never_clears(reason, never):
    assert reasons.never_clears(reason) is never


def test_reasons_in_words():
    assert reasons.in_words("Resources") == "waiting for resources (nodes busy) (Resources)"
    assert reasons.in_words("ReqNodeNotAvail, UnavailableNodes:node[1-2]") == (
        "nodes it needs are unavailable (down, drained or reserved for maintenance) "
        "(ReqNodeNotAvail: UnavailableNodes:node[1-2])")
    assert reasons.in_words("PartitionNodeLimit") == "more nodes than the partition allows (PartitionNodeLimit)"
    assert "QOSGrpCpuLimit" in reasons.in_words("QOSGrpCpuLimit")


# ---- what to change, from the real job, partition and node records -------------------------------


def test_explain_from_real_records():
    jobs = {j["JobId"]: j for j in records("scontrol_jobs.txt")}
    part, nodes = records("partition.txt")[0], records("nodes.txt")
    assert reasons.explain("PartitionNodeLimit", jobs["612"], part, nodes) == (
        "nodes: 5 but partition debug has only 3 nodes (PartitionNodeLimit): lower nodes or pick another "
        "slurm.partition")
    assert reasons.explain("PartitionConfig", jobs["613"], part, nodes) == (
        "slurm.cpus_per_task: 8 but the nodes of partition debug have at most 2 CPUs (PartitionConfig): "
        "lower slurm.cpus_per_task or pick another slurm.partition")
    assert reasons.explain("DependencyNeverSatisfied", jobs["615"], part, nodes) == (
        "its dependency can never be met (afterok:614(failed): the job it waits for ended the wrong way; "
        "DependencyNeverSatisfied): fix the dependency in slurm.extra_args and submit again")
    # The cluster's partition has no MaxTime: the real job record with a time limit, a stand-in MaxTime.
    timed = {**jobs["612"], "NumNodes": "1-1", "TimeLimit": "02:00:00"}
    assert reasons.explain("PartitionTimeLimit", timed, {**part, "MaxTime": "01:00:00"}, nodes) == (
        "slurm.time: 02:00:00 but partition debug allows at most 01:00:00 (PartitionTimeLimit): lower slurm.time "
        "or pick another slurm.partition")
    # Without the partition (a transport that cannot read it): the reason's own words.
    assert reasons.explain("InvalidQOS", {}, None, []) == "a QOS SLURM does not know (InvalidQOS): fix slurm.qos"


# ---- checked before submit, against the partition (a stand-in transport) -------------------------


class Blind:
    """A transport answering with the real job records, and no way to read partitions."""

    name = "cli"

    def __init__(self, part_changes: dict | None = None, states=None):
        self.part = {**records("partition.txt")[0], **(part_changes or {})}
        self.nodes = records("nodes.txt")
        self.states = list(states or [])
        self.submitted: list[str] = []
        self.cancelled: list[list[str]] = []

    def submit(self, request):
        self.submitted.append(request.script)
        return "700"

    def query(self, ids):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return {i: state for i in ids}

    def cancel(self, ids, signal=None):
        self.cancelled.append(list(ids))

    def job_info(self, job_id):
        return {j["JobId"]: j for j in records("scontrol_jobs.txt")}.get(job_id, {})


class Standin(Blind):
    """... that reads the real partition/node records (optionally changed)."""

    def partitions(self, cluster=None):
        return [self.part], self.nodes


def spec_of(tmp_path, **changes):
    import yaml

    from halo_sched.spec import load

    data = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    data["trainer"]["script"] = str(REPO / "examples" / "train_ddp.py")
    for key, value in changes.items():
        if key == "slurm":
            data.setdefault("slurm", {}).update(value)
        else:
            data[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load(str(path))


@pytest.mark.parametrize("changes, part, field, words", [
    ({"nodes": 5}, {}, "nodes", "nodes: 5 but partition debug has only 3 nodes (PartitionNodeLimit)"),
    ({"nodes": 3}, {"MaxNodes": "2"}, "nodes", "3 but partition debug has at most 2 nodes (PartitionNodeLimit)"),
    # The cluster's partition has MaxTime=INFINITE, and changing it would need slurmctld
    # reconfigured (tests/cluster/slurm-cluster.sh writes it once): a stand-in MaxTime.
    ({"slurm": {"time": "2:00:00"}}, {"MaxTime": "01:00:00"}, "slurm.time",
     "2:00:00 but partition debug allows at most 01:00:00 (PartitionTimeLimit)"),
    ({"nodes": 1, "slurm": {"cpus_per_task": 8}}, {}, "slurm.cpus_per_task",
     "8 but the nodes of partition debug have at most 2 CPUs (PartitionConfig)"),
    ({"slurm": {"mem": "4G"}}, {}, "slurm.mem", "4096M but the nodes of partition debug have at most 2048M"),
])
def test_submit_and_plan_refuse_what_the_partition_cannot_run(tmp_path, monkeypatch, changes, part, field, words):
    monkeypatch.chdir(tmp_path)
    t = Standin(part)
    sched = SlurmScheduler(transport=t)
    spec = spec_of(tmp_path, **changes)
    for call in (lambda: sched.submit(spec), lambda: sched.plan(spec)):
        with pytest.raises(SpecError) as err:
            call()
        assert err.value.exit_code == 2
        assert [f for f, _ in err.value.problems] == [field]
        assert words in str(err.value)
    assert t.submitted == []


def test_a_job_that_fits_is_submitted_and_plan_says_what_was_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = Standin()
    sched = SlurmScheduler(transport=t)
    assert sched.submit(spec_of(tmp_path, nodes=3)).id == "700"
    ok, text = sched.plan(spec_of(tmp_path, nodes=3))
    assert "partition limits: ok: partition debug: at most 3 nodes, time UNLIMITED, 2 CPUs and 2048M memory" in text
    # A transport that cannot read partitions: said, not guessed.
    sched = SlurmScheduler(transport=Blind())
    assert "partition limits: unchecked: the cli transport cannot read the cluster's partitions" in \
        sched.plan(spec_of(tmp_path, nodes=5))[1]


def test_output_directory_checked_at_submit(tmp_path, monkeypatch):
    """halo-sched sets --output itself (halo-%x-%j.out in the submit directory): a submit
    directory the job cannot write would end it FAILED at launch (JobLaunchFailure)."""
    monkeypatch.chdir(tmp_path)
    t = Standin()
    sched = SlurmScheduler(transport=t)
    spec = spec_of(tmp_path)
    real_access = os.access
    # Root may write anywhere here: a stand-in for a read-only submit directory.
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    for call in (lambda: sched.submit(spec), lambda: sched.plan(spec)):
        with pytest.raises(SpecError) as err:
            call()
        assert err.value.problems == [("submit directory", f"output path halo-%x-%j.out: directory {tmp_path} is not "
                                       "writable by this user (the job would end FAILED at launch, JobLaunchFailure): "
                                       "submit from a writable directory")]
    assert t.submitted == []
    problems, _ = output_problems(f"{tmp_path}/missing/%j.out", "cli")
    assert problems and f"directory {tmp_path}/missing does not exist" in problems[0][1]
    assert output_problems("x.out", "rest") == (
        [], "unchecked: slurmrestd may run on a host that does not share this one's filesystem")


# ---- ended while waiting -------------------------------------------------------------------------


def test_wait_cancels_a_job_that_can_never_start(tmp_path):
    pending = st.parse_squeue(fixture("squeue_impossible.txt"))
    t = Standin(states=[by_id(pending)["612"]])
    sched = SlurmScheduler(transport=t)
    seen = []
    state = sched.wait("612", timeout=30, on_change=seen.append)
    assert t.cancelled == [["612"]]
    assert state.status is JobStatus.CANCELLED
    assert state.describe() == (
        "CANCELLED: can never start: nodes: 5 but partition debug has only 3 nodes (PartitionNodeLimit): "
        "lower nodes or pick another slurm.partition; cancelled it")
    assert [s.reason for s in seen] == ["PartitionNodeLimit"]  # its pending line was printed first


def test_every_change_of_reason_is_a_change():
    base = dict(id="5", status=JobStatus.PENDING, raw_state="PENDING", nodes_total=1, nodes_running=0)
    seq = iter([JobState(reason="None", **base), JobState(reason="PartitionConfig", **base),
                JobState(reason="PartitionNodeLimit", **base), JobState(reason="PartitionNodeLimit", **base),
                JobState(id="5", status=JobStatus.COMPLETED, raw_state="COMPLETED", exit_code=0)])
    seen = []
    wait_loop(lambda left: next(seq), None, on_change=seen.append)
    assert [s.reason for s in seen] == ["None", "PartitionConfig", "PartitionNodeLimit", ""]


def test_pending_progress_carries_waited_time_reason_and_what_it_waits_for():
    sched = SlurmScheduler(transport=Standin())
    submitted = (dt.datetime.now() - dt.timedelta(seconds=65)).isoformat(timespec="seconds")
    dep = JobState("622", JobStatus.PENDING, "PENDING", reason="Dependency", nodes_running=0,
                   slurm=SlurmDetail(submitted=submitted, dependency="afterany:620(unfulfilled)",
                                     expected_start="2026-12-01T13:00:00"))
    line = sched.progress(dep)
    assert line.startswith("PENDING for 1m0")  # 1m05s, give or take the clock's second
    assert line.endswith("waiting for a job it depends on (Dependency); waits for job 620 to end "
                         "(afterany, unfulfilled); expected start 2026-12-01 13:00:00 (squeue --start)")


# ---- item 3's lines ------------------------------------------------------------------------------


def test_a_cancelled_pending_job_shows_no_pending_reason():
    s = st.make_state("9", "CANCELLED", exit_rc=0, exit_sig=0, nodes=5, reason="PartitionNodeLimit", source="x")
    assert "PartitionNodeLimit" not in s.describe()
    s = st.make_state("9", "FAILED", exit_rc=3, exit_sig=0, nodes=1, reason="NonZeroExitCode", source="x")
    assert s.describe() == "FAILED exit=3 reason=NonZeroExitCode"


def test_launch_failure_is_slurmds_error_not_exit_181():
    # squeue -O exit_code printed 4021 for a job whose output directory did not exist.
    rows = [ln for ln in fixture("squeue_impossible.txt").splitlines()][:1]
    row = rows[0].split(st.SEP)
    row[0] = row[1] = "626"
    row[2], row[3], row[5], row[6] = "FAILED", "4021", "JobLaunchFailure", "node1"
    (s,) = st.parse_squeue(st.SEP.join(row))
    (c,) = st.parse_scontrol_states(fixture("scontrol_launch_failed.txt"))  # ExitCode=0:53
    for state in (s, c):
        assert state.exit_code is None
        assert "exit=181" not in state.describe()
        assert "slurmd error 4021: Slurmd could not connect IO" in state.reason


def test_signal_exit_codes_say_so():
    s = st.make_state("9", "CANCELLED", exit_rc=0, exit_sig=9, nodes=1, reason="", source="x")
    assert s.describe() == "CANCELLED exit=137 (128+9: killed by signal 9, SIGKILL)"


def test_scancel_errors_are_one_clean_line():
    assert clean_scancel("scancel: error: Kill job error on job id 5: Invalid job id specified\n"
                         "scancel: error: Kill job error on job id 5: Invalid job id specified\n") == (
        "Kill job error on job id 5: Invalid job id specified")


# ---- on the real cluster -------------------------------------------------------------------------


def _env(tmp_path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HALO_SCHED_BACKEND": "slurm",
            "HALO_SCHED_HOME": str(tmp_path / "halo-home")}


#: "At once": a CLI start and a few calls to slurmctld, with room for a loaded 2-core machine (18.8 s
#: seen beside the rest of the suite). What these tests guard against waits for a job that never
#: starts: until _halo's timeout, or the library wait's 60 s.
PROMPT_S = 30


def _halo(tmp_path, *args, timeout=90):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def _sbatch(tmp_path, *args) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-D", str(tmp_path), "-o", f"{tmp_path}/%j.out", *args],
                         capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip().split(";")[0]


def _queued_though_impossible(tmp_path, *args) -> str | None:
    """A job that can never start (more nodes or CPUs than the partition has). 22.05 queues both
    kinds (pending with PartitionNodeLimit/PartitionConfig: what watch and wait must end); 24.11
    refuses both at submit and 26.05 the -N5 one ("Requested node configuration is not
    available"), so nothing waits there: that refusal is checked instead, and None returned."""
    from cluster.cluster import slurm_version

    out = subprocess.run(["sbatch", "--parsable", "-D", str(tmp_path), "-o", f"{tmp_path}/%j.out", *args],
                         capture_output=True, text=True, timeout=30)
    if out.returncode == 0:
        return out.stdout.strip().split(";")[0]
    assert slurm_version() != "22.05" and out.returncode == 1, out
    assert "Requested node configuration is not available" in out.stderr, out
    return None


def _squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "--noheader", "--states=all", "-o", "%T", "-j", job_id],
                          capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.slurm
@pytest.mark.parametrize("changes, words", [
    ({"nodes": 5}, "nodes: 5 but partition debug has only 3 nodes (PartitionNodeLimit): lower nodes or pick "
                   "another slurm.partition"),
    ({"nodes": 1, "slurm": {"cpus_per_task": 8}},
     "slurm.cpus_per_task: 8 but the nodes of partition debug have at most 2 CPUs (PartitionConfig)"),
])
def test_cluster_refuses_at_submit_and_plan(slurm_cluster, tmp_path, changes, words):
    spec_of(tmp_path, **changes)  # writes job.yaml
    for cmd in ("submit", "plan"):
        proc, took = _halo(tmp_path, cmd, "job.yaml", "--backend", "slurm")
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert took < PROMPT_S
    assert proc.stdout == ""


@pytest.mark.slurm
@pytest.mark.parametrize("sbatch_args, words", [
    (["-N5"], "CANCELLED: can never start: nodes: 5 but partition debug has only 3 nodes (PartitionNodeLimit): "
              "lower nodes or pick another slurm.partition; cancelled it"),
    (["-N1", "-c8"], "CANCELLED: can never start: slurm.cpus_per_task: 8 but the nodes of partition debug have at "
                     "most 2 CPUs (PartitionConfig)"),
])
def test_cluster_watch_ends_a_job_that_can_never_start(slurm_cluster, tmp_path, sbatch_args, words):
    job = _queued_though_impossible(tmp_path, *sbatch_args, "--wrap", "true")
    if job is None:
        return
    proc, took = _halo(tmp_path, "watch", job, "--backend", "slurm")
    assert proc.returncode == 1, proc.stderr
    assert f"halo-sched: {job} {words}" in proc.stderr
    assert took < PROMPT_S
    assert _squeue_state(job) == "CANCELLED"


@pytest.mark.slurm
def test_cluster_submit_wait_ends_on_a_dependency_on_a_failed_job(slurm_cluster, tmp_path):
    failed = _sbatch(tmp_path, "-N1", "--wrap", "exit 3")
    deadline = time.monotonic() + 30
    while _squeue_state(failed) != "FAILED" and time.monotonic() < deadline:
        time.sleep(0.5)
    spec_of(tmp_path, nodes=1, slurm={"extra_args": [f"--dependency=afterok:{failed}"]})
    proc, took = _halo(tmp_path, "submit", "job.yaml", "--backend", "slurm", "--wait")
    job = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr
    assert (f"CANCELLED: can never start: its dependency can never be met (afterok:{failed}(failed): the job it "
            "waits for ended the wrong way; DependencyNeverSatisfied)") in proc.stderr
    assert took < PROMPT_S
    assert _squeue_state(job) == "CANCELLED"


@pytest.mark.slurm
def test_cluster_job_wait_in_the_library(slurm_cluster, tmp_path):
    from halo_sched.backends.base import Job

    job = _queued_though_impossible(tmp_path, "-N5", "--wrap", "true")
    if job is None:
        return
    start = time.monotonic()
    state = Job(SlurmScheduler(), job).wait(timeout=60)
    assert time.monotonic() - start < PROMPT_S
    assert state.status is JobStatus.CANCELLED and "PartitionNodeLimit" in state.verdict


@pytest.mark.slurm
def test_cluster_queued_job_shows_reason_and_waited_time_at_every_change(slurm_cluster, tmp_path):
    blocker = _sbatch(tmp_path, "-N3", "--exclusive", "-t", "1", "--wrap", "sleep 8")
    queued = _sbatch(tmp_path, "-N1", "-t", "1", "--wrap", "true")
    after = _sbatch(tmp_path, "-N1", "-t", "1", f"--dependency=afterany:{blocker}", "--wrap", "true")
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "watch", j, "--backend", "slurm"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for j in (queued, after)]
    outs = [p.communicate(timeout=90)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = outs[0].splitlines()
    pending = [ln for ln in lines if ": PENDING for " in ln]
    assert pending, outs[0]
    # Resources, in words, with what it needs and what is free; the waited time on the line.
    assert any("waiting for resources (nodes busy) (Resources); needs 1 node, 1 CPU; partition debug has "
               "0 of 3 nodes idle, 0 CPUs free" in ln for ln in pending), outs[0]
    dep_lines = [ln for ln in outs[1].splitlines() if ": PENDING for " in ln]
    assert any(f"(Dependency); waits for job {blocker} to end (afterany, unfulfilled)" in ln for ln in dep_lines), \
        outs[1]
    assert f"halo-sched: {queued} COMPLETED exit=0" in outs[0]


def test_cancel_of_an_ended_job_says_so():
    done = st.make_state("9", "COMPLETED", exit_rc=0, exit_sig=0, nodes=1, reason="None", source="x")
    t = Standin(states=[done])
    assert SlurmScheduler(transport=t).cancel(["9"]) == {"9": "COMPLETED exit=0"}
    assert t.cancelled == []  # nothing sent to scancel


@pytest.mark.slurm
def test_cluster_cancel_of_a_completed_job(slurm_cluster, tmp_path):
    job = _sbatch(tmp_path, "-N1", "--wrap", "true")
    deadline = time.monotonic() + 30
    while _squeue_state(job) != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.5)
    proc, _ = _halo(tmp_path, "cancel", job, "--backend", "slurm")
    assert proc.returncode == 0
    assert proc.stderr.strip() == f"halo-sched: {job} already ended (COMPLETED exit=0); nothing to cancel"


@pytest.mark.slurm
def test_cluster_rest_transport_checks_partitions_too(slurm_cluster, tmp_path, monkeypatch):
    """slurmrestd (GET .../partitions and .../nodes) serves the same limits as scontrol."""
    from halo_sched.backends.slurm.transport import get_transport

    monkeypatch.chdir(tmp_path)
    sched = SlurmScheduler(transport=get_transport("rest"))
    with pytest.raises(SpecError) as err:
        sched.plan(spec_of(tmp_path, nodes=5))
    assert err.value.problems == [("nodes", "5 but partition debug has only 3 nodes (PartitionNodeLimit): lower "
                                            "nodes or pick another slurm.partition")]
    ok, text = sched.plan(spec_of(tmp_path, nodes=1))
    assert "partition limits: ok: partition debug: at most 3 nodes" in text
    assert "output file: unchecked: slurmrestd may run on a host" in text
