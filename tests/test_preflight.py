"""halo-sched preflight: the spec transformation and result parsing (pure), the node checks that
need no torch, and the real test on the local backend (2 nodes x 2 processes, gloo) and on the
local SLURM cluster."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import halo_sched.spec  # the module itself: `import halo_sched` loads it lazily, on first use
from halo_sched import preflight
from halo_sched.node.trainers import preflight_bw
from helpers import REPO, cli, example_job, free_port, loopback_hosts


# ---- the job that runs the test ---------------------------------------------------------------


def _spec(tmp_path, **overrides):
    return halo_sched.load(example_job(tmp_path, free_port(), **overrides))


def test_only_the_trainer_changes(tmp_path):
    spec = _spec(tmp_path, setup=["echo mine"], secret_env=["HF_TOKEN"],
                 network={"interface": "lo", "fabric": "infiniband"}, image="reg/img:1")
    pf = preflight.preflight_spec(spec, 4 << 20)
    same = ("nodes", "nproc_per_node", "gpus_per_node", "env", "secret_env", "image", "rendezvous", "storage",
            "network", "slurm", "nomad", "parallelism")
    for name in same:
        assert getattr(pf, name) == getattr(spec, name), name
    assert pf.setup[0] == "echo mine"  # the job's own setup first: the test sees its venv/image
    assert pf.trainer.script == preflight.SCRIPT_NAME and pf.name == "ddp-cpu-preflight"
    args = pf.trainer.args
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--interface") + 1] == "lo" and args[args.index("--fabric") + 1] == "infiniband"
    gpu = preflight.preflight_spec(_spec(tmp_path, gpus_per_node=2), 1 << 30)
    assert gpu.trainer.args[gpu.trainer.args.index("--device") + 1] == "cuda"  # nccl on GPUs


def test_setup_lines_write_the_script_byte_exact(tmp_path):
    # Run the added setup lines as the entry script does (bash, set -e) and compare the file.
    pf = preflight.preflight_spec(_spec(tmp_path), 4 << 20)
    script = "set -e\n" + "\n".join(pf.setup[-3:]) + '\nprintf %s "$PWD"\n'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    written = os.path.join(r.stdout, preflight.SCRIPT_NAME)
    assert r.stdout.startswith(str(tmp_path))
    assert open(written, "rb").read() == preflight.SCRIPT.read_bytes()


def test_rendered_job_carries_the_script_for_every_backend(tmp_path):
    pf = preflight.preflight_spec(_spec(tmp_path, image="reg/img:1"), 4 << 20)
    for backend in ("local", "slurm", "nomad"):
        text = halo_sched.render(pf, backend)
        assert preflight.SCRIPT_NAME in text and "base64 -d" in text, backend


# ---- reading results back ---------------------------------------------------------------------

RESULT = {"version": 1, "nodes": 3, "world": 6, "nproc_per_node": 2, "device": "cpu", "comm": "gloo",
          "size_bytes": 4194304, "iters": 3, "pair_unit": "node", "hosts": {"0": "a", "1": "b", "2": "c"},
          "checks": [{"check": "same NCCL env", "ok": True, "detail": "4 variables identical", "fix": "",
                      "fatal": False, "node": None, "host": None}],
          "pairs": [{"src": 1, "dst": 0, "bytes": 4194304, "seconds": [0.01], "mib_s": 400.0},
                    {"src": 2, "dst": 0, "bytes": 4194304, "seconds": [0.02], "mib_s": 200.0}],
          "all_gather": {"ranks": 6, "bytes": 4194304, "seconds": [0.02], "mib_s": 250.0}}


def _line(mark, data, prefix):
    return f"{prefix}{mark} {json.dumps(data)}\n"


def test_parse_lines_reads_any_backend_prefix_and_skips_torn_lines():
    node = {"node": 1, "host": "b", "checks": []}
    lines = [
        "[node 0] step 1\n",
        _line(preflight.RESULT_MARK, {**RESULT, "world": 99}, "[node 0] [rank 0] "),  # an earlier run
        _line(preflight.NODE_MARK, node, "1: "),  # srun --label
        "[node 0] halo-sched-preflight {\"pairs\": [1, 2\n",  # torn: not JSON
        "0: halo-sched-preflight [1, 2]\n",  # not an object
        "0: echo halo-sched-preflight-x {}\n",
        _line(preflight.RESULT_MARK, RESULT, "0: "),
    ]
    result, nodes = preflight.parse_lines(lines)
    assert result == RESULT  # the last whole result line
    assert nodes == {1: node}


def _srun_relayed(text: str, label: str) -> list[str]:
    """A task's output as srun --label writes it: each line in pieces of at most 1024 bytes
    (SLURM_IO_MAX_MSG_LEN, slurmstepd io.c _task_build_message), each piece labelled."""
    out = []
    for line in text.splitlines():
        raw = line.encode()
        out += [f"{label}{raw[i:i + 1024].decode(errors='replace')}\n" for i in range(0, max(len(raw), 1), 1024)]
    return out


def test_a_result_longer_than_srun_relays_whole_is_read_back(capsys):
    """A 16-node result (found with 3 nodes on the multi-host rig: 1,024+ bytes) goes out in
    parts that srun relays whole, interleaved with another node's lines; the reader puts it back
    together. A part missing or forged is no result."""
    big = {**RESULT, "nodes": 16, "hosts": {str(i): f"host-{i:02d}.example" for i in range(16)},
           "pairs": [{"src": i, "dst": 0, "bytes": 4194304, "seconds": [0.0123456789012345] * 3, "mib_s": 300.0 + i}
                     for i in range(1, 16)]}
    preflight_bw.emit(preflight.RESULT_MARK, big)
    out = capsys.readouterr().out
    assert len(json.dumps(big)) > 2048 and all(len(ln.encode()) <= 1024 for ln in out.splitlines()), out
    lines = _srun_relayed(out, "0: [rank 0] ")
    lines[1:1] = [_line(preflight.NODE_MARK, {"node": 1, "host": "b", "checks": []}, "1: ")]
    result, nodes = preflight.parse_lines(lines)
    assert result == big and nodes[1]["host"] == "b"
    assert preflight.parse_lines(lines[:2] + lines[3:])[0] is None  # a part lost
    forged = [ln.replace('"n":', '"n":1,"x":') for ln in lines]
    assert preflight.parse_lines(forged)[0] is None


@pytest.mark.parametrize("bad", [
    {"pairs": [{**RESULT["pairs"][0], "mib_s": "NaN"}]},  # spelled as JSON's NaN below
    {"pairs": [{**RESULT["pairs"][0], "mib_s": "1e400"}]},  # a float beyond range: Infinity
    {"pairs": [{**RESULT["pairs"][0], "mib_s": "fast"}]},
    {"pairs": [{"src": 1}]},
    {"all_gather": {"ranks": 6}},
    {"checks": [{"check": "nic"}]},
    {"checks": "none"},
])
def test_a_result_line_a_rank_forged_or_broke_is_no_result(bad):
    """Rank output is evidence, not a verdict: a result whose figures are not finite numbers
    (NaN passes every ``<`` floor) or whose fields the report reads are missing is skipped;
    ``--json`` output stays strict JSON."""
    text = json.dumps({**RESULT, **bad}).replace('"NaN"', "NaN").replace('"1e400"', "1e400")
    result, _ = preflight.parse_lines([f"0: {preflight.RESULT_MARK} {text}\n"])
    assert result is None
    rep = preflight.Report("j", "local", "COMPLETED", 3, 4194304, 300.0, result, {})
    assert not rep.passed
    json.loads(preflight.as_json(rep), parse_constant=lambda c: pytest.fail(c))


def test_verdict_names_the_slowest_pair_and_fails_below_min():
    rep = preflight.Report("j", "local", "COMPLETED", 3, 4194304, None, RESULT, {})
    assert rep.passed and rep.slowest_pair["src"] == 2
    table = preflight.format_table(rep)
    assert "send/recv node 2 -> node 0" in table and "all_gather over 6 ranks" in table
    assert "slowest pair: node 2 (c) -> node 0: 200.0 MiB/s" in table and "verdict: PASS" in table
    low = preflight.Report("j", "local", "COMPLETED", 3, 4194304, 300.0, RESULT, {})
    assert not low.passed
    assert low.reasons == ["send/recv node 2 -> node 0: 200.0 MiB/s is below --min-mibps 300",
                           "all_gather over 6 ranks: 250.0 MiB/s is below --min-mibps 300"]
    assert "LOW" in preflight.format_table(low) and "verdict: FAIL" in preflight.format_table(low)
    assert low.to_json()["verdict"] == "fail" and low.to_json()["slowest_pair"] == {"src": 2, "dst": 0, "mib_s": 200.0}


def test_no_result_fails_and_names_nodes_that_did_not_report():
    bad = {"check": "interface eth9", "ok": False, "detail": "no interface eth9", "fix": "set network.interface",
           "fatal": True, "node": 1, "host": "b"}
    rep = preflight.Report("j", "slurm", "FAILED", 3, 1 << 20, None, None, {1: {"node": 1, "host": "b", "checks": [bad]}})
    assert not rep.passed
    assert rep.reasons[0] == "node 1 (b): interface eth9: no interface eth9"
    assert "no check report from node 0, 2" in rep.reasons[1]
    assert "fix: set network.interface" in preflight.format_table(rep)


# ---- node checks that need no torch -----------------------------------------------------------


def test_interface_check():
    assert preflight_bw.check_interface("lo")["ok"] and "127.0.0.1" in preflight_bw.check_interface("lo")["detail"]
    missing = preflight_bw.check_interface("nosuch0")
    assert not missing["ok"] and missing["fatal"] and "lo" in missing["fix"]
    prefix = preflight_bw.check_interface("l")  # NCCL reads a prefix, gloo does not
    assert not prefix["ok"] and "gloo needs the exact name" in prefix["detail"]


def _info(rank, node, host, boot, **env):
    return {"rank": rank, "node": node, "local_rank": 0, "host": host, "boot": boot, "env": env}


def test_loopback_master_across_hosts_fails_naming_the_node():
    same = [_info(0, 0, "a", "x"), _info(1, 1, "a", "x")]
    assert all(c["ok"] for c in preflight_bw.cross_node_checks(same, "127.0.0.1"))
    two = [_info(0, 0, "a", "x"), _info(1, 1, "b", "y")]
    bad = [c for c in preflight_bw.cross_node_checks(two, "127.0.0.1") if not c["ok"]]
    assert [(c["check"], c["node"]) for c in bad] == [("master address", 1)]
    assert "network.interface" in bad[0]["fix"]
    assert all(c["ok"] for c in preflight_bw.cross_node_checks(two, "10.0.0.1"))


def test_nccl_env_that_differs_is_named_with_its_nodes():
    infos = [_info(0, 0, "a", "x", NCCL_PROTO="simple"), _info(1, 0, "a", "x", NCCL_PROTO="simple"),
             _info(2, 1, "b", "y")]
    bad = [c for c in preflight_bw.cross_node_checks(infos, "10.0.0.1") if not c["ok"]]
    assert len(bad) == 1 and bad[0]["check"] == "same NCCL_PROTO" and bad[0]["node"] == 1
    assert "node 0: 'simple'" in bad[0]["detail"] and "node 1: '<unset>'" in bad[0]["detail"]


def test_bad_input_exits_2(tmp_path):
    job = example_job(tmp_path, free_port())
    for extra in (["--size", "lots"], ["--size", "2"], ["--min-mibps", "-1"], ["--iters", "0"]):
        r = cli("preflight", str(job), *extra)
        assert r.returncode == 2, (extra, r.stderr)
        assert "Traceback" not in r.stderr


def test_timeout_cancels_the_test_job(tmp_path):
    # A test that cannot start (its setup hangs) must not hold the nodes after --timeout.
    job = example_job(tmp_path, free_port(), setup=["sleep 300"])
    r = cli("preflight", str(job), "--size", "4M", "--timeout", "3", "--json", timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["state"] == "CANCELLED" and rep["verdict"] == "fail"
    assert "before rank 0 reported" in rep["reasons"][-1]


def test_the_cli_path_does_not_import_torch():
    code = "import sys, halo_sched.preflight, halo_sched.layout; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "False", r.stderr


# ---- the real test: local backend, torchrun + gloo --------------------------------------------


@pytest.mark.torch
def test_local_preflight_passes_with_a_table(tmp_path):
    job = example_job(tmp_path, free_port(), network={"interface": "lo"})
    r = cli("preflight", str(job), "--size", "4M", "--iters", "2")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    out = r.stdout
    assert "2 nodes x 2 = 4 ranks, gloo on cpu, 4 MiB" in out
    assert "check interface lo" in out and "2 nodes" in out
    assert "check same NCCL env" in out and "check master address" in out and "127.0.0.1 (1 host)" in out
    assert "send/recv node 1 -> node 0" in out and "all_gather over 4 ranks" in out
    assert "slowest pair: node 1" in out and "verdict: PASS" in out


@pytest.mark.torch
def test_local_preflight_json_fails_an_impossible_minimum(tmp_path):
    job = example_job(tmp_path, free_port())
    r = cli("preflight", str(job), "--size", "4M", "--iters", "1", "--min-mibps", "1e12", "--json")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["verdict"] == "fail" and rep["state"] == "COMPLETED" and rep["comm"] == "gloo"
    assert rep["world"] == 4 and rep["size_bytes"] == 4 << 20
    assert [(p["src"], p["dst"]) for p in rep["pairs"]] == [(1, 0)]
    assert rep["pairs"][0]["mib_s"] > 0 and rep["all_gather"]["mib_s"] > 0
    assert rep["all_gather"]["bytes"] == 4 << 20 and rep["slowest_pair"]["src"] == 1
    assert any("below --min-mibps" in x for x in rep["reasons"])


@pytest.mark.torch
def test_local_preflight_missing_interface_names_node_and_fix(tmp_path):
    job = example_job(tmp_path, free_port(), network={"interface": "nosuch0"})
    r = cli("preflight", str(job), "--size", "4M", "--json")
    assert r.returncode == 1, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    bad = [c for c in rep["checks"] if not c["ok"]]
    assert bad and {c["check"] for c in bad} == {"interface nosuch0"}
    assert bad[0]["node"] in (0, 1) and "set network.interface" in bad[0]["fix"]
    assert rep["state"] == "FAILED" and rep["pairs"] == []


@pytest.mark.torch
def test_local_preflight_fabric_devices_and_differing_nccl_env(tmp_path):
    if os.path.exists("/dev/infiniband"):
        pytest.skip("this machine has /dev/infiniband")
    # Node 1 alone exports an NCCL variable in setup: the ranks disagree.
    job = example_job(tmp_path, free_port(), network={"fabric": "infiniband"},
                      setup=['[ "$HALO_NODE_RANK" != 1 ] || export NCCL_PROTO=simple'])
    r = cli("preflight", str(job), "--size", "4M", "--iters", "1")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    out = r.stdout
    assert "check /dev/infiniband" in out and "node 0 (" in out and "node 1 (" in out
    assert "/dev/infiniband missing (network.fabric infiniband needs the RDMA devices)" in out
    assert "check same NCCL_PROTO" in out and "node 1: 'simple'" in out
    assert "verdict: FAIL" in out
    # The bandwidth test still ran: these checks do not stop the collectives.
    assert "send/recv node 1 -> node 0" in out


# ---- the real SLURM cluster -------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.torch
def test_slurm_preflight_passes(tmp_path, slurm_cluster):
    env = dict(os.environ)
    env.update(slurm_cluster)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    job = example_job(tmp_path, free_port(), network={"interface": "lo"})
    r = cli("preflight", str(job), "--backend", "slurm", "--size", "4M", "--iters", "2", "--json",
            cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["verdict"] == "pass" and rep["state"] == "COMPLETED" and rep["world"] == 4
    assert rep["job_id"].isdigit() and [(p["src"], p["dst"]) for p in rep["pairs"]] == [(1, 0)]
    assert {c["check"] for c in rep["checks"]} == {"interface lo", "master address", "same NCCL env"}


@pytest.mark.torch
def test_nomad_job_carries_and_runs_the_test(tmp_path):
    # No Nomad here: the rendered job runs as a client would start its tasks (tests/nomad/client_sim.py),
    # proving the script reaches an allocation through the job alone (setup in the entry template).
    from halo_sched.backends.nomad.render import job_payload
    from helpers import load_nomad_helper

    client_sim = load_nomad_helper("client_sim")
    spec = halo_sched.spec.JobSpec.model_validate({
        "name": "pf", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "unused.py"},
        "env": {"OMP_NUM_THREADS": "1"}, "rendezvous": {"port": free_port(), "timeout_s": 120},
        "nomad": {"driver": "raw_exec"},
    })
    job = job_payload(preflight.preflight_spec(spec, 1 << 20, iters=1))["Job"]
    env = dict(os.environ)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    with client_sim.SimCluster(job, tmp_path / "nomad", host_env=env, hosts=loopback_hosts(2)) as cluster:
        cluster.place()
        cluster.start()
        codes = cluster.wait(timeout=180)
        out = "".join(cluster.stdout(name) + cluster.stderr(name) for name in codes)
    assert set(codes.values()) == {0}, out[-3000:]
    result, nodes = preflight.parse_lines(out.splitlines())
    assert result is not None and sorted(nodes) == [0, 1]
    assert [(p["src"], p["dst"]) for p in result["pairs"]] == [(1, 0)] and result["world"] == 2
