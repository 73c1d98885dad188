"""Malformed job files of every kind, through the CLI as a user runs it: exit 2, the field named,
never a traceback, never a hang (each run has a timeout well under what a hang would take)."""
from __future__ import annotations

import time

import pytest

from helpers import cli

GOOD = "name: j\nnodes: 2\nnproc_per_node: 1\ntrainer: {script: t.py}\n"
LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 9)}]" for i in range(1, 10)]
    + ["name: *j"]) + "\n"

CASES = {
    # name: (file text or bytes, words the error must contain)
    "empty file": ("", "must be a mapping"),
    "only a comment": ("# nothing\n", "must be a mapping"),
    "a list": ("- name: j\n", "must be a mapping"),
    "a scalar": ("just text\n", "must be a mapping"),
    "nodes is text": (GOOD.replace("nodes: 2", "nodes: two"), "nodes"),
    "nodes is a bool": (GOOD.replace("nodes: 2", "nodes: true"), "nodes"),
    "negative nodes": (GOOD.replace("nodes: 2", "nodes: -1"), "nodes"),
    "zero processes": (GOOD.replace("nproc_per_node: 1", "nproc_per_node: 0"), "nproc_per_node"),
    "huge count": (GOOD.replace("nodes: 2", "nodes: 99999999999999999999"), "nodes"),
    "port out of range": (GOOD + "rendezvous: {port: 70000}\n", "rendezvous.port"),
    "port negative": (GOOD + "rendezvous: {port: -5}\n", "rendezvous.port"),
    "timeout zero": (GOOD + "rendezvous: {timeout_s: 0}\n", "rendezvous.timeout_s"),
    "unknown key": (GOOD + "nodez: 3\n", "nodez"),
    "unknown nested key": (GOOD + "slurm: {partitoin: a}\n", "slurm.partitoin"),
    "bad env name": (GOOD + "env: {'1X': a}\n", "env"),
    "env value not text": (GOOD + "env: {X: 1.0}\n", "env"),
    "reserved env": (GOOD + "env: {RANK: '3'}\n", "env"),
    "secret bad name": (GOOD + "secret_env: ['A-B']\n", "secret_env"),
    "secret reserved": (GOOD + "secret_env: [MASTER_PORT]\n", "secret_env"),
    "control character in a name": ('name: "a\\u0007b"\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n', "name"),
    "carriage return in setup": (GOOD + 'setup: ["echo a\\rb"]\n', "setup"),
    "NUL in an arg": (GOOD.replace("{script: t.py}", '{script: t.py, args: ["a\\0b"]}'), "trainer.args"),
    "raw control byte": ("name: a\x07b\n", "YAML"),
    "not UTF-8": (b"name: \xff\xfe\n", "cannot read"),
    "duplicate key": (GOOD + "nodes: 3\n", "duplicate key"),
    "YAML syntax": ("name: [unclosed\n", "YAML syntax error"),
    "python tag": (GOOD + "image: !!python/object/apply:os.system ['true']\n", "YAML"),
    "billion laughs": (LAUGHS, "expands to more than"),
    "deep nesting": ("a: " + "[" * 20000 + "]" * 20000 + "\n", "nested"),
    "deep mapping": ("".join("  " * i + "k:\n" for i in range(200)), "nested"),
    "10 MB file": (GOOD + "env:\n" + "".join(f"  K{i}: '{'v' * 100}'\n" for i in range(100_000)), "larger than"),
    "volumes wrong type": (GOOD + "nomad: {volumes: /a:/b}\n", "nomad.volumes"),
    "restart count negative": (GOOD + "slurm: {max_requeues: -1}\n", "slurm.max_requeues"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_job_file_is_exit_2_naming_the_field(tmp_path, case):
    text, words = CASES[case]
    f = tmp_path / "job.yaml"
    if isinstance(text, bytes):
        f.write_bytes(text)
    else:
        f.write_text(text, encoding="utf-8")
    for command in (["validate"], ["render", "--backend", "slurm"], ["submit", "--dry-run", "--backend", "nomad"]):
        t0 = time.monotonic()
        r = cli(command[0], str(f), *command[1:], timeout=30)
        took = time.monotonic() - t0
        assert r.returncode == 2, (case, command, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
        assert words in r.stderr, (case, r.stderr[-2000:])
        assert took < 15, f"{case}: {took:.1f}s"
        assert len(r.stderr) < 20_000, "the error echoes the whole file"


# --------------------------------------------------------------------------------------------
# Files that once made the loader run away or block: each run bounded in memory and time, so a
# regression fails here instead of taking the machine with it.

MEMORY_LIMIT = 1536 * 1024 * 1024  # address space of the child: Python and the YAML loader need far less


def _limited():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def bounded(*argv, timeout=30):
    """Run ``python argv`` under MEMORY_LIMIT and ``timeout``: (CompletedProcess, seconds)."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env=env, preexec_fn=_limited)
    return r, time.monotonic() - t0


CYCLES = {
    # An alias inside the value of its own anchor: a value that contains itself.
    "mapping in itself": ("trainer: &x {script: train.py, args: *x}\n", 4),
    "sequence in itself": (GOOD + "slurm: {extra_args: &a [*a]}\n", 5),
    "merge of itself": (GOOD + "nomad: &n {<<: *n, cpu: 100}\n", 5),
    "deeper inside itself": (GOOD + "env: &e {A: {B: [x, {C: *e}]}}\n", 5),
    "block style": (GOOD + "slurm: &s\n  partition: gpu\n  extra_args:\n    - *s\n", 8),
}


@pytest.mark.parametrize("case", sorted(CYCLES))
def test_a_value_containing_itself_is_refused_by_the_cli(tmp_path, case):
    text, line = CYCLES[case]
    if not text.startswith(GOOD):
        text = GOOD.replace("trainer: {script: t.py}\n", "") + text
    f = tmp_path / "job.yaml"
    f.write_text(text)
    r, took = bounded("-m", "halo_sched.cli", "validate", str(f))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
    assert "cannot contain itself" in r.stderr and f"line {line}," in r.stderr, r.stderr
    assert took < 15, took


@pytest.mark.parametrize("case", sorted(CYCLES))
def test_a_value_containing_itself_is_refused_by_loads(case):
    # loads() itself, in a child process bounded like the CLI above (an endless loop here would
    # otherwise grow this test process without bound).
    text, line = CYCLES[case]
    if not text.startswith(GOOD):
        text = GOOD.replace("trainer: {script: t.py}\n", "") + text
    code = ("import sys, time\nfrom halo_sched.errors import SpecError\nfrom halo_sched.spec import loads\n"
            "t0 = time.monotonic()\ntry:\n    loads(sys.argv[1])\nexcept SpecError as e:\n"
            "    print(time.monotonic() - t0)\n    print(e.problems)\nelse:\n    print('accepted')\n")
    r, _ = bounded("-c", code, text)
    assert r.returncode == 0, r.stderr[-2000:]
    took, problems = r.stdout.split("\n", 1)
    assert "cannot contain itself" in problems and f"line {line}," in problems, problems
    assert float(took) < 2, took


def test_many_aliases_are_refused_before_anything_is_built():
    text = GOOD + "x: &x a\nslurm: {extra_args: [" + ", ".join(["*x"] * 1500) + "]}\n"
    import halo_sched
    from halo_sched.errors import SpecError

    with pytest.raises(SpecError) as ei:
        halo_sched.loads(text)
    assert "more than 1000 aliases" in str(ei.value) and "line 6" in str(ei.value)


def _socket(tmp_path):
    import socket

    p = tmp_path / "job.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))  # a path in the file system, no traffic
    _socket.keep = s
    return p, "socket"


NOT_FILES = {
    "socket": _socket,
    "directory": lambda tmp_path: (tmp_path, "directory"),
    "/dev/zero": lambda tmp_path: ("/dev/zero", "character device"),
    "/dev/null": lambda tmp_path: ("/dev/null", "character device"),
}


@pytest.mark.parametrize("kind", sorted(NOT_FILES))
def test_a_job_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, kind):
    path, words = NOT_FILES[kind](tmp_path)
    try:
        r, took = bounded("-m", "halo_sched.cli", "validate", str(path))
    finally:
        if kind == "socket":
            _socket.keep.close()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert f"is a {words}, not a regular file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_named_pipe_no_one_writes_to_ends_at_once(tmp_path):
    import os

    p = tmp_path / "job.fifo"
    os.mkfifo(p)  # no writer: it reads as empty, it does not block
    r, took = bounded("-m", "halo_sched.cli", "validate", str(p))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "must be a mapping" in r.stderr and "Traceback" not in r.stderr


def test_a_pipe_whose_writer_never_ends_is_given_up_on(tmp_path):
    import os
    import subprocess

    p = tmp_path / "job.fifo"
    os.mkfifo(p)
    # A writer that sends part of a job and then keeps the pipe open (bounded: it sleeps 60 s).
    writer = subprocess.Popen(["bash", "-c", f"{{ echo 'name: x'; sleep 60; }} > {p}"])
    try:
        r, took = bounded("-m", "halo_sched.cli", "validate", str(p))
    finally:
        writer.kill()
        writer.wait()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "did not end within 10 s" in r.stderr, r.stderr


def test_a_job_file_through_process_substitution_loads(tmp_path):
    import subprocess
    import sys

    (tmp_path / "job.yaml").write_text(GOOD)
    (tmp_path / "t.py").write_text("")  # its trainer.script, in the current directory (a pipe's job file has no other)
    r = subprocess.run(["bash", "-c", f'"{sys.executable}" -m halo_sched.cli validate <(cat job.yaml)'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("backend, job_id", [("local", "x\n"), ("nomad", "job\n"), ("slurm", "halo\n:123")])
def test_a_job_id_with_a_trailing_newline_is_refused(tmp_path, backend, job_id):
    from halo_sched.errors import UsageError

    with pytest.raises(UsageError):
        if backend == "local":
            from halo_sched.backends.local import LocalScheduler

            d = tmp_path / job_id  # such a directory exists: the id must still not name it
            d.mkdir()
            (d / "state.json").write_text("{}")
            LocalScheduler(root=tmp_path)._dir(job_id)
        elif backend == "nomad":
            from halo_sched.backends.nomad import NomadScheduler

            NomadScheduler(client=object())._split(job_id)
        else:
            from halo_sched.backends.slurm.transport.base import split_cluster

            split_cluster(job_id)
