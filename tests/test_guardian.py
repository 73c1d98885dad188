"""A SLURM attempt's guardian (halo_sched/node/guardian.py), against stand-in ``scontrol`` and
``sbatch`` on PATH (the cluster tests are tests/test_lost_node_slurm.py): its script runs the node
runtime the attempt's own script carries and submits that script again, byte for byte; it acts on
a batch host gone from the job's node list and on NODE_FAIL only, once per failed attempt (the
batch script's marker holds); the client submits it with each first attempt, in the attempt's
partition and environment, and ``cancel`` takes it first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from halo_sched.node import guardian, successor
from helpers import REPO, scontrol_show_job

KEY = "k" * 64

SCONTROL = r'''#!/usr/bin/env python3
import os, re, sys
d = os.path.dirname(os.path.abspath(__file__))
a = sys.argv[1:]
def expand(text):
    m = re.fullmatch(r"([a-z]+)\[(\d+)-(\d+)\]", text)
    return [f"{m[1]}{i}" for i in range(int(m[2]), int(m[3]) + 1)] if m else [h for h in text.split(",") if h]
if a[:2] == ["show", "job"]:
    sys.stdout.write(open(os.path.join(d, "show_job")).read())
elif a[:2] == ["show", "hostnames"]:
    print("\n".join(expand(a[2])))
elif a[:3] == ["-o", "show", "node"]:
    for h in expand(a[3]):
        print(f"NodeName={h} Arch=x86_64 State={'DOWN+NOT_RESPONDING' if h in open(os.path.join(d, 'down')).read().split() else 'IDLE'} Partitions=debug")
else:
    sys.exit(2)
'''
SBATCH = r'''#!/bin/sh
d=$(dirname "$0")
n=$(($(cat "$d/n" 2> /dev/null || echo 0) + 1))
echo "$n" > "$d/n"
for last; do :; done
cp "$last" "$d/script.$n"
echo "$* | run=${HALO_RUN_ID:-} attempt=${HALO_RUN_ATTEMPT:-} excluded=${HALO_RUN_EXCLUDED:-}" >> "$d/calls"
echo $((100 + n))
'''


def _attempt_script() -> bytes:
    """A real batch script of a run (examples/ddp-cpu.yaml with retry:), node runtime and all."""
    import yaml

    from halo_sched.backends.slurm.render import render_sbatch
    from halo_sched.spec import from_dict

    data = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    data["retry"] = {"attempts": 3, "on": ["node"]}
    return render_sbatch(from_dict(data)).encode()


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """Stand-in scontrol (the attempt's record in SLURM's own layout, node states from the file
    ``down``) and sbatch (each call's argv and run variables logged, its script copied)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(SCONTROL)
    (bin_ / "sbatch").write_text(SBATCH)
    (bin_ / "down").write_text("")
    for f in ("scontrol", "sbatch"):
        (bin_ / f).chmod(0o755)
    out = tmp_path / "halo-job-7.out"
    out.write_text("")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("HALO_FAILURE_KEY", KEY)
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    return {"bin": bin_, "out": out, "dir": tmp_path}


def _ended(c, state: str, nodelist: str, batch: str = "node1", down: str = "") -> None:
    import re

    text = scontrol_show_job("7", str(c["out"]), nodelist=nodelist, state=state)
    (c["bin"] / "show_job").write_text(re.sub(r"BatchHost=\S+", f"BatchHost={batch}", text))
    (c["bin"] / "down").write_text(down)


def _calls(c) -> list[str]:
    p = c["bin"] / "calls"
    return p.read_text().splitlines() if p.exists() else []


ARGS = ["3", "node", "7", "0", "node9", "bad1"]  # ATTEMPTS ON RUN ATTEMPT EXCLUDED KEPT_OFF


def test_a_lost_batch_host_starts_one_next_attempt_from_the_guardians_own_script(slurm, tmp_path):
    """End to end: the guardian's script (under bash, as slurmd runs it) loads the runtime the
    attempt's script carries, finds the batch host gone from the node list, and submits that
    script byte for byte, keeping off the batch host, then the new attempt's own guardian."""
    attempt = _attempt_script()
    script = tmp_path / "guardian.sh"
    script.write_bytes(successor.guardian_script(attempt, "7", ARGS))
    _ended(slurm, "CANCELLED", "node2")
    env = {**os.environ, "PYTHONPATH": "", "PYTHONNOUSERSITE": "1"}
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "job 7 ended CANCELLED after its batch host node1 left the allocation" in r.stderr, r.stderr
    calls = _calls(slurm)
    assert len(calls) == 2, calls
    argv, _, run = calls[0].partition(" | ")
    # After the attempt, and after the guardian itself (job 9): it holds its CPU no longer than that.
    assert "--dependency=afterany:7:9" in argv.split() and "--comment=halo-run:7.1" in argv, argv
    assert "--exclude=bad1,node9,node1 " in argv and run == "run=7 attempt=1 excluded=node9,node1", calls[0]
    assert (slurm["bin"] / "script.1").read_bytes() == attempt  # the attempt's script, unchanged
    # The new attempt's guardian: pending on it, its file beside the job's, its script the same again.
    gargv = calls[1].partition(" | ")[0]
    for opt in ("--job-name=halo-guardian-101", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
                "--dependency=afternotok:101", "--kill-on-invalid-dep=yes", "--partition=debug",
                f"--output={tmp_path}/halo-guardian-101.log"):
        assert opt in gargv.split(), (opt, gargv)
    assert (slurm["bin"] / "script.2").read_bytes() == successor.guardian_script(
        attempt, "101", ["3", "node", "7", "1", "node9,node1", "bad1"])
    marker = successor.read_marker(successor.marker_path(str(tmp_path), "7", 1), KEY)
    assert marker["job"] == "101" and marker["guardian"] == "102" and marker["by"] == "its guardian", marker
    assert marker["culprit"] == "node1" and marker["excluded"] == ["node9", "node1"], marker


def test_node_fail_excludes_the_node_slurm_marked_down(slurm):
    _ended(slurm, "NODE_FAIL", "node1", down="node1")
    assert guardian.main(["7", str(slurm["out"]), *ARGS]) == 0
    argv = _calls(slurm)[0]
    assert "--exclude=bad1,node9,node1 " in argv, argv
    marker = successor.read_marker(successor.marker_path(str(slurm["dir"]), "7", 1), KEY)
    assert marker["why"] == "node fault: host node1, node left the allocation (SLURM marked it down)", marker


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "COMPLETED"])
def test_an_attempt_that_kept_its_batch_host_is_left_to_its_batch_script(slurm, capsys, state):
    """The batch script lived to its end: it decided (a job's fault, a successor of its own), or
    the job was cancelled by hand or ran out of time. Nothing is submitted."""
    _ended(slurm, state, "node[1-2]")
    assert guardian.main(["7", str(slurm["out"]), *ARGS]) == 0
    assert _calls(slurm) == []
    assert f"job 7 ended {state} with its batch host in place" in capsys.readouterr().err


def test_an_attempt_already_carried_on_is_not_carried_on_again(slurm, capsys):
    """The batch script submitted the successor and then lost its host: the marker holds."""
    path = successor.marker_path(str(slurm["dir"]), "7", 1)
    Path(path).write_text(successor._signed({"run": "7", "attempt": 1, "job": "55", "excluded": []}, KEY))
    _ended(slurm, "CANCELLED", "node2")
    assert guardian.main(["7", str(slurm["out"]), *ARGS]) == 0
    assert _calls(slurm) == [] and "attempt 2 of run 7 is already submitted as 55" in capsys.readouterr().err


@pytest.mark.parametrize("args, said", [(["3", "preflight", "7", "0", "", ""], "not retried: node fault"),
                                        (["2", "node", "7", "1", "", ""], "all 2 attempts used")])
def test_retry_on_and_the_attempts_still_decide(slurm, capsys, args, said):
    _ended(slurm, "CANCELLED", "node2")
    assert guardian.main(["7", str(slurm["out"]), *args]) == 0
    assert _calls(slurm) == [] and said in capsys.readouterr().err


def test_a_job_slurmctld_forgot_is_said_and_left(slurm, capsys):
    (slurm["bin"] / "show_job").write_text("")
    assert guardian.main(["7", str(slurm["out"]), *ARGS]) == 1
    assert _calls(slurm) == [] and "slurmctld no longer knows job 7" in capsys.readouterr().err


def test_the_script_takes_only_a_job_id_and_quotes_its_words():
    with pytest.raises(ValueError):
        successor.guardian_script(b"", "7; rm -rf /", ARGS)
    text = successor.guardian_script(b"#!/bin/bash\necho attempt\n", "7", ["3", "node", "7", "0", "", "a b"]).decode()
    assert "python3 - \"$halo_g\" 7 3 node 7 0 '' 'a b' <<'HALO_GUARDIAN_EOF'" in text
    head, _, rest = text.partition("\nexit $?\n")
    assert rest == "#!/bin/bash\necho attempt\n" and "#SBATCH" not in head
    tail = int(next(ln for ln in head.splitlines() if ln.startswith("tail -n +")).split()[2][1:])
    assert text.splitlines()[tail - 1:] == ["#!/bin/bash", "echo attempt"]


# ---- the client's side: the first attempt's guardian, and cancel ------------------------------


class Transport:
    name = "cli"

    def __init__(self):
        self.requests, self.cancelled, self.states = [], [], {}

    def submit(self, request):
        self.requests.append(request)
        return str(700 + len(self.requests) - 1)

    def query(self, ids):
        from halo_sched.backends.base import JobState, JobStatus

        return {i: JobState(i, self.states.get(i, JobStatus.PENDING)) for i in ids}

    def cancel(self, ids, signal=None):
        self.cancelled.append(list(ids))

    def job_info(self, job_id):
        return {}


def _spec(tmp_path, **changes):
    import yaml

    from halo_sched.spec import load

    data = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    data["trainer"]["script"] = str(REPO / "examples" / "train_ddp.py")
    data.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load(str(path))


def test_the_client_submits_each_first_attempt_with_its_guardian_and_records_it(tmp_path, monkeypatch):
    from halo_sched import records
    from halo_sched.backends.slurm import SlurmScheduler

    monkeypatch.chdir(tmp_path)
    t = Transport()
    job = SlurmScheduler(transport=t).submit(_spec(tmp_path, retry={"attempts": 3, "on": ["node"]},
                                                   slurm={"partition": "gpu", "qos": "high"}))
    assert job.id == "700" and len(t.requests) == 2
    attempt, guard = t.requests
    assert attempt.has("no-kill")
    args = guard.arguments()
    for opt in ("--job-name=halo-guardian-700", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=10",
                "--dependency=afternotok:700", "--kill-on-invalid-dep=yes", "--partition=gpu", "--qos=high",
                f"--output={tmp_path}/halo-guardian-700.log"):
        assert opt in args, (opt, args)
    assert guard.script.encode() == successor.guardian_script(attempt.script.encode(), "700",
                                                            ["3", "node", "700", "0", "", ""])
    assert guard.secret_names == attempt.secret_names
    assert records.find("700", "slurm")[0]["guardian"] == "701"


def test_a_job_without_retry_has_no_guardian(tmp_path, monkeypatch):
    from halo_sched.backends.slurm import SlurmScheduler

    monkeypatch.chdir(tmp_path)
    t = Transport()
    SlurmScheduler(transport=t).submit(_spec(tmp_path))
    assert len(t.requests) == 1 and not t.requests[0].has("no-kill")


def test_cancel_takes_the_attempts_guardian_first(tmp_path, monkeypatch):
    from halo_sched import records
    from halo_sched.backends.base import JobStatus
    from halo_sched.backends.slurm import SlurmScheduler

    records.write({"id": "700", "backend": "slurm", "submitted": 1.0, "guardian": "701",
                   "run": {"id": "700", "attempt": 0, "excluded": []}})
    t = Transport()
    t.states = {"700": JobStatus.RUNNING}
    t.cancel_once = lambda ids, **kw: t.cancelled.append(list(ids))
    SlurmScheduler(transport=t).cancel(["700"])
    assert t.cancelled == [["701"], ["700"]]
    t.cancelled, t.states = [], {"700": JobStatus.NODE_FAIL}  # ended, its guardian about to run: still taken
    SlurmScheduler(transport=t).cancel(["700"])
    assert t.cancelled == [["701"]]


@pytest.mark.parametrize("changes, no_kill, watch, guard", [
    ({"retry": {"attempts": 2}}, True, True, "halo_guard_end 1"),
    ({"retry": {"attempts": 2}, "nodes": 1}, True, False, "halo_guard_end 1"),  # lost alone: NODE_FAIL
    ({"slurm": {"spare_nodes": 1, "exclusive": True}}, True, True, "halo_guard_end 0"),  # no run: no guardian
    ({"retry": {"attempts": 2}, "slurm": {"extra_args": ["--no-kill=off"]}}, False, False, "halo_guard_end 1"),
    ({}, False, False, None),
])
def test_which_jobs_keep_their_allocation_and_watch_their_batch_host(tmp_path, changes, no_kill, watch, guard):
    from halo_sched.backends.slurm.render import render_sbatch

    text = render_sbatch(_spec(tmp_path, **changes))
    assert ("#SBATCH --no-kill\n" in text) is no_kill
    assert ("\nhalo_watch_batch_host 10  #" in text) is watch
    assert (guard is not None and f"\n{guard}  #" in text) or (guard is None and "\nhalo_guard_end" not in text)


def test_a_submit_directory_with_spaces_and_quotes_still_gets_its_guardian(tmp_path, monkeypatch):
    """The guardian's output file is beside the job's, in a directory sbatch's words cannot hold
    unquoted; typed as the job's own --output is, it goes as it is (a string of --name=value
    made the submit an internal error after the job itself was queued)."""
    from halo_sched.backends.slurm import SlurmScheduler

    work = tmp_path / "it's \"q\" A=b x"
    work.mkdir()
    monkeypatch.chdir(work)
    t = Transport()
    SlurmScheduler(transport=t).submit(_spec(work, retry={"attempts": 2}))
    assert len(t.requests) == 2 and f"--output={work}/halo-guardian-700.log" in t.requests[1].arguments()


@pytest.mark.parametrize("version, key, value", [("v0.0.38", "no_kill", "set"),
                                                 ("v0.0.41", "kill_on_node_fail", False)])
def test_slurmrestd_is_told_no_kill_in_words_it_takes(version, key, value):
    """22.05's slurmrestd refuses the boolean its own openapi.json documents for no_kill
    ("Invalid no kill specification": slurm_opt.c arg_set_data_no_kill takes "set"/"off"/"no"):
    every run with retry: (and hot spares) failed to submit through it (seen on the test cluster)."""
    from halo_sched.backends.slurm.request import SbatchRequest
    from halo_sched.backends.slurm.transport import rest_job_properties
    from halo_sched.sbatch_options import Setting

    job = rest_job_properties(SbatchRequest(options=(Setting("nodes", 2), Setting("no-kill"))), environment={},
                              cwd="/w", api_version=version)
    assert job[key] == value, job
