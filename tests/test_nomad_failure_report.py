"""Nomad names the first failure as the other backends do: from the ``halo-sched-failure`` lines
in the dead allocations' task logs (read through the fake API's client fs logs endpoint, which
follows command/agent/fs_endpoint.go and client/fs_endpoint.go), falling back to what Nomad
itself says (a lost node, a task's exit code) when the logs cannot be read."""
from __future__ import annotations

import json
import os
import re
from unittest import mock

import pytest
import yaml

import halo_sched
import halo_sched.spec
from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from halo_sched.node.failure_collector import sign
from helpers import REPO, cli, load_nomad_helper, nomad_sim_job, stored_record, wait_dead

TAG = "halo-sched-failure"  # docs/failures.md's line format: `halo-sched-failure {json}`

fake_api = load_nomad_helper("fake_api")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "tok-fail"
KEY = "7a" * 32  # the jobs' failure key here (submit below): the canned lines are signed with it
T0 = 1_800_000_000.0  # failure times in the canned lines: 2027-01-15 08:00:00 UTC


def nodes(n=3):
    return [FakeNode(f"gpu-{c}", docker_volumes_enabled=True) for c in "abcdefgh"[:n]]


def spec_file(tmp_path, n=3):
    data = yaml.safe_load((REPO / "examples" / "nomad-gpu.yaml").read_text())
    data["nodes"], data["gpus_per_node"], data["nproc_per_node"] = n, 2, 2
    data["nomad"]["memory"], data["nomad"]["shm_size"] = 65536, "8GiB"
    data["nomad"]["namespace"] = None
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def line(node, rank, t, error, exit_code=1, stopped=False, host=None, key=KEY):
    rec = {"node": node, "rank": rank, "local_rank": None if rank is None else rank % 2,
           "host": host or f"gpu-{'abc'[node]}", "exit_code": exit_code, "signal": None, "time": t,
           "error": error, "tail": [error], "stopped": stopped}
    body = json.dumps(rec, separators=(',', ':'))
    return f'{TAG} {body[:-1]},"mac":"{sign(body, key)}"}}\n'  # as a node's collector signs it


def submit(fake, tmp_path, n=3):
    client = NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1))
    sched = NomadScheduler(client=client)
    with mock.patch("halo_sched.backends.base.new_failure_key", return_value=KEY):  # the whole submit: a record
        job_id = sched.submit(halo_sched.load(spec_file(tmp_path, n))).id
    fake.set_running(job_id)
    return sched, job_id


def fail(fake, job_id, group, text, code=1):
    alloc = fake.alloc_for(job_id, group)["ID"]
    # A traceback first, then the collector's lines (stderr), as the entry script writes them.
    fake.write_log(alloc, "Traceback (most recent call last):\n  ...\n" + text, type="stderr")
    fake.finish(job_id, group, exit_code=code)
    return alloc


def test_status_names_the_first_failure_from_the_task_logs(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        # Node 2 (trainer[2]) fails first; node 0's rank 1 dies a second later waiting for it.
        fail(fake, job_id, "trainer[2]", line(2, 5, T0 + 3.25, "ValueError: bad shard 7", exit_code=3))
        fail(fake, job_id, "trainer[0]", line(0, 1, T0 + 4.5, "RuntimeError: NCCL timeout"))
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.FAILED
        want = re.compile(r"FAILED: ValueError: bad shard 7 \[rank 5 \(node 2, host gpu-c, local rank 1\) exit 3 at "
                          r"\d\d:\d\d:\d\d\]; 1 other rank ended after it")
        assert want.match(st.describe()), st.describe()
        # Only the tails of the two failed allocations were read, once each, from the end.
        reads = fake.requests_to("/v1/client/fs/logs/")
        assert {r.query["origin"] for r in reads} == {"end"} and all(r.query["plain"] == "true" for r in reads)
        assert len(reads) == 2 and {r.query["type"] for r in reads} == {"stderr"}
        # Cached: asking again reads nothing more.
        assert sched.query([job_id])[job_id].describe() == st.describe()
        assert len(fake.requests_to("/v1/client/fs/logs/")) == 2


def test_running_job_is_not_read(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.RUNNING and st.failure is None
        fake.finish(job_id, "trainer[0]", 0)
        fake.finish(job_id, "trainer[1]", 0)
        fake.finish(job_id, "trainer[2]", 0)
        assert sched.query([job_id])[job_id].status is JobStatus.COMPLETED
        assert fake.requests_to("/v1/client/fs/logs/") == []


def test_logs_refused_fall_back_to_the_exit_code(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        alloc = fail(fake, job_id, "trainer[1]", line(1, 2, T0, "ValueError: x"), code=7)
        fake.fail_next(4, status=403, body="Permission denied", path_contains="/fs/logs/")
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.FAILED
        assert re.match(r"FAILED: node 1 \(Nomad node gpu-\w\) exit 7 at \d\d:\d\d:\d\d: "
                            r"task torchrun: Terminated: Exit Code: 7", st.describe()), st.describe()
        # Client garbage-collected the allocation: 404, the same fallback and never an error.
        fake.gc_logs.add(alloc)
        sched2 = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN)))
        assert "exit 7" in sched2.query([job_id])[job_id].describe()


def test_lost_node_is_named_by_node_rank_and_nomad_node(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        host = fake.alloc_for(job_id, "trainer[2]")["NodeName"]
        fake.node_down(host)
        # Node 0's rank crashes on the lost peer before Nomad notices; its line is earlier.
        fail(fake, job_id, "trainer[0]", line(0, 0, 1.0, "RuntimeError: connection reset by peer"))
        st = sched.query([job_id])[job_id]
        assert st.status is JobStatus.NODE_FAIL
        # disconnect { replace = false } (the example's): the allocation is "unknown", not replaced.
        assert re.match(rf"NODE_FAIL: node 2 \(Nomad node {host}\) disconnected at \d\d:\d\d:\d\d: allocation "
                        r"\w{8} unknown: .*node is disconnected; 1 other rank ended after it", st.describe()), st.describe()
        # The lost allocation's logs were not asked for (its client is unreachable).
        lost = fake.alloc_for(job_id, "trainer[2]")
        assert not [r for r in fake.requests_to("/v1/client/fs/logs/") if lost["ID"] in r.path]


def test_fake_logs_origin_end_is_the_tail_in_bytes(tmp_path):
    # client/fs_endpoint.go findClosest: a negative offset counts back from the end, clamped at 0.
    with FakeNomad(nodes(), token=TOKEN) as fake:
        sched, job_id = submit(fake, tmp_path)
        alloc = fake.alloc_for(job_id, "trainer[0]")["ID"]
        fake.write_log(alloc, "é" * 10 + "tail\n", type="stderr")
        c = NomadClient(NomadConfig(address=fake.address, token=TOKEN))
        assert c.log_tail(alloc, "torchrun", "stderr", 5) == "tail\n"
        assert c.log_tail(alloc, "torchrun", "stderr", 10_000) == "é" * 10 + "tail\n"
        assert c.log_tail("no-such-alloc", "torchrun", "stderr") is None


def test_cli_status_wait_and_logs_filter(tmp_path):
    with FakeNomad(nodes(), token=TOKEN) as fake:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(tmp_path / "home"))
        r = cli("submit", str(spec_file(tmp_path)), "--backend", "nomad", env=env)
        job_id = r.stdout.split()[-1]
        fake.set_running(job_id)
        for g, node in (("trainer[0]", 0), ("trainer[1]", 1), ("trainer[2]", 2)):
            alloc = fake.alloc_for(job_id, g)["ID"]
            fake.write_log(alloc, f"[rank {2 * node}] step 1\n[rank {2 * node + 1}] step 1\nnode {node} up\n")
        # The key this submit made (its record): what the job's nodes would sign with.
        key = stored_record(tmp_path / "home", job_id)["failure_key"]
        fail(fake, job_id, "trainer[1]", line(1, 3, T0, "ValueError: rank three", exit_code=3, key=key))
        st = cli("status", job_id, env=env)
        assert re.search(r"FAILED: ValueError: rank three \[rank 3 \(node 1, host gpu-b, local rank 1\) exit 3 at ",
                         st.stdout), st.stdout + st.stderr
        js = json.loads(cli("status", job_id, "--json", env=env).stdout)
        assert js["failure"]["first"]["rank"] == 3 and js["failure"]["others"] == 0
        # watch: the watcher stops the survivors and its last word names the rank.
        w = cli("watch", job_id, "--timeout", "20", "--quiet", env=env)
        assert w.returncode == 1 and "FAILED: ValueError: rank three [rank 3 (node 1" in w.stderr, w.stderr
        out = cli("logs", job_id, "--node", "2", "--rank", "5", env=env).stdout.splitlines()
        assert out == ["[node 2 rank 5] step 1"]
        out = cli("logs", job_id, "--node", "1", env=env).stdout.splitlines()
        assert out[:3] == ["[node 1 rank 2] step 1", "[node 1 rank 3] step 1", "[node 1] node 1 up"]


@pytest.mark.torch
def test_sim_three_nodes_rank_on_node_2_fails_first(tmp_path):
    """Real torchrun in the client simulator: 3 nodes x 2 ranks, rank 5 (node 2, local rank 1)
    raises; the others fail after it. The simulator's task logs and exit codes then stand in
    for the Nomad client's, served through the fake API: status names rank 5 on node 2."""
    fields = {"name": "sim-fail", "nodes": 3,
              "trainer": {"script": str(REPO / "tests" / "trainers" / "first_failure.py"),
                          "args": ["--fail-rank", "5", "--how", "raise", "--timeout", "30"]}}
    with nomad_sim_job(tmp_path, fields, nodes=3) as (fake, sched, cluster, job_id):
        wait_dead(fake, sched, job_id, 180)
        logs = {a.name: (cluster.stdout(a.name), cluster.stderr(a.name)) for a in cluster.allocations}
        st = sched.query([job_id])[job_id]
        assert fake.job_record(job_id)["Status"] == "dead", logs
        assert {a["ClientStatus"] for a in fake.allocs_of(job_id)} == {"failed"}, logs
    assert st.status is JobStatus.FAILED
    assert re.match(r"FAILED: ValueError: rank 5 fails on purpose \[rank 5 \(node 2, host [^,]+, local rank 1\) exit 1 "
                    r"at \d\d:\d\d:\d\d\]; \d+ other ranks? ended after it", st.describe()), \
        (st.describe(), logs)


@pytest.mark.torch
def test_sim_a_forged_line_names_no_culprit_and_no_rank_holds_the_key(tmp_path):
    """Issue 28 on Nomad (client simulator, real torchrun): rank 0 prints a failure line dated 100 s
    before rank 3's real failure; the key reached the entry script in the task's Env, not a rank."""
    from test_failure_report_local import FORGER

    trainer = tmp_path / "forger.py"
    trainer.write_text(FORGER)
    fields = {"name": "sim-forge", "nodes": 2, "trainer": {"script": str(trainer)}}
    os.environ["MY_TOKEN"] = "tok_" + "nomadsecret" * 3  # read by the trainer only (no secret_env here)
    os.environ["FORGER_SLEEP"] = "6"  # Nomad ends no group when another fails: node 0 fails on its own
    try:
        with nomad_sim_job(tmp_path, fields, nodes=2) as (fake, sched, cluster, job_id):
            wait_dead(fake, sched, job_id, 180)
            logs = "".join(cluster.stdout(a.name) + cluster.stderr(a.name) for a in cluster.allocations)
            st = sched.query([job_id])[job_id]
    finally:
        del os.environ["MY_TOKEN"], os.environ["FORGER_SLEEP"]
    assert st.status is JobStatus.FAILED
    first = st.failure.first
    assert first is not None and first.rank == 3 and first.host != "victim-host", (st.describe(), logs)
    assert st.failure.unverified and "victim-host" not in st.describe()
    assert "key in my environment: True" not in logs and logs.count("key in my environment: False") == 4, logs
