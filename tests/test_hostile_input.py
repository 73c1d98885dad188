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
