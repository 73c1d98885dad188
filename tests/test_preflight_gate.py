"""preflight.gate: each node's own checks run inside the job, after setup and before torchrun; a
node whose interface is missing fails the attempt in seconds as a node fault (the preflight
pattern of halo_sched/node/failure_classes.py), and torchrun never starts."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

# Node 1's setup points gloo at an interface this host does not have, as a node whose NIC is
# missing or named otherwise would (the gate checks the interface the node's ranks will use).
BAD_NODE_1 = 'if [ "$halo_rank" = 1 ]; then export GLOO_SOCKET_IFNAME=nosuchif0; fi'


def _job(tmp_path, gate: bool, nodes_var: str = "halo_rank"):
    setup = [BAD_NODE_1.replace("halo_rank", nodes_var)]
    return example_job(tmp_path, free_port(), nproc_per_node=1, setup=setup,
                       preflight={"gate": gate})


def test_the_gate_is_off_by_default_and_renders_only_when_asked(tmp_path):
    off = cli("render", str(example_job(tmp_path, free_port())), "--backend", "local")
    assert off.returncode == 0 and "preflight gate" not in off.stdout
    on = cli("render", str(_job(tmp_path, True)), "--backend", "local")
    assert on.returncode == 0 and "--gate --node=" in on.stdout, on.stderr[-2000:]


@pytest.mark.parametrize("bad", [{"gate": "yes"}, {"gate": True, "min_busbw": 1}, ["gate"]])
def test_a_bad_preflight_field_is_exit_2_naming_it(tmp_path, bad):
    job = example_job(tmp_path, free_port(), preflight=bad)
    r = cli("validate", str(job))
    assert r.returncode == 2 and "preflight" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("value, says", [
    (1, "not a bandwidth"), (5.0, "not a bandwidth"), ("5", "not a bandwidth"), ("5 gb/s", "not a bandwidth"),
    ("-1GB/s", "not a bandwidth"), ("0GB/s", "above 0"), ("0.0MB/s", "above 0"), ("5GB/s; rm -rf /", "not a bandwidth"),
    ("1e3GB/s", "not a bandwidth"), (True, "not a bandwidth"), ("9" * 60 + "GB/s", "not a bandwidth"),
])
def test_a_bad_min_busbw_is_exit_2_naming_it(tmp_path, value, says):
    job = example_job(tmp_path, free_port(), preflight={"gate": True, "min_busbw": value})
    r = cli("validate", str(job))
    assert r.returncode == 2 and "preflight.min_busbw" in r.stderr and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("gate", [False, None])
def test_min_busbw_without_the_gate_is_exit_2(tmp_path, gate):
    pre = {"min_busbw": "5GB/s"} if gate is None else {"gate": gate, "min_busbw": "5GB/s"}
    r = cli("validate", str(example_job(tmp_path, free_port(), preflight=pre)))
    assert r.returncode == 2 and "preflight.min_busbw needs preflight.gate: true" in r.stderr, r.stderr


def test_min_busbw_renders_the_bandwidth_test_only_when_set(tmp_path):
    plain = cli("render", str(_job(tmp_path, True)), "--backend", "local")
    assert plain.returncode == 0 and "  --min-busbw=" not in plain.stdout
    for value, gbps in (("5GB/s", "5.0"), ("800MB/s", "0.8"), ("1.5 GB/s", "1.5")):
        job = example_job(tmp_path, free_port(), preflight={"gate": True, "min_busbw": value})
        r = cli("render", str(job), "--backend", "local")
        assert r.returncode == 0, r.stderr
        assert f"--min-busbw={gbps} --size=64M --nodes=2" in r.stdout, r.stdout[-3000:]
        assert '--master-addr="$HALO_MASTER_ADDR" --master-port="$HALO_MASTER_PORT"' in r.stdout


def test_rendering_a_floor_imports_no_torch(tmp_path):
    job = example_job(tmp_path, free_port(), image="pytorch/pytorch:2.3.0",
                      preflight={"gate": True, "min_busbw": "5GB/s"})
    code = ("import sys, halo_sched\n"
            "for b in ('local', 'slurm', 'nomad'):\n"
            f"    assert '--min-busbw=5.0' in halo_sched.render(halo_sched.load({str(job)!r}), b), b\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr[-2000:])


def test_which_node_a_slow_pair_fails():
    from halo_sched.node.trainers.preflight_bw import busbw_verdict

    # node i's figure is its send/recv to node 0; node 0's is its best pair.
    assert busbw_verdict({1: 9.0, 2: 3.0, 3: 9.5}, 5.0) == {0: (9.5, False), 1: (9.0, False), 2: (3.0, True),
                                                            3: (9.5, False)}
    # Every pair slow, 3+ nodes: node 0, their one common end, alone.
    assert busbw_verdict({1: 1.0, 2: 2.0}, 5.0) == {0: (2.0, True), 1: (1.0, False), 2: (2.0, False)}
    # 2 nodes, one pair: its two ends cannot be told apart; node 1 fails, always the same one.
    assert busbw_verdict({1: 1.0}, 5.0) == {0: (1.0, False), 1: (1.0, True)}
    assert busbw_verdict({1: 6.0}, 5.0) == {0: (6.0, False), 1: (6.0, False)}
    assert busbw_verdict({}, 5.0) == {}


def _busbw_job(tmp_path, floor: str):
    return example_job(tmp_path, free_port(), nproc_per_node=1, preflight={"gate": True, "min_busbw": floor})


@pytest.mark.torch
def test_a_node_below_min_busbw_fails_the_gate_as_a_node_fault_local(tmp_path):
    start = time.monotonic()
    r = cli("submit", str(_busbw_job(tmp_path, "900000GB/s")), "--backend", "local", "--wait", "--quiet",
            "--timeout", "120")
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    st = json.loads(cli("status", job_id, "--json").stdout)
    assert st["failure_class"]["class"] == "node" and st["failure_class"]["by"] == "preflight", st
    err = st["failure"]["first"]["error"]
    m = re.search(r"preflight gate: busbw: node (1) \(\S+\) measured ([0-9.]+) GB/s, below preflight.min_busbw "
                  r"900000 GB/s \(send/recv to node 0, 64 MiB, median of 3, gloo", err)
    assert m and float(m.group(2)) > 0 and st["failure"]["first"]["node"] == 1, err
    logs = cli("logs", job_id).stdout
    assert "[node 0] halo-sched-preflight-node" in logs and "but its slow pair is blamed on the other end" in logs
    assert "torchrun not started" in logs and "world of" not in logs and "step " not in logs, logs[-3000:]
    print(f"busbw gate failure on local: {took:.1f} s from submit to FAILED; {err[:160]}")


@pytest.mark.torch
def test_a_node_above_min_busbw_passes_and_the_job_trains_local(tmp_path):
    r = cli("submit", str(_busbw_job(tmp_path, "1MB/s")), "--backend", "local", "--wait", "--quiet",
            "--timeout", "120")
    assert r.returncode == 0, r.stderr[-3000:]
    logs = cli("logs", r.stdout.strip().splitlines()[-1]).stdout
    for node in (0, 1):
        assert re.search(rf'\[node {node}\] halo-sched-preflight-node .*"check": "busbw","detail": "[0-9.]+ GB/s, '
                         r"at least preflight.min_busbw 0.001 GB/s", logs), logs[-3000:]
    assert "replicas in sync: True" in logs and "TCPStore.cpp" not in logs.split("world:")[0], logs[-3000:]


@pytest.mark.torch
def test_the_gate_fails_a_node_with_a_missing_interface_before_torchrun_local(tmp_path):
    start = time.monotonic()
    r = cli("submit", str(_job(tmp_path, True)), "--backend", "local", "--wait", "--quiet", "--timeout", "120")
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    st = json.loads(cli("status", job_id, "--json").stdout)
    assert st["failure_class"]["class"] == "node" and st["failure_class"]["by"] == "preflight", st
    first = st["failure"]["first"]
    assert first["node"] == 1 and "preflight gate: interface nosuchif0: no interface nosuchif0" in first["error"]
    logs = cli("logs", job_id).stdout
    assert "node 1: preflight gate: this node failed its checks" in logs, logs[-3000:]
    assert "world of" not in logs  # the trainer never ran on node 1's say-so
    print(f"gate failure on local: {took:.1f} s from submit to FAILED")
    assert took < 90, took


@pytest.mark.torch
def test_a_passing_gate_lets_the_job_run(tmp_path):
    job = example_job(tmp_path, free_port(), nproc_per_node=1, preflight={"gate": True})
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120")
    assert r.returncode == 0, r.stderr[-3000:]
    logs = cli("logs", r.stdout.strip().splitlines()[-1]).stdout
    assert re.search(r"node 1: preflight gate passed in \d+ s", logs), logs[-3000:]


def _failed_at_the_gate_on_slurm(tmp_path, env, job):
    """Submit ``job`` to the SLURM cluster and wait: it fails at the gate as a node fault (by
    preflight) of node rank 1, which the ledger then holds and the next render excludes. Returns
    (seconds from submit to FAILED, the job id, its status JSON)."""
    start = time.monotonic()
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "240", cwd=tmp_path, env=env)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    fc = st["failure_class"]
    assert fc["class"] == "node" and fc["by"] == "preflight", st
    # SLURM's own name for the node that ran node rank 1.
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                           timeout=60).stdout
    nodes = re.search(r"(?<![A-Za-z])NodeList=(\S+)", shown).group(1)
    names = subprocess.run(["scontrol", "show", "hostnames", nodes], env=env, capture_output=True, text=True,
                           timeout=60).stdout.split()
    assert fc["host"] == names[1], (fc, names)
    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert [(e["host"], e["job"], e["backend"]) for e in ledger] == [(names[1], job_id, "slurm")], ledger
    # The next job keeps off it.
    rendered = cli("render", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert f"#SBATCH --exclude={names[1]}\n" in rendered.stdout, rendered.stdout[:1500]
    return took, job_id, st


@pytest.mark.slurm
@pytest.mark.torch
def test_the_gate_fails_a_node_on_slurm_and_the_node_is_ledgered(tmp_path, slurm_cluster):
    env = slurm_env(slurm_cluster, pythonpath=True)
    took, job_id, _ = _failed_at_the_gate_on_slurm(tmp_path, env, _job(tmp_path, True))
    logs = cli("logs", job_id, cwd=tmp_path, env=env).stdout
    assert "world of" not in logs, logs[-3000:]
    print(f"gate failure on slurm: {took:.1f} s from submit to FAILED")
    assert took < 200, took


@pytest.mark.slurm
@pytest.mark.torch
def test_a_node_below_min_busbw_is_ledgered_on_slurm(tmp_path, slurm_cluster):
    env = slurm_env(slurm_cluster, pythonpath=True)
    took, _, st = _failed_at_the_gate_on_slurm(tmp_path, env, _busbw_job(tmp_path, "900000GB/s"))
    err = st["failure"]["first"]["error"]
    assert re.search(r"busbw: node 1 \(\S+\) measured [0-9.]+ GB/s, below preflight.min_busbw 900000 GB/s", err), err
    print(f"busbw gate failure on slurm: {took:.1f} s from submit to FAILED; {err[:200]}")


@pytest.mark.slurm
@pytest.mark.torch
def test_a_floor_the_nodes_meet_lets_the_job_train_on_slurm(tmp_path, slurm_cluster):
    """The gate's store on rank 0's port is gone before torchrun listens there."""
    env = slurm_env(slurm_cluster, pythonpath=True)
    job = example_job(tmp_path, free_port(), nproc_per_node=1, preflight={"gate": True, "min_busbw": "1MB/s"},
                      trainer={"script": str(REPO / "examples" / "train_ddp.py"), "args": ["--steps", "5"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "240", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    logs = cli("logs", r.stdout.strip().splitlines()[-1], cwd=tmp_path, env=env).stdout
    assert len(re.findall(r'"check": "busbw","detail": "[0-9.]+ GB/s, at least preflight.min_busbw', logs)) == 2, logs[-3000:]
    assert "replicas in sync: True" in logs, logs[-3000:]


def test_the_gate_reaches_nomad_inside_the_entry_template(tmp_path):
    from halo_sched.backends.nomad.render import job_payload
    from helpers import entry_script
    from halo_sched.spec import load

    spec = load(str(example_job(tmp_path, free_port(), image="pytorch/pytorch:2.3.0", preflight={"gate": True})))
    entry = entry_script(spec)
    assert "--gate --node=" in entry
    for g in job_payload(spec)["Job"]["TaskGroups"]:
        assert g["Tasks"][0]["Templates"][0]["EmbeddedTmpl"] == entry  # byte for byte, Nomad's delimiters apart


def test_the_gates_signed_line_fits_one_srun_piece_and_verifies():
    # The mac's 72 bytes took a busbw failure line past srun's 1,024 (seen: a torn line, the node
    # not ledgered on SLURM). The line stays under 1,000 bytes; its error gives way, not the check line.
    from halo_sched.node.failures import parse_line
    from halo_sched.node.trainers.preflight_bw import FAILURE_TAG, NODE_MARK, failure_body

    key = "9e" * 32
    check = f'{NODE_MARK} {{"checks": [{{"check": "busbw", "detail": "{"d" * 380}", "fatal": true}}], "node": 1}}'
    record = {"node": 1, "rank": None, "host": "vm", "exit_code": 1, "time": 5.0,
              "error": "preflight gate: busbw: " + "e" * 500, "tail": [check], "node_name": "node2"}
    line = f"1: {FAILURE_TAG} {failure_body(record, key)}\n"
    assert len(line.encode()) <= 1000
    f = parse_line(line, key)
    assert f.trusted and f.tail == (check,) and f.error.startswith("preflight gate: busbw: eee")
