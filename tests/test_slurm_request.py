"""The typed sbatch request (halo_sched/backends/slurm/request.py): the script's #SBATCH header
is written from it, and each transport sends what it says, whatever the script's text says: a
script whose #SBATCH lines lie changes nothing any transport asks of SLURM."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import halo_sched
from halo_sched.backends.slurm.render import batch_request
from halo_sched.backends.slurm.request import SbatchRequest
from helpers import request_of
from halo_sched.backends.slurm.transport import CliTransport, PyslurmTransport, RestTransport, rest_job_properties
from halo_sched.launch import compile_launch
from halo_sched.sbatch_options import OPTIONS, SHORT, parse_setting
from halo_sched.spec import load, loads
from slurmrestd_stub import Slurmrestd
from test_slurm_pyslurm import fake_pyslurm

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ("ddp-cpu", "ddp-gpu", "rl-servers")
# Every option a header could lie about, in both spellings sbatch reads.
LIES = ("#SBATCH --job-name=liar -N 9 --partition=evil --time=1 --mem=1T --export=NONE\n"
        "#SBATCH --clusters=far --gpus-per-node=0 -o /tmp/elsewhere --no-requeue --comment=lie\n")


def request(name: str, extra: str = "") -> SbatchRequest:
    spec = loads((REPO / "examples" / f"{name}.yaml").read_text() + extra) if extra else \
        load(REPO / "examples" / f"{name}.yaml")
    return batch_request(compile_launch(spec))


def lying(req: SbatchRequest) -> SbatchRequest:
    """The same request with a script whose #SBATCH header says something else."""
    body = "".join(line for line in req.script.splitlines(keepends=True) if not line.startswith("#SBATCH"))
    first, _, rest = body.partition("\n")
    return req.with_script(first + "\n" + LIES + rest)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_header_is_the_requests_directives(name):
    req = request(name, "secret_env: [HF_TOKEN]\n")
    header = [line[len("#SBATCH "):] for line in req.script.splitlines() if line.startswith("#SBATCH")]
    assert header == [s.text() for s in req.directives()]
    # --export=ALL goes on sbatch's command line only (a submitter's SBATCH_EXPORT beats #SBATCH).
    assert req.get("export") == "ALL" and "--export=ALL" not in header and "--export=ALL" in req.arguments()


def _runner(calls):
    def run(argv, input=None):
        calls.append((list(argv), input))
        return subprocess.CompletedProcess(argv, 0, "42\n", "")
    return run


@pytest.mark.parametrize("name", EXAMPLES)
def test_cli_puts_every_option_of_the_request_on_sbatchs_command_line(name):
    """sbatch takes a command-line option over the script's #SBATCH line: what it is asked is the
    request's, whatever the header says."""
    req = request(name)
    calls: list = []
    t = CliTransport(runner=_runner(calls))
    t.submit(req)
    t.submit(lying(req))
    t.test_only(lying(req))
    t.submit_once(lying(req), token="tok")
    (honest, script), (lied, lie), (tested, _), (once, _) = calls
    assert honest == lied == ["sbatch", "--parsable", *req.arguments()] and script == req.script and lie != script
    assert tested == ["sbatch", "--test-only", *req.arguments()]
    assert once == ["sbatch", "--parsable", *req.arguments(), "--comment=halo-token:tok"]
    assert {f"--{s.text()[2:]}" for s in req.directives()} <= set(honest)


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.42", "v0.0.44"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_rest_job_is_the_requests(name, version):
    req = request(name, "secret_env: [HF_TOKEN]\n")
    env = {"PATH": "/bin", "HF_TOKEN": "hf", "NOMAD_TOKEN": "n"}
    job = rest_job_properties(req, environment=env, cwd="/w", api_version=version)
    assert rest_job_properties(lying(req), environment=env, cwd="/w", api_version=version) == job
    assert job["name"] == req.get("job-name") and job["nodes"] == str(req.get("nodes"))
    assert job["standard_output"] == req.get("output")
    environment = job["environment"] if version == "v0.0.38" else dict(e.split("=", 1) for e in job["environment"])
    assert environment == {"PATH": "/bin", "HF_TOKEN": "hf"}  # --export=ALL, less tokens not in secret_env
    if req.has("time"):
        assert job["time_limit"] == (req.get("time").text if version == "v0.0.38" else req.get("time").minutes)


def test_rest_sends_the_request_and_the_script_as_the_program():
    req = request("ddp-gpu")
    with Slurmrestd("25.11") as stub:
        t = RestTransport(url=stub.url, token="t", user="alice", api_version="v0.0.44", retries=1, environment={})
        honest, lied = stub.jobs[int(t.submit(req))], stub.jobs[int(t.submit(lying(req)))]
    assert {**honest.desc, "script": ""} == {**lied.desc, "script": ""} and lied.script == lying(req).script
    assert honest.desc["partition"] == "gpu" and honest.desc["nodes"] == "2" and honest.desc["tres_per_node"] == "gres/gpu:8"


@pytest.mark.parametrize("name", EXAMPLES)
def test_pyslurm_attributes_are_the_requests(name, monkeypatch):
    fake = fake_pyslurm()
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    req = request(name)
    t = PyslurmTransport(cluster_version="22.05.8", environment={"PATH": "/bin"})
    t.submit(req)
    t.submit(lying(req))
    honest, lied = fake.submitted
    drop = ("script", "environment")  # the private file's path; the environment is checked elsewhere
    assert {k: v for k, v in honest["attrs"].items() if k not in drop} == \
        {k: v for k, v in lied["attrs"].items() if k not in drop}
    assert lied["script"] == lying(req).script
    a = honest["attrs"]
    assert a["name"] == req.get("job-name") and a["nodes"] == str(req.get("nodes"))
    assert a["standard_output"] == req.get("output") and a["log_files_open_mode"] == "append"


# ---------------------------------------------------------------------------------------------
# slurm.extra_args: typed when the job file is loaded


MIN = "name: t\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n"


@pytest.mark.parametrize("arg,words", [
    ("--mem-per-cpu=lots", "'lots' is not a SLURM memory size"),
    ("--nice=abc", "'abc' is not a whole number"),
    ("--mail-type=SOMETIMES", "SOMETIMES: not a mail type"),
    ("--nodelist=node[1-3", "not a node list"),
    ("--hold=yes", "takes no value"),
    ("--dependency", "needs a value"),
    ("--time-min=tomorrow", "not a SLURM time"),
    ("--dep=afterok:5", "write the option's full name (--dependency)"),
])
def test_extra_args_are_typed_at_load_time(arg, words, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(MIN + f"slurm: {{extra_args: ['{arg}']}}\n")
    proc = subprocess.run([sys.executable, "-m", "halo_sched.cli", "validate", str(job)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "slurm.extra_args" in proc.stderr and words in proc.stderr and "Traceback" not in proc.stderr


def test_extra_args_given_twice_are_refused():
    with pytest.raises(halo_sched.SpecError, match="--comment is given twice"):
        loads(MIN + "slurm: {extra_args: ['--comment=a', '--comment=b']}\n")


def test_extra_args_reach_every_transport_typed():
    req = batch_request(compile_launch(loads(MIN + "slurm: {extra_args: ['--mem-per-cpu=2G', '--mail-type=END,FAIL', "
                                                   "'--nodelist=n[1,3],n5', '--container-image=x']}\n")))
    assert req.get("mem-per-cpu") == ("2G", 2048) and req.get("mail-type") == ("END", "FAIL")
    assert req.get("nodelist") == ("n[1,3]", "n5") and req.get("container-image") == "x"
    assert "#SBATCH --nodelist=n[1,3],n5\n" in req.script and "#SBATCH --container-image=x\n" in req.script


def test_one_table_of_option_names():
    """Every option the transports translate is in sbatch_options.OPTIONS, and its short letter
    is the one sbatch(1) gives; no module keeps another table of them."""
    from halo_sched.backends.slurm.transport import pyslurm, rest

    assert set(rest._HANDLERS) <= set(OPTIONS) and set(pyslurm._ATTRS) <= set(OPTIONS)
    assert SHORT["N"] == "nodes" and SHORT["J"] == "job-name" and SHORT["w"] == "nodelist"
    assert all(parse_setting(s.text()) == s for s in request("ddp-gpu").options)
    sources = "\n".join(p.read_text() for p in (REPO / "halo_sched").rglob("*.py") if p.name != "sbatch_options.py")
    assert not re.search(r"[\"']J[\"']\s*:\s*[\"'](--)?job-name", sources)


def test_a_hand_written_script_needs_its_options_in_the_request():
    req = request_of("#!/bin/bash\n#SBATCH --partition=ignored\ntrue\n", ["--partition=debug"])
    assert req.get("partition") == "debug" and req.arguments() == ["--partition=debug"]
    with pytest.raises(ValueError, match="--partition given twice"):
        SbatchRequest(options=(parse_setting("--partition=a"), parse_setting("--partition=b")))
