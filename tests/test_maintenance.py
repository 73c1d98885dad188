"""Planned maintenance without the queue (issue 39 item 3), without a cluster: what Slurm 22.05's
scontrol prints for a drained node and a MAINT reservation (recorded on the test cluster:
tests/fixtures/slurm/22.05/maintenance/), read by halo_sched/node/maintenance.py; the planned swap
restart.py makes (a signed swap line marked planned, the node released from the job, a spare
left); what the submitter makes of it (never ledgered, the swap's cost); the successor, which
neither blames nor keeps off a node that left for maintenance. The run on the cluster, with real
torchrun, is tests/test_maintenance_slurm.py."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from halo_sched.node import maintenance, restart, successor
from halo_sched.node.failure_collector import record_line
from halo_sched.node.spares import swap_line
from helpers import REPO, cli, write_tool

KEY = "k" * 64
FIXTURES = REPO / "tests" / "fixtures" / "slurm" / "22.05" / "maintenance"
#: The 3 nodes of the recording; node2 drained (Reason=maint), reservation "maint" on node3.
HOSTS = {"node1": ["node1"], "node2": ["node2"], "node3": ["node3"], "node[1-3]": ["node1", "node2", "node3"],
         "node[1,3]": ["node1", "node3"], "node[2-3]": ["node2", "node3"]}


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _expand(expr: str) -> list[str]:
    return HOSTS[expr]


# ---- what 22.05 prints, read ----------------------------------------------------------------


def test_a_drained_node_is_read_from_22_05_s_show_node_whatever_its_base_state():
    nodes = maintenance.records(_text("show_node.out"), "NodeName")
    assert [n["NodeName"] for n in nodes] == ["node1", "node2", "node3"]
    states = {n["NodeName"]: n["State"] for n in nodes}
    assert states["node2"] == "ALLOCATED+DRAIN", states  # a job on it: sinfo's "draining"
    assert maintenance.drained(nodes) == {"node2": "drained: maint"}
    # Once released from the job (node/restart.py planned): IDLE+DRAIN, sinfo's "drained".
    idle = maintenance.records(_text("show_node_released.out"), "NodeName")
    assert {n["NodeName"]: n["State"] for n in idle}["node2"] == "IDLE+DRAIN"
    assert maintenance.drained(idle) == {"node2": "drained: maint"}
    # Flags that are no drain (a not-responding node, a reservation's own) are not maintenance.
    assert maintenance.drained([{"NodeName": "n9", "State": "IDLE+RESERVED"},
                                {"NodeName": "n8", "State": "DOWN+NOT_RESPONDING"},
                                {"NodeName": "n7", "State": "DRAINED"}]) == {}


def test_a_maint_reservation_that_begins_before_the_job_ends_is_read_from_22_05_s_output():
    resvs = maintenance.records(_text("show_reservation.out"), "ReservationName")
    by_name = {r["ReservationName"]: r for r in resvs}
    assert by_name["maint"]["Flags"].split(",")[0] == "MAINT" and by_name["maint"]["Nodes"] == "node3", by_name
    assert "MAINT" not in by_name["other"]["Flags"].split(","), by_name["other"]
    start = maintenance.when(by_name["maint"]["StartTime"])
    from halo_sched.node.spares import show_job_records

    job = show_job_records(_text("show_job.out"))[0]
    end = maintenance.when(job["EndTime"])
    assert start is not None and end is not None and start < end, (by_name["maint"]["StartTime"], job["EndTime"])
    now = start - 60
    assert maintenance.reserved(resvs, end, now, _expand) == {"node3": f"maintenance reservation maint from "
                                                                       f"{by_name['maint']['StartTime']}"}
    # The job ends before it begins, or it is over: not the job's business; no end known: it is.
    assert maintenance.reserved(resvs, start - 1, now, _expand) == {}
    assert maintenance.reserved(resvs, end, maintenance.when(by_name["maint"]["EndTime"]) + 1, _expand) == {}
    assert set(maintenance.reserved(resvs, None, now, _expand)) == {"node3"}
    assert maintenance.records(_text("show_reservation_none.out"), "ReservationName") == []
    assert maintenance.when("Unknown") is None and maintenance.when("None") is None


def test_each_leaving_host_of_the_step_gets_a_free_spare_never_a_used_or_leaving_one():
    ranks, alloc = ["n1", "n2"], ["n1", "n2", "n3", "n4", "n5"]
    assert maintenance.leaving(ranks, alloc, [], {}) == []
    assert maintenance.leaving(ranks, alloc, ["n3"], {"n2": "drained: maint"}) == [("n2", "n4", "drained: maint")]
    # A drained spare is no spare; a host off the rank map leaving is none of the step's business.
    assert maintenance.leaving(ranks, alloc, ["n3"], {"n4": "drained: x", "n2": "drained: y"}) == [("n2", "n5", "drained: y")]
    assert maintenance.leaving(ranks, alloc, [], {"n5": "drained"}) == []
    # Two at once, one spare: the first gets it, the second none ("" : it runs on).
    assert maintenance.leaving(ranks, ["n1", "n2", "n3"], [], {"n1": "a", "n2": "b"}) == [("n1", "n3", "a"), ("n2", "", "b")]
    # A reason is one bounded line of text.
    got = maintenance.leaving(ranks, alloc, [], {"n1": "drained: \x1b[31mred\nline " + "x" * 500})
    assert "\n" not in got[0][2] and "\x1b" not in got[0][2] and len(got[0][2]) <= 200, got


# ---- the watcher against a stand-in scontrol ------------------------------------------------

SCONTROL = r'''#!{python}
import json, os, sys
d = os.path.dirname(os.path.abspath(__file__))
a = sys.argv[1:]
with open(os.path.join(d, "calls"), "a") as f:
    f.write(" ".join(a) + " | " + os.environ.get("SLURM_TIME_FORMAT", "") + "\n")
files = json.load(open(os.path.join(d, "answers.json")))
key = " ".join(a)
if a[:2] == ["show", "hostnames"]:
    print("\n".join(json.load(open(os.path.join(d, "hosts.json")))[a[2]]))
elif a[:1] == ["update"]:
    sys.exit(int(os.environ.get("FAKE_UPDATE_RC", "0")))
elif key in files:
    sys.stdout.write(open(files[key]).read())
else:
    sys.exit("fake scontrol: unsupported " + key)
'''


def _scontrol(tmp_path, monkeypatch, answers: dict[str, str]) -> Path:
    """A stand-in scontrol on PATH that answers each argv (joined) with a fixture file; its calls
    logged to bin/calls. The watcher's loop is bounded: its parent seems gone after a few looks
    (it then ends, exit 1, as it does when the batch script's watcher is killed)."""
    looks = iter(range(12))
    monkeypatch.setattr(maintenance.os, "getppid", lambda: 1 if next(looks, None) is not None else -1)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    write_tool(bindir, "scontrol", SCONTROL)
    (bindir / "answers.json").write_text(json.dumps(answers))
    (bindir / "hosts.json").write_text(json.dumps(HOSTS))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return bindir


def _show_job(tmp_path, nodelist="node[1-3]", out=None) -> str:
    """The recorded ``scontrol show job``, with this test's node list and output file."""
    import re

    text = _text("show_job.out")
    text = re.sub(r"(?m)^(   NodeList=)\S+$", rf"\g<1>{nodelist}", text)
    if out is not None:
        text = re.sub(r"(?m)^(   StdOut=).*$", lambda m: m.group(1) + str(out), text)
    p = tmp_path / f"show_job.{nodelist}"
    p.write_text(text)
    return str(p)


def _job_id() -> str:
    return _text("show_job.out").split()[0].partition("=")[2]


def test_the_watcher_asks_three_things_in_standard_time_and_names_the_drained_host_and_its_spare(tmp_path, monkeypatch,
                                                                                                capsys):
    job = _job_id()
    bindir = _scontrol(tmp_path, monkeypatch, {
        f"show job {job}": _show_job(tmp_path),
        "-o show node node1,node2,node3": str(FIXTURES / "show_node.out"),
        "-o show reservation": str(FIXTURES / "show_reservation_none.out")})
    assert maintenance.main(["--job", job, "--ranks", "node1,node2", "--every", "0.5"]) == 0
    assert capsys.readouterr().out == "node2 node3 drained: maint\n"
    calls = (bindir / "calls").read_text().splitlines()
    assert [c.partition(" | ")[0] for c in calls] == [f"show job {job}", "show hostnames node[1-3]",
                                                     "-o show node node1,node2,node3", "-o show reservation"]
    assert all(c.endswith(" | standard") for c in calls), calls


def test_with_no_spare_left_the_watcher_says_so_and_sends_no_warning(tmp_path, monkeypatch, capsys):
    job = _job_id()
    _scontrol(tmp_path, monkeypatch, {
        f"show job {job}": _show_job(tmp_path),
        "-o show node node1,node2,node3": str(FIXTURES / "show_node.out"),
        "-o show reservation": str(FIXTURES / "show_reservation.out")})
    # node3, the one spare, is used already (a fault's swap before).
    assert maintenance.main(["--job", job, "--ranks", "node1,node2", "--used", "node3", "--every", "0.5"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "node2 (drained: maint) to leave for maintenance, and no spare left: the job runs on" in err, err


def test_a_maintenance_reservation_on_the_spare_leaves_no_spare(tmp_path, monkeypatch, capsys):
    """The recorded reservation covers node3, the spare, and begins before the job ends: node2's
    drain finds no usable spare."""
    job = _job_id()
    _scontrol(tmp_path, monkeypatch, {
        f"show job {job}": _show_job(tmp_path),
        "-o show node node1,node2,node3": str(FIXTURES / "show_node.out"),
        "-o show reservation": str(FIXTURES / "show_reservation.out")})
    # The recording's clock: a minute before the reservation begins (it is over by now).
    start = maintenance.when(re.search(r"StartTime=(\S+)", _text("show_reservation.out"))[1])
    monkeypatch.setattr(maintenance.time, "time", lambda: start - 60)
    assert maintenance.main(["--job", job, "--ranks", "node1,node2", "--every", "0.5"]) == 1
    assert "no spare left" in capsys.readouterr().err


# ---- the planned swap (restart.py --planned) ------------------------------------------------


def _planned(tmp_path, monkeypatch, capsys, lines: str, ranks="node1,node2", left="", update_rc="0"):
    job = _job_id()
    out = tmp_path / f"halo-job-{job}.out"
    out.write_text("")
    bindir = _scontrol(tmp_path, monkeypatch, {
        f"show job {job}": _show_job(tmp_path, out=out),
        **{f"-o show node {h}": str(FIXTURES / "show_node.out") for h in ("node1", "node2", "node3")}})
    monkeypatch.setenv("FAKE_UPDATE_RC", update_rc)
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    plan = tmp_path / "maint"
    plan.write_text(lines)
    warned = time.time() - 5
    os.utime(plan, (warned, warned))
    rc = restart.main(["--job", job, "--planned", str(plan), "--ranks", ranks, "--left", left, "--master", "10.0.0.1",
                       "--spares", "1", "--restart", "1", "--from", "0"])
    got = capsys.readouterr()
    calls = [c.partition(" | ")[0] for c in (bindir / "calls").read_text().splitlines()]
    return rc, got.out.split(), got.err, calls, out, warned


def test_the_planned_swap_gives_the_rank_to_the_spare_signs_a_planned_line_and_releases_the_node(tmp_path, monkeypatch,
                                                                                               capsys):
    from halo_sched.backends.slurm.spares import parse_swap, swaps_of

    rc, words, err, calls, out, warned = _planned(tmp_path, monkeypatch, capsys, "node2 node3 drained: maint\n")
    assert rc == 0 and words == ["planned", "node1,node3", "10.0.0.1", "0", "node2"], (words, err)
    job = _job_id()
    assert f"update JobId={job} NodeList=node1,node3" in calls, calls
    assert "node rank 1: node2 leaves for maintenance (drained: maint); node3 takes its rank, restart 1, 0 spares left" in err
    assert "node2 released from the job: its maintenance can begin" in err, err
    (swap,) = swaps_of([out], KEY, ended=False)  # the side file, signed
    assert (swap["rank"], swap["bad"], swap["spare"], swap["reason"], swap["planned"]) == (
        1, "node2", "node3", "drained: maint", True), swap
    assert swap["warned"] == pytest.approx(warned, abs=0.01) and swap["spares_left"] == 0
    # A fault's swap line says nothing of the kind; an unsigned "planned" counts for nothing.
    fault = parse_swap(swap_line({"job": job, "rank": 1, "bad": "node2", "spare": "node3", "reason": "x", "by": "xid",
                                  "time": 1.0, "spares_left": 0, "warned": 2.0}, KEY), KEY)
    assert fault["planned"] is False and fault["warned"] is None


def test_the_batch_host_s_rank_moves_but_the_host_stays_and_no_spare_keeps_the_ranks(tmp_path, monkeypatch, capsys):
    rc, words, err, calls, _, _ = _planned(tmp_path, monkeypatch, capsys, "node1 node3 drained: maint\n")
    assert rc == 0 and words[:2] == ["planned", "node3,node2"] and words[-1] == "node1", (words, err)
    assert not any(c.startswith("update") for c in calls) and "node1 runs the batch script" in err, (calls, err)
    # The spare gone meanwhile (used by a fault's swap): the ranks start again where they were.
    (tmp_path / "b").mkdir()
    rc, words, err, calls, _, _ = _planned(tmp_path / "b", monkeypatch, capsys, "node2 node3 drained: maint\n",
                                           left="node3")
    assert rc == 0 and words[:2] == ["planned", "node1,node2"] and words[-1] == "node3", (words, err)
    assert "node2 is to leave for maintenance (drained: maint) and no spare is left: it keeps its rank" in err


def test_a_refused_release_keeps_the_node_idle_in_the_job_and_the_swap_stands(tmp_path, monkeypatch, capsys):
    rc, words, err, _, _, _ = _planned(tmp_path, monkeypatch, capsys, "node2 node3 drained: maint\n", update_rc="1")
    assert rc == 0 and words[:2] == ["planned", "node1,node3"], (words, err)
    assert "node2 kept in the job, idle (scontrol update NodeList= failed" in err, err


# ---- the submitter's side: never ledgered, what it cost, what status says -------------------


def _swap(**kw) -> dict:
    base = {"rank": 1, "bad": "node2", "spare": "node3", "reason": "drained: maint", "by": "maintenance",
            "time": 1000.0, "spares_left": 0, "planned": True, "warned": 995.0}
    return {**base, **kw}


def test_a_planned_swap_is_never_ledgered_a_fault_s_is(tmp_path, monkeypatch):
    from halo_sched import ledger

    got = ledger.observe_swaps("7", "slurm", [_swap(), _swap(bad="node1", planned=False, reason="GPU Xid error")])
    assert [e.host for e in got] == ["node1"]
    assert [e.host for e in ledger.active()] == ["node1"]


def test_each_swap_s_cost_runs_from_its_warning_to_every_node_rank_training_again(tmp_path):
    from halo_sched.jobstate import _describe_spares as describe
    from halo_sched.backends.slurm.spares import spares_state, with_costs
    from halo_sched.core import _progress_firsts

    # The hang monitors' copies beside the output file (backends/slurm/progress.py), one per node rank.
    rec = {"id": "7", "backend": "slurm", "nodes": 2, "outputs": [str(tmp_path / "halo-job-7.out")]}
    root = tmp_path / ".halo-progress" / "7"
    for node, times in ((0, [990.0, 1003.5, 1004.5, 1011.0]), (1, [991.0, 1006.0, 1007.0, 1012.5])):
        d = root / f"node-{node}" / "progress"
        d.mkdir(parents=True)
        (d / f"rank-{node}").write_text("".join(f"{i} {t}\n" for i, t in enumerate(times)))
    planned, fault = with_costs([_swap(), _swap(time=1010.0, warned=None, planned=False, bad="node1",
                                                reason="GPU Xid error")], _progress_firsts(rec))
    assert planned["cost_s"] == pytest.approx(11.0)  # node rank 1 trains again last, 11 s after the warning
    assert fault["cost_s"] == pytest.approx(2.5)  # a fault's: from its swap (1010) to 1012.5
    no_reports = _progress_firsts({**rec, "outputs": [str(tmp_path / "elsewhere" / "x.out")]})
    assert with_costs([_swap()], no_reports)[0]["cost_s"] is None  # no progress reports: not known
    # A node rank that never reports (here node rank 2 of 3): when every one trains again is not known.
    assert with_costs([_swap()], _progress_firsts({**rec, "nodes": 3}))[0]["cost_s"] is None
    text = describe(spares_state(2, [planned, fault]))
    assert text == ("0 of 2 spares left (node2 -> node3: maintenance (drained: maint), training again 11 s after the "
                    "warning, node1 -> node3: GPU Xid error, training again 2.5 s after the swap)"), text


# ---- the successor: a node that left for maintenance is no culprit --------------------------


def _line(host: str, node: int, at: float) -> str:
    xid = ["kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."]
    body = {"node": node, "rank": node, "local_rank": 0, "host": host, "exit_code": 1, "signal": None, "time": at,
            "error": "NCCL error", "tail": [], "stopped": False, "node_name": host, "evidence": xid}
    return f"{node}: " + record_line(body, KEY, [])


def test_the_successor_neither_blames_nor_keeps_off_a_node_released_for_maintenance(tmp_path, monkeypatch):
    """node2 left for maintenance (released: the job's NodeList is node[1,3]); node3, its spare,
    failed later with a node's fault. The culprit is node3; node2 is not kept off the next attempt
    (without LEFT it was taken for a node that left the allocation, and blamed)."""
    job = _job_id()
    out = tmp_path / f"halo-job-{job}.out"
    out.write_text(_line("node3", 1, 2000.0))
    bindir = _scontrol(tmp_path, monkeypatch, {f"show job {job}": _show_job(tmp_path, "node[1,3]", out)})
    write_tool(bindir, "sbatch", '#!/bin/sh\necho "$*" >> "$(dirname "$0")/sbatch.calls"\necho 900\n')
    write_tool(bindir, "squeue", "#!/bin/sh\n")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=3\n")
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    assert successor.main(["1", job, str(script), "3", "node", job, "0", "", "", "node1,node3", "1999", "", "node2"]) == 0
    calls = (bindir / "sbatch.calls").read_text().splitlines()
    assert "--exclude=node3 " in calls[0], calls
    assert successor.read_marker(successor.marker_path(str(tmp_path), job, 1), KEY)["culprit"] == "node3"


# ---- the batch script ------------------------------------------------------------------------


def test_only_a_job_with_spares_watches_for_maintenance_and_the_poll_is_30_s(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "m", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"},
                                "slurm": {"spare_nodes": 1, "exclusive": True}, "retry": {"attempts": 2}}))
    text = cli("render", str(path), "--backend", "slurm", cwd=tmp_path).stdout
    assert 'halo_maint_watch 30 "$halo_ranks" "$halo_swapped,$halo_left"' in text
    assert "--planned \"$halo_planned\"" in text and '"$halo_swapped" "$halo_left" ||' in text
    plain = cli("render", str(REPO / "examples" / "ddp-cpu.yaml"), "--backend", "slurm").stdout
    retry_only = json.loads(path.read_text())
    del retry_only["slurm"]
    path.write_text(json.dumps(retry_only))
    assert "halo_maint_watch" not in plain
    assert "halo_maint_watch" not in cli("render", str(path), "--backend", "slurm", cwd=tmp_path).stdout
