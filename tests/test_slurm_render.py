"""The sbatch script's own logic, run by bash with stand-ins (no cluster): the warning trap and
requeue decision, the srun options it builds (CPUs, pyxis working directory and mounts).
The real-cluster counterpart is tests/test_slurm_preemption.py."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

import halo_sched
from halo_sched.backends.slurm.render import render_sbatch
from helpers import REPO, base_env, fake_bin, live_group_members, run_sbatch, write_tool

MIN = "name: t\nnodes: 2\nnproc_per_node: 2\ntrainer: {script: train.py}\n"

# srun that stays up until the batch script has passed the warning on (scancel) SENDS times (a
# node whose task was not running yet hears only a later send), then exits RC.
SLOW_SRUN = r'''#!{python}
import json, os, sys, time
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps(["srun", *sys.argv[1:]]) + "\n")
deadline = time.time() + 20
def sends():
    try:
        with open(os.environ["LOG"] + ".warned") as f:
            return len(f.read())
    except OSError:
        return 0
while sends() < int(os.environ.get("SENDS", "1")) and time.time() < deadline:
    time.sleep(0.05)
sys.exit(int(os.environ.get("SRUN_RC", "0")))
'''
LOGGING_TOOL = r'''#!{python}
import json, os, sys
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
if os.path.basename(sys.argv[0]) == "scancel":
    with open(os.environ["LOG"] + ".warned", "a") as f:
        f.write("x")
if sys.argv[1:2] != ["requeue"] and os.path.basename(sys.argv[0]) == "scontrol":
    os.execv(os.environ["REAL_SCONTROL"], [os.environ["REAL_SCONTROL"], *sys.argv[1:]])
'''


def _run_warned(tmp_path, spec_text: str, restart_count: str | None, srun_rc: int = 0, sends: int = 1,
                extra_env: dict | None = None, left: list | None = None):
    """Run the batch script, send it SIGUSR2 as slurmctld would (--signal=B:), return (rc, calls);
    ``left`` gets the processes of the script's group still alive the moment it exited."""
    spec = halo_sched.loads(spec_text)
    fakes = fake_bin(tmp_path)  # scontrol for the master address
    bindir = tmp_path / "bin2"
    bindir.mkdir()
    write_tool(bindir, "srun", SLOW_SRUN)
    write_tool(bindir, "scancel", LOGGING_TOOL)
    write_tool(bindir, "scontrol", LOGGING_TOOL)
    log = tmp_path / "calls.log"
    env = base_env(fakes, tmp_path)
    env.update(PATH=f"{bindir}:{env['PATH']}", LOG=str(log), REAL_SCONTROL=str(fakes / "scontrol"),
               SRUN_RC=str(srun_rc), SENDS=str(sends), FAKE_SLURM_NODES="a,b", SLURM_JOB_NODELIST="a,b", SLURM_JOB_ID="42",
               SLURM_JOB_CPUS_PER_NODE="8(x2)")
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = restart_count
    env.update(extra_env or {})
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 20
    while not (log.exists() and '"srun"' in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    if left is not None:
        proc.wait(timeout=30)  # a few lines of output: the pipes cannot fill meanwhile
        left += live_group_members(proc.pid)
    _, err = proc.communicate(timeout=30)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return proc.returncode, [c for c in calls if c[0] != "scontrol" or c[1] == "requeue"], err


def test_warning_is_forwarded_and_a_saved_run_requeues(tmp_path):
    rc, calls, err = _run_warned(tmp_path, MIN + "slurm: {requeue: true, max_requeues: 2}\n", "1")
    assert rc == 0, err
    # srun ran in the background; the trap passed the warning on to the steps as URG (each
    # node's entry hands USR2 to its ranks), then requeued.
    assert [c[0] for c in calls] == ["srun", "scancel", "scontrol"]
    assert calls[1][1:] == ["--signal=URG", "42"] and calls[2][1:] == ["requeue", "42"]
    assert "requeueing for run 3" in err


def test_the_warning_is_sent_again_for_a_node_that_was_not_running_yet(tmp_path):
    # The step ends only after the third send (1 s and 2 s after the first): the forward kept
    # trying, and stopped with srun (no send after it).
    left: list[int] = []
    rc, calls, err = _run_warned(tmp_path, MIN, None, sends=3, left=left)
    # The batch script and all it started are done when it exits (an orphaned sleep of the forward
    # would hold its output open until the next send's time, 4 s later).
    assert left == [], f"still running after the batch script exited: {left}"
    assert rc == 0, err
    assert [c[0] for c in calls] == ["srun", "scancel", "scancel", "scancel"], calls
    assert all(c[1:] == ["--signal=URG", "42"] for c in calls[1:])
    # Nothing of the batch script outlives it (the forward would send again 4 s later).
    time.sleep(0.2)
    marker = f"LOG={tmp_path / 'calls.log'}".encode()
    left = [p for p in os.listdir("/proc") if p.isdigit() and marker in _environ(p)]
    assert not left, left


def _environ(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def test_requeues_stop_at_max_requeues(tmp_path):
    rc, calls, err = _run_warned(tmp_path, MIN + "slurm: {requeue: true, max_requeues: 2}\n", "2")
    assert rc == 0 and [c[0] for c in calls] == ["srun", "scancel"], (calls, err)
    assert "max_requeues=2 reached" in err


def test_max_requeues_counts_this_jobs_requeues_not_the_runs_attempts(tmp_path):
    """The third attempt of a run (its successor's HALO_RUN_ATTEMPT=2), never requeued yet: the
    trainer's restart count is 2, and the job may still be requeued twice."""
    rc, calls, err = _run_warned(tmp_path, MIN + "retry: {attempts: 3}\nslurm: {requeue: true, max_requeues: 2}\n", None,
                                 extra_env={"HALO_RUN_ID": "41", "HALO_RUN_ATTEMPT": "2", "HALO_RUN_EXCLUDED": ""})
    assert rc == 0 and [c[0] for c in calls] == ["srun", "scancel", "scontrol"], (calls, err)
    assert "requeue 1 of slurm.max_requeues=2" in err, err


def test_a_rank_failing_after_the_warning_fails_the_job_without_requeue(tmp_path):
    rc, calls, err = _run_warned(tmp_path, MIN + "slurm: {requeue: true}\n", None, srun_rc=3)
    assert rc == 3 and [c[0] for c in calls] == ["srun", "scancel"], (calls, err)


def test_signal_goes_to_the_batch_shell():
    text = render_sbatch(halo_sched.loads(MIN + "slurm: {signal: 'SIGHUP@90'}\n"))
    # The batch shell's trap and forwarder are the node runtime's (halo_sched/node/batch.sh): the
    # script calls them with the warning signal and its carrier.
    assert "#SBATCH --signal=B:HUP@90" in text and "\nhalo_batch_warning HUP URG\n" in text and "trap '' HUP" in text
    # Each node's entry notes URG until its runtime is loaded, then hands it to halo_warning.
    assert "trap 'halo_warned_at=${halo_warned_at:-$SECONDS}' URG" in text and "\nhalo_warning_trap HUP URG\n" in text
    # URG is the only signal the batch script sends the steps: a server or torchrun ignores it.
    assert set(re.findall(r"\nhalo_batch_warning \w+ (\w+)\n", text)) == {"URG"}
    assert "scancel --signal=\"$halo_carrier\"" in (REPO / "halo_sched" / "node" / "batch.sh").read_text()
    assert "#SBATCH --signal=B:USR2" in render_sbatch(halo_sched.loads(MIN + "slurm: {signal: 'B:USR2'}\n"))
    assert "--signal" not in render_sbatch(halo_sched.loads(MIN)).split("set -eu")[0]


def _srun_args(tmp_path, spec_text: str, cwd=None, extra_env=None) -> list[str]:
    r, _ = run_sbatch(render_sbatch(halo_sched.loads(spec_text)), tmp_path, ["a", "b"], extra_env=extra_env)
    assert r.returncode == 0, r.stderr
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    return argv[: argv.index("bash")]


@pytest.mark.parametrize("extra, sbatch_cpus, srun_cpus", [
    # slurm.cpus_per_task unset: each rank a CPU of its own (2 ranks), four with GPUs (for the
    # DataLoader workers); without it, --ntasks-per-node=1 holds one CPU per node for all ranks.
    ("", 2, 2),
    ("gpus_per_node: 2\n", 8, 8),
    ("slurm: {cpus_per_task: 6}\ngpus_per_node: 2\n", 6, 6),
    # The whole node (exclusive), or CPUs by GPU: srun gets the fewest any node holds (72, 36).
    ("slurm: {exclusive: true}\n", None, 36),
    ("gpus_per_node: 2\nslurm: {extra_args: ['--cpus-per-gpu=3']}\n", None, 36),
])
def test_each_rank_gets_cpus_from_sbatch_and_srun(tmp_path, extra, sbatch_cpus, srun_cpus):
    text = render_sbatch(halo_sched.loads(MIN + extra))
    asked = re.findall(r"^#SBATCH --cpus-per-task=(\d+)$", text, re.M)
    assert asked == ([str(sbatch_cpus)] if sbatch_cpus else []), asked
    args = _srun_args(tmp_path, MIN + extra, extra_env={"SLURM_JOB_CPUS_PER_NODE": "72,36(x1)"})
    assert f"--cpus-per-task={srun_cpus}" in args, args


def test_too_few_cpus_per_rank_is_a_loud_warning(tmp_path):
    from halo_sched.layout import LayoutWarning

    with pytest.warns(LayoutWarning, match=r"slurm.cpus_per_task.*4 ranks per node share 2 CPUs"):
        halo_sched.loads(MIN.replace("nproc_per_node: 2", "nproc_per_node: 4") + "slurm: {cpus_per_task: 2}\n")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        halo_sched.loads(MIN + "slurm: {cpus_per_task: 2}\n")  # one each: no warning
        halo_sched.loads(MIN)
    # sbatch refuses --cpus-per-gpu beside --cpus-per-task: so does validate.
    from halo_sched.errors import SpecError

    with pytest.raises(SpecError, match="conflicts with slurm.cpus_per_task"):
        halo_sched.loads(MIN + "slurm: {cpus_per_task: 2, extra_args: ['--cpus-per-gpu=3']}\n")


# srun that only logs its argv (one JSON line per step) and exits 0.
LOG_SRUN = r'''#!{python}
import json, os, sys
with open(os.environ["LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
'''


def _steps(tmp_path, spec_text: str, job_id: str | None):
    """Run the batch script as job ``job_id`` with an srun that only logs: (process, [argv of each step])."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    fakes = fake_bin(tmp_path)
    write_tool(fakes, "srun", LOG_SRUN)
    env = base_env(fakes, tmp_path)
    env.update(LOG=str(tmp_path / "steps.log"), FAKE_SLURM_NODES="a,b,c,d", SLURM_JOB_NODELIST="a,b,c,d",
               SLURM_JOB_CPUS_PER_NODE="8(x4)", **({"SLURM_JOB_ID": job_id} if job_id is not None else {}))
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(halo_sched.loads(spec_text)))
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "steps.log"
    return r, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _master_port(steps: list[list[str]]) -> int:
    """The port the trainer step hands each task: halo-srun ADDR PORT ENTRY."""
    (argv,) = [a for a in steps if any("halo-entry" in x for x in a)]
    return int(argv[argv.index("halo-srun") + 2])


@pytest.mark.parametrize("job_id, port", [("7", 28507), ("1000", 28500), ("4242", 28742), ("4294967295", 28795)])
def test_an_unset_rendezvous_port_is_the_jobs_own(tmp_path, job_id, port):
    """rendezvous.port unset: 28500 + SLURM_JOB_ID % 1000, computed once in the batch script and
    handed to every node's task as the address is (the entry script stays the same text)."""
    r, steps = _steps(tmp_path, MIN, job_id)
    assert r.returncode == 0, r.stderr
    assert _master_port(steps) == port and f"master 127.0.0.1:{port}" in r.stderr


def test_a_set_rendezvous_port_is_honoured(tmp_path):
    r, steps = _steps(tmp_path, MIN + "rendezvous: {port: 29500}\n", "7")
    assert r.returncode == 0, r.stderr
    assert _master_port(steps) == 29500


def test_no_job_id_no_derived_port(tmp_path):
    r, steps = _steps(tmp_path, MIN, None)
    assert r.returncode == 1 and "cannot derive the master port" in r.stderr and "rendezvous.port" in r.stderr
    assert steps == []


def test_the_derived_port_steps_over_the_servers_ports(tmp_path):
    servers = ("servers: [{name: a, nodes: 1, command: [x], port: 28507, group_port: 28508},"
               " {name: b, nodes: 1, command: [y], port: 28509}]\n")
    for job_id, port in (("7", 28510), ("8", 28510), ("6", 28506), ("1010", 28510)):
        # (The stand-in server steps end at once, which ends the job: only the port matters here.)
        r, _ = _steps(tmp_path / job_id, MIN + servers, job_id)
        assert f"master 127.0.0.1:{port}" in r.stderr, r.stderr
    # Past the end of the range it wraps to its start.
    wrap = "servers: [{name: a, nodes: 1, command: [x], port: 29499}]\n"
    r, _ = _steps(tmp_path / "wrap", MIN + wrap, "999")
    assert "master 127.0.0.1:28500" in r.stderr, r.stderr


def test_pyxis_runs_in_the_mounted_submit_directory(tmp_path):
    image = MIN + "image: nvcr.io/nvidia/pytorch:25.01-py3\n"
    sub = tmp_path / "a"
    args = _srun_args(sub, image)
    # run_sbatch runs the script in the test's working directory: that is the submit directory.
    import os

    pwd = os.getcwd()
    assert f"--container-workdir={pwd}" in args and f"--container-mounts={pwd}:{pwd}" in args
    # A mount that already covers it is not doubled.
    args = _srun_args(tmp_path / "b", image + "slurm: {container_mounts: ['/:/host']}\n")
    assert f"--container-mounts=/:/host,{pwd}:{pwd}" in args
    args = _srun_args(tmp_path / "c", image + f"slurm: {{container_mounts: ['{pwd}:{pwd}']}}\n")
    assert f"--container-mounts={pwd}:{pwd}" in args
    # An explicit working directory inside the image: no submit-directory mount.
    args = _srun_args(tmp_path / "d", image + "slurm: {container_workdir: /workspace, container_mounts: ['/data:/data']}\n")
    assert "--container-workdir=/workspace" in args and "--container-mounts=/data:/data" in args
    args = _srun_args(tmp_path / "e", image + "slurm: {container_workdir: /workspace}\n")
    assert not any(a.startswith("--container-mounts") for a in args)



@pytest.mark.parametrize("odd", ["a,b", "a:b"])
def test_pyxis_refuses_a_submit_directory_its_mounts_cannot_carry(tmp_path, odd):
    submit = tmp_path / odd
    submit.mkdir()
    image = MIN + "image: nvcr.io/nvidia/pytorch:25.01-py3\n"
    r, started = run_sbatch(render_sbatch(halo_sched.loads(image)), tmp_path / "run", ["a", "b"], cwd=submit)
    err = r.stderr.decode()
    assert r.returncode == 1 and f"the submit directory {submit} contains ',' or ':'" in err, err
    assert "set slurm.container_workdir" in err, err
    assert not (tmp_path / "run" / "srun.log").exists() and not started  # refused before any step

# srun for the server-address probe: each task's output labelled "K: " as srun --label writes it;
# any other step only logs the server addresses it was started with.
PROBE_SRUN = r'''#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
opts = [a for a in args if a.startswith("--")]
nodes = int(next(a for a in opts if a.startswith("--nodes=")).split("=")[1])
if "halo-probe" in args:
    assert "--label" in opts
    for i in range(nodes):
        out = subprocess.run(args[len(opts):], env={{**os.environ, "SLURM_NODEID": str(i)}}, capture_output=True,
                             text=True).stdout
        sys.stdout.write("".join(f"{{i}}: {{line}}\n" for line in out.splitlines()))
else:
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps(os.environ.get("HALO_SERVER_VLLM_ADDRS")) + "\n")
'''
# ip -4 -o addr show dev IF: each node its own fabric address (10.9.0.K+1), none on node MISSING.
FAKE_IP = r'''#!/bin/bash
[ "${{SLURM_NODEID:-b}}" != "${{MISSING:-}}" ] || exit 0
echo "5: $6    inet 10.9.0.$((${{SLURM_NODEID:-0}} + 1))/24 brd 10.9.0.255 scope global $6\       valid_lft forever"
'''


@pytest.mark.parametrize("missing", [None, "1"])
def test_servers_take_their_address_on_the_interface_from_their_own_node(tmp_path, missing):
    spec = halo_sched.loads(MIN + "network: {interface: ib0}\n"
                            "servers: [{name: vllm, nodes: 2, command: [serve], port: 8000}]\n")
    fakes = fake_bin(tmp_path)
    write_tool(fakes, "srun", PROBE_SRUN)
    write_tool(fakes, "ip", FAKE_IP)
    log = tmp_path / "steps.log"
    env = base_env(fakes, tmp_path)
    env.update(LOG=str(log), FAKE_SLURM_NODES="a,b,c,d", SLURM_JOB_NODELIST="a,b,c,d", SLURM_JOB_ID="42",
               SLURM_JOB_CPUS_PER_NODE="8(x4)", **({"MISSING": missing} if missing else {}))
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec))
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    if missing:
        # The second server node (c... its task 1, host d) has no address there: named, nothing started.
        assert r.returncode == 1 and "network.interface ib0 has no IPv4 address on d (server vllm)" in r.stderr, r.stderr
        assert not log.exists()
        return
    # NodeAddr is 127.0.0.1 everywhere (the stand-in scontrol); the servers' own ib0 addresses win.
    assert json.loads(log.read_text().splitlines()[0]) == "10.9.0.1,10.9.0.2", (log.read_text(), r.stderr)


def test_each_task_drops_srun_task_variables_before_the_entry(tmp_path):
    """srun's one task per node gets SLURM_PROCID = node index, SLURM_NTASKS = nodes, ...: gone
    before torchrun; the job's variables stay."""
    gone = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS",
            "SLURM_TASK_PID", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_STEPID",
            "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE", "SLURM_CPU_BIND",
            "SLURM_CPU_BIND_LIST", "SLURM_SRUN_COMM_PORT"]
    kept = ["SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_CPUS_PER_NODE", "SLURM_NNODES", "SLURM_CPUS_ON_NODE",
            "HALO_SLURM_STEP_ID"]
    r, recs = run_sbatch(render_sbatch(halo_sched.loads(MIN)), tmp_path, ["a", "b"], env_names=gone + kept)
    assert r.returncode == 0, r.stderr
    assert sorted(recs) == [0, 1]
    for rank, rec in recs.items():
        assert f"--node_rank={rank}" in rec["argv"]
        assert sorted(rec["env_hex"]) == sorted(kept), rec["env_hex"]
        assert bytes.fromhex(rec["env_hex"]["SLURM_JOB_ID"]) == b"7"
