"""One launch contract: every backend runs the same entry; only --node_rank differs per node.

Each backend's rendered output is executed the way its scheduler would run it, with a fake
torchrun that records its argv and environment: SLURM's sbatch script with srun/scontrol
stand-ins (srun starts one task per node with SLURM_NODEID set), Nomad's entry template with
each group's env, and the local backend's entry with its node rank.
"""
from __future__ import annotations

import json
import subprocess

import pytest

import halo_sched
from halo_sched.backends.local import _supervisor_job
from halo_sched.backends.nomad.render import job_payload
from halo_sched.backends.slurm.render import render_sbatch
from halo_sched.launch import compile_launch
from helpers import entry_script
from helpers import HOSTILE_MORE, base_env, fake_bin, records, run_entry, run_sbatch

SPEC = f"""
name: contract
nodes: 4
nproc_per_node: 3
trainer:
  script: train.py
  args: ["--lr", "0.1", {json.dumps(HOSTILE_MORE)}]
env:
  HOSTILE: {json.dumps(HOSTILE_MORE)}
  PLAIN: "1"
setup:
  - export FROM_SETUP=yes
rendezvous: {{port: 29511, timeout_s: 30}}
storage: {{shared: false, nccl_timeout_minutes: 20}}
nomad: {{driver: raw_exec}}
"""
ENV_NAMES = ["HOSTILE", "PLAIN", "FROM_SETUP", "DIST_SHARED_FILESYSTEM", "DIST_NCCL_TIMEOUT_MINUTES", "DIST_STORE_TIMEOUT_HOURS",
             "HALO_RESTART_COUNT", "HALO_WARNING_SIGNAL"]


@pytest.fixture
def spec():
    return halo_sched.loads(SPEC)


def _run_local(spec, tmp_path, port=None):
    """Each node as the local supervisor starts it: the plan's common env and the node's own.
    ``port``: what submit picked when rendezvous.port is unset."""
    bindir, out = fake_bin(tmp_path), tmp_path / "local"
    out.mkdir()
    env = base_env(bindir, out, ENV_NAMES)
    job = _supervisor_job(compile_launch(spec), tmp_path / "job", [], None, spec.rendezvous.port or port)
    for node in job["nodes"]:
        node_env = {**job["env"], **{k: v for k, v in node["env"].items() if k != "HALO_LOG_DIR"}}
        r = run_entry(entry_script(spec), tmp_path, node_env, env)
        assert r.returncode == 0, r.stderr
    return records(out)


def _run_slurm(spec, tmp_path, job_id="7"):
    r, recs = run_sbatch(render_sbatch(spec), tmp_path / f"slurm-run-{job_id}", ["gpu-a", "gpu-b", "gpu-c", "gpu-d"],
                         env_names=ENV_NAMES, nodelist="gpu-[a-d]", extra_env={"SLURM_JOB_ID": job_id})
    assert r.returncode == 0, r.stderr
    return recs


def _run_nomad(spec, tmp_path, dynamic_port=None):
    """``dynamic_port``: the port Nomad gave the rendezvous label (rendezvous.port unset)."""
    bindir, out = fake_bin(tmp_path), tmp_path / "nomad"
    out.mkdir()
    env = base_env(bindir, out, ENV_NAMES)
    groups = job_payload(spec)["Job"]["TaskGroups"]
    # One group of count N: every allocation gets the same env but its own NOMAD_ALLOC_INDEX,
    # which the client interpolates into HALO_NODE_RANK.
    assert [(g["Name"], g["Count"]) for g in groups] == [("trainer", spec.nodes)]
    for g in groups:
        task = g["Tasks"][0]
        tpl = task["Templates"][0]
        # The delimiters never occur in the script, so Go templating copies it unchanged.
        assert tpl["LeftDelim"] not in tpl["EmbeddedTmpl"] and tpl["RightDelim"] not in tpl["EmbeddedTmpl"]
        for index in range(g["Count"]):
            port = str(spec.rendezvous.port or dynamic_port)
            task_dir = tmp_path / f"{g['Name']}-{index}-local"
            task_dir.mkdir()
            # What the client interpolates into this task's Env (the task directory too: left
            # as written, "${NOMAD_TASK_DIR}/halo-logs" is a relative path, made in the cwd).
            client = {"${NOMAD_IP_rdzv}": "127.0.0.1", "${NOMAD_ALLOC_INDEX}": str(index),
                      "${NOMAD_PORT_rdzv}": port, "${NOMAD_TASK_DIR}": str(task_dir)}
            node_env = {}
            for k, v in task["Env"].items():
                for var, value in client.items():
                    v = v.replace(var, value)
                assert "${NOMAD_" not in v, (k, v)
                node_env[k] = v
            if "HALO_MASTER_ADDR_FILE" in node_env:
                addr = tmp_path / f"{g['Name']}-{index}-master"
                # What the nomadService template renders once rank 0 is up: address, then port.
                addr.write_text(f"127.0.0.1\n{port}\n")
                node_env["HALO_MASTER_ADDR_FILE"] = str(addr)
            r = run_entry(tpl["EmbeddedTmpl"], tmp_path, node_env, env)
            assert r.returncode == 0, r.stderr
    return records(out)


def test_entry_is_the_same_text_in_every_backend(spec):
    entry = entry_script(spec)
    assert entry.rstrip("\n") in render_sbatch(spec)
    for g in job_payload(spec)["Job"]["TaskGroups"]:
        assert g["Tasks"][0]["Templates"][0]["EmbeddedTmpl"] == entry
    assert entry in halo_sched.render(spec, "local")


def test_only_node_rank_differs_across_nodes_and_backends(spec, tmp_path):
    runs = {
        "local": _run_local(spec, tmp_path),
        "slurm": _run_slurm(spec, tmp_path),
        "nomad": _run_nomad(spec, tmp_path),
    }
    reference = None
    for backend, recs in runs.items():
        assert sorted(recs) == [0, 1, 2, 3], backend
        for rank, rec in recs.items():
            argv = rec["argv"]
            assert argv.count(f"--node_rank={rank}") == 1
            # The log directory is per node by design (node-K under a per-node temporary or
            # HALO_LOG_DIR): each node keeps its own ranks' files; it must still end in node-K.
            assert [a for a in argv if a.startswith("--log-dir=")][0].endswith(f"/node-{rank}"), argv
            masked = ["--node_rank=*" if a.startswith("--node_rank=") else "--log-dir=*" if a.startswith("--log-dir=")
                      else a for a in argv]
            if reference is None:
                reference = (masked, rec["env_hex"])
            assert (masked, rec["env_hex"]) == reference, (backend, rank)
    argv, env_hex = reference
    assert argv == [
        "--nnodes=4", "--nproc_per_node=3", "--node_rank=*", "--master_addr=127.0.0.1", "--master_port=29511",
        "--max_restarts=0", "--rdzv_conf=timeout=30", "--log-dir=*", "--tee=3", "train.py", "--lr", "0.1", HOSTILE_MORE,
    ]
    assert bytes.fromhex(env_hex["HOSTILE"]) == HOSTILE_MORE.encode()
    assert bytes.fromhex(env_hex["FROM_SETUP"]) == b"yes"
    assert bytes.fromhex(env_hex["DIST_SHARED_FILESYSTEM"]) == b"0"
    assert bytes.fromhex(env_hex["DIST_NCCL_TIMEOUT_MINUTES"]) == b"20"
    # A first run everywhere (SLURM: SLURM_RESTART_COUNT unset), and the trainer's warning signal.
    assert bytes.fromhex(env_hex["HALO_RESTART_COUNT"]) == b"0"
    assert bytes.fromhex(env_hex["HALO_WARNING_SIGNAL"]) == b"USR2"


def test_an_unset_port_is_the_jobs_own_and_the_same_on_every_node(tmp_path):
    """rendezvous.port unset: every node of a job still gets one port (and only --node_rank
    differs), from its backend: the one local submit picked, SLURM's 28500 + job id % 1000 (two
    jobs, two ports), Nomad's dynamic port (index 0's registration's .Port in every node's
    file)."""
    spec = halo_sched.loads(SPEC.replace("port: 29511, ", ""))
    assert spec.rendezvous.port is None
    entry = entry_script(spec)
    assert "29500" not in entry and "--master_port=\"$HALO_MASTER_PORT\"" in entry
    runs = {"local": (_run_local(spec, tmp_path, port=28777), 28777),
            "slurm job 7": (_run_slurm(spec, tmp_path, job_id="7"), 28507),
            "slurm job 12345": (_run_slurm(spec, tmp_path, job_id="12345"), 28845),
            "nomad": (_run_nomad(spec, tmp_path, dynamic_port=23456), 23456)}
    for backend, (recs, port) in runs.items():
        assert sorted(recs) == [0, 1, 2, 3], backend
        ports = {a for rec in recs.values() for a in rec["argv"] if a.startswith("--master_port=")}
        assert ports == {f"--master_port={port}"}, (backend, ports)


def test_entry_refuses_a_bad_master_port(spec, tmp_path):
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    for bad in ("", "x", "0", "65536", "123456", "29 511", "-1"):
        r = run_entry(entry_script(spec), tmp_path, {"HALO_NODE_RANK": "0", "HALO_MASTER_ADDR": "127.0.0.1",
                                                     "HALO_MASTER_PORT": bad}, base_env(bindir, out))
        assert r.returncode == 1 and "HALO_MASTER_PORT" in r.stderr, (bad, r.stderr)
    assert records(out) == {}


def test_slurm_refuses_loopback_master_across_hosts(spec, tmp_path):
    # Addresses from the documentation range: written by the stand-in scontrol, never contacted.
    r, recs = run_sbatch(render_sbatch(spec), tmp_path, ["a", "b", "c", "d"],
                         addrs=["127.0.1.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"])
    assert r.returncode == 1
    assert b"different hosts" in r.stderr
    assert recs == {}  # nothing started


def test_slurm_master_is_first_hosts_nodeaddr_not_its_name(spec, tmp_path):
    # Node names that resolve nowhere; SLURM reaches them by NodeAddr.
    r, recs = run_sbatch(render_sbatch(spec), tmp_path, ["n-x", "n-y", "n-z", "n-w"],
                         addrs=["127.0.0.9"] * 4, nodelist="n-[w-z]")
    assert r.returncode == 0, r.stderr
    assert len(recs) == 4 and all("--master_addr=127.0.0.9" in rec["argv"] for rec in recs.values())


def test_slurm_fails_loudly_without_scontrol(spec, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    r = subprocess.run(["/bin/bash", str(script)], env={"PATH": "/nonexistent", "SLURM_JOB_NODELIST": "a", "SLURM_JOB_ID": "1"},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "scontrol is not on PATH" in r.stderr


def test_worker_waits_for_published_master_then_gives_up(tmp_path):
    spec = halo_sched.loads(SPEC.replace("timeout_s: 30", "timeout_s: 2"))
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    empty = tmp_path / "master"
    # Blank while rank 0 is absent (whitespace must not pass for an address), and an address
    # without its port is not rank 0 published either.
    for text in (" \n", "127.0.0.1\n", "127.0.0.1\n \n"):
        empty.write_text(text)
        r = run_entry(entry_script(spec), tmp_path, {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR_FILE": str(empty)},
                      base_env(bindir, out))
        assert r.returncode == 1, text
        assert "rendezvous.timeout_s=2s" in r.stderr
    assert records(out) == {}


def test_entry_rejects_bad_node_rank(spec, tmp_path):
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    for bad in ("", "x", "4", "-1", "+1", "2 ", "1e1", "0x1", "9999999999"):
        r = run_entry(entry_script(spec), tmp_path, {"HALO_NODE_RANK": bad, "HALO_MASTER_ADDR": "127.0.0.1",
                                                     "HALO_MASTER_PORT": "29511"}, base_env(bindir, out))
        assert r.returncode == 1 and "HALO_NODE_RANK" in r.stderr, (bad, r.stderr)
    assert records(out) == {}


def test_rendezvous_deadline_starts_after_setup(tmp_path):
    """A setup slower than rendezvous.timeout_s (a pip install, an image pull) is not a missing
    rank 0: the wait for rank 0's address starts when setup ends. Rank 0 is published 1 s after
    the 3 s setup; a deadline counted from the start (2 s) would have failed the node."""
    spec = halo_sched.loads(SPEC.replace("timeout_s: 30", "timeout_s: 2").replace("export FROM_SETUP=yes", "sleep 3"))
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    master = tmp_path / "master"
    master.write_text("")
    publisher = subprocess.Popen(["bash", "-c", f"sleep 4; printf '127.0.0.1\\n29511\\n' > {master}"])
    try:
        r = run_entry(entry_script(spec), tmp_path, {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR_FILE": str(master)},
                      base_env(bindir, out))
    finally:
        publisher.wait()
    assert r.returncode == 0, r.stderr
    assert "--master_addr=127.0.0.1" in records(out)[1]["argv"] and "--master_port=29511" in records(out)[1]["argv"]


def test_local_submit_picks_a_free_port_for_a_job_without_one(monkeypatch, tmp_path):
    """rendezvous.port unset on the local backend: a port of 27500-28499 that is free now, none
    of the job's server ports and none handed to another job not yet listening, from a random
    start."""
    from halo_sched.backends import local

    spec = halo_sched.loads(SPEC.replace("port: 29511, ", ""))
    monkeypatch.setattr(local, "LOCAL_PORTS", range(28700, 28704))
    monkeypatch.setattr(local.secrets, "randbelow", lambda n: 0)
    monkeypatch.setattr(local, "_port_in_use", lambda port: port == 28700)  # another job holds it
    assert local._free_master_port(spec, tmp_path / "a") == 28701
    # Submitted at the same moment, before the first job's torchrun binds 28701: another port.
    assert local._free_master_port(spec, tmp_path / "a") == 28702
    with_server = halo_sched.loads(SPEC.replace("port: 29511, ", "") + "servers: [{name: s, nodes: 1, command: [x], "
                                   "port: 28701, group_port: 28702}]\n")
    assert local._free_master_port(with_server, tmp_path / "a") == 28703
    with pytest.raises(local.SchedulerError, match="no free port in 28700-28703"):
        local._free_master_port(with_server, tmp_path / "a")  # in use, the servers', or reserved
    monkeypatch.undo()
    assert not local._port_in_use(local._free_master_port(spec, tmp_path / "b"))


def test_local_submit_hands_its_port_to_every_node(tmp_path):
    """The port submit picked is in the job's record and in every node's environment."""
    from halo_sched.backends.local import LocalScheduler
    from halo_sched.node.contract import DERIVED_PORTS, LOCAL_PORTS

    spec = halo_sched.loads(SPEC.replace("port: 29511, ", "").replace("export FROM_SETUP=yes", "sleep 300"))
    sched = LocalScheduler(tmp_path / "state")
    job_id = sched.schedule(sched.dryrun(spec))
    try:
        meta = json.loads((tmp_path / "state" / job_id / "job.json").read_text())
        # Its own range: never the port a SLURM job on this machine derives from its id.
        assert meta["master_port"] in LOCAL_PORTS and meta["master_port"] not in DERIVED_PORTS
        assert meta["launch"]["env"]["HALO_MASTER_PORT"] == str(meta["master_port"])
    finally:
        sched.cancel([job_id])
        assert sched.wait(job_id, timeout=30, poll=0.2).status.terminal
