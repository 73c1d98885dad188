"""The node ledger (halo_sched/ledger.py): written by whoever sees a node fault, safe under
concurrent writers, a bad or newer file skipped with one warning and never fatal; `halo-sched
nodes`; and new jobs kept off its hosts (SLURM --exclude, Nomad constraints), through the
launch plan. Every test runs with its own empty HALO_SCHED_HOME (tests/conftest.py)."""
from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

import halo_sched
from halo_sched import ledger, records
from halo_sched.jobstate import JobState, JobStatus
from halo_sched.errors import UsageError
from halo_sched.launch import compile_launch
from halo_sched.node.failures import FailureReport, RankFailure
from helpers import REPO, cli

NCCL = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")


def _hosts(now=None) -> tuple[str, ...]:
    """The hosts new jobs keep off, sorted, each once."""
    return tuple(sorted({h for _, h in ledger.exclusions(now)}))


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_add_is_once_per_job_and_host_and_expires(monkeypatch):
    e = ledger.add("h2", "NCCL network error", "101", "slurm", now=1000.0, hours=1)
    assert (e.host, e.job, e.since, e.expires) == ("h2", "101", 1000.0, 4600.0)
    assert ledger.add("h2", "other words", "101", "slurm", now=2000.0) == e  # seen again: unchanged
    ledger.add("h2", "GPU Xid error", "102", "slurm", now=1500.0, hours=1)
    assert [x.job for x in ledger.active(now=4000.0)] == ["101", "102"]
    assert _hosts(now=4000.0) == ("h2",)
    assert [x.job for x in ledger.active(now=4700.0)] == ["102"]
    assert ledger.active(now=5200.0) == []
    assert len(ledger.entries()) == 2 and ledger.path().name == "halo-sched.db"
    assert ledger.clear("h2") == 2 and ledger.entries() == []
    monkeypatch.setenv(ledger.EXPIRY_ENV, "0.5")
    e = ledger.add("h3", "x", "1", "nomad")
    assert e.expires - e.since == pytest.approx(1800.0)


def _writer(home: str, worker: int, n: int) -> None:
    os.environ["HALO_SCHED_HOME"] = home
    for i in range(n):
        assert ledger.add(f"host-{worker}-{i}", "NCCL network error", f"job-{worker}-{i}", "slurm") is not None


def test_concurrent_writers_all_land(tmp_path, monkeypatch):
    """Four processes adding 25 entries each at once: 100 entries, one whole file, no temp left."""
    home = tmp_path / "shared-home"
    monkeypatch.setenv("HALO_SCHED_HOME", str(home))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(home), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a writer did not finish within 120 s"
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    hosts = {e.host for e in ledger.active()}
    assert len(hosts) == 100, f"{100 - len(hosts)} entries lost"
    assert not [p.name for p in home.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("text, why", [
    ('{"version": 1, "entries": [', "truncated JSON"),
    ("[1, 2]", "not a ledger"),
    ('{"version": 1, "entries": [{"host": "h1"}]}', "an entry lacks"),
    ('{"version": 1, "entries": [{"host": "h1 --x", "reason": "", "job": "1", "backend": "slurm", '
     '"since": 1, "expires": 9e99}]}', "wrong type"),
    ('{"version": 2, "entries": [{"host": "h1", "future": true}]}', "written by a newer halo-sched (ledger version 2"),
])
def test_an_earlier_releases_bad_or_newer_file_is_not_imported_and_says_so_never_fatal(text, why, capsys, tmp_path):
    ledger._warned.clear()
    ledger.legacy_path().parent.mkdir(parents=True, exist_ok=True)
    ledger.legacy_path().write_text(text)
    assert ledger.active() == [] and ledger.active() == []
    err = capsys.readouterr().err
    assert err.count("halo-sched: warning: skipping the node ledger") == 1 and why in err, err
    # Rendering a job still works, avoiding nothing; the store takes new entries; the file stays.
    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    assert "#SBATCH --exclude" not in halo_sched.render(spec, "slurm")
    assert ledger.add("h9", "x", "1", "slurm") is not None
    assert ledger.legacy_path().read_text() == text
    r = cli("render", str(REPO / "examples" / "ddp-cpu.yaml"), "--backend", "slurm", env=_env())
    assert r.returncode == 0 and r.stderr.count("skipping the node ledger") == 1, r.stderr


def test_an_earlier_releases_ledger_is_imported_once_without_entries_that_never_expire(capsys):
    ledger._warned.clear()
    entry = {"host": "h1", "reason": "NCCL network error", "job": "1", "backend": "slurm", "since": 1000.0,
             "expires": 4600.0, "by": "nccl-system"}
    forever = [dict(entry, host=f"h{i}", expires=e) for i, e in ((2, 1e300), (3, float("inf")), (4, float("nan")))]
    ledger.legacy_path().parent.mkdir(parents=True, exist_ok=True)
    ledger.legacy_path().write_text(json.dumps({"version": 1, "entries": [entry, *forever]}))
    assert [e.host for e in ledger.entries()] == ["h1"]
    assert "3 entries with since/expires out of range" in capsys.readouterr().err
    assert not ledger.legacy_path().exists() and ledger.legacy_path().with_name("nodes.json.imported").exists()
    assert _hosts(now=2000.0) == ("h1",) and _hosts(now=5000.0) == ()
    r = cli("nodes", "--json", env=_env())
    assert r.returncode == 0 and "Infinity" not in r.stdout and "NaN" not in r.stdout, r.stdout


#: The node's own evidence on a failure (failure_collector.node_evidence): a GPU NVML calls lost.
LOST = ("nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.",)


def _failed(host="h2", error=NCCL, status=JobStatus.FAILED, evidence=LOST, job="4242"):
    f = RankFailure(node=1, rank=1, local_rank=0, host=host, exit_code=1, signal=None, time=1.8e9, error=error,
                    evidence=evidence)
    return JobState(job, status, raw_state=status.value, failure=FailureReport([f]))


def _record(job_id="4242", backend="slurm"):
    rec = {"version": 1, "id": job_id, "backend": backend, "name": "t", "submitted": time.time(), "spec": {"slurm": {}},
           "outputs": [], "scheduler": {}}
    records.write(rec)
    return rec


def test_a_record_update_that_sees_a_node_fault_ledgers_the_host_once():
    from halo_sched.core import note

    _record()
    note("slurm", "4242", _failed())
    note("slurm", "4242", _failed())
    (e,) = ledger.active()
    reason = "GPU lost; the rank reported an NCCL network error"
    assert (e.host, e.job, e.backend, e.reason, e.by) == ("h2", "4242", "slurm", reason, "gpu-lost")
    last = records.find("4242", "slurm")[0]["last_state"]
    assert last["failure_class"] == {"class": "node", "failure": "node", "reason": reason, "host": "h2",
                                    "by": "gpu-lost"}
    assert last["describe"].startswith(f"FAILED (node fault: host h2, {reason}): ")
    # A job's own fault ledgers nothing, and says so in the record.
    _record("4243")
    note("slurm", "4243", _failed(host="h3", error="ValueError: boom", evidence=()))
    assert _hosts() == ("h2",)
    assert records.find("4243", "slurm")[0]["last_state"]["failure_class"]["class"] == "job"
    # The local backend runs on this one host: its node faults are classified, never ledgered.
    _record("local-1", "local")
    note("local", "local-1", _failed(host="thishost"))
    assert records.find("local-1", "local")[0]["last_state"]["failure_class"]["class"] == "node"
    assert _hosts() == ("h2",)


def test_nodes_command_lists_clears_and_refuses_bad_input():
    ledger.add("h2", "GPU Xid error", "77", "slurm")
    r = cli("nodes", env=_env())
    assert r.returncode == 0 and "h2" in r.stdout and "GPU Xid error" in r.stdout and "77@slurm" in r.stdout, r
    r = cli("nodes", "--json", env=_env())
    [row] = json.loads(r.stdout)
    assert (row["host"], row["job"], row["backend"]) == ("h2", "77", "slurm") and row["expires"] > row["since"]
    ledger.add("h3", "evil \x1b[31mred\x07", "j\x1b]0;title\x07", "slurm")  # a hand-edited file is data
    r = cli("nodes", env=_env())
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "evil ?[31mred?" in r.stdout, r.stdout
    ledger.clear("h3")
    r = cli("nodes", "clear", "h9", env=_env())
    assert r.returncode == 2 and "'h9' is not in the node ledger" in r.stderr, r.stderr
    r = cli("nodes", "clear", "h2;reboot", env=_env())
    assert r.returncode == 2 and "HOST: 'h2;reboot' is not a host name" in r.stderr and "Traceback" not in r.stderr
    r = cli("nodes", env={**_env(), ledger.EXPIRY_ENV: "-3"})
    assert r.returncode == 2 and f"{ledger.EXPIRY_ENV}: '-3' is not a positive number" in r.stderr, r.stderr
    r = cli("nodes", "clear", "h2", env=_env())
    assert r.returncode == 0 and ledger.active() == []


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_expiry_must_be_a_positive_number(value):
    with pytest.raises(UsageError, match="positive number"):
        ledger.expiry_hours(value)


def test_slurm_render_excludes_ledgered_hosts_with_a_comment():
    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    empty = halo_sched.render(spec, "slurm")
    ledger.add("n2", "GPU Xid error", "1", "slurm")
    ledger.add("n1", "NCCL network error", "2", "slurm")
    ledger.add("gpu-x", "node lost (Nomad allocation lost)", "j", "nomad")  # another scheduler's node
    assert compile_launch(spec, ledgered=ledger.exclusions()).exclude_hosts("slurm") == ("n1", "n2")
    assert compile_launch(spec, ledgered=ledger.exclusions()).exclude_hosts("nomad") == ("gpu-x",)
    assert compile_launch(spec).exclude_hosts("slurm") == ()  # compiling reads no store: the backend hands it over
    text = halo_sched.render(spec, "slurm")
    assert "#SBATCH --exclude=n1,n2\n" in text
    assert "# Kept off the hosts of the node ledger (`halo-sched nodes`)" in text
    # Nothing else changes; the job file can turn it off.
    assert [ln for ln in text.splitlines() if ln not in empty.splitlines()] == [
        ln for ln in text.splitlines() if "node ledger" in ln or "#SBATCH --exclude" in ln or "nodes clear" in ln
        or "avoid_ledgered_nodes" in ln]
    off = spec.model_copy(update={"avoid_ledgered_nodes": False})
    assert halo_sched.render(off, "slurm") == empty
    # The user's own --exclude joins the ledger's (sbatch keeps only the last one).
    own = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"extra_args": ["--exclude=n7"]})})
    text = halo_sched.render(own, "slurm")
    assert "#SBATCH --exclude=n7,n1,n2\n" in text and text.count("#SBATCH --exclude=") == 1


def test_a_ranks_own_words_fence_a_host_only_when_repeated():
    """Issue 43: a rank that printed an NCCL line (signed by its node's collector, but its own
    words: no node-side evidence) fenced its host off for every later job. Now the ledger keeps it
    as a rank's report, and new jobs avoid the host once REPEATED different jobs failed so there."""
    from halo_sched.core import note

    assert ledger.REPEATED == 2
    _record("501")
    note("slurm", "501", _failed(host="h5", evidence=(), job="501"))
    note("slurm", "501", _failed(host="h5", evidence=(), job="501"))  # seen again: once per job
    (e,) = ledger.active()
    assert (e.host, e.job, e.by, e.said) == ("h5", "501", "rank-said:nccl-system", True), e
    assert _hosts() == ()  # one job's words: not avoided
    last = records.find("501", "slurm")[0]["last_state"]["failure_class"]
    assert (last["class"], last["host"], last["said"], last["suspect"]) == ("unknown", "", True, "h5"), last
    r = cli("nodes", env=_env())
    assert "a rank's report; 1 job so far: not avoided before 2 jobs" in r.stdout, r.stdout
    _record("502")
    note("slurm", "502", _failed(host="h5", evidence=(), job="502"))
    assert _hosts() == ("h5",)  # repeated failures there: avoided
    r = cli("nodes", "--json", env=_env())
    assert [x["avoided"] for x in json.loads(r.stdout)] == [True, True], r.stdout
    # The local backend ledgers nothing, whatever the words.
    _record("local-2", "local")
    note("local", "local-2", _failed(host="thishost", evidence=(), job="local-2"))
    assert {x.host for x in ledger.active()} == {"h5"}


def test_nomad_render_constrains_node_name_and_the_hcl_says_the_same():
    from hclparse import hcl2json, jobspec

    from halo_sched.backends.nomad.render import job_payload, render_hcl

    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    ledger.add("gpu-b", "node lost (Nomad allocation lost)", "j-1", "nomad")
    ledger.add("node7", "GPU Xid error", "99", "slurm")  # a SLURM node: not Nomad's business
    job = job_payload(spec, "j")["Job"]
    assert [c for c in job["Constraints"] if "LTarget" in c] == [
        {"LTarget": "${node.unique.name}", "RTarget": "gpu-b", "Operand": "!="}]
    hcl = render_hcl(spec, "j")
    assert "# Kept off the hosts of the node ledger" in hcl
    parsed = jobspec.api_job(hcl2json.load(hcl))
    assert jobspec.comparable(parsed) == jobspec.comparable(job)


def test_local_backend_ignores_the_ledger():
    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    empty = halo_sched.render(spec, "local")
    ledger.add("n1", "GPU Xid error", "1", "slurm")
    assert halo_sched.render(spec, "local") == empty


def test_nomad_lost_allocation_ledgers_its_node_and_the_next_job_keeps_off_it(tmp_path):
    """Through the fake Nomad API (its placement honours ``${node.unique.name} != NAME``): a node
    goes down under a running job; `status` (core.query_and_note) ledgers it; the next job's
    payload carries the constraint and is placed on the other nodes."""
    from helpers import load_nomad_helper

    from halo_sched import core
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig
    from halo_sched.backends.nomad.render import job_payload

    fake_api = load_nomad_helper("fake_api")
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    spec = spec.model_copy(update={"nodes": 3, "gpus_per_node": 2, "nproc_per_node": 2, "nomad": spec.nomad.model_copy(
        update={"namespace": None, "memory": 65536, "shm_size": "8GiB"})})
    with fake_api.FakeNomad([fake_api.FakeNode(f"gpu-{c}", docker_volumes_enabled=True) for c in "abc"],
                            token="tok") as fake:
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token="tok", retry_attempts=1)))
        job_id = sched.submit(spec).id
        fake.set_running(job_id)
        victim = fake.alloc_for(job_id, "trainer[2]")["NodeName"]
        fake.node_down(victim)
        st = core.query_and_note("nomad", sched, [job_id])[job_id]
        assert st.status is JobStatus.NODE_FAIL and f"(Nomad node {victim}) disconnected" in st.describe()
        assert st.failure_class().describe() == f"node fault: host {victim}, node disconnected (Nomad allocation unknown)"
        cls = records.find(job_id, "nomad")[0]["last_state"]["failure_class"]
        assert (cls["class"], cls["host"]) == ("node", victim)
        (e,) = ledger.active()
        assert (e.host, e.job, e.backend, e.by) == (victim, job_id, "nomad", "node-lost")
        core.query_and_note("nomad", sched, [job_id])  # seen again: still one entry
        assert len(ledger.active()) == 1
        payload = job_payload(spec, "next")["Job"]
        assert {"LTarget": "${node.unique.name}", "RTarget": victim, "Operand": "!="} in payload["Constraints"]
        fake.add_node(fake_api.FakeNode("gpu-d", docker_volumes_enabled=True))
        next_id = sched.submit(spec).id
        placed = {a["NodeName"] for a in fake.allocs_of(next_id)}
        assert placed and victim not in placed, placed
