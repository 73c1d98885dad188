"""A job file's trainer.script is checked before a node starts (issue 41, item 2).

A relative script is read from the job file's directory, on every backend whose nodes see this
machine's files (local; SLURM on the host); the nodes are given that file (relative to the submit
directory they start in when it lies below it, else absolute), so they run the file that was
checked. A script found only from the current directory (the former rule) is still used, with a
warning. Where the nodes read it elsewhere (an image, Nomad's task) it is not checked: a warning
says so. A missing one is exit 2 naming trainer.script, before anything is submitted.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import halo_sched
from halo_sched import records
from halo_sched.errors import SpecError
from halo_sched.spec import checked_script, from_record, load, with_changes
from helpers import REPO

JOB = "name: sc\nnodes: 1\nnproc_per_node: 1\ntrainer:\n  script: {script}\n{extra}"


def cli(*args, cwd, timeout=60, env=None):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def project(tmp_path):
    """project/job.yaml naming train.py beside it; elsewhere/ another directory to run from."""
    proj, other = tmp_path / "project", tmp_path / "elsewhere"
    proj.mkdir()
    other.mkdir()
    (proj / "train.py").write_text("print('ok')\n")
    (proj / "job.yaml").write_text(JOB.format(script="train.py", extra=""))
    return proj, other


def _argv_script(rendered: str) -> str:
    """The script torchrun is given in a rendered local/SLURM job (after its last option)."""
    lines = rendered.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "--tee=3 \\")
    return lines[at + 1].split()[0]


def test_a_relative_script_is_read_from_the_job_files_directory_wherever_halo_sched_runs(project):
    proj, other = project
    r = cli("validate", str(proj / "job.yaml"), cwd=other)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    # The nodes start in the submit directory: given the file that was checked.
    for backend in ("local", "slurm"):
        r = cli("render", str(proj / "job.yaml"), "--backend", backend, cwd=other)
        assert r.returncode == 0, r.stderr
        assert _argv_script(r.stdout) == str(proj / "train.py")
        r = cli("render", "project/job.yaml", "--backend", backend, cwd=proj.parent)  # below it: relative
        assert _argv_script(r.stdout) == "project/train.py"
        r = cli("render", "job.yaml", "--backend", backend, cwd=proj)  # from its own directory: as written
        assert _argv_script(r.stdout) == "train.py"


def test_a_missing_script_is_exit_2_naming_the_field_at_validate_and_submit(project):
    proj, other = project
    (proj / "job.yaml").write_text(JOB.format(script="nope.py", extra=""))
    r = cli("validate", str(proj / "job.yaml"), cwd=other)
    assert r.returncode == 2
    assert "trainer.script (line 5): " in r.stderr and f"{proj / 'nope.py'}: no such file" in r.stderr, r.stderr
    assert "the job file's directory" in r.stderr and "Traceback" not in r.stderr
    for extra in ((), ("--dry-run",), ("--wait",)):
        r = cli("submit", str(proj / "job.yaml"), *extra, cwd=other)
        assert r.returncode == 2, r.stderr
        assert "trainer.script (line 5)" in r.stderr and "no such file" in r.stderr, r.stderr
        assert r.stdout == ""  # nothing rendered, no job id
    assert not list(records.page(0))  # nothing submitted, nothing recorded
    # A directory is no script either.
    (proj / "dir.py").mkdir()
    (proj / "job.yaml").write_text(JOB.format(script="dir.py", extra=""))
    r = cli("validate", str(proj / "job.yaml"), cwd=other)
    assert r.returncode == 2 and "is a directory, not a file" in r.stderr, r.stderr


def test_the_library_submit_refuses_it_too(project, monkeypatch):
    proj, other = project
    (proj / "job.yaml").write_text(JOB.format(script="nope.py", extra=""))
    monkeypatch.chdir(other)
    spec = halo_sched.load(proj / "job.yaml")
    with pytest.raises(SpecError) as e:
        halo_sched.submit(spec, "local")
    assert e.value.exit_code == 2 and "trainer.script" in str(e.value) and "nope.py" in str(e.value)
    assert not list(records.page(0))


def test_a_script_found_only_from_the_current_directory_still_runs_with_a_warning(project):
    """A job file written for the former rule (relative to where halo-sched runs) keeps working."""
    proj, other = project
    (other / "sub").mkdir()
    (other / "sub" / "old.py").write_text("print('ok')\n")
    (proj / "job.yaml").write_text(JOB.format(script="sub/old.py", extra=""))
    r = cli("validate", str(proj / "job.yaml"), cwd=other)
    assert r.returncode == 0
    assert "halo-sched: warning: " in r.stderr and "not in the job file's directory" in r.stderr
    assert str(other / "sub" / "old.py") in r.stderr and "write it relative to the job file" in r.stderr
    r = cli("render", str(proj / "job.yaml"), cwd=other)
    assert _argv_script(r.stdout) == "sub/old.py"
    # Both places hold one: the job file's directory wins, and the warning names the other.
    (proj / "sub").mkdir()
    (proj / "sub" / "old.py").write_text("print('new')\n")
    r = cli("validate", str(proj / "job.yaml"), cwd=other)
    assert r.returncode == 0 and "is another file" in r.stderr, r.stderr
    assert _argv_script(cli("render", str(proj / "job.yaml"), cwd=other).stdout) == str(proj / "sub" / "old.py")


@pytest.mark.parametrize("backend, extra, why", [
    ("nomad", "image: repo/train:1\n", "read inside image repo/train:1"),
    ("nomad", "", "read on the Nomad clients' own hosts"),
    ("slurm", "image: repo/train:1\n", "read inside image repo/train:1 (pyxis)"),
])
def test_a_script_the_nodes_read_elsewhere_is_not_checked_and_a_warning_says_so(project, backend, extra, why):
    proj, other = project
    (proj / "job.yaml").write_text(JOB.format(script="/workspace/train.py", extra=extra))
    r = cli("validate", str(proj / "job.yaml"), "--backend", backend, cwd=other)
    assert r.returncode == 0, r.stderr
    assert f"warning: {proj / 'job.yaml'}: trainer.script /workspace/train.py: not checked ({why})" in r.stderr
    # The same file on local is checked (the local backend runs no image): missing, exit 2.
    assert cli("validate", str(proj / "job.yaml"), "--backend", "local", cwd=other).returncode == 2


def test_slurm_on_the_host_checks_it(project):
    proj, other = project
    (proj / "job.yaml").write_text(JOB.format(script="nope.py", extra="image: repo/x:1\nslurm: {container_runtime: none}\n"))
    r = cli("validate", str(proj / "job.yaml"), "--backend", "slurm", cwd=other)
    assert r.returncode == 2 and "no such file" in r.stderr


def test_a_job_file_through_a_pipe_reads_it_from_the_current_directory(project):
    proj, other = project
    cmd = f"{sys.executable} -m halo_sched.cli validate <(cat {proj / 'job.yaml'})"
    r = subprocess.run(["bash", "-c", cmd], cwd=proj, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["bash", "-c", cmd], cwd=other, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "(the job file came through a pipe)" in r.stderr, r.stderr


def test_changes_and_records_keep_where_it_is_read_from(project, monkeypatch):
    """with_changes (and --set), a run's next attempt and a spec rebuilt from a job's record read
    a relative script from the job file's directory as the first submit did."""
    proj, other = project
    monkeypatch.chdir(other)
    spec = load(proj / "job.yaml")
    changed = with_changes(spec, {"trainer.args": ["--lr", "0.1"]})
    assert checked_script(changed, "local").on_nodes == str(proj / "train.py")
    rec = records.build("local", spec, "sc-1", job_file=spec.job_file)
    assert rec["script_dir"] == str(proj)
    monkeypatch.chdir(proj.parent)  # a keeper or watch elsewhere: the same file
    again = from_record(rec)
    assert checked_script(again, "local").on_nodes == "project/train.py"
    # A record from before script_dir read it from its submit directory, as then.
    old = {k: v for k, v in rec.items() if k != "script_dir"}
    assert from_record(old).script_check("local").on_nodes == "elsewhere/train.py"
    # A spec built in code has no job file: the script as written, not checked.
    built = halo_sched.spec_from_yaml(JOB.format(script="nowhere.py", extra=""))
    assert checked_script(built, "local") == ("nowhere.py", None, ())


def test_the_examples_run_from_the_checkout_and_from_their_own_directory():
    """README's commands: examples/*.yaml name their script beside them."""
    for cwd, path in ((REPO, "examples/ddp-cpu.yaml"), (REPO / "examples", "ddp-cpu.yaml")):
        r = cli("validate", path, cwd=cwd)
        assert r.returncode == 0 and r.stderr == "", r.stderr


def test_the_preflight_test_runs_its_own_script_not_one_beside_the_job_file(project, monkeypatch):
    """preflight swaps the trainer for its bandwidth test, which setup writes on the node and cds
    into: given as written, never looked for beside the job file."""
    from halo_sched.preflight import SCRIPT_NAME, preflight_spec

    proj, other = project
    monkeypatch.chdir(other)
    test = preflight_spec(load(proj / "job.yaml"), 1 << 20)
    assert checked_script(test, "local") == (SCRIPT_NAME, None, ())
    assert _argv_script(halo_sched.render(test, "slurm")) == SCRIPT_NAME
