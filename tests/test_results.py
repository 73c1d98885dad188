"""Results as values (issue 41, item 3): rank 0 writes a small JSON value to ``$HALO_RESULT_FILE``
(halo_sched/node/result.py), which every backend sets on its nodes where the submitter can read
it back; ``Run.result().value``, ``status --json``, ``status``'s line and ``export`` carry it.
The value is hostile: bounded, parsed as strict JSON only, escaped where shown. Local end to end
with a stand-in torchrun (no torch); SLURM's batch script run with stand-in srun; Nomad's through
the fake API and its client simulator."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import halo_sched
from halo_sched import records
from halo_sched.backends.base import Job, JobState, JobStatus, Scheduler
from halo_sched.node import result
from halo_sched.outcome import NO_RESULT, attach_value

from helpers import REPO, free_port, nomad_sim_job, run_sbatch

# torchrun's stand-in: each local rank runs the script with RANK, LOCAL_RANK and WORLD_SIZE set,
# as torchrun would (no torch here); the exit is the worst rank's.
STAND_IN = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("--"):
    k, _, v = args.pop(0)[2:].partition("=")
    opts[k] = v
nproc, nnodes, node = int(opts.get("nproc_per_node", 1)), int(opts.get("nnodes", 1)), int(opts.get("node_rank", 0))
procs = [subprocess.Popen([sys.executable, *args], env={{**os.environ, "RANK": str(node * nproc + i),
         "LOCAL_RANK": str(i), "WORLD_SIZE": str(nnodes * nproc)}}) for i in range(nproc)]
sys.exit(max(p.wait() for p in procs))
"""

# Rank 0's value: text a terminal would act on, a lone surrogate's escape, nesting, numbers.
VALUE = {"loss": 0.25, "title": "\x1b]0;owned\x07\x1b[2J", "rows": [[1, 2], {"k": None}], "ok": True}

# One write per line: two ranks share their node's stdout and stderr.
TRAIN = """import os
from halo_sched.node import result
rank = os.environ["RANK"]
os.write(1, f"out {rank}\\n".encode())
os.write(2, f"err {rank}\\n".encode())
assert result.write(%r) is (rank == "0")
"""


def stand_in(tmp_path) -> str:
    """A setup line that puts the stand-in torchrun first on PATH (the supervisor puts the
    submitting Python's directory, and its real torchrun, first otherwise)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text(STAND_IN.format(python=sys.executable))
    (bindir / "torchrun").chmod(0o755)
    return f'export PATH="{bindir}:$PATH"'


def local_job(tmp_path, script: str, name: str = "res", **fields) -> dict:
    (tmp_path / "train.py").write_text(script)
    return {"name": name, "nodes": 2, "nproc_per_node": 2, "setup": [stand_in(tmp_path)],
            "trainer": {"script": str(tmp_path / "train.py")}, "rendezvous": {"port": free_port()}, **fields}


def cli(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=cwd, capture_output=True,
                          timeout=timeout)


# ---- the node side: writing one, and reading what a job left -----------------------------------


def test_write_is_rank_0s_atomic_and_bounded(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "result.json"
    monkeypatch.setenv("HALO_RESULT_FILE", str(path))
    monkeypatch.setenv("RANK", "1")
    assert result.write({"a": 1}) is False and not path.exists()  # only rank 0 writes
    monkeypatch.setenv("RANK", "0")
    assert result.write({"a": 1}) is True and result.write({"a": 2}) is True  # the last one wins
    assert result.parse(result.read_bounded(path)) == {"a": 2} and os.listdir(path.parent) == ["result.json"]
    big = "x" * result.MAX_BYTES
    for bad, words in [({"x": big}, f"more than the {result.MAX_BYTES} a result may take"),
                       (float("nan"), "not finite"), ({"x": object()}, "is not JSON"),
                       (_nested(result.MAX_DEPTH + 1), f"deeper than {result.MAX_DEPTH} levels")]:
        with pytest.raises(result.ResultError, match=words):
            result.write(bad)  # on every rank: the mistake shows where it is made
    assert result.parse(result.read_bounded(path)) == {"a": 2}  # a refused value leaves the last one
    monkeypatch.delenv("HALO_RESULT_FILE")
    assert result.write({"a": 3}) is False  # outside halo-sched: nothing, no error


def _nested(n: int):
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize("data, words", [
    (b"x" * (result.MAX_BYTES + 1), f"more than {result.MAX_BYTES} bytes"),
    (b"\xff\xfe", "not UTF-8"),
    (b"{'a': 1}", "not JSON"),
    (b"NaN", "not JSON"),
    (b"[1e999]", "not finite"),
    (b"9" * 5000, "not JSON"),  # more digits than Python turns into an int
    (b"[" * 60000, "deeper than"),
    (json.dumps(_nested(result.MAX_DEPTH + 1)).encode(), "deeper than"),
], ids=["too-large", "not-utf8", "python-literal", "nan", "infinity", "huge-int", "deep-60000", "deep-33"])
def test_a_hostile_result_file_is_refused_naming_what_is_wrong(data, words):
    with pytest.raises(result.ResultError, match=words):
        result.parse(data)


def test_reading_is_bounded_and_never_follows_or_waits(tmp_path):
    assert result.read_bounded(tmp_path / "none") is None
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:  # sparse: 1 GiB that takes no disk; read: MAX + 1 bytes
        f.truncate(1 << 30)
    assert len(result.read_bounded(huge)) == result.MAX_BYTES + 1
    (tmp_path / "link").symlink_to(huge)
    with pytest.raises(result.ResultError, match="cannot be read"):
        result.read_bounded(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")  # a FIFO a job put there: no writer, and no wait for one
    t0 = time.monotonic()
    with pytest.raises(result.ResultError, match="not a regular file"):
        result.read_bounded(tmp_path / "fifo")
    assert time.monotonic() - t0 < 10
    assert result.parse(json.dumps("\ud800").encode()) == "\ufffd"  # a lone surrogate's escape


# ---- kept in the record once, for an end that stays -----------------------------------------------


class Files(Scheduler):
    """A scheduler whose jobs have ended and whose result files hold ``data`` (bytes, None, or an
    exception to raise), counting the reads."""

    name = "slurm"

    def __init__(self, data):
        self.data, self.reads = data, 0

    def read_result(self, job_id, record=None):
        self.reads += 1
        if isinstance(self.data, BaseException):
            raise self.data
        return self.data

    def query(self, ids):  # pragma: no cover - not asked
        return {}

    render = schedule = cancel = logs = query


def _record(job_id: str) -> None:
    records.write({"id": job_id, "backend": "slurm", "name": "r", "submitted": time.time(), "spec": {"slurm": {}}})


def test_a_result_is_kept_for_an_end_that_stays_and_read_once():
    _record("9")
    sched = Files(b'{"loss": 1}')
    requeued = attach_value(sched, "9", JobState("9", JobStatus.PREEMPTED), keep=True)
    assert requeued.value == {"loss": 1} and "result" not in records.find("9", "slurm")[0]  # it may run again
    done = attach_value(sched, "9", JobState("9", JobStatus.COMPLETED), keep=True)
    assert done.value == {"loss": 1} and done.value_note == "" and sched.reads == 2
    sched.data = b'{"loss": 2}'  # the files change (or go): the record's, read at the end, stands
    again = attach_value(sched, "9", JobState("9", JobStatus.COMPLETED))
    assert again.value == {"loss": 1} and sched.reads == 2
    assert records.find("9", "slurm")[0]["result"]["for"] == "COMPLETED"
    running = attach_value(sched, "9", JobState("9", JobStatus.RUNNING))
    assert running.value is None and running.value_note is None and sched.reads == 2


def test_no_result_a_bad_one_and_one_not_readable_now_each_say_so():
    _record("10")
    none = attach_value(Files(None), "10", JobState("10", JobStatus.COMPLETED))
    assert none.value is None and none.value_note == NO_RESULT
    bad = attach_value(Files(b"{"), "10", JobState("10", JobStatus.FAILED))
    assert bad.value is None and bad.value_note.startswith("the result file is not JSON")
    down = Files(halo_sched.SchedulerError("no route to the client"))
    later = attach_value(down, "10", JobState("10", JobStatus.COMPLETED), keep=True)
    assert later.value_note == "not read: no route to the client" and "result" not in records.find("10", "slurm")[0]
    class Carries(Files):  # a backend of its own that does not carry one: Scheduler's default
        read_result = Scheduler.read_result

    kept = attach_value(Carries(None), "10", JobState("10", JobStatus.COMPLETED), keep=True)
    assert kept.value is None and kept.value_note.startswith("not carried: the slurm backend does not carry")
    assert records.find("10", "slurm")[0]["result"]["note"] == kept.value_note  # said for good


# ---- local, end to end ---------------------------------------------------------------------------


def test_local_rank_0s_value_comes_back_from_result_status_export_and_list(tmp_path, monkeypatch):
    """Also the logs filters (item 4) on the same job: each stream apart, a regex, since."""
    monkeypatch.chdir(tmp_path)
    run = halo_sched.submit(local_job(tmp_path, TRAIN % (VALUE,)), "local")
    state = run.result(timeout=120)
    assert state.value == VALUE and state.value_note == "", (state, list(run.logs()))
    assert halo_sched.job(run.id).result().value == VALUE
    # status --json carries it; status's line shows it bounded and escaped (no byte a terminal acts on).
    r = cli("status", run.id, "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["value"] == VALUE, r.stderr
    r = cli("status", run.id, cwd=tmp_path)
    line = r.stdout.decode().splitlines()[1]
    assert line.startswith(f"{run.id}\tvalue: {{") and "\\u001b]0;owned" in line and b"\x1b" not in r.stdout, r.stdout
    # export and list carry it from the record, and so do halo_sched.list() and describe().
    jobs = [json.loads(x) for x in cli("export", cwd=tmp_path).stdout.splitlines() if b'"kind": "job"' in x]
    assert jobs[0]["result"]["value"] == VALUE and jobs[0]["result"]["for"] == "COMPLETED"
    listed = json.loads(cli("list", "--json", cwd=tmp_path).stdout.splitlines()[0])
    assert listed["value"] == VALUE and halo_sched.list()[0].value == VALUE
    assert halo_sched.describe(run.id)["result"]["value"] == VALUE
    # The logs, filtered as the CLI filters them.
    errs = [x.text for x in run.logs(stream="stderr") if x.text.startswith("err")]
    assert sorted(errs) == ["err 0", "err 1", "err 2", "err 3"]
    assert not [x for x in run.logs(stream="stderr") if x.text.startswith("out")]
    assert all(x.stream == "stdout" for x in run.logs(stream="stdout"))
    assert sorted(x.text for x in run.logs(grep=r"^(out|err) [13]$")) == ["err 1", "err 3", "out 1", "out 3"]
    assert list(run.logs(since=time.time() + 3600)) == [] and len(list(run.logs(since="1h"))) == len(list(run.logs()))
    r = cli("logs", run.id, "--stream", "stderr", "--grep", "^err [02]$", "--since", "10m", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.decode() == "".join(run.logs(stream="stderr", grep="^err [02]$",
                                                                       since="10m")), r.stderr
    assert sorted(r.stdout.decode().splitlines()) == ["[node 0] err 0", "[node 1] err 2"]


def test_local_without_a_result_says_nothing_and_a_value_too_large_is_refused_on_the_node(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    too_big = "from halo_sched.node import result\nresult.write('x' * %d)\n" % result.MAX_BYTES
    failed = halo_sched.submit(local_job(tmp_path, too_big, name="big", nodes=1, nproc_per_node=1), "local")
    err = failed.exception(timeout=120)
    assert isinstance(err, halo_sched.JobFailed) and "more than the 65536 a result may take" in err.report.error, err
    quiet = halo_sched.submit(local_job(tmp_path, "pass\n", name="quiet", nodes=1, nproc_per_node=1), "local")
    state = quiet.result(timeout=120)
    assert state.value is None and state.value_note == NO_RESULT
    r = cli("status", quiet.id, cwd=tmp_path)
    assert r.stdout.decode().splitlines() == [f"{quiet.id}\tCOMPLETED exit=0"]  # no line for no value
    assert json.loads(cli("status", quiet.id, "--json", cwd=tmp_path).stdout)["value_note"] == NO_RESULT


# ---- SLURM: the batch script sets it beside the output file; read back from there -----------------


def test_slurm_batch_script_gives_rank_0_a_path_beside_the_output_and_status_reads_it(tmp_path):
    from halo_sched.backends.slurm import SlurmScheduler

    text = halo_sched.render({"name": "res", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"}}, "slurm")
    stale = tmp_path / ".halo-result" / "7.json"
    stale.parent.mkdir()
    stale.write_text('{"from": "the run before a requeue"}')
    r, recs = run_sbatch(text, tmp_path / "run", ["a", "b"], env_names=["HALO_RESULT_FILE"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    seen = {bytes.fromhex(rec["env_hex"]["HALO_RESULT_FILE"]).decode() for rec in recs.values()}
    assert seen == {str(stale)} and not stale.exists()  # every node, the job's own; a requeued run starts clean
    stale.write_text('{"loss": 0.5}')
    sched = SlurmScheduler()
    rec = {"outputs": [str(tmp_path / "halo-res-7.out")]}
    assert result.parse(sched.read_result("7", rec)) == {"loss": 0.5}
    assert sched.read_result("cluster2:8", rec) is None  # sbatch -M: the nodes' SLURM_JOB_ID is 8
    with pytest.raises(halo_sched.SchedulerError, match="no output file is known"):
        sched.read_result("9", {"outputs": []})


# ---- Nomad: the task directory of node 0, read through the client's fs API -----------------------


def test_nomad_rank_0s_result_is_read_through_the_clients_fs_api(tmp_path):
    """Also ``logs(stream=)`` (item 4): Nomad keeps each task's stdout and stderr apart."""
    script = tmp_path / "train.py"
    # The protocol itself, no halo-sched import: the variable is what the job must carry.
    script.write_text("import json, os\nos.write(1, f\"out {os.environ['RANK']}\\n\".encode())\n"
                      "os.write(2, f\"err {os.environ['RANK']}\\n\".encode())\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    open(os.environ['HALO_RESULT_FILE'], 'w').write(json.dumps({'where': 'nomad'}))\n")
    fields = {"name": "nres", "nodes": 2, "setup": [stand_in(tmp_path)], "trainer": {"script": str(script)}}
    with nomad_sim_job(tmp_path, fields) as (fake, sched, cluster, job_id):
        state = Job(sched, job_id).wait(timeout=120)
        assert state.status is JobStatus.COMPLETED, ([cluster.stderr(a.name)[-1500:] for a in cluster.allocations],
                                                     state.describe())
        assert state.value == {"where": "nomad"} and state.value_note == "", state.value_note
        errs = sorted(x.text for x in Job(sched, job_id).logs(stream="stderr") if x.text.startswith("err"))
        assert errs == ["err 0", "err 1", "err 2", "err 3"]
        assert not [x for x in Job(sched, job_id).logs(stream="stdout") if x.text.startswith("err")]
        with pytest.raises(halo_sched.UsageError, match="since: the nomad backend's output keeps no time"):
            Job(sched, job_id).logs(since="1h")
        # Gone from the client (garbage-collected): not readable now, said, nothing kept.
        with fake._lock:
            fake.gc_logs.update(fake._allocs)
        gone = attach_value(sched, job_id, JobState(job_id, JobStatus.COMPLETED))
        assert gone.value is None and gone.value_note.startswith("not read: Nomad's client did not serve"), gone


def test_each_backend_renders_the_variable(tmp_path):
    spec = {"name": "r", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"}}
    assert 'export HALO_RESULT_FILE="$PWD"/.halo-result/"$SLURM_JOB_ID".json' in halo_sched.render(spec, "slurm")
    payload = json.loads(halo_sched.render({**spec, "image": "repo/img:1"}, "nomad", format="json"))
    task = payload["Job"]["TaskGroups"][0]["Tasks"][0]
    assert task["Env"]["HALO_RESULT_FILE"] == "${NOMAD_TASK_DIR}/halo-result.json"
    assert "HALO_RESULT_FILE=result.json in the job's directory" in halo_sched.render(spec, "local")
