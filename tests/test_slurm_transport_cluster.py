"""The SLURM transports against the real local cluster (tests/cluster/slurm-cluster.sh).

Plain batch scripts, no torch. The time-limit job is submitted when the module starts and
checked last, so its ~60-90 s (SLURM enforces limits in whole minutes, checked every 30 s)
overlap the other tests. The ``slurm_cluster`` fixture comes from tests/conftest.py
(tests/cluster/fixtures.py).
"""
from __future__ import annotations

import subprocess
import time

import pytest

from halo_sched.backends.base import JobStatus
from halo_sched.backends.slurm.request import SbatchRequest
from helpers import request_of
from halo_sched.backends.slurm.transport import CliTransport, RestTransport, default_runner, rest_job_properties
from helpers import slurm_jwt

pytestmark = pytest.mark.slurm


class CountingRunner:
    def __init__(self):
        self.inner = default_runner()
        self.calls: list[list[str]] = []

    def __call__(self, argv, input=None):
        self.calls.append(list(argv))
        return self.inner(argv, input)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("slurm-jobs")


@pytest.fixture(scope="module")
def cli(slurm_cluster, workdir):
    t = CliTransport()
    t.submitted = []
    yield t
    # Nothing of ours keeps running after the module.
    if t.submitted:
        t.cancel(t.submitted)


def submit(t: CliTransport, workdir, body: str, *args: str) -> str:
    job_id = t.submit(request_of("#!/bin/bash\n" + body, [f"--chdir={workdir}", f"--output={workdir}/%j.out", *args]))
    t.submitted.append(job_id)
    return job_id


def wait_for(t, job_id: str, statuses: set[JobStatus], timeout: float, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        state = t.query([job_id])[job_id]
        if not seen or seen[-1] != state.status:
            seen.append(state.status)
        if state.status in statuses:
            return state, seen
        assert time.monotonic() < deadline, f"job {job_id} still {state.describe()} after {timeout}s (saw {seen})"
        time.sleep(interval)


@pytest.fixture(scope="module", autouse=True)
def timeout_job(cli, workdir):
    """Started first, checked last (test_time_limit_is_timeout)."""
    job_id = submit(cli, workdir, "sleep 600\n", "--time=1", "--job-name=halo-timeout")
    return job_id, time.monotonic()


def test_submit_running_then_completed(cli, workdir):
    job_id = submit(
        cli, workdir, "srun --ntasks-per-node=1 bash -c 'echo $SLURM_NODEID $(hostname)'\nsleep 3\n", "--nodes=2", "--ntasks-per-node=1"
    )
    running, _ = wait_for(cli, job_id, {JobStatus.RUNNING, JobStatus.COMPLETED}, 60)
    assert running.status is JobStatus.RUNNING, "the job finished before it was ever seen running"
    assert running.nodes_total == 2 and running.nodes_running == 2 and running.exit_code is None
    done, _ = wait_for(cli, job_id, {s for s in JobStatus if s.terminal}, 60)
    assert done.status is JobStatus.COMPLETED and done.exit_code == 0, done
    info = cli.job_info(job_id)
    assert info["NumNodes"] == "2" and info["StdOut"] == f"{workdir}/{job_id}.out"
    node_ids = sorted(line.split()[0] for line in open(info["StdOut"]).read().split("\n") if line.strip())
    assert node_ids == ["0", "1"]


def test_exit_3_is_failed_with_exit_code(cli, workdir):
    job_id = submit(cli, workdir, "echo failing\nexit 3\n")
    state, _ = wait_for(cli, job_id, {s for s in JobStatus if s.terminal}, 60)
    assert state.status is JobStatus.FAILED and state.exit_code == 3, state
    assert state.raw_state == "FAILED" and state.reason == "NonZeroExitCode"


def test_cancel_running_job(cli, workdir):
    job_id = submit(cli, workdir, "sleep 300\n")
    wait_for(cli, job_id, {JobStatus.RUNNING}, 60)
    cli.cancel([job_id])
    state, _ = wait_for(cli, job_id, {s for s in JobStatus if s.terminal}, 30)
    assert state.status is JobStatus.CANCELLED, state
    cli.cancel([job_id])  # cancelling a finished job is harmless


def test_query_many_ids_costs_at_most_3_calls(cli, workdir):
    ids = [submit(cli, workdir, "true\n", "--job-name=halo-tiny") for _ in range(40)]
    ids += list(cli.submitted[:3]) + ["999999", "999998"]  # earlier jobs (some finished), unknown ids
    counting = CountingRunner()
    t = CliTransport(runner=counting)  # fresh: this first poll also probes for accounting
    deadline = time.monotonic() + 120
    polls = 0
    while True:
        counting.calls.clear()
        states = t.query(ids)
        polls += 1
        assert set(states) == set(ids)
        assert len(counting.calls) <= 3, counting.calls
        tiny = [states[i] for i in ids[:40]]
        if all(s.status is JobStatus.COMPLETED for s in tiny):
            break
        assert time.monotonic() < deadline, [s.describe() for s in tiny if s.status is not JobStatus.COMPLETED]
        time.sleep(1)
    assert states["999999"].status is JobStatus.UNKNOWN
    assert t.accounting is False
    # A lone unknown id (squeue refuses it outright) is still answered within the budget.
    counting.calls.clear()
    assert t.query(["999999"])["999999"].status is JobStatus.UNKNOWN
    assert len(counting.calls) <= 3


def test_job_info_of_unknown_job(cli):
    from halo_sched.errors import SchedulerError

    with pytest.raises(SchedulerError, match="not known"):
        cli.job_info("999999")


def test_every_daemon_of_the_cluster_runs_in_its_state_directory(slurm_cluster):
    """A daemon keeps the directory it was started in. Started from a test run's checkout,
    slurmrestd outlived it (a shared cluster outlives runs) and died on the next run's first job
    submit ("getcwd failed"), failing every REST test of that run."""
    import os
    from pathlib import Path

    state = Path(slurm_cluster["SLURM_CONF"]).parent.parent
    daemons = {p.stem: int(p.read_text().split()[0]) for p in (state / "run").glob("*.pid")}
    assert any(name.startswith("slurmrestd") for name in daemons), daemons
    cwds = {name: os.readlink(f"/proc/{pid}/cwd") for name, pid in daemons.items()}
    assert all(c == "/" or c.startswith(f"{state}/") for c in cwds.values()), (state, cwds)


def test_rest_transport_with_jwt(cli, workdir, slurm_cluster):
    """slurmrestd 22.05 (v0.0.38) with a JWT acts as the token's user; the request's options
    become job properties (slurmrestd reads no #SBATCH line)."""
    rest = RestTransport(url=slurm_cluster["HALO_SLURMRESTD_URL"], token=slurm_jwt(), user="root")
    script = request_of("#!/bin/bash\nsrun bash -c 'echo $SLURM_NODEID'\nexit 4\n",
                        ["--job-name=halo-rest", "--nodes=2", "--ntasks-per-node=1", f"--chdir={workdir}",
                         f"--output={workdir}/rest-%j.out"])
    job_id = rest.submit(script)
    cli.submitted.append(job_id)
    state, _ = wait_for(rest, job_id, {s for s in JobStatus if s.terminal}, 60)
    assert state.status is JobStatus.FAILED and state.exit_code == 4 and state.nodes_total == 2
    # The CLI sees the same job, owned by root (the token's user), with the script's options.
    info = cli.job_info(job_id)
    assert info["UserId"].startswith("root(") and info["JobName"] == "halo-rest"
    assert info["StdOut"] == f"{workdir}/rest-{job_id}.out"
    assert sorted(open(info["StdOut"]).read().split()) == ["0", "1"]

    sleeper = rest.submit(request_of("#!/bin/bash\nsleep 300\n", [f"--chdir={workdir}", f"--output={workdir}/rest-%j.out"]))
    cli.submitted.append(sleeper)
    wait_for(rest, sleeper, {JobStatus.RUNNING}, 60)
    rest.cancel([sleeper])
    state, _ = wait_for(cli, sleeper, {s for s in JobStatus if s.terminal}, 30)
    assert state.status is JobStatus.CANCELLED
    assert rest.query(["999999"])["999999"].status is JobStatus.UNKNOWN


def test_rest_transport_local_auth_reads(cli, slurm_cluster):
    """rest_auth/local over the unix socket: accepted for root, no token; it reads every job."""
    rest = RestTransport(socket_path=slurm_cluster["HALO_SLURMRESTD_SOCKET"], token="")
    ids = cli.submitted[:3]
    from_rest = rest.query(ids)
    from_cli = cli.query(ids)
    assert {i: s.status for i, s in from_rest.items()} == {i: s.status for i, s in from_cli.items()}


def test_time_limit_is_timeout(cli, timeout_job):
    job_id, submitted = timeout_job
    state, seen = wait_for(cli, job_id, {s for s in JobStatus if s.terminal}, 150, interval=1)
    assert state.status is JobStatus.TIMEOUT, (state, seen)
    assert state.reason == "TimeLimit"
    print(f"time-limit job {job_id}: TIMEOUT {time.monotonic() - submitted:.0f}s after submission")


# ---------------------------------------------------------------------------------------------
# A job on a named cluster (sbatch --clusters)

# The real clients resolve --clusters through slurmdbd (src/common/slurmdb_defs.c,
# slurmdb_get_info_cluster) and this test cluster has no accounting, so every one of them fails
# with "Problem talking to database" (test_real_clients_need_slurmdbd_for_clusters). This
# wrapper stands in for a client run with --clusters=halo on a cluster that has slurmdbd: it
# drops --clusters=halo (the one cluster there is; from sbatch's script too) and prints what the
# real client prints with it: sbatch --parsable appends ";halo" (src/sbatch/sbatch.c), squeue
# without --noheader starts with "CLUSTER: halo" (src/squeue/squeue.c _multi_cluster). Another
# cluster name fails as the real client does. Every call is logged, so the test can check that
# no call for the job went without --clusters.
CLUSTER_SHIM = r"""#!/bin/bash
name=$(basename "$0")
echo "$name $*" >>"$SHIM_LOG"
cluster= args=()
for a in "$@"; do case $a in --clusters=*) cluster=${a#*=} ;; *) args+=("$a") ;; esac; done
if [[ $name == sbatch ]]; then
    script=$(cat)
    from_script=$(sed -n 's/^#SBATCH --clusters=\([^ ]*\)$/\1/p' <<<"$script" | head -n1)
    cluster=${cluster:-$from_script}
    script=$(sed '/^#SBATCH --clusters=/d' <<<"$script")
fi
if [[ -n $cluster && $cluster != halo ]]; then
    echo "$name: error: '$cluster' can't be reached now, or it is an invalid entry for --cluster.  Use 'sacctmgr list clusters' to see available clusters." >&2
    exit 1
fi
real=REALDIR/$name
if [[ $name == sbatch ]]; then
    out=$("$real" "${args[@]}" <<<"$script") || exit $?
    if [[ -n $cluster && " ${args[*]} " == *" --parsable "* ]]; then echo "$out;$cluster"; else echo "$out"; fi
    exit 0
fi
if [[ $name == squeue && -n $cluster && " ${args[*]} " != *" --noheader "* ]]; then echo "CLUSTER: $cluster"; fi
exec "$real" "${args[@]}"
"""


@pytest.fixture
def cluster_shim(tmp_path, monkeypatch, slurm_cluster):
    import os
    import shutil

    real = os.path.dirname(shutil.which("sbatch"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "scontrol", "scancel", "sacct"):
        (bin_dir / name).write_text(CLUSTER_SHIM.replace("REALDIR", real))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("SHIM_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_real_clients_need_slurmdbd_for_clusters(cli, workdir):
    """Why the end-to-end test below needs its stand-in: sbatch --clusters fails on a cluster
    without slurmdbd, and halo-sched passes sbatch's own words on."""
    from halo_sched.errors import SchedulerError

    with pytest.raises(SchedulerError, match="(?s)sbatch failed .*'halo' can't be reached"):
        cli.submit(request_of("#!/bin/bash\ntrue\n", ["--clusters=halo", f"--chdir={workdir}"]))


def test_job_on_a_named_cluster_submit_status_wait_cancel(cli, workdir, cluster_shim, tmp_path):
    """slurm.extra_args: ["--clusters=halo"] from the job file to the end of the job: the id
    carries the cluster, and status, wait and cancel (CLI and Python API) all reach the job."""
    import os
    import sys

    import halo_sched
    from halo_sched.backends.slurm.render import render_sbatch
    from halo_sched.spec import loads

    spec = loads("name: far\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\nslurm: {extra_args: ['--clusters=halo']}\n")
    assert "#SBATCH --clusters=halo\n" in render_sbatch(spec)  # the option reaches sbatch (and its header)

    t = CliTransport()
    opts = ["--clusters=halo", f"--chdir={workdir}", f"--output={workdir}/%j.out"]
    short = t.submit(request_of("#!/bin/bash\nsleep 2\nexit 0\n", opts))
    long_ = t.submit(request_of("#!/bin/bash\nsleep 300\n", opts))
    cli.submitted += [split(short), split(long_)]
    assert short.startswith("halo:") and long_.startswith("halo:")

    # Job.wait() follows the job to its end: before, an id without its cluster read UNKNOWN and
    # the wait returned at once.
    started = time.monotonic()
    done = halo_sched.job(short, "slurm").wait(timeout=60)
    assert done.status is JobStatus.COMPLETED and done.exit_code == 0 and done.id == short, done
    assert time.monotonic() - started >= 1.5

    env = dict(os.environ)
    run = lambda *a: subprocess.run([sys.executable, "-m", "halo_sched.cli", *a, "--backend", "slurm"],  # noqa: E731
                                    capture_output=True, text=True, env=env, timeout=120)
    wait_for(t, long_, {JobStatus.RUNNING}, 60)
    # status asks for at most 10 s (outage.ASK_BOUND_S) through this bash shim; beside the whole
    # suite on 2 cores one run had its squeue cut at 0.5 s. What is checked here is where the calls
    # go, not how fast: a call cut by that bound is asked again (at most twice).
    for _ in range(3):
        status = run("status", long_, short)
        if status.returncode == 0 or "timed out" not in status.stderr:
            break
    lines = status.stdout.splitlines()
    assert status.returncode == 0 and lines[0].startswith(f"{long_}\tRUNNING") and lines[1] == f"{short}\tCOMPLETED exit=0", status
    assert run("cancel", long_).returncode == 0
    watched = run("watch", long_, "--quiet")
    assert watched.returncode == 1 and "CANCELLED" in watched.stderr, watched

    calls = [line.split() for line in cluster_shim.read_text().splitlines()]
    for call in calls:
        assert "--clusters=halo" in call or call[0] == "sbatch", f"a call went to the local cluster without --clusters: {call}"
    assert {c[0] for c in calls} >= {"sbatch", "squeue", "scancel"}


def split(job_id: str) -> str:
    from halo_sched.backends.slurm.transport import split_cluster

    return split_cluster(job_id)[1]


# ---------------------------------------------------------------------------------------------
# The rendered examples through slurmrestd 22.05 (v0.0.38), for real

SECRET = "hf-value-for-the-ranks"
FOREIGN = {"NOMAD_TOKEN": "nomad-token-not-for-the-job", "AWS_SECRET_ACCESS_KEY": "aws-key-not-for-the-job"}


def example(name: str, tmp_path, **overrides) -> str:
    """examples/NAME.yaml rendered by halo-sched with what the local cluster needs (a free port,
    the trainer by absolute path) and ``overrides``; returns the job file's path."""
    import yaml

    from helpers import REPO, free_port

    data = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    data["rendezvous"]["port"] = free_port()
    if "script" in data.get("trainer", {}):
        data["trainer"]["script"] = str(REPO / "examples" / "train_ddp.py")
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rendered(path: str) -> SbatchRequest:
    from halo_sched.backends.slurm.render import batch_request
    from halo_sched.launch import compile_launch
    from halo_sched.spec import load

    return batch_request(compile_launch(load(path)))


@pytest.fixture
def rest(slurm_cluster, workdir, monkeypatch):
    """The JWT slurmrestd, submitting from ``workdir`` as root."""
    monkeypatch.chdir(workdir)
    return RestTransport(url=slurm_cluster["HALO_SLURMRESTD_URL"], token=slurm_jwt(), user="root")


def test_slurm_takes_the_request_not_the_scripts_header(cli, rest, workdir):
    """A script whose #SBATCH lines say otherwise: sbatch (the options on its command line win
    over the script's) and slurmrestd (it reads no #SBATCH line) both queue the request's job.
    sbatch still reads a header line the request has no option for (--hold here); a rendered
    script's header is the request's own (tests/test_slurm_request.py)."""
    script = "#!/bin/bash\n#SBATCH --job-name=liar --time=1 --comment=lie\n#SBATCH --hold\ntrue\n"
    req = request_of(script, ["--job-name=halo-honest", "--time=7", "--comment=honest", f"--chdir={workdir}",
                              f"--output={workdir}/%j.out", "--begin=now+1hour"])
    for t in (cli, rest):
        job_id = t.submit(req)
        cli.submitted.append(job_id)
        info = cli.job_info(job_id)
        t.cancel([job_id])
        assert (info["JobName"], info["TimeLimit"], info["Comment"]) == ("halo-honest", "00:07:00", "honest"), t
        assert info["Reason"] == ("JobHeldUser" if t is cli else "BeginTime"), (t, info["Reason"])


@pytest.mark.torch
def test_rest_runs_the_rendered_cpu_example_to_its_end(cli, slurm_cluster, tmp_path):
    """examples/ddp-cpu.yaml (with a secret) through `halo-sched submit --wait` on the rest
    transport: 2 nodes x 2 ranks form one world and complete; the ranks get the secret, and no
    other token of the submitter (SLURM_JWT included) reaches the job."""
    import json
    import os
    import sys

    from helpers import cli as run_cli

    reports = tmp_path / "reports"
    job = example("ddp-cpu", tmp_path, secret_env=["HF_TOKEN"], trainer={
        "args": ["--steps", "5", "--report-dir", str(reports), "--echo-env", "HF_TOKEN", "--echo-env", "SLURM_JWT",
                 "--echo-env", "NOMAD_TOKEN", "--echo-env", "AWS_SECRET_ACCESS_KEY"]})
    env = {**os.environ, **slurm_cluster, **FOREIGN, "HF_TOKEN": SECRET, "HALO_SLURM_TRANSPORT": "rest",
           "SLURM_JWT": slurm_jwt(), "SLURM_JWT_USER": "root",
           # the ranks' torchrun is this venv's (the job's PATH is the submitter's)
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    env.pop("HALO_SLURMRESTD_SOCKET", None)
    r = run_cli("submit", job, "--backend", "slurm", "--wait", cwd=tmp_path, env=env, timeout=240)
    job_id = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if job_id.isdigit():
        cli.submitted.append(job_id)
    assert r.returncode == 0, r.stderr
    assert "RUNNING on 2 nodes" in r.stderr and "COMPLETED" in r.stderr
    ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(4)]
    assert sorted((x["rank"], x["node_rank"]) for x in ranks) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    for x in ranks:
        assert bytes.fromhex(x["env_hex"]["HF_TOKEN"]).decode() == SECRET
        assert x["env_hex"]["SLURM_JWT"] == x["env_hex"]["NOMAD_TOKEN"] == x["env_hex"]["AWS_SECRET_ACCESS_KEY"] == ""
    info = cli.job_info(job_id)
    assert info["JobName"] == "ddp-cpu" and info["JobState"] == "COMPLETED" and info["NumNodes"] == "2"
    assert info["StdOut"] == str(tmp_path / f"halo-ddp-cpu-{job_id}.out")
    assert "master 127.0.0.1:" in open(info["StdOut"]).read()
    print(f"ddp-cpu through slurmrestd v0.0.38: job {job_id} COMPLETED")


def test_rest_gpu_examples_are_refused_by_this_cluster_and_their_options_land(cli, rest, workdir, tmp_path):
    """ddp-gpu and rl-servers, rendered as they are, ask for 8 GPUs per node: slurmrestd 22.05
    (24.11: slurmctld) checks GRES itself (slurm_opt.c gres_job_state_validate: "Invalid generic resource (gres)
    specification" in its log) and this cluster has none, so nothing is queued. The same job
    without GPUs and held shows every other option of ddp-gpu arrived: time limit, exclusive,
    CPUs per task, no requeue, the output file in append mode."""
    from halo_sched.errors import SchedulerError

    seen = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i"], capture_output=True, text=True).stdout.split()
    gres = (r"HTTP 400: Failure during parsing.*GPU|"  # 22.05, v0.0.38 (the reason in its log; the transport adds it)
            r"HTTP (?:500|422): Invalid generic resource \(gres\) specification")  # 24.11 (v0.0.42): 500, 26.05 (v0.0.44): 422
    for name in ("ddp-gpu", "rl-servers"):
        # As rendered: 24.11+ refuse the partition (gpu: not on this cluster) before the GPUs.
        with pytest.raises(SchedulerError, match=gres + r"|HTTP (?:500|422): Invalid partition name specified"):
            rest.submit(rendered(example(name, tmp_path)))
        # In this cluster's partition: the GPUs are what is refused, by every release.
        with pytest.raises(SchedulerError, match=gres):
            rest.submit(rendered(example(name, tmp_path, slurm={"partition": None, "account": None})))
    after = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert set(after) - set(seen) == set(), "a refused job was queued"

    job = example("ddp-gpu", tmp_path, gpus_per_node=0, nproc_per_node=1, network={"interface": None},
                  slurm={"partition": None, "account": None, "cpus_per_task": 2, "extra_args": ["--hold"]})
    text = rendered(job)
    assert text.has("exclusive") and text.has("no-requeue") and text.get("signal") == ("B", "USR2", 120)
    job_id = rest.submit(text)
    cli.submitted.append(job_id)
    info = cli.job_info(job_id)
    assert (info["JobState"], info["Reason"]) == ("PENDING", "JobHeldUser")
    assert info["TimeLimit"] == "04:00:00" and info["OverSubscribe"] == "NO" and info["CPUs/Task"] == "2"
    assert info["Requeue"] == "0" and info["NumNodes"] in ("2", "2-2") and info["JobName"] == "ddp-gpu"
    assert info["StdOut"] == f"{workdir}/halo-ddp-gpu-{job_id}.out"
    rest.cancel([job_id])
    assert wait_for(cli, job_id, {JobStatus.CANCELLED}, 30)[0].status is JobStatus.CANCELLED


def test_rest_requeue_options_reach_slurmctld(cli, rest, workdir):
    """slurmrestd 22.05 takes "requeue": false and ignores it; "no_requeue" (sbatch's
    --no-requeue, v0.0.38 jobs.c) is what the transport sends, and it wins over an earlier
    "requeue". The cluster's JobRequeue=0 makes 0 the default, hence "requeue" first. From
    v0.0.40 (24.11 here) "requeue" is a boolean and false is kept. The version is the one the
    transport chose from this slurmrestd's /openapi/v3 (22.05: v0.0.38; 24.11: v0.0.42)."""
    version = rest._version()
    typed = version != "v0.0.38"

    def held(job: dict) -> str:
        desc = {"environment": ["PATH=/usr/bin:/bin"] if typed else {"PATH": "/usr/bin:/bin"}, "hold": True,
                "current_working_directory": str(workdir), **job}
        script = "#!/bin/bash\ntrue\n"
        body = {"job": {**desc, "script": script}} if typed else {"script": script, "job": desc}
        job_id = str(rest._request("POST", f"/slurm/{version}/job/submit", body, retry=False)["job_id"])
        cli.submitted.append(job_id)
        requeue = cli.job_info(job_id)["Requeue"]
        rest.cancel([job_id])
        return requeue

    script = request_of("#!/bin/bash\n", ["--requeue", "--no-requeue"])
    if typed:
        assert held({"requeue": True}) == "1"
        assert held({"requeue": False}) == "0"
        assert rest_job_properties(script, environment={}, api_version=version)["requeue"] is False
        return
    assert held({"requeue": "yes"}) == "1"
    assert held({"requeue": "yes", "no_requeue": True}) == "0"
    job = rest_job_properties(script, environment={})
    assert job["no_requeue"] is True and "requeue" not in job


def test_rest_version_choice_passes_over_a_version_the_server_lacks(cli, rest, workdir, monkeypatch):
    """Each release drops its oldest data_parser (26.05 serves v0.0.42-45 and no v0.0.41; the
    26.11 branch has no v0.0.42): the choice reads what this slurmrestd offers and takes the
    first spoken one it has. With a preferred list that starts with a version this server lacks,
    the choice passes over it to the same served version, which submits, answers and cancels; a
    pinned version it lacks is refused naming the version and the releases that serve it."""
    from cluster.cluster import slurm_version

    from halo_sched.backends.slurm.transport import rest as rest_module
    from halo_sched.errors import MissingDependency

    offered = {p.split("/")[2] for p in rest._request("GET", "/openapi/v3").get("paths") or {}
               if p.startswith("/slurm/v")}
    chosen = rest._version()
    expected = {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}.get(slurm_version())
    assert chosen == (expected or chosen) and chosen in offered, (chosen, sorted(offered))
    lacking = next(v for v in rest_module.API_VERSIONS if v not in offered)
    monkeypatch.setattr(rest_module, "API_VERSIONS",
                        (lacking, *(v for v in rest_module.API_VERSIONS if v != lacking)))
    fresh = RestTransport(url=rest.url, token=rest.token, user="root", api_version="auto")
    # v0.0.45 carries --cores-per-socket again (JOB_DESC_MSG, parsers.c slurm-26-05-3-1), which
    # v0.0.41-44 have no field for: slurmctld gets it as sbatch's would.
    extra = ["--cores-per-socket=1"] if chosen == "v0.0.45" else []
    job_id = fresh.submit(request_of("#!/bin/bash\ntrue\n", ["--hold", "--job-name=halo-fallthrough",
                                                                f"--chdir={workdir}", *extra]))
    cli.submitted.append(job_id)
    assert fresh.api_version == chosen
    if extra:
        assert cli.job_info(job_id)["ReqB:S:C:T"] == "0:0:1:*"
    assert fresh.query([job_id])[job_id].status is JobStatus.PENDING
    fresh.cancel([job_id])
    assert wait_for(cli, job_id, {JobStatus.CANCELLED}, 30)[0].status is JobStatus.CANCELLED
    pinned = RestTransport(url=rest.url, token=rest.token, user="root", api_version=lacking, retries=1)
    with pytest.raises(MissingDependency, match=rf"does not offer API {lacking} \(HALO_SLURMRESTD_API\)"):
        pinned.query([job_id])
    print(f"Slurm {slurm_version()}: offers {', '.join(sorted(offered))}; chose {chosen}, and {chosen} "
          f"again with {lacking} (not served) preferred first")


@pytest.mark.torch
def test_rest_v38_time_limit_warning_reaches_every_rank(cli, rest, workdir, tmp_path):
    """slurm.signal through slurmrestd 22.05: it refuses "B:", so the steps get URG at the
    warning time (job_mgr.c send_job_warn_signal without KILL_JOB_BATCH: steps only), which each
    node's entry takes as the warning and hands to its ranks as USR2. time=3, USR2@120: the warning
    comes 30-60 s after the start (the end at most warn time + 30 s away), leaving the ranks 120 s to
    save and exit 0 (60 s, with time=2 and USR2@60, was too little beside the whole suite: TIMEOUT),
    and the job completes."""
    import json
    import os
    import sys

    reports = tmp_path / "reports"
    job = example("ddp-cpu", tmp_path, slurm={"time": "3", "signal": "USR2@120", "cpus_per_task": 2}, trainer={
        "args": ["--steps", "100000", "--step-time", "0.2", "--report-dir", str(reports),
                 "--checkpoint-dir", str(tmp_path / "ckpt")]})
    rest.environment = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    job_id = rest.submit(rendered(job))
    cli.submitted.append(job_id)
    assert cli.job_info(job_id)["TimeLimit"] == "00:03:00"
    state, _ = wait_for(rest, job_id, {s for s in JobStatus if s.terminal}, 270, interval=2)
    out = open(f"{workdir}/halo-ddp-cpu-{job_id}.out").read()
    assert state.status is JobStatus.COMPLETED and state.exit_code == 0, (state, out[-3000:])
    ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(4)]
    assert all(x["stopped"] and x["saved_step"] == ranks[0]["saved_step"] for x in ranks), ranks
    # Each node's entry names the ranks it hands the warning to. A rank that had already stopped with
    # the others (one node's warning came first, and the all_reduce stops every rank) may have exited
    # before its own node's entry read its rank ("SIGUSR2 to rank ? (pid N)"): beside the whole suite
    # node 1's entry handed it on 1 s after node 0's, its ranks gone (24.11, 2026-12-07).
    assert any(x["warnings"] for x in ranks), ranks
    assert all(f"SIGUSR2 to rank {x['rank']} (pid" in out or (x["stopped"] and not x["warnings"]) for x in ranks), \
        (ranks, out[-3000:])
    print(f"v0.0.38 warning: job {job_id} COMPLETED after the ranks saved at step {ranks[0]['saved_step']}")
