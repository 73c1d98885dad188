"""SLURM output parsing and the CLI transport's call budget, on recorded/hand-written output.

Fixtures: tests/fixtures/slurm/<version>/ (see its README: 22.05 is recorded from a real cluster,
23.11/24.05 are hand-written).
"""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from halo_sched.backends.base import JobStatus
from halo_sched.backends.slurm import status as st
from halo_sched.backends.slurm.transport import (
    CliTransport,
    PyslurmTransport,
    RestTransport,
    get_transport,
    rest_job_properties,
    rest_job_state,
)
from helpers import request_of
from halo_sched.errors import MissingDependency, SchedulerError, UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def load(version: str) -> tuple[dict, dict]:
    d = FIXTURES / version
    return json.loads((d / "calls.json").read_text()), json.loads((d / "jobs.json").read_text())


def out(version: str, call: str) -> str:
    calls, _ = load(version)
    f = calls[call].get("stdout_file")
    return (FIXTURES / version / f).read_text() if f else calls[call].get("stdout", "")


def check(state, expect: dict) -> None:
    assert state.status.value == expect["status"], (state, expect)
    if expect.get("exit_code") is not None:
        assert state.exit_code == expect["exit_code"], (state, expect)
    if state.status.terminal is False:
        assert state.exit_code is None
    if "nodes_total" in expect:
        assert state.nodes_total == expect["nodes_total"], (state, expect)


class FixtureSlurm:
    """A runner that answers like SLURM's clients from one fixture folder.

    squeue ``--jobs`` filters the recorded full listing the way squeue does (an id matches its
    job, its array tasks, its het components); a single unknown id fails the call as in 22.05,
    and ``any_unknown_fails`` makes every list with an unknown id fail (as some versions do).
    ``sacct``: the recorded answer ("disabled" for 22.05) or, with ``sacct_down``, slurmdbd
    unreachable.
    """

    def __init__(self, version: str, any_unknown_fails: bool = False, sacct_down: bool = False):
        self.version = version
        self.calls_fx, _ = load(version)
        self.any_unknown_fails = any_unknown_fails
        self.sacct_down = sacct_down
        self.calls: list[list[str]] = []

    @staticmethod
    def _jobs_arg(argv: list[str]) -> list[str] | None:
        for a in argv:
            if a.startswith("--jobs="):
                return a[len("--jobs=") :].split(",")
        return None

    @staticmethod
    def _matches(state, ids: list[str]) -> bool:
        return bool({state.id, state.slurm and state.slurm.base_id, state.slurm and state.slurm.job_id_raw} & set(ids))

    def _done(self, argv, rc, stdout="", stderr=""):
        return subprocess.CompletedProcess(argv, rc, stdout, stderr)

    def __call__(self, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        cmd = argv[0]
        if cmd == "sacct":
            if self.sacct_down:
                return self._done(argv, 1, stderr="sacct: error: Problem talking to the database: Connection refused\n")
            rec = self.calls_fx["sacct"]
            if rec["returncode"] != 0:
                return self._done(argv, rec["returncode"], stderr=rec["stderr"])
            ids = self._jobs_arg(argv) or []
            keep = []
            for line in out(self.version, "sacct").splitlines():
                job = line.split("|", 1)[0].split(".", 1)[0]
                base = st.split_job_id(job)[0]
                raw = line.split("|")[1].split(".", 1)[0]
                if {job, base, raw} & set(ids):
                    keep.append(line + "\n")
            return self._done(argv, 0, "".join(keep))
        if cmd == "squeue":
            ids = self._jobs_arg(argv)
            lines = out(self.version, "squeue_all").splitlines(keepends=True)
            if ids is None:
                return self._done(argv, 0, "".join(lines))
            keep = [ln for ln in lines if any(self._matches(s, ids) for s in st.parse_squeue(ln))]
            known = {i for i in ids if any(self._matches(s, [i]) for ln in lines for s in st.parse_squeue(ln))}
            unknown = [i for i in ids if i not in known]
            if unknown and (len(ids) == 1 or self.any_unknown_fails):
                return self._done(argv, 1, stderr=self.calls_fx["squeue_single_unknown"]["stderr"])
            return self._done(argv, 0, "".join(keep))
        if cmd == "scontrol":
            if argv[1:] == ["--version"]:
                return self._done(argv, 0, out(self.version, "scontrol_version"))
            text = out(self.version, "scontrol_all")
            if argv[-1] != "job":
                recs = [ln for ln in text.splitlines(keepends=True) if ln.startswith(f"JobId={argv[-1]} ")]
                if not recs:
                    return self._done(argv, 1, stderr="slurm_load_jobs error: Invalid job id specified\n")
                return self._done(argv, 0, "".join(recs))
            return self._done(argv, 0, text)
        if cmd in ("scancel", "sbatch"):
            return self._done(argv, 0, "4242\n" if cmd == "sbatch" else "")
        raise AssertionError(f"unexpected command {argv}")


# ---------------------------------------------------------------------------------------------
# state mapping and small parsers


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("PENDING", JobStatus.PENDING),
        ("PD", JobStatus.PENDING),
        ("CONFIGURING", JobStatus.PENDING),
        ("REQUEUED", JobStatus.PENDING),
        ("REQUEUE_HOLD", JobStatus.PENDING),
        ("RUNNING", JobStatus.RUNNING),
        ("COMPLETING", JobStatus.RUNNING),
        ("SUSPENDED", JobStatus.RUNNING),
        ("COMPLETED", JobStatus.COMPLETED),
        ("CD", JobStatus.COMPLETED),
        ("FAILED", JobStatus.FAILED),
        ("BOOT_FAIL", JobStatus.FAILED),
        ("DEADLINE", JobStatus.FAILED),
        ("CANCELLED", JobStatus.CANCELLED),
        ("CANCELLED by 0", JobStatus.CANCELLED),
        ("CANCELLED by 1000", JobStatus.CANCELLED),
        ("CANCELLED+", JobStatus.CANCELLED),
        ("cancelled", JobStatus.CANCELLED),
        ("TIMEOUT", JobStatus.TIMEOUT),
        ("NODE_FAIL", JobStatus.NODE_FAIL),
        ("PREEMPTED", JobStatus.PREEMPTED),
        ("OUT_OF_MEMORY", JobStatus.OUT_OF_MEMORY),
        ("OOM", JobStatus.OUT_OF_MEMORY),
        ("RUNNING,SIGNALING", JobStatus.RUNNING),
        ("REVOKED", JobStatus.UNKNOWN),
        ("SOMETHING_NEW", JobStatus.UNKNOWN),
        ("", JobStatus.UNKNOWN),
    ],
)
def test_map_state(raw, expected):
    assert st.map_state(raw) is expected


def test_exit_codes():
    assert st.parse_exit_pair("2:0") == (2, 0)
    assert st.parse_exit_pair("0:15") == (0, 15)
    assert st.parse_exit_pair("") == (None, None)
    assert st.decode_wait_status("768") == (3, 0)
    assert st.decode_wait_status(15) == (0, 15)
    assert st.decode_wait_status("N/A") == (None, None)
    # squeue -O exit_code from 23.02 on (24.11.5 here): rc:sig, not a wait status.
    assert st.decode_wait_status("3:0") == (3, 0)
    assert st.decode_wait_status("0:15") == (0, 15)
    assert st.decode_wait_status("137:0") == (137, 0)
    assert st.decode_wait_status("0:0") == (0, 0)


def test_split_ids_and_array_ranges():
    assert st.split_job_id("123") == ("123", None, None)
    assert st.split_job_id("123_4") == ("123", "4", None)
    assert st.split_job_id("123_[1-5%2]") == ("123", "[1-5%2]", None)
    assert st.split_job_id("123+1") == ("123", None, "1")
    assert st._array_spec_contains("[3-10%2]", 7)
    assert st._array_spec_contains("1,4-8:2", 6)
    assert not st._array_spec_contains("1,4-8:2", 5)
    assert not st._array_spec_contains("[3-10]", 11)


def test_unknown_state_word_keeps_raw_and_explains():
    (s,) = st.parse_squeue(st.SEP.join(["5", "5", "WEIRD_NEW", "0", "1", "None", ""]) + st.SEP + "\n")
    assert s.status is JobStatus.UNKNOWN and s.raw_state == "WEIRD_NEW" and "WEIRD_NEW" in s.reason


# ---------------------------------------------------------------------------------------------
# 22.05, recorded from the real cluster


def test_2205_squeue_scontrol_rest_agree_with_what_happened():
    _, jobs = load("22.05")
    ids = [j["id"] for j in jobs.values()]
    from_squeue = st.select_states(ids, st.parse_squeue(out("22.05", "squeue_all")))
    from_jobs_call = st.select_states(ids, st.parse_squeue(out("22.05", "squeue_jobs")))
    from_scontrol = st.select_states(ids, st.parse_scontrol_states(out("22.05", "scontrol_all")))
    rest_doc = json.loads((FIXTURES / "22.05" / "rest_jobs.json").read_text())
    from_rest = st.select_states(ids, [rest_job_state(j) for j in rest_doc["jobs"]])
    for name, expect in jobs.items():
        for source in (from_squeue, from_jobs_call, from_scontrol, from_rest):
            check(source[expect["id"]], expect)
        # The sources agree on the exit code too (one is a wait status, one is "rc:sig").
        assert from_squeue[expect["id"]].exit_code == from_scontrol[expect["id"]].exit_code == from_rest[expect["id"]].exit_code


def test_2205_details():
    _, jobs = load("22.05")
    states = st.parse_squeue(out("22.05", "squeue_all"))
    by = lambda name: st.match_states(jobs[name]["id"], states)  # noqa: E731
    assert by("completed").nodes_total == 2
    assert by("running").nodes_running == 2 and by("running").slurm.nodelist == "node[1-2]"
    assert by("pending").reason == "Resources" and by("pending").nodes_running == 0
    assert by("pending_too_big").reason == "PartitionNodeLimit"
    assert by("timeout").reason == "TimeLimit" and by("timeout").slurm.signal == 15
    assert by("failed").exit_code == 3
    het = by("het")
    assert set(het.slurm.components) == {f"{jobs['het']['id']}+0", f"{jobs['het']['id']}+1"}
    arr_id = jobs["array"]["id"]
    arr = by("array")
    assert arr.status is JobStatus.RUNNING and f"{arr_id}_[3-4%2]" in arr.slurm.components
    assert st.match_states(f"{arr_id}_1", states).status is JobStatus.RUNNING
    pending_task = st.match_states(f"{arr_id}_4", states)
    assert pending_task.status is JobStatus.PENDING and pending_task.id == f"{arr_id}_4"
    assert st.match_states(f"{arr_id}_9", states) is None
    assert st.match_states("999999", states) is None


def test_2205_recorded_errors_are_recognised():
    calls, _ = load("22.05")
    assert st.sacct_disabled(calls["sacct"]["stderr"])
    assert calls["squeue_single_unknown"]["returncode"] != 0
    assert st.squeue_invalid_id(calls["squeue_single_unknown"]["stderr"])
    assert calls["squeue_jobs_with_unknown"]["returncode"] == 0  # 22.05: only a lone unknown id fails


def test_2205_query_through_fake_runner():
    _, jobs = load("22.05")
    fake = FixtureSlurm("22.05")
    t = CliTransport(runner=fake)
    ids = [j["id"] for j in jobs.values()] + ["999999"]
    result = t.query(ids)
    for expect in jobs.values():
        check(result[expect["id"]], expect)
    assert result["999999"].status is JobStatus.UNKNOWN and "MinJobAge" in result["999999"].reason
    assert t.accounting is False
    assert [c[0] for c in fake.calls] == ["sacct", "squeue"]  # probe, then one full listing


def test_job_info_fields():
    _, jobs = load("22.05")
    t = CliTransport(runner=FixtureSlurm("22.05"))
    info = t.job_info(jobs["completed"]["id"])
    assert info["StdOut"].startswith("/tmp/halo-rec-") and info["NodeList"] == "node[1-2]"
    assert info["WorkDir"] and info["JobState"] == "COMPLETED"
    with pytest.raises(SchedulerError, match="not known"):
        t.job_info("999999")
    recorded = st.parse_scontrol_jobs(out("22.05", "scontrol_job_completed"))
    assert recorded[0]["TRES"] == "cpu=2,node=2,billing=2"


def test_2205_multiline_scontrol_layout_parses_the_same():
    one_line = out("22.05", "scontrol_job_completed")
    multi = one_line.replace(" UserId=", "\n   UserId=").replace(" NodeList=", "\n   NodeList=") + "\n"
    assert st.parse_scontrol_jobs(multi) == st.parse_scontrol_jobs(one_line)


# ---------------------------------------------------------------------------------------------
# 23.11 / 24.05, hand-written (accounting on)


@pytest.mark.parametrize("version", ["23.11", "24.05"])
def test_sacct_parsing(version):
    _, jobs = load(version)
    states = st.parse_sacct(out(version, "sacct"))
    assert all("." not in s.id for s in states)  # steps are folded into their job
    for name, expect in jobs["sacct"].items():
        got = st.match_states(expect["id"], states)
        assert got is not None, name
        check(got, expect)


@pytest.mark.parametrize("version", ["23.11", "24.05"])
def test_slurmctld_parsing(version):
    _, jobs = load(version)
    sq = st.parse_squeue(out(version, "squeue_all"))
    sc = st.parse_scontrol_states(out(version, "scontrol_all"))
    for name, expect in jobs["slurmctld"].items():
        for states in (sq, sc):
            got = st.match_states(expect["id"], states)
            assert got is not None, name
            check(got, expect)


def test_sacct_details():
    states = st.parse_sacct(out("23.11", "sacct"))
    oom = st.match_states("1006", states)
    assert oom.raw_state == "FAILED" and "1006.0" in oom.reason and oom.slurm.steps["1006.0"] == "OUT_OF_MEMORY"
    assert st.match_states("1003", states).raw_state == "CANCELLED by 1000"
    assert st.match_states("1017", states).slurm.derived_exit_code == 2
    pending = st.match_states("1014", states)
    assert pending.reason == "Priority" and pending.slurm.nodelist == ""
    # A finished job's sacct Reason is history, not a reason.
    assert st.match_states("1002", states).reason == ""
    assert st.match_states("1012+0", states).slurm.steps == {"1012+0.batch": "RUNNING"}


def test_scontrol_newer_fields_spaces_and_equals():
    recs = st.parse_scontrol_jobs(out("23.11", "scontrol_all"))
    first = recs[0]
    assert first["WorkDir"] == "/home/alice/my runs"
    assert first["StdOut"] == "/home/alice/my runs/slurm-1002.out"
    assert first["Command"] == "/home/alice/my runs/launch job.sh"
    assert first["ReqTRES"].endswith("gres/gpu=16") and first["TresPerNode"] == "gres/gpu:8"
    rec24 = st.parse_scontrol_jobs(out("24.05", "scontrol_all"))[0]
    assert rec24["AdminComment"] == '{"note": "a=b c"}'
    assert rec24["SegmentSize"] == "2" and rec24["ResvPorts"] == "12000-12001"
    assert rec24["Container"] == ""
    assert st.scontrol_display_id({"JobId": "1011", "ArrayJobId": "1009", "ArrayTaskId": "2"}) == "1009_2"


def test_aggregate_prefers_the_telling_failure():
    a = st.make_state("9_1", "COMPLETED", exit_rc=0, exit_sig=0, nodes=1, reason="", source="x")
    b = st.make_state("9_2", "CANCELLED", exit_rc=0, exit_sig=15, nodes=1, reason="", source="x")
    c = st.make_state("9_3", "NODE_FAIL", exit_rc=1, exit_sig=0, nodes=2, reason="", source="x")
    agg = st.aggregate("9", [a, b, c])
    assert agg.status is JobStatus.NODE_FAIL and agg.exit_code == 1 and agg.nodes_total == 4
    d = st.make_state("9_4", "PENDING", exit_rc=0, exit_sig=0, nodes=1, reason="Priority", source="x")
    assert st.aggregate("9", [a, d]).status is JobStatus.PENDING


# ---------------------------------------------------------------------------------------------
# call budget: one scheduler call per poll, at most 3


def _ids_45(version: str) -> list[str]:
    _, jobs = load(version)
    tables = jobs.values() if "sacct" not in jobs else list(jobs["sacct"].values()) + list(jobs["slurmctld"].values())
    ids = list(dict.fromkeys(j["id"] for j in tables))
    ids += [str(900000 + i) for i in range(45 - len(ids))]  # purged/unknown ids
    assert len(ids) == 45
    return ids


@pytest.mark.parametrize("version", ["22.05", "23.11", "24.05"])
@pytest.mark.parametrize("any_unknown_fails", [False, True])
def test_query_45_ids_costs_at_most_3_calls(version, any_unknown_fails):
    fake = FixtureSlurm(version, any_unknown_fails=any_unknown_fails)
    t = CliTransport(runner=fake)
    ids = _ids_45(version)
    for poll in range(3):  # the first poll also discovers whether accounting exists
        fake.calls.clear()
        result = t.query(ids)
        assert set(result) == set(ids)
        assert len(fake.calls) <= 3, fake.calls
        assert sum(s.status is JobStatus.UNKNOWN for s in result.values()) >= 45 - 25
    assert t.accounting is (version != "22.05")


def test_query_without_accounting_steady_state():
    fake = FixtureSlurm("22.05")
    t = CliTransport(runner=fake, accounting=False)
    _, jobs = load("22.05")
    known = [j["id"] for j in jobs.values()]
    t.query(known)
    assert [c[0] for c in fake.calls] == ["squeue"]  # everything known: one call
    fake.calls.clear()
    t.query(known + ["999998", "999999"])
    assert [c[0] for c in fake.calls] == ["squeue", "scontrol"]
    fake.calls.clear()
    t.query(["999999"])  # a lone unknown id fails squeue; the full listing answers
    assert [c[0] for c in fake.calls] == ["squeue", "squeue"]


def test_query_with_accounting_is_one_sacct_call():
    fake = FixtureSlurm("23.11")
    t = CliTransport(runner=fake)
    _, jobs = load("23.11")
    result = t.query([j["id"] for j in jobs["sacct"].values()])
    assert [c[0] for c in fake.calls] == ["sacct"]
    check(result["1006"], jobs["sacct"]["failed_step_oom"])


def test_sacct_down_falls_back_and_asks_again_next_poll():
    fake = FixtureSlurm("23.11", sacct_down=True)
    t = CliTransport(runner=fake)
    ids = _ids_45("23.11")
    result = t.query(ids)
    assert len(fake.calls) <= 3 and fake.calls[0][0] == "sacct"
    assert t.accounting is None  # not cached: slurmdbd may come back
    assert result["1015"].status is JobStatus.RUNNING
    assert "Problem talking to the database" in result["900000"].reason


def test_many_ids_are_chunked_for_sacct_but_listed_once_by_squeue():
    ids = [str(100000 + i) for i in range(25)]
    fake = FixtureSlurm("23.11")
    CliTransport(runner=fake, chunk_size=10, accounting=True).query(ids)
    sacct_calls = [c for c in fake.calls if c[0] == "sacct"]
    assert len(sacct_calls) == 3 and all(len(c[-1].split(",")) <= 10 for c in sacct_calls)
    fake = FixtureSlurm("22.05")
    CliTransport(runner=fake, chunk_size=10, accounting=False).query(ids)
    assert [c[0] for c in fake.calls] == ["squeue"] and not any(a.startswith("--jobs") for a in fake.calls[0])


# ---------------------------------------------------------------------------------------------
# submit / cancel / errors


def _runner(replies):
    calls = []

    def run(argv, input=None):
        calls.append((list(argv), input))
        rc, stdout, stderr = replies.pop(0)
        return subprocess.CompletedProcess(argv, rc, stdout, stderr)

    run.calls = calls
    return run


def test_submit_parses_parsable_output_and_passes_script_on_stdin():
    run = _runner([(0, "1234\n", "sbatch: warning: something\n")])
    assert CliTransport(runner=run).submit(request_of("#!/bin/bash\ntrue\n", ["--qos=high"])) == "1234"
    argv, stdin = run.calls[0]
    assert argv == ["sbatch", "--parsable", "--qos=high"] and stdin.startswith("#!/bin/bash")
    # With -M, sbatch prints "ID;CLUSTER" (src/sbatch/sbatch.c): the cluster stays in the id.
    run = _runner([(0, "1234;halo\n", "")])
    assert CliTransport(runner=run).submit(request_of("#!/bin/bash\ntrue\n", ["--clusters=halo"])) == "halo:1234"


def test_submit_failure_carries_stderr_and_is_not_retried():
    run = _runner([(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n")])
    with pytest.raises(SchedulerError, match="Invalid partition name"):
        CliTransport(runner=run, retry_wait=0).submit(request_of("#!/bin/bash\n"))
    run = _runner([(1, "", "sbatch: error: Socket timed out on send/recv operation\n")])
    with pytest.raises(SchedulerError, match="timed out"):
        CliTransport(runner=run, retry_wait=0).submit(request_of("#!/bin/bash\n"))
    assert len(run.calls) == 1

    def slow(argv, input=None):
        raise subprocess.TimeoutExpired(argv, 60)

    with pytest.raises(SchedulerError, match="may have been queued"):
        CliTransport(runner=slow).submit(request_of("#!/bin/bash\n"))


def test_cancel_is_one_call_with_signal():
    run = _runner([(0, "", "")])
    CliTransport(runner=run).cancel(["1", "2", "3_4", "2"], signal="USR2")
    # --batch: the batch script gets the signal, as with slurm.signal's --signal=B:, and forwards it.
    assert run.calls[0][0] == ["scancel", "--batch", "--signal=USR2", "1", "2", "3_4"]
    run = _runner([])
    CliTransport(runner=run).cancel([])
    assert run.calls == []


def test_transient_errors_are_retried_for_queries():
    run = _runner([(1, "", "squeue: error: Unable to contact slurm controller (connect failure)\n"), (0, "", ""), (0, "", "")])
    result = CliTransport(runner=run, accounting=False, retry_wait=0).query(["5"])
    assert len(run.calls) == 3 and result["5"].status is JobStatus.UNKNOWN  # squeue x2, scontrol
    run = _runner([(1, "", "squeue: error: Socket timed out on send/recv operation\n")] * 2)
    with pytest.raises(SchedulerError, match="failed 2 times"):
        CliTransport(runner=run, accounting=False, retries=2, retry_wait=0).query(["5"])


def test_a_connection_the_controller_drops_while_it_stops_is_retried():
    # What squeue printed when slurmctld stopped during its call (24.11, the 90 s outage test beside
    # the whole suite, 2026-12-07): the controller going away, not an answer. It once ended
    # `watch --outage-budget 20` with exit 1 instead of waiting.
    run = _runner([(1, "", "slurm_load_jobs error: Connection reset by peer\n"), (0, "", ""), (0, "", "")])
    result = CliTransport(runner=run, accounting=False, retry_wait=0).query(["5"])
    assert len(run.calls) == 3 and result["5"].status is JobStatus.UNKNOWN


def test_real_errors_are_not_swallowed():
    run = _runner([(1, "", "squeue: error: Invalid user: nobody\n")])
    with pytest.raises(SchedulerError, match="Invalid user"):
        CliTransport(runner=run, accounting=False).query(["5"])


def test_missing_binaries_are_a_missing_dependency():
    def run(argv, input=None):
        raise FileNotFoundError(argv[0])

    with pytest.raises(MissingDependency, match="sbatch not found"):
        CliTransport(runner=run).submit(request_of("#!/bin/bash\n"))


def test_get_transport():
    assert isinstance(get_transport(), CliTransport)
    assert isinstance(get_transport("cli", chunk_size=5), CliTransport)
    with pytest.raises(UsageError, match="unknown SLURM transport"):
        get_transport("grpc")


def test_transport_module_does_not_import_torch():
    code = "import sys, halo_sched.backends.slurm.transport; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# slurmrestd request building (the live test is in test_slurm_transport_cluster.py)


def test_request_options_become_rest_properties():
    request = request_of("#!/bin/bash\nsrun hostname\n",
                         ["--job-name=train", "--nodes=2", "--time=10", "--ntasks-per-node=1", "--exclusive",
                          "--output=/tmp/out-%j.log", "--export=NONE,KEEP,SET=1", "--partition=debug"])
    job = rest_job_properties(request, environment={"KEEP": "k", "DROP": "d"}, cwd="/w")
    assert job["name"] == "train" and job["nodes"] == "2" and job["time_limit"] == "10"
    assert job["tasks_per_node"] == "1" and job["exclusive"] == "exclusive"
    assert job["standard_output"] == "/tmp/out-%j.log" and job["partition"] == "debug"
    assert job["environment"] == {"KEEP": "k", "SET": "1"} and job["current_working_directory"] == "/w"


def test_rest_refuses_options_it_cannot_express():
    from halo_sched.errors import UsageError

    with pytest.raises(UsageError, match="slurm.extra_args.*--container-image"):
        rest_job_properties(request_of("#!/bin/bash\n", ["--container-image=nvcr.io/x"]), environment={})
    # slurmrestd 22.05 takes "requeue": false and ignores it; "no_requeue" is sbatch's --no-requeue.
    assert rest_job_properties(request_of("#!/bin/bash\n", ["--no-requeue"]), environment={})["no_requeue"] is True


def test_rest_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("HALO_SLURMRESTD_URL", raising=False)
    monkeypatch.delenv("HALO_SLURMRESTD_SOCKET", raising=False)
    monkeypatch.delenv("SLURM_JWT", raising=False)
    with pytest.raises(MissingDependency, match="endpoint"):
        RestTransport()
    with pytest.raises(MissingDependency, match="JWT"):
        RestTransport(url="http://127.0.0.1:1")
    monkeypatch.setenv("HALO_SLURMRESTD_SOCKET", "/nonexistent.sock")
    monkeypatch.setenv("HALO_SLURMRESTD_URL", "http://127.0.0.1:1")
    assert RestTransport().socket_path == "/nonexistent.sock"  # no token: rest_auth/local
    assert RestTransport(token="t").url == "http://127.0.0.1:1"  # token: the JWT endpoint
    with pytest.raises(SchedulerError, match="slurmrestd"):
        RestTransport(retries=1).query(["1"])


# ---------------------------------------------------------------------------------------------
# pyslurm: guarded (it cannot be built here); exercised against a stand-in module


def test_pyslurm_missing_is_a_clear_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    with pytest.raises(MissingDependency, match="pyslurm"):
        PyslurmTransport(cluster_version="22.05.8")


def _fake_pyslurm(version: str):
    sent: list[tuple] = []  # (job id, signal, steps) of every send_signal and cancel

    class Job:
        def __init__(self, job_id, **kw):
            self.id = job_id
            self.state, self.state_reason = kw.get("state", "RUNNING"), kw.get("reason", "None")
            self.exit_code, self.exit_code_signal = kw.get("rc", 0), kw.get("sig", 0)
            self.num_nodes, self.allocated_nodes = kw.get("nodes", 2), "node[1-2]"
            self.array_id, self.array_task_id, self.array_tasks_waiting = kw.get("array_id"), kw.get("task"), None
            self.heterogeneous_id, self.heterogeneous_offset = 0, 0

        def send_signal(self, sig, steps="children"):
            sent.append((self.id, sig, steps))

        def cancel(self):
            sent.append((self.id, "KILL", "all"))

    class Jobs(dict):
        @staticmethod
        def load():
            return Jobs({7: Job(7), 8: Job(8, state="FAILED", rc=3), 9: Job(9, array_id=8, task=2, state="COMPLETED")})

    return types.SimpleNamespace(__version__=version, Job=Job, Jobs=Jobs, RPCError=RuntimeError, sent=sent)


def test_pyslurm_warns_the_batch_script_alone(monkeypatch):
    # As `scancel --batch --signal`: the batch script passes the warning on to every rank.
    fake = _fake_pyslurm("22.5.1")
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    t = PyslurmTransport(cluster_version="22.05.8")
    t.cancel(["7"], signal="USR2")
    t.cancel(["8"])
    assert fake.sent == [(7, "SIGUSR2", "batch"), (8, "KILL", "all")]


def test_pyslurm_version_must_match(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", _fake_pyslurm("25.11.0"))
    with pytest.raises(MissingDependency, match="does not match this cluster's Slurm 22.05.8"):
        PyslurmTransport(cluster_version="22.05.8")


def test_pyslurm_query_with_matching_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", _fake_pyslurm("22.5.1"))
    t = PyslurmTransport(cluster_version="22.05.8")
    res = t.query(["7", "8", "8_2", "404"])
    assert res["7"].status is JobStatus.RUNNING and res["7"].nodes_running == 2
    assert res["8"].status is JobStatus.FAILED and res["8"].exit_code == 3
    assert res["8_2"].status is JobStatus.COMPLETED
    assert res["404"].status is JobStatus.UNKNOWN
