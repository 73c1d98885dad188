"""Shared test helpers: fake torchrun/srun/scontrol that record what a node would really run."""
from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The line of tests/trainers/hang.py where its stuck rank sleeps: the line a hang report names.
HANG_LINE = next(i for i, text in enumerate((REPO / "tests" / "trainers" / "hang.py").read_text().splitlines(), 1)
                 if "time.sleep(3600)  # the hang" in text)

HOSTILE = 'it\'s "q" $(cmd) ${HOME} %{x} {{ x }} \\ ü'
# Everything the layers between a job file and a rank could interpret: shell quoting and
# expansion, HCL interpolation, Go-template and Nomad runtime syntax, heredoc terminators.
HOSTILE_MORE = HOSTILE + "\n`date` $$ $HOME ${{x}} %%{y} \"\\\"\t\r\nHALO_ENTRY_EOF\nEOT\n[[halo-\n'"

FAKE_TORCHRUN = r'''#!{python}
import json, os, sys
out = os.environ["FAKE_TORCHRUN_DIR"]
args = sys.argv[1:]
rank = [a.split("=", 1)[1] for a in args if a.startswith("--node_rank=")][0]
names = os.environ.get("FAKE_TORCHRUN_ENV", "").split(",")
env = {{n: os.environb[n.encode()].hex() for n in names if n and n.encode() in os.environb}}
with open(os.path.join(out, "node%s.json" % rank), "w") as f:
    json.dump({{"argv": args, "env_hex": env, "cwd": os.getcwd()}}, f)
'''

# srun as SLURM runs it for us: one copy of the command per node, with the variables srun sets
# for each task (as a 2-node step of the test cluster's Slurm 22.05 printed them).
FAKE_SRUN = r'''#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
if os.environ.get("FAKE_SRUN_LOG"):
    with open(os.environ["FAKE_SRUN_LOG"], "a") as f:
        f.write(json.dumps(args) + "\n")
nodes, label = 1, False
while args and args[0].startswith("-"):
    a = args.pop(0)
    if a.startswith("--nodes="):
        nodes = int(a.split("=", 1)[1])
    label = label or a == "--label"
def start(i):
    env = {{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0", "SLURM_GTIDS": str(i),
           "SLURM_NTASKS": str(nodes), "SLURM_NPROCS": str(nodes), "SLURM_NTASKS_PER_NODE": "1",
           "SLURM_TASKS_PER_NODE": f"1(x{{nodes}})", "SLURM_TASK_PID": str(os.getpid()), "SLURM_STEP_ID": "0",
           "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes),
           "SLURM_STEP_TASKS_PER_NODE": f"1(x{{nodes}})", "SLURM_CPU_BIND": "quiet,mask_cpu:0x1",
           "SLURM_CPU_BIND_LIST": "0x1", "SLURM_SRUN_COMM_PORT": "39213", "SLURM_NNODES": str(nodes),
           "SLURM_CPUS_ON_NODE": "1"}}
    if not label:
        return subprocess.Popen(args, env=env)
    # --label: "K: " before each line of task K's output, as srun writes it.
    return subprocess.Popen(["bash", "-c", 'set -o pipefail; {{ "$@" 2>&1 1>&3 3>&- | sed "s/^/$0: /" >&2; }} 3>&1 | sed "s/^/$0: /"',
                             str(i), *args], env=env)
procs = [start(i) for i in range(nodes)]
sys.exit(max(p.wait() for p in procs))
'''

FAKE_SCONTROL = r'''#!{python}
import os, sys
nodes = os.environ["FAKE_SLURM_NODES"].split(",")
addrs = os.environ.get("FAKE_SLURM_ADDRS", ",".join(["127.0.0.1"] * len(nodes))).split(",")
a = sys.argv[1:]
if a[:2] == ["show", "hostnames"]:
    print("\n".join(nodes))
elif a[:3] == ["-o", "show", "node"]:
    for n, ad in zip(nodes, addrs):
        print(f"NodeName={{n}} Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 NodeAddr={{ad}} NodeHostName={{n}} Version=22.05.8 OS=Linux State=ALLOCATED")
else:
    sys.exit("fake scontrol: unsupported " + " ".join(a))
'''


def in_ci() -> bool:
    """Whether this run is CI's (CI=true, as .ci/run sets it): what a developer's machine may skip,
    CI must run, so a missing prerequisite there fails the test instead."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def write_tool(bindir: Path, name: str, body: str) -> Path:
    p = bindir / name
    p.write_text(body.format(python=sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def fake_bin(tmp: Path) -> Path:
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    write_tool(b, "torchrun", FAKE_TORCHRUN)
    write_tool(b, "srun", FAKE_SRUN)
    write_tool(b, "scontrol", FAKE_SCONTROL)
    return b


def base_env(bindir: Path, outdir: Path, env_names=()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALO_", "SLURM_", "NOMAD_"))}
    env["PATH"] = f"{bindir}:{env['PATH']}"
    env["FAKE_TORCHRUN_DIR"] = str(outdir)
    env["FAKE_TORCHRUN_ENV"] = ",".join(env_names)
    return env


def run_entry(entry: str, tmp: Path, node_env: dict, env: dict) -> subprocess.CompletedProcess:
    script = tmp / "entry.sh"
    script.write_text(entry)
    return subprocess.run(["bash", str(script)], env={**env, **node_env}, capture_output=True, text=True, timeout=60)


def records(outdir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(outdir.glob("node*.json"))}


# ---- ports --------------------------------------------------------------------------------------
# A port found free by binding and closing can be taken by anyone before the job binds it (torchrun
# binds the rendezvous port itself, so no socket can be handed over). Ports come instead from a
# range outside the kernel's ephemeral range (outgoing connections never take them), each reserved
# with an flock on /tmp/halo-test-ports/PORT.lock that every test process on this machine honours,
# and checked bindable. A test's reservations last until its end (conftest.py releases them).
PORT_LOCK_DIR = Path("/tmp/halo-test-ports")
_held: dict[int, object] = {}          # port -> its open, locked lock file
_test_ports: list[int] | None = None   # reservations of the running test (None: keep to the end)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def reserve_port(lo: int = 12000, hi: int = 20000, host: str = "127.0.0.1") -> int:
    """A port in [lo, hi) that no other test holds and nothing listens on, held for the test."""
    import fcntl
    import random
    import socket

    e_lo, e_hi = _ephemeral_range()
    candidates = [p for p in range(lo, hi) if not e_lo <= p <= e_hi and p not in _held]
    random.shuffle(candidates)
    PORT_LOCK_DIR.mkdir(exist_ok=True)
    for port in candidates:
        f = open(PORT_LOCK_DIR / f"{port}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds: TIME_WAIT is no obstacle
            try:
                s.bind((host, port))
            except OSError:
                f.close()
                continue
        _held[port] = f
        if _test_ports is not None:
            _test_ports.append(port)
        return port
    raise RuntimeError(f"no free port in {lo}-{hi} outside the ephemeral range {e_lo}-{e_hi}")


def free_port() -> int:
    """A free loopback port, reserved for the running test (see reserve_port)."""
    return reserve_port()


def release_test_ports() -> None:
    global _test_ports
    for port in _test_ports or []:
        f = _held.pop(port, None)
        if f is not None:
            f.close()
    _test_ports = None


def begin_test_ports() -> None:
    global _test_ports
    _test_ports = []


def slurm_env(cluster: dict, pythonpath: bool = False) -> dict:
    """The environment a test talks to the local SLURM cluster with: ``cluster``'s settings, and
    this venv first on PATH (sbatch exports the environment to the tasks: their torchrun is this
    venv's); with ``pythonpath``, this checkout on PYTHONPATH too."""
    e = dict(os.environ)
    e.update(cluster)
    e["PATH"] = f"{os.path.dirname(sys.executable)}:{e['PATH']}"
    if pythonpath:
        e["PYTHONPATH"] = str(REPO)
    return e


def until(pred, timeout: float, step: float = 0.5):
    """``pred()``'s first true value, asked every ``step`` seconds for up to ``timeout``; else None."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return None


def cli(*args, cwd=REPO, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would (python -m keeps it on this interpreter)."""
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def submit_with_no_client_left(job: Path, cwd: Path, env: dict, started: Path) -> str:
    """``submit JOB --backend slurm --wait``, killed (SIGKILL: no handler, nothing left waiting) once
    ``started`` holds two lines (each rank writes one when it starts); the run id it printed."""
    import re
    import signal

    sub = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "submit", str(job), "--backend", "slurm", "--wait"],
                           cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert until(lambda: started.exists() and len(started.read_text().splitlines()) >= 2, 120), \
            "the ranks never started"
    finally:
        sub.send_signal(signal.SIGKILL)
        _, err = sub.communicate(timeout=30)
    m = re.search(r"submitted ddp-cpu to slurm as (\d+)\n", err)
    assert m, err[-3000:]
    return m.group(1)


def example_job(tmp: Path, port: int, **overrides) -> Path:
    """examples/ddp-cpu.yaml with a free rendezvous port and test overrides, written to tmp."""
    import yaml

    data = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    # The example's script is relative to the example's directory, and this copy is elsewhere.
    data["trainer"]["script"] = str(REPO / "examples" / data["trainer"]["script"])
    data["rendezvous"]["port"] = port
    for key, value in overrides.items():
        data[key] = value
    patient_first_step(data)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


# A rank counts as hung before its first progress report after hang.first_step_s (2 x timeout_s by
# default). The suite's short timeouts (15-30 s) made that 30-60 s, and beside the rest of the suite on
# 2 cores a rank's `import torch` alone once took over 62 s (CI, 2026-12-06: the rig's retry ended HUNG in
# hang.py's import). Tests that set a short hang timeout for a hang after training began get 300 s for
# the first step; a test of the first step's bound names first_step_s itself.
SUITE_FIRST_STEP_S = 300


def patient_first_step(fields: dict) -> dict:
    """Give a job's ``hang`` (when the test set one) ``first_step_s: 300`` unless it names its own."""
    hang = fields.get("hang")
    if isinstance(hang, dict) and "first_step_s" not in hang:
        fields["hang"] = {**hang, "first_step_s": SUITE_FIRST_STEP_S}
    return fields


def load_nomad_helper(name: str):
    """Load tests/nomad/<name>.py. tests/nomad is not a package, and a top-level ``nomad`` may be
    another installed package (python-nomad), so the helpers load by path under names that cannot
    collide."""
    import importlib.util

    mod_name = f"halo_tests_nomad_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    path = REPO / "tests" / "nomad" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


#: The token the fake Nomad API is started with in the simulator tests (nomad_sim_job).
SIM_TOKEN = "tok-sim"


def loopback_hosts(n: int, names: list[str] | None = None) -> list:
    """``n`` client nodes of their own on this machine for the client simulator (client_sim.SimHost
    without a namespace, all at 127.0.0.1): each has its own node name and its own used ports. A
    halo-sched job's trainer allocations each reserve the rendezvous port, and ``distinct_hosts``
    puts them on distinct clients; on one simulated host a static port is reserved only once."""
    client_sim = load_nomad_helper("client_sim")
    return [client_sim.SimHost(name, enter=[], ip="127.0.0.1") for name in (names or [f"sim-{i}" for i in range(n)])]


@contextlib.contextmanager
def nomad_sim_job(tmp_path: Path, fields: dict, nodes: int = 2, hosts: list | None = None):
    """A job submitted to the fake Nomad API (tests/nomad/fake_api.py, the servers) whose
    allocations run for real in the client simulator (tests/nomad/client_sim.py, the clients) on
    ``nodes`` CPU nodes: the job file's ``fields`` over 2 processes a node, raw_exec, a free
    rendezvous port (60 s timeout) and one thread per rank. Yields (fake, scheduler, cluster,
    job id); the simulator's exits and logs come back through the API, nothing copied by hand.
    The client nodes are ``hosts`` (client_sim.SimHost, e.g. the multi-host rig's namespaces),
    else :func:`loopback_hosts`; each allocation runs on the host the fake's scheduler chose."""
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig
    from halo_sched.models import JobSpec

    fake_api, client_sim = load_nomad_helper("fake_api"), load_nomad_helper("client_sim")
    spec = JobSpec.model_validate({"nproc_per_node": 2, "env": {"OMP_NUM_THREADS": "1"},
                                   "rendezvous": {"port": free_port(), "timeout_s": 60},
                                   "nomad": {"driver": "raw_exec"}, **patient_first_step(dict(fields))})
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    hosts = hosts or loopback_hosts(nodes)
    names = [h.name for h in hosts]
    with fake_api.FakeNomad([fake_api.FakeNode(n, gpus=0) for n in names], token=SIM_TOKEN) as fake:
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=SIM_TOKEN, retry_attempts=1)))
        dry = sched.dryrun(spec)
        # As Scheduler.submit: a failure key, in the trainer tasks' Env as registered and in the record.
        from halo_sched import records
        from halo_sched.backends.base import failure_key_in_env, new_failure_key
        from halo_sched.backends.nomad import with_failure_key

        key = new_failure_key()
        with client_sim.SimCluster(with_failure_key(dry.payload, key)["Job"], tmp_path / "nomad",
                                   host_env=env, hosts=hosts) as cluster:
            fake.attach_sim(cluster)
            with failure_key_in_env(key):
                job_id = sched.schedule(dry)
            assert job_id == dry.payload["Job"]["ID"]
            records.record_submit("nomad", spec, dry.text, job_id, {**sched.record_fields(dry, job_id),
                                                                     "failure_key": key})
            yield fake, sched, cluster, job_id


def wait_dead(fake, sched, job_id: str, timeout: float) -> None:
    """Query the job as a watcher polls (the fake follows the simulator) until Nomad has it dead,
    at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sched.query([job_id])
        if fake.job_record(job_id)["Status"] == "dead":
            return
        time.sleep(0.5)


def live_group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (PID 1 here may never reap orphans)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def run_sbatch(script_text: str, tmp: Path, nodes: list[str], addrs: list[str] | None = None,
               env_names=(), nodelist: str | None = None, extra_env: dict | None = None, cwd: Path | None = None):
    """Run a rendered sbatch script as the batch step would (in ``cwd``, the submit directory: the
    test's own by default), with stand-in srun/scontrol (one task per node, SLURM_NODEID set in
    each) and a recording torchrun.
    Returns (the completed process, the records of the torchruns that started)."""
    tmp.mkdir(parents=True, exist_ok=True)
    bindir, out = fake_bin(tmp), tmp / "out"
    out.mkdir(exist_ok=True)
    script = tmp / "job.sbatch"
    script.write_text(script_text)
    env = base_env(bindir, out, env_names)
    env.update(FAKE_SLURM_NODES=",".join(nodes), SLURM_JOB_NODELIST=nodelist or ",".join(nodes), SLURM_JOB_ID="7",
               SLURM_JOB_CPUS_PER_NODE=f"4(x{len(nodes)})", FAKE_SRUN_LOG=str(tmp / "srun.log"))
    env.update(extra_env or {})
    if addrs:
        env["FAKE_SLURM_ADDRS"] = ",".join(addrs)
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60, cwd=cwd)
    return r, records(out)


def slurm_jwt(user: str = "root", env: dict | None = None) -> str:
    """A JWT for slurmrestd from the test cluster (``scontrol token``), acting as ``user``."""
    out = subprocess.run(["scontrol", "token", f"username={user}", "lifespan=600"], capture_output=True, text=True,
                         check=True, env=env).stdout
    return out.strip().split("=", 1)[1]


def stored_record(home, job_id: str) -> dict:
    """A job's record as the history store (``HOME/halo-sched.db``) holds it, read directly (with
    fields ``export`` leaves out, such as the failure key)."""
    import sqlite3

    con = sqlite3.connect(f"file:{Path(home) / 'halo-sched.db'}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    assert row is not None, f"no record of {job_id} in {home}"
    return json.loads(row[0])


def store_text(home) -> str:
    """Every byte of the history store under ``home`` (the database and its write-ahead log) and
    of the rendered texts beside it, as text to search for what must not be there (a local job's
    own output, under ``local/``, is the job's)."""
    home = Path(home)
    files = [*home.glob("halo-sched.db*"), *(home / "rendered").glob("*.rendered")]
    return "".join(p.read_bytes().decode("latin-1") for p in sorted(files) if p.is_file())


# ---- the library's pieces, put together as the tests need them ------------------------------------


def entry_script(spec) -> str:
    """The per-node entry script of ``spec``'s plan (launch.render_entry)."""
    from halo_sched.launch import compile_launch, render_entry

    return render_entry(compile_launch(spec))


def server_script(spec, role) -> str:
    """The entry of server role ``role`` (one of ``spec.servers``) in ``spec``'s plan."""
    from halo_sched.launch import compile_launch
    from halo_sched.servers import render_server

    launch = compile_launch(spec)
    return render_server(launch, launch.servers[spec.servers.index(role)])


def load_all(on_bad=None) -> list[dict]:
    """Every usable job record, newest first (``on_bad`` hears of each unusable one)."""
    from halo_sched import records

    return [r for r in records.page(0, on_bad=on_bad) if not isinstance(r, records.BadRecord)]


def legacy_record_path(job_id: str, backend: str) -> Path:
    """The file an earlier release kept a job's record in (records.import_files reads them)."""
    from urllib.parse import quote

    from halo_sched import records

    return records.jobs_dir() / f"{quote(job_id, safe='')}@{quote(backend, safe='')}.json"


def request_of(script: str, args=(), secret_names=()):
    """A request for a script written by hand: ``args`` (``--name[=value]``) are its options."""
    from halo_sched.backends.slurm.request import SbatchRequest

    return SbatchRequest(script=script, secret_names=tuple(secret_names)).with_options(*args)


def job_variable(job: dict, **items: str) -> dict[str, dict[str, str]]:
    """``SimCluster(variables=...)`` as submit leaves the job's Variable for a job with servers:
    the servers' shell (halo_sched/node/server.sh), which their tasks read from it, and ``items``
    (secrets). The node runtime is left out: the simulator's python has halo-sched."""
    from halo_sched.backends.nomad.names import variable_path
    from halo_sched.node_runtime import SERVER_ITEM, server_shell

    return {variable_path(job["ID"]): {SERVER_ITEM: server_shell(), **items}}


def scontrol_show_job(job_id: str, stdout: str, nodelist: str = "node[1-2]", workdir: str | None = None,
                      name: str = "job", state: str = "RUNNING") -> str:
    """``scontrol show job JOB`` as Slurm 22.05.8 prints it (its own layout, recorded on the test
    cluster; src/scontrol/info_job.c keeps it through 25.11): every line after the first indented,
    WorkDir, Comment and the Std* paths alone on theirs, whatever they hold."""
    workdir = workdir if workdir is not None else os.path.dirname(stdout)
    return (f"JobId={job_id} JobName={name}\n"
            "   UserId=root(0) GroupId=root(0) MCS_label=N/A\n"
            "   Priority=4294901756 Nice=0 Account=(null) QOS=(null)\n"
            f"   JobState={state} Reason=None Dependency=(null)\n"
            "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0\n"
            "   RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A\n"
            "   Partition=debug AllocNode:Sid=localhost:25525\n"
            "   ReqNodeList=(null) ExcNodeList=(null)\n"
            f"   NodeList={nodelist}\n"
            f"   BatchHost={nodelist.split('[')[0]}1\n"
            "   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*\n"
            "   TRES=cpu=2,node=2,billing=2\n"
            "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)\n"
            "   Command=(null)\n"
            f"   WorkDir={workdir}\n"
            "   Comment=halo-sched:tok There=x \n"
            f"   StdErr={stdout}\n"
            "   StdIn=/dev/null\n"
            f"   StdOut={stdout}\n"
            "   Power=\n"
            "   \n\n")
