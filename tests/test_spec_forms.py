"""One validation whatever the input's form (issue 43, item 7): a job's content given as a dict
(``spec_from_dict``, ``submit(dict)``), changed in code (``with_changes``, ``model_copy``) or read
from YAML is held to the same checks, the YAML reader's bounds included (a lone surrogate, nesting,
keys that are not names, a value that contains itself, the count of values):
a SpecError naming the field (exit 2), never a UnicodeEncodeError or a RecursionError, and a
refused submit leaves nothing on disk."""
from __future__ import annotations

import copy
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import halo_sched
from halo_sched.errors import SpecError
from halo_sched.spec import MAX_YAML_DEPTH, MAX_YAML_VALUES
from helpers import REPO

SPEC = {"name": "forms", "nodes": 1, "nproc_per_node": 1, "trainer": {"script": "train.py", "args": ["--lr", "0.1"]},
        "env": {"OMP_NUM_THREADS": "1"}}
SURROGATE = "half of a UTF-16 surrogate pair"


def _deep(levels: int) -> dict:
    top = node = {}
    for _ in range(levels):
        node["a"] = {}
        node = node["a"]
    return top


def _cycle() -> dict:
    env: dict = {"A": "1"}
    env["B"] = env
    return env


def _with(**changes) -> dict:
    data = copy.deepcopy(SPEC)
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        node = data
        for part in head:
            node = node[part]
        node[last] = value
    return data


@pytest.mark.parametrize("data, field, words", [
    (_with(env__X="ok \ud800"), "env.X", SURROGATE),
    (_with(env={"OMP_NUM_THREADS": "1", "\udc80": "v"}), "env", SURROGATE),
    (_with(trainer__args=["--lr", "\udfff"]), "trainer.args[1]", SURROGATE),
    (_with(name="n\ud800"), "name", SURROGATE),
    (_with(env=_deep(2000)), "env", f"nested more than {MAX_YAML_DEPTH} levels deep"),
    (_with(env=_deep(20_000)), "env", f"nested more than {MAX_YAML_DEPTH} levels deep"),
    (_with(env={1: "v"}), "env", "key 1 is int, not a name"),
    (_with(env=_cycle()), "env.B", "a value contains itself"),
    (_with(trainer__args=["x"] * (MAX_YAML_VALUES + 1)), "trainer", f"more than {MAX_YAML_VALUES} values"),
])
def test_a_dict_is_held_to_what_the_job_file_reader_refuses(data, field, words):
    with pytest.raises(SpecError) as info:
        halo_sched.spec_from_dict(data)
    err = info.value
    assert err.exit_code == 2 and err.problems[0][0] == field and words in err.problems[0][1], str(err)
    str(err).encode("utf-8")  # the error itself can be printed: no surrogate in it
    assert len(str(err)) < 400


def test_the_same_surrogate_gets_the_same_words_from_yaml_and_from_a_dict():
    from halo_sched.spec import loads

    with pytest.raises(SpecError) as from_yaml:
        loads('name: forms\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: train.py}\nenv: {X: "\\ud800"}\n')
    with pytest.raises(SpecError) as from_dict:
        halo_sched.spec_from_dict(_with(env__X="\ud800"))
    assert from_yaml.value.problems[0][1] == from_dict.value.problems[0][1]


def test_every_entry_point_that_builds_a_spec_runs_the_same_checks():
    spec = halo_sched.spec_from_dict(SPEC)
    calls = {
        "with_changes": lambda: halo_sched.with_changes(spec, {"env.X": "\ud800"}),
        "with_changes deep": lambda: halo_sched.with_changes(spec, {"env": _deep(2000)}),
        "spec_of": lambda: halo_sched.spec_of(_with(env__X="\ud800")),
        "render(dict)": lambda: halo_sched.render(_with(trainer__args=["\ud800"]), backend="local"),
        # model_copy(update=...) skips pydantic: render and submit validate again.
        "render(model_copy)": lambda: halo_sched.render(spec.model_copy(update={"env": {"X": "\ud800"}}), backend="local"),
        "validated": lambda: __import__("halo_sched.spec", fromlist=["validated"]).validated(
            spec.model_copy(update={"env": {"X": "\ud800"}})),
    }
    for name, call in calls.items():
        with pytest.raises(SpecError) as info:
            call()
        assert info.value.problems[0][0] in ("env.X", "env", "trainer.args[0]"), (name, str(info.value))


def _job_dirs(home: Path) -> list[str]:
    local = home / "local"
    return [p.name for p in local.iterdir() if not p.name.startswith(".")] if local.is_dir() else []


def _records(home: Path) -> int:
    db = home / "halo-sched.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM jobs").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("how", ["dict", "model_copy", "with_changes"])
def test_a_refused_submit_leaves_no_job_directory_and_no_record(how):
    home = Path(os.environ["HALO_SCHED_HOME"])
    spec = halo_sched.spec_from_dict(SPEC)
    given = {"dict": lambda: _with(env__X="\ud800"),
             "model_copy": lambda: spec.model_copy(update={"env": {"X": "\ud800"}}),
             "with_changes": lambda: halo_sched.with_changes(spec, {"trainer.args": ["\ud800"]})}[how]
    with pytest.raises(SpecError) as info:
        halo_sched.submit(given(), backend="local")
    assert SURROGATE in str(info.value)
    assert _job_dirs(home) == [] and _records(home) == 0


def test_a_local_job_refused_while_its_directory_is_written_leaves_none(monkeypatch):
    from halo_sched.backends import local

    def broken():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local, "runtime", broken)
    home = Path(os.environ["HALO_SCHED_HOME"])
    with pytest.raises(OSError):
        halo_sched.submit(SPEC, backend="local")
    assert _job_dirs(home) == []


def test_a_deep_or_huge_dict_is_refused_in_bounded_time_and_memory():
    # A process of its own with its memory capped: the checks are iterative and stop at the bound.
    code = ("import halo_sched, sys\n"
            "top = node = {}\n"
            "for _ in range(300_000):\n    node['a'] = {}; node = node['a']\n"
            "spec = {'name': 'x', 'nodes': 1, 'nproc_per_node': 1, 'trainer': {'script': 't.py'}, 'env': top}\n"
            "try:\n    halo_sched.spec_from_dict(spec)\nexcept halo_sched.SpecError as e:\n"
            "    print(e.problems[0][0]); sys.exit(2)\n")
    r = subprocess.run(["bash", "-c", 'ulimit -v 2000000; exec "$0" -c "$1"', sys.executable, code],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and r.stdout.strip() == "env", r.stderr[-2000:]


def test_an_env_value_that_is_a_section_is_named_without_its_whole_text():
    with pytest.raises(SpecError) as info:
        halo_sched.spec_from_dict(_with(env__X=_deep(60)))
    assert "X: value must be a string, got dict" in str(info.value) and len(str(info.value)) < 200
