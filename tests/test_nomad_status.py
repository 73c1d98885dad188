"""The Nomad state fold, plan text and version checks (pure), on hand-written Nomad answers in
the constant-size shape: one group ``trainer`` (count N, ``JOB.trainer[K]`` is rank K)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad.plan import format_plan, parse_version, plan_summary, version_warnings
from halo_sched.backends.nomad.state import job_state, ranks_text

# Nomad's own words (nomad/structs/alloc.go AllocTimeoutReasonMaxRunDuration), not halo-sched's copy.
MAX_RUN_DURATION_DESC = "allocation exceeded max_run_duration"

JOB = "halo-test"


def stub(n: int, status: str = "running", stop: bool = False) -> dict:
    """A JobListStub as ``GET /v1/jobs?meta=true`` returns it."""
    return {"ID": JOB, "Status": status, "Stop": stop, "Version": 0, "Meta": {"halo_sched_nodes": str(n)},
            "JobSummary": {"Summary": {"trainer": {}}}}


def alloc(rank: int, status: str, create_index: int, *, desired: str = "run", exit_code: int | None = None,
          time: int | None = None, version: int = 0, **extra) -> dict:
    """An AllocListStub for node rank ``rank``."""
    group, index = "trainer", rank
    events = []
    if exit_code is not None:
        events.append({"Type": "Terminated", "ExitCode": exit_code, "Time": time or create_index * 10,
                       "DisplayMessage": f"Exit Code: {exit_code}"})
    return {"ID": f"a{rank}-{create_index}-0000", "Name": f"{JOB}.{group}[{index}]", "TaskGroup": group,
            "JobID": JOB, "JobVersion": version, "ClientStatus": status, "DesiredStatus": desired,
            "CreateIndex": create_index, "ModifyTime": (time or create_index * 10), "NodeName": f"host-{rank}",
            "NodeID": f"node-id-{rank}",
            "TaskStates": {"torchrun": {"State": "dead" if exit_code is not None else "running",
                                        "Failed": bool(exit_code), "Events": events}}, **extra}


def running(n: int) -> list[dict]:
    return [alloc(r, "running", 10 + r) for r in range(n)]


# ------------------------------------------------------------------------------------ per node rank


def test_allocation_names_give_node_ranks():
    allocs = running(4)
    state = job_state(stub(4), allocs, [], JOB)
    assert state.status is JobStatus.RUNNING and (state.nodes_running, state.nodes_total) == (4, 4)
    nodes = state.nomad.nodes
    assert [n["node_rank"] for n in nodes] == [0, 1, 2, 3]
    assert nodes[3]["alloc_name"] == f"{JOB}.trainer[3]" and nodes[3]["node"] == "host-3"
    assert nodes[3]["alloc_id"] == allocs[3]["ID"] and nodes[3]["client_status"] == "running"


def test_partial_counts_unplaced_ranks_and_says_why():
    # 8 nodes: ranks 0-4 placed; the blocked evaluation explains the 3 others.
    metric = {"NodesEvaluated": 5, "NodesFiltered": 5, "ConstraintFiltered": {"distinct_hosts": 5},
              "CoalescedFailures": 6}  # stale: the blocked eval keeps its first metrics
    evals = [{"ID": "e1", "Status": "blocked", "CreateIndex": 5, "FailedTGAllocs": {"trainer": metric}}]
    state = job_state(stub(8), running(5), evals, JOB)
    assert state.status is JobStatus.PARTIAL and (state.nodes_running, state.nodes_total) == (5, 8)
    assert state.nomad.blocked["trainer"].startswith("trainer: 3 of 8 unplaced (node ranks 5-7): 0/5 nodes eligible")
    assert "distinct_hosts: 5" in state.reason and state.reason.startswith("blocked: trainer: 3 of 8")
    assert [n["phase"] for n in state.nomad.nodes][5:] == ["unplaced"] * 3


def test_nothing_placed_is_pending_naming_the_group():
    m = {"NodesEvaluated": 1, "NodesExhausted": 1, "DimensionExhausted": {"devices: no devices match request": 1}}
    evals = [{"Status": "blocked", "FailedTGAllocs": {"trainer": {**m, "CoalescedFailures": 3}}}]
    state = job_state(stub(4, status="pending"), [], evals, JOB)
    assert state.status is JobStatus.PENDING and state.nodes_running == 0
    assert set(state.nomad.blocked) == {"trainer"}
    assert "trainer: 4 of 4 unplaced (node ranks 0-3): 0/1 nodes eligible" in state.reason


def test_only_the_latest_allocation_of_a_name_counts():
    # A stopped older allocation of rank 1 (e.g. from a re-registered version) is superseded.
    allocs = running(3) + [alloc(1, "complete", 5, desired="stop", exit_code=0, version=0)]
    allocs[1]["JobVersion"] = 1
    state = job_state(stub(3), allocs, [], JOB)
    assert state.status is JobStatus.RUNNING
    assert state.nomad.nodes[1]["alloc_id"] == allocs[1]["ID"]


# ------------------------------------------------------------------------------------ lost, dead, timeout


def test_lost_allocation_is_node_fail_naming_rank_and_node():
    allocs = running(3)
    allocs[2] = alloc(2, "lost", 12, ClientDescription="alloc is lost since its node is down")
    state = job_state(stub(3), allocs, [], JOB)
    assert state.status is JobStatus.NODE_FAIL
    assert "node rank 2" in state.reason and "host-2" in state.reason and "lost" in state.reason
    assert "node ranks 0-1 still running" in state.reason


def test_unknown_allocation_of_a_down_node_is_node_fail():
    # With disconnect { replace = false } Nomad marks a running allocation on a down node "unknown".
    allocs = running(2)
    allocs[1] = alloc(1, "unknown", 11, ClientDescription="alloc is unknown since its node is disconnected")
    assert job_state(stub(2), allocs, [], JOB).status is JobStatus.NODE_FAIL


def test_lost_rank_with_a_replacement_is_still_node_fail_not_partial():
    # A server that replaces lost allocations (no disconnect block, or older than 1.8): the
    # replacement keeps the name and starts; the world never re-forms around it.
    allocs = running(3)
    allocs[1] = alloc(1, "lost", 11, ClientDescription="alloc is lost since its node is down")
    allocs.append(alloc(1, "pending", 30))
    state = job_state(stub(3), allocs, [], JOB)
    assert state.status is JobStatus.NODE_FAIL
    assert "starting" not in state.reason and "replacement" in state.reason
    assert state.nomad.nodes[1]["client_status"] == "lost"


def test_failed_rank_keeps_its_exit_code_and_names_the_survivors():
    allocs = running(4)
    allocs[2] = alloc(2, "failed", 12, exit_code=3)
    state = job_state(stub(4), allocs, [], JOB)
    assert state.status is JobStatus.FAILED and state.exit_code == 3
    assert "node rank 2" in state.reason and "Exit Code: 3" in state.reason
    assert "node ranks 0-1, 3 still running" in state.reason
    assert [d["node_rank"] for d in state.nomad.dead] == [2]


def test_first_dead_rank_is_named_first():
    allocs = running(3)
    allocs[0] = alloc(0, "failed", 10, exit_code=1, time=500)
    allocs[2] = alloc(2, "failed", 12, exit_code=7, time=100)
    state = job_state(stub(3), allocs, [], JOB)
    assert state.reason.startswith("node rank 2 died first") and state.exit_code == 7


def test_timeout_only_from_the_exact_client_description():
    allocs = running(2)
    allocs[0] = alloc(0, "complete", 10, exit_code=137, ClientDescription=MAX_RUN_DURATION_DESC)
    assert job_state(stub(2), allocs, [], JOB).status is JobStatus.TIMEOUT
    # The words elsewhere (an image name, a task event, the desired description) are not a timeout.
    decoy = alloc(0, "complete", 10, exit_code=0, ClientDescription="All tasks have completed",
                  DesiredDescription="image registry/max_run_duration:latest")
    decoy["TaskStates"]["torchrun"]["Events"].append({"Type": "Killing", "DisplayMessage": MAX_RUN_DURATION_DESC})
    both = [decoy, alloc(1, "complete", 11, exit_code=0)]
    assert job_state(stub(2), both, [], JOB).status is JobStatus.COMPLETED
    failed_with_text = alloc(0, "failed", 10, exit_code=1, ClientDescription=MAX_RUN_DURATION_DESC)
    assert job_state(stub(2), [failed_with_text, running(2)[1]], [], JOB).status is JobStatus.FAILED


def test_timeout_wins_over_the_crash_it_causes():
    allocs = [alloc(0, "complete", 10, exit_code=137, time=100, ClientDescription=MAX_RUN_DURATION_DESC),
              alloc(1, "failed", 11, exit_code=1, time=200)]
    state = job_state(stub(2), allocs, [], JOB)
    assert state.status is JobStatus.TIMEOUT and state.reason.startswith("node rank 0 died first")


def test_stop_after_a_dead_rank_keeps_the_failure():
    # What the watcher does: rank 1 fails, then the job is stopped and rank 0 killed.
    allocs = [alloc(0, "complete", 10, desired="stop", exit_code=143, time=300), alloc(1, "failed", 11, exit_code=2, time=100)]
    allocs[0]["TaskStates"]["torchrun"]["Events"].insert(0, {"Type": "Killing", "Time": 250})
    state = job_state(stub(2, status="dead", stop=True), allocs, [], JOB)
    assert state.status is JobStatus.FAILED and state.exit_code == 2 and "then the job was stopped" in state.reason


def test_rank_crashing_because_of_a_stop_is_cancelled():
    allocs = [alloc(0, "complete", 10, desired="stop", exit_code=143, time=300), alloc(1, "failed", 11, exit_code=1, time=400)]
    allocs[0]["TaskStates"]["torchrun"]["Events"].insert(0, {"Type": "Killing", "Time": 250})
    state = job_state(stub(2, status="dead", stop=True), allocs, [], JOB)
    assert state.status is JobStatus.CANCELLED


def test_unknown_job_and_meta_only():
    assert job_state(None, [], [], JOB).status is JobStatus.UNKNOWN
    state = job_state(stub(4, status="pending"), [], [], JOB)
    assert state.status is JobStatus.PENDING and state.nodes_total == 4


_PHASES = ["unplaced", "pending", "running", "complete", "failed", "timeout", "lost"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PHASES), st.integers(1, 255)), min_size=1, max_size=6))
def test_precedence_property(phases):
    """TIMEOUT > NODE_FAIL > FAILED > COMPLETED/RUNNING > PARTIAL > PENDING; nodes_running is exact."""
    n = len(phases)
    allocs = []
    for rank, (phase, code) in enumerate(phases):
        if phase in ("pending", "running"):
            allocs.append(alloc(rank, phase, 10 + rank))
        elif phase == "complete":
            allocs.append(alloc(rank, "complete", 10 + rank, exit_code=0))
        elif phase == "failed":
            allocs.append(alloc(rank, "failed", 10 + rank, exit_code=code))
        elif phase == "timeout":
            allocs.append(alloc(rank, "complete", 10 + rank, ClientDescription=MAX_RUN_DURATION_DESC))
        elif phase == "lost":
            allocs.append(alloc(rank, "lost", 10 + rank))
    state = job_state(stub(n), allocs, [], JOB)
    names = [p for p, _ in phases]
    n_running = names.count("running")
    assert state.nodes_running == n_running and state.nodes_total == n
    if "timeout" in names:
        expected = JobStatus.TIMEOUT
    elif "lost" in names:
        expected = JobStatus.NODE_FAIL
    elif "failed" in names:
        expected = JobStatus.FAILED
        assert state.exit_code == phases[names.index("failed")][1]
    elif names.count("complete") == n:
        expected = JobStatus.COMPLETED
    elif n_running and n_running + names.count("complete") == n:
        expected = JobStatus.RUNNING
    elif n_running:
        expected = JobStatus.PARTIAL
    else:
        expected = JobStatus.PENDING
    assert state.status is expected


def test_ranks_text():
    assert ranks_text([7, 1, 2, 3, 5]) == "1-3, 5, 7" and ranks_text([]) == ""


# ------------------------------------------------------------------------------------ plan and versions


def test_plan_text_counts_unplaced_ranks():
    plan = {"Annotations": {"DesiredTGUpdates": {"server-vllm": {"Place": 1}, "trainer": {"Place": 8}}},
            "FailedTGAllocs": {"trainer": {"NodesEvaluated": 4, "NodesExhausted": 4, "CoalescedFailures": 2,
                                           "DimensionExhausted": {"devices: no devices match request": 4}}}}
    groups = plan_summary(plan)
    # The trainer first, then the server groups.
    assert [(g.group, g.can_place, g.unplaced) for g in groups] == [("trainer", False, 3), ("server-vllm", True, 0)]
    text = format_plan(plan, "ddp")
    assert "6/9 nodes can be placed now" in text
    assert "trainer: CANNOT place 3 of 8: 0/4 nodes eligible" in text and "no gang scheduling" in text


def test_version_warnings_name_the_feature_the_server_lacks():
    job = {"TaskGroups": [{"Name": "trainer", "MaxRunDuration": 10**9, "Disconnect": {"Replace": False}}]}
    assert parse_version("2.0.3-beta.1+ent") == (2, 0, 3) and parse_version("nope") is None
    assert version_warnings(job, "2.0.3") == []
    old = version_warnings(job, "2.0.2")
    assert len(old) == 1 and "max_run_duration" in old[0] and "2.0.3" in old[0] and "drops it" in old[0]
    older = version_warnings(job, "1.7.7")
    assert len(older) == 2 and any("disconnect" in w and "1.8" in w for w in older)
    assert version_warnings({"TaskGroups": [{"Name": "trainer"}]}, "1.0.0") == []
    unknown = version_warnings(job, None)
    assert len(unknown) == 1 and "could not read" in unknown[0]
