"""One exit-code table, and every subcommand held to it.

The table is halo_sched/cli.py's docstring (docs/cli.md's "Exit codes" repeats it; README.md's
sums it up). Here: unknown, over-long and malformed job ids on every command that takes one
(local, Nomad against the fake API, SLURM through a stand-in transport), bad option values,
``submit --dry-run`` with an unset ``secret_env`` variable, and readers that go away (``| head``)
without changing the code.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from halo_sched import cli, errors, records
from halo_sched.backends.base import JobState, JobStatus
from halo_sched.backends.slurm import SlurmScheduler
from helpers import REPO, example_job, free_port, load_all, load_nomad_helper

ID_COMMANDS = ("status", "watch", "logs", "cancel")
LONG_ID = "a" * 5000
BAD_IDS = {
    "unknown": ("nope-123", "'nope-123'"),
    "over-long": (LONG_ID, "too long (5000 characters"),
    "control character": ("job\x1b[2Jx", "whitespace or control characters"),
    "newline": ("job\nx", "whitespace or control characters"),
    "empty": ("", "empty"),
}


def run(*args, env=None, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, **kw)


def closed_port() -> int:
    """A loopback port nobody listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the table -------------------------------------------------------------------------------


def _codes(text: str, row: str) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(row, text, re.M)}


def test_one_table_in_the_docstring_the_readme_and_the_constants():
    doc = _codes(cli.__doc__, r"^(\d+)\s{2,}\S")
    def table(path, heading):
        text = (REPO / path).read_text()
        section = text[text.index(heading):]
        section = section[:section.index("\n#", 1)]
        return _codes(section, r"^\| `?(\d+)`? \|")

    full = table("docs/cli.md", "### Exit codes")  # the whole text of each code
    short = table("README.md", "## Exit codes")  # the front door's summary
    named = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert doc == full == short == named == {0, 1, 2, 3, 130}
    for cls, code in ((errors.SpecError, 2), (errors.UsageError, 2), (errors.UnknownJob, 2),
                      (errors.SchedulerError, 1), (errors.OutcomeUnknown, 3), (errors.MissingDependency, 2)):
        assert cls.exit_code == code, cls


# ---- job ids: local (the default backend) ----------------------------------------------------


@pytest.mark.parametrize("command", ID_COMMANDS)
@pytest.mark.parametrize("kind", list(BAD_IDS))
def test_a_bad_id_is_bad_input_on_every_command(command, kind):
    job_id, said = BAD_IDS[kind]
    r = run(command, job_id, env={"HALO_SCHED_BACKEND": "local"})
    assert r.returncode == 2, (command, kind, r.returncode, r.stderr)
    assert said in r.stderr, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and len(r.stderr) < 300, r.stderr  # the id cut for display
    assert r.stdout == ""


# ---- job ids: SLURM (a stand-in transport) and Nomad (the fake API) --------------------------


class Forgetful:
    """A SLURM transport that knows no job; cancel must never be asked for one."""

    def __init__(self):
        self.cancelled = []

    def query(self, ids):
        return {i: JobState(i, JobStatus.UNKNOWN, reason=f"SLURM has no job {i}") for i in ids}

    def cancel_once(self, ids, **kw):
        self.cancelled += list(ids)

    def job_info(self, job_id):
        raise errors.SchedulerError(f"job {job_id} is not known to slurmctld")


@pytest.mark.parametrize("command", ID_COMMANDS)
def test_slurm_unknown_id_is_bad_input(command, monkeypatch, capsys):
    t = Forgetful()
    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=t))
    assert cli.main([command, "99999", "--backend", "slurm"]) == 2
    assert "no job '99999' on slurm" in capsys.readouterr().err
    assert t.cancelled == []


def test_status_shows_the_known_ids_and_names_the_unknown_one(monkeypatch, capsys):
    records.write({"id": "4242", "backend": "slurm", "submitted": 1.0,
                   "last_state": {"status": "COMPLETED", "describe": "COMPLETED exit=0"}})
    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=Forgetful()))
    assert cli.main(["status", "99999", "4242", "--backend", "slurm"]) == 2
    out, err = capsys.readouterr()
    # 4242 has a record: known (its last known state shown); 99999 has neither.
    assert out.startswith("4242\tCOMPLETED exit=0 (last known") and "99999" not in out
    assert "no job '99999' on slurm" in err and "4242" not in err


def test_a_recorded_job_the_scheduler_forgot_has_an_unknown_outcome(monkeypatch, capsys):
    # Known (it has a record), but the scheduler no longer says how it ended: neither 0 nor 1.
    records.write({"id": "4242", "backend": "slurm", "submitted": 1.0})
    monkeypatch.setattr(cli, "_scheduler", lambda name: SlurmScheduler(transport=Forgetful()))
    assert cli.main(["watch", "4242", "--quiet"]) == 3
    assert "its outcome is unknown" in capsys.readouterr().err


def test_nomad_unknown_id_is_bad_input_on_every_command():
    fake_api = load_nomad_helper("fake_api")
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")], token="tok") as fake:
        env = {"NOMAD_ADDR": fake.address, "NOMAD_TOKEN": "tok", "HALO_SCHED_BACKEND": "nomad"}
        for command in ID_COMMANDS:
            r = run(command, "nope-123", env=env)
            assert r.returncode == 2 and "no job 'nope-123' on nomad" in r.stderr, (command, r.stderr)
            r = run(command, "a/b/c", env=env)  # not [REGION:][NAMESPACE/]ID
            assert r.returncode == 2 and "not a Nomad job id" in r.stderr, (command, r.stderr)


# ---- option values ---------------------------------------------------------------------------


def _known_local_job(job_id="done-1", nodes=2, per_node=2):
    from halo_sched.backends.local import state_root

    d = state_root() / job_id
    d.mkdir(parents=True)
    (d / "state.json").write_text('{"state": "COMPLETED", "exit_code": 0}')
    (d / "job.json").write_text(json.dumps({"nodes": nodes}))
    (d / "job.log").write_text("".join(f"[node {k}] [rank {k * per_node}] hi\n" for k in range(nodes)))
    records.write({"id": job_id, "backend": "local", "submitted": 1.0, "nodes": nodes, "nproc_per_node": per_node})
    return job_id


BAD_OPTIONS = {
    "limit negative": (["list", "--limit", "-1"], "--limit"),
    "limit word": (["list", "--limit", "x"], "--limit"),
    "state unknown": (["list", "--state", "bogus"], "use one of PENDING, PARTIAL, RUNNING"),
    "node past the job": (["logs", "{known}", "--node", "99"], "--node 99: job 'done-1' has 2 nodes (0..1)"),
    "node negative": (["logs", "{known}", "--node", "-1"], "--node"),
    "rank past the job": (["logs", "{known}", "--rank", "4"], "--rank 4: job 'done-1' has 4 ranks (0..3)"),
    "min-mibps inf": (["preflight", "{job}", "--min-mibps", "inf"], "--min-mibps"),
    "min-mibps nan": (["preflight", "{job}", "--min-mibps", "nan"], "--min-mibps"),
    "min-mibps 0": (["preflight", "{job}", "--min-mibps", "0"], "--min-mibps"),
    "iters 0": (["preflight", "{job}", "--iters", "0"], "--iters"),
    "submit timeout negative": (["submit", "{job}", "--wait", "--timeout", "-5"], "--timeout"),
    "watch timeout inf": (["watch", "{known}", "--timeout", "inf"], "--timeout"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_option_values_are_refused_naming_the_option(tmp_path, case):
    values = {"job": str(example_job(tmp_path, free_port())), "known": _known_local_job()}
    args, said = BAD_OPTIONS[case]
    r = run(*[a.format(**values) for a in args], env={"HALO_SCHED_BACKEND": "local"})
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert r.stdout == "", args


def test_in_range_options_still_work():
    known = _known_local_job()
    r = run("logs", known, "--node", "1")
    assert r.returncode == 0 and r.stdout == "[node 1 rank 2] hi\n"
    for i in range(3):
        records.write({"id": f"old-{i}", "backend": "local", "submitted": 10.0 + i})
    # --limit 0 is every record, as documented; the oldest is never dropped.
    ids = [line.split("\t")[0] for line in run("list", "--limit", "0").stdout.splitlines()]
    assert len(ids) == 4 and "old-0" in ids
    assert [line.split("\t")[0] for line in run("list", "--limit", "2").stdout.splitlines()] == ["old-2", "old-1"]


def test_help_says_what_the_backend_defaults_to():
    for command in ("render", "submit", "plan", "preflight"):
        text = " ".join(run(command, "--help").stdout.split())
        assert "(default: $HALO_SCHED_BACKEND, else local)" in text, (command, text)
        assert "record" not in text.split("--backend")[1].split("--")[0], command
    text = " ".join(run("status", "--help").stdout.split())
    assert "the backend in the job's record, else $HALO_SCHED_BACKEND, else local" in text


# ---- submit --dry-run refuses what submit would refuse ---------------------------------------


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_dry_run_with_an_unset_secret_is_bad_input(tmp_path, backend):
    job = str(example_job(tmp_path, free_port(), secret_env=["APP_TEST_SECRET"]))
    env = {k: v for k, v in os.environ.items() if k != "APP_TEST_SECRET"}
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", job, "--dry-run", "--backend", backend],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "secret_env" in r.stderr and "APP_TEST_SECRET is not set" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout  # what would have been submitted is still shown
    r = run("submit", job, "--dry-run", "--backend", backend, env={"APP_TEST_SECRET": "s3cr3t-value"})
    assert r.returncode == 0, r.stderr
    assert "s3cr3t-value" not in r.stdout + r.stderr
    assert load_all() == []  # nothing was submitted


# ---- a reader that goes away -----------------------------------------------------------------


def run_into_closed_pipe(*args, stdout_closed=True, stderr_closed=True, env=None, timeout=60):
    """The command with stdout (and stderr) writing into a pipe whose reader is gone, as under
    ``| head`` once head has exited: every write there fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, stdout=w if stdout_closed else subprocess.PIPE,
                              stderr=w if stderr_closed else subprocess.PIPE)
    finally:
        os.close(w)


def test_a_broken_pipe_keeps_the_exit_code(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [\n")
    good = str(example_job(tmp_path, free_port()))
    assert run_into_closed_pipe("validate", str(bad)).returncode == 2
    assert run_into_closed_pipe("validate", good, str(bad)).returncode == 2
    assert run_into_closed_pipe("status", "nope-1", env={"HALO_SCHED_BACKEND": "local"}).returncode == 2
    # A scheduler failure (nothing listens there): 1, never 0 because the reader left.
    env = {"NOMAD_ADDR": f"http://127.0.0.1:{closed_port()}"}
    assert run_into_closed_pipe("status", "x", "--backend", "nomad", env=env).returncode == 1
    # stdout gone, stderr read: the outcome and its message, and nothing about the pipe.
    r = run_into_closed_pipe("validate", good, str(bad), stderr_closed=False)
    assert r.returncode == 2 and "YAML syntax error" in r.stderr
    for r in (r, run_into_closed_pipe("schema", stderr_closed=False)):
        assert "BrokenPipeError" not in r.stderr and "Exception ignored" not in r.stderr and "Traceback" not in r.stderr
    assert r.returncode == 0 and r.stderr == ""


def test_following_logs_into_a_closed_pipe_stops_at_once():
    # A running job (its "supervisor" is this test process) followed into a pipe nobody reads:
    # once output is discarded, following on would never end.
    from halo_sched.backends.local import state_root
    from halo_sched.node.processes import start_time

    job_id = _known_local_job()
    d = state_root() / job_id
    (d / "state.json").write_text('{"state": "RUNNING", "nodes_running": 2}')
    (d / "supervisor.pid").write_text(f"{os.getpid()} {start_time(os.getpid())}")
    (d / "job.log").write_text("[node 0] x\n" * 10_000)
    r = run_into_closed_pipe("logs", "--follow", job_id, stderr_closed=False, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr


# ---- the parser a run builds: its command's alone (start-up), parsing as the whole one does ---


PARSE_CASES = [
    ["validate", "a.yaml", "b.yaml"], ["render", "job.yaml", "-b", "nomad", "--format", "json"],
    ["--debug", "render", "job.yaml"], ["render", "job.yaml", "--debug"],
    ["submit", "job.yaml", "--backend", "slurm", "--wait", "--timeout", "5"], ["status", "a", "b"],
    ["list", "--limit", "0", "--json"], ["cancel", "x", "--purge"], ["logs", "x", "--node", "1"],
    ["preflight", "job.yaml", "--size", "4M"], ["gc"], ["schema"], ["watch", "x"], ["plan", "job.yaml"],
]


@pytest.mark.parametrize("argv", PARSE_CASES, ids=lambda a: " ".join(a))
def test_the_command_alone_parses_as_the_whole_parser(argv):
    only = cli._command_in(argv)
    assert only in cli.COMMANDS
    assert vars(cli.build_parser(only=only).parse_args(argv)) == vars(cli.build_parser().parse_args(argv))


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_the_command_alone_has_the_same_help_and_errors(command, capsys):
    def run(parser, argv):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        out = capsys.readouterr()
        return exc.value.code, out.out, out.err

    for argv in ([command, "--help"], [command, "--no-such-option"]):
        assert run(cli.build_parser(only=command), argv) == run(cli.build_parser(), argv)


def test_only_a_named_command_narrows_the_parser():
    assert cli._command_in(["--debug", "render", "x"]) == "render"
    # no command, or not one: the whole parser (its help lists every command; its error names the choices)
    for argv in ([], ["--help"], ["--version"], ["rendr", "x"], ["--", "render"]):
        assert cli._command_in(argv) is None


@pytest.mark.parametrize("under", ["", "/sub"])
def test_a_state_directory_that_is_a_file_is_exit_2_naming_the_variable(tmp_path, under):
    """HALO_SCHED_HOME naming a file (or a path through one): every command that keeps state
    says so, exit 2, not ``internal error: NotADirectoryError``."""
    import helpers

    f = tmp_path / "a-file"
    f.write_text("")
    env = {**os.environ, "HALO_SCHED_HOME": f"{f}{under}"}
    for args in (["list"], ["status", "j-1"], ["nodes"], ["submit", "examples/ddp-cpu.yaml", "--backend", "local"]):
        r = helpers.cli(*args, env=env, timeout=60)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert f"HALO_SCHED_HOME: '{f}{under}'" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert helpers.cli("validate", "examples/ddp-cpu.yaml", env=env, timeout=60).returncode == 0
