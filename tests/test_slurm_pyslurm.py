"""The pyslurm transport: against a stand-in module that behaves as pyslurm 22.5.x does, and,
where pyslurm imports (built for this cluster's Slurm), against the real one on the local cluster.

The stand-in follows PySlurm/pyslurm at branch 22.5.x (commit 987ee72, after tag v22.5.3; the
same API through 25.11.x):
* ``pyslurm/core/job/submission.pxd``: the ``JobSubmitDescription`` attributes (any other
  raises AttributeError, as a cdef class does);
* ``pyslurm/core/job/submission.pyx``: ``submit()`` reads the script through
  ``_validate_batch_script`` (``Path(script).is_file()``: a path is read, text is taken as text,
  and text with a line longer than a file name may be raises OSError ENAMETOOLONG);
  ``_set_defaults`` (ntasks 1, environment "ALL" when empty); ``_set_environment`` (a dict is
  the job's environment plus every SLURM_* of the module's ``pyenviron``);
* ``pyslurm/core/job/sbatch_opts.pyx``: ``load_sbatch_options()`` takes a PATH (ValueError
  otherwise) and maps ``--partition`` to the missing attribute ``partition``;
* ``pyslurm/core/job/job.pyx``: ``Job(id).send_signal(signal, steps="children", hurry=False)``,
  ``Job.cancel()``, ``Jobs.load()``.
"""
from __future__ import annotations

import os
import re
import signal
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from halo_sched.backends.base import JobStatus
from halo_sched.backends.slurm.render import batch_request
from halo_sched.backends.slurm.request import SbatchRequest
from helpers import request_of
from halo_sched.backends.slurm.transport import PyslurmTransport
from halo_sched.errors import SchedulerError, UsageError
from halo_sched.launch import compile_launch
from halo_sched.spec import load, loads

REPO = Path(__file__).resolve().parent.parent

# submission.pxd (22.5.x) "cdef public" attributes.
ATTRIBUTES = frozenset("""
name account user_id group_id priority site_factor wckey array batch_constraints begin_time clusters
cluster_constraints comment admin_comment requires_contiguous_nodes cores_reserved_for_system
threads_reserved_for_system working_directory cpu_frequency nodes deadline delay_boot_time dependencies
excluded_nodes required_nodes constraints kill_on_node_fail licenses mail_user mail_types mcs_label
memory_per_cpu memory_per_node memory_per_gpu network nice log_files_open_mode overcommit partitions
power_options profile_types accounting_gather_frequency qos requires_node_reboot is_requeueable
reservations script script_args environment resource_sharing distribution time_limit time_limit_min
container cpus_per_task cpus_per_gpu sockets_per_node cores_per_socket threads_per_core gpus
gpus_per_socket gpus_per_task gres_per_node gpu_binding ntasks ntasks_per_node ntasks_per_socket
ntasks_per_core ntasks_per_gpu switches signal standard_in standard_output standard_error
kill_on_invalid_dependency spreads_over_nodes use_min_nodes gres_binding temporary_disk_per_node
get_user_environment min_cpus_per_node wait_all_nodes
""".split())


def fake_pyslurm(version: str = "22.5.3"):
    submitted: list[dict] = []
    sent: list[tuple] = []
    submission = types.SimpleNamespace(pyenviron=os.environ)

    class JobSubmitDescription:
        def __init__(self, **kwargs):
            for k in ATTRIBUTES:
                object.__setattr__(self, k, None)
            for k, v in kwargs.items():
                setattr(self, k, v)

        def __setattr__(self, key, value):
            if key not in ATTRIBUTES:
                raise AttributeError(f"'pyslurm.core.job.submission.JobSubmitDescription' object has no attribute '{key}'")
            object.__setattr__(self, key, value)

        def load_sbatch_options(self, overwrite=False):
            if not Path(self.script).is_file():
                raise ValueError("The script path you provided is not valid.")
            if "#SBATCH --partition" in Path(self.script).read_text():
                self.partition = "x"  # sbatch_opts.pyx: _SbatchOpt("p", "partition", "partition")

        def submit(self):
            script = self.script
            if Path(script).is_file():  # _validate_batch_script
                mode = stat.S_IMODE(os.stat(script).st_mode)
                script = Path(script).read_text()
            else:
                mode = None
            if isinstance(self.signal, str):  # _set_signal -> _parse_signal_str_to_dict -> signal_to_num
                name = re.split("[:@]+", self.signal)[1 if ":" in self.signal else 0]
                if not name.isnumeric() and name not in signal.Signals.__members__:
                    raise ValueError(f"Invalid Signal: {name}.")
            env = self.environment or "ALL"  # _set_defaults
            if isinstance(env, dict):  # _set_environment
                env = {**{k: v for k, v in submission.pyenviron.items() if k.startswith("SLURM_")}, **env}
            submitted.append({"attrs": {k: getattr(self, k) for k in ATTRIBUTES if getattr(self, k) is not None},
                              "script": script, "mode": mode, "path": self.script, "env": env,
                              "ntasks": self.ntasks or 1})
            return 100 + len(submitted)

    class Job:
        def __init__(self, job_id):
            self.id = job_id

        def send_signal(self, signal, steps="children", hurry=False):
            sent.append((self.id, signal, steps))

        def cancel(self):
            sent.append((self.id, "SIGKILL", "all"))

    class Jobs(dict):
        @staticmethod
        def load(preload_passwd_info=False, frozen=False):
            return Jobs()

    mod = types.SimpleNamespace(__version__=version, JobSubmitDescription=JobSubmitDescription, Job=Job, Jobs=Jobs,
                                RPCError=RuntimeError, submitted=submitted, sent=sent)
    mod.core = types.SimpleNamespace(job=types.SimpleNamespace(submission=submission))
    return mod


@pytest.fixture
def fake(monkeypatch):
    mod = fake_pyslurm()
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    return mod


def render_sbatch(spec) -> SbatchRequest:
    return batch_request(compile_launch(spec))


def example(name: str, **extra) -> SbatchRequest:
    text = (REPO / "examples" / f"{name}.yaml").read_text()
    return render_sbatch(loads(text + "".join(f"{k}: {v}\n" for k, v in extra.items())) if extra
                         else load(REPO / "examples" / f"{name}.yaml"))


def test_rendered_examples_are_submitted_with_every_option(fake):
    t = PyslurmTransport(cluster_version="22.05.8", environment={"PATH": "/bin"})
    for name in ("ddp-cpu", "ddp-gpu", "rl-servers"):
        req = example(name)
        text = req.script
        job_id = t.submit(req)
        sub = fake.submitted[-1]
        assert job_id == str(100 + len(fake.submitted))
        # The script reached pyslurm as a private file, removed after.
        assert sub["script"] == text and sub["mode"] == 0o600 and not os.path.exists(sub["path"])
        a = sub["attrs"]
        assert a["log_files_open_mode"] == "append" and a["standard_output"] == "halo-%x-%j.out"
        assert a["ntasks_per_node"] == 1 and a["ntasks"] == int(a["nodes"])  # as sbatch, not pyslurm's 1
    a = fake.submitted[1]["attrs"]  # ddp-gpu
    assert a["partitions"] == "gpu" and a["account"] == "ml-research" and a["time_limit"] == "04:00:00"
    assert a["gres_per_node"] == "gpu:8" and a["cpus_per_task"] == 64 and a["resource_sharing"] == "no"
    assert a["is_requeueable"] is False and a["signal"] == "B:SIGUSR2@120"
    assert fake.submitted[2]["attrs"]["nodes"] == "3"


def test_the_script_as_text_is_what_pyslurm_refuses(fake):
    """Why the file: given the rendered text, pyslurm looks for a file of that name."""
    text = example("ddp-gpu").script
    d = fake.JobSubmitDescription(script=text)
    with pytest.raises((OSError, ValueError)):
        d.load_sbatch_options()
    with pytest.raises(AttributeError, match="partition"):  # and with a path, its own table fails
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"halo-t-{os.getpid()}.sh"
        path.write_text(text)
        try:
            fake.JobSubmitDescription(script=str(path)).load_sbatch_options()
        finally:
            path.unlink()


def test_secret_env_job_gets_the_secret_and_no_other_token(fake, monkeypatch):
    """A job with secret_env has --export=ALL (on sbatch's command line): accepted. The job gets the
    secret and the rest of the submitter's environment, not its tokens; SLURM_JWT not even
    through pyslurm's own copy of every SLURM_* variable."""
    monkeypatch.setenv("SLURM_JWT", "jwt-of-the-submitter")
    env = {"PATH": "/bin", "HF_TOKEN": "hf", "NOMAD_TOKEN": "nomad", "SLURM_JWT": "jwt-of-the-submitter",
           "SLURM_CONF": "/etc/slurm.conf"}
    t = PyslurmTransport(cluster_version="22.05.8", environment=env)
    t.submit(example("ddp-cpu", secret_env="[HF_TOKEN]"))
    got = fake.submitted[-1]["env"]
    assert got["HF_TOKEN"] == "hf" and got["PATH"] == "/bin" and got["SLURM_CONF"] == "/etc/slurm.conf"
    assert "NOMAD_TOKEN" not in got and "SLURM_JWT" not in got
    assert fake.core.job.submission.pyenviron is os.environ  # restored


def test_options_pyslurm_cannot_take_are_refused_naming_the_field(fake):
    text = render_sbatch(loads((REPO / "examples" / "ddp-cpu.yaml").read_text()
                               + "slurm:\n  extra_args: ['--container-image=x', '--comment=fine']\n"))
    t = PyslurmTransport(cluster_version="22.05.8")
    with pytest.raises(UsageError, match=r"^slurm\.extra_args.*--container-image=x") as e:
        t.submit(text)
    assert "--comment" not in str(e.value) and not fake.submitted
    with pytest.raises(UsageError, match="local cluster only"):
        t.submit(request_of("#!/bin/bash\ntrue\n", ["--clusters=far"]))


# ---------------------------------------------------------------------------------------------
# The real pyslurm, where it imports: one built against this cluster's libslurm, on PYTHONPATH
# (nothing of it is in the repository).


def _real_pyslurm():
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        return False
    return True


real = pytest.mark.skipif(not _real_pyslurm(), reason="pyslurm is not importable here (it must be built "
                          "against this cluster's Slurm release; put the build on PYTHONPATH to run this)")


@real
@pytest.mark.slurm
@pytest.mark.torch
def test_real_pyslurm_runs_the_rendered_cpu_example(slurm_cluster, tmp_path, monkeypatch):
    import json

    from halo_sched.backends.slurm.transport import CliTransport
    from helpers import free_port, slurm_jwt

    monkeypatch.chdir(tmp_path)
    # A real JWT in this process: pyslurm then authenticates with it (auth/jwt is an AltType
    # here), and it must still not reach the job.
    monkeypatch.setenv("SLURM_JWT", slurm_jwt())
    reports = tmp_path / "reports"
    data = (REPO / "examples" / "ddp-cpu.yaml").read_text().replace("script: train_ddp.py", f"script: {REPO / 'examples' / 'train_ddp.py'}")
    data = data.replace("port: 29500", f"port: {free_port()}").replace(
        'args: ["--steps", "20"]', f'args: ["--steps", "5", "--report-dir", "{reports}", "--echo-env", "HF_TOKEN", '
                                   '"--echo-env", "SLURM_JWT", "--echo-env", "NOMAD_TOKEN"]')
    text = render_sbatch(loads(data + "secret_env: [HF_TOKEN]\n"))
    env = {**os.environ, "HF_TOKEN": "hf-value", "NOMAD_TOKEN": "nomad-value",
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    t = PyslurmTransport(environment=env)
    job_id = t.submit(text)
    try:
        deadline = time.monotonic() + 150
        while not (state := t.query([job_id])[job_id]).status.terminal:
            assert time.monotonic() < deadline, state
            time.sleep(1)
        assert state.status is JobStatus.COMPLETED and state.exit_code == 0 and state.nodes_total == 2, state
        ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(4)]
        assert sorted((x["rank"], x["node_rank"]) for x in ranks) == [(0, 0), (1, 0), (2, 1), (3, 1)]
        for x in ranks:
            assert bytes.fromhex(x["env_hex"]["HF_TOKEN"]) == b"hf-value"
            assert x["env_hex"]["SLURM_JWT"] == x["env_hex"]["NOMAD_TOKEN"] == ""
        info = CliTransport().job_info(job_id)
        assert info["JobName"] == "ddp-cpu" and info["NumTasks"] == "2"
        assert t.job_info(job_id)["StdOut"] == str(tmp_path / f"halo-ddp-cpu-{job_id}.out")
        print(f"ddp-cpu through pyslurm: job {job_id} COMPLETED")
    finally:
        t.cancel([job_id])


@real
@pytest.mark.slurm
def test_real_pyslurm_gpu_example_is_refused_and_a_held_job_cancelled(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = PyslurmTransport()
    data = (REPO / "examples" / "ddp-gpu.yaml").read_text()
    # This cluster has no GPUs (no GresTypes): slurmctld refuses the request, nothing is queued.
    on_this_cluster = data.replace("  partition: gpu\n", "").replace("  account: ml-research\n", "")
    with pytest.raises(SchedulerError, match="(?i)generic resource"):
        t.submit(render_sbatch(loads(on_this_cluster)))
    data = data.replace("gpus_per_node: 8", "gpus_per_node: 0").replace("nproc_per_node: 8", "nproc_per_node: 1")
    data = data.replace("  partition: gpu\n", "").replace("  account: ml-research\n", "").replace(
        "cpus_per_task: 64", "cpus_per_task: 2\n  extra_args: ['--hold']").replace("  interface: ib0\n", "")
    job_id = t.submit(render_sbatch(loads(data)))
    from halo_sched.backends.slurm.transport import CliTransport

    info = CliTransport().job_info(job_id)
    try:
        assert (info["JobState"], info["Reason"]) == ("PENDING", "JobHeldUser")
        assert info["TimeLimit"] == "04:00:00" and info["OverSubscribe"] == "NO" and info["CPUs/Task"] == "2"
        assert info["Requeue"] == "0" and info["NumTasks"] == "2"
    finally:
        t.cancel([job_id])
    deadline = time.monotonic() + 30
    while t.query([job_id])[job_id].status is not JobStatus.CANCELLED:
        assert time.monotonic() < deadline
        time.sleep(0.5)
