"""The history store under hostile or unusual conditions (issue 43): a record nested too deeply
costs only itself and never a submitted job's id; option values and homes that cannot be used are
exit 2 naming them; a store the user cannot write still serves every read; the home is private to
its owner; `list --limit 0` and `export` stream. Every CLI run is bounded in time and memory."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from halo_sched import records
from helpers import REPO, example_job, legacy_record_path, write_tool

MEMORY = 1024 * 1024 * 1024


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(*args, env=None, timeout=60, preexec_fn=_limited) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn, env={**os.environ, **(env or {})})


def _clean(r: subprocess.CompletedProcess) -> None:
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def _rec(job_id: str, submitted: float, backend: str = "local", **extra) -> dict:
    rec = {"version": 1, "id": job_id, "backend": backend, "name": "t", "submitted": submitted,
           "submitted_iso": "2026-01-01T00:00:00+0000", "spec": {"slurm": {}}, "outputs": [], "scheduler": {},
           "last_state": {"status": "FAILED", "describe": f"FAILED {job_id}", "at": submitted}, **extra}
    records.write(rec)
    return rec


FAKE_SBATCH = "#!/bin/bash\ncat > /dev/null\necho 4242\n"
FAKE_SCONTROL = "#!/bin/bash\necho 'scontrol: stand-in' >&2\nexit 1\n"


def _sbatch_env(tmp_path: Path) -> dict:
    """A stand-in sbatch (job 4242) and scontrol first on PATH: submit --backend slurm, no cluster."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in (("sbatch", FAKE_SBATCH), ("scontrol", FAKE_SCONTROL)):
        write_tool(b, name, body)
    return {"PATH": f"{b}:{os.environ['PATH']}", "HALO_SUBMIT_RETRY_S": "0"}


# ---- item 5: one bad record costs only itself ---------------------------------------------------


def _deep(levels: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(levels):
        value = {"x": value}
    return value


def test_a_legacy_record_nested_600_deep_costs_only_itself(tmp_path):
    _rec("good-1", 10.0)
    records.jobs_dir().mkdir(parents=True, exist_ok=True)
    legacy_record_path("deep-1", "local").write_text(json.dumps(
        {"id": "deep-1", "backend": "local", "submitted": 20.0, "name": "d", "extra": _deep(600)}))
    r = run("list")
    _clean(r)
    assert r.returncode == 0
    rows = {line.split("\t")[0]: line for line in r.stdout.splitlines()}
    assert "FAILED good-1" in rows["good-1"]
    assert "UNREADABLE record (nested more than 100 levels deep)" in rows["deep-1"], r.stdout
    for args in (["status", "good-1"], ["status", "deep-1"], ["list", "--json"], ["export"]):
        r = run(*args)
        _clean(r)
        assert r.returncode in (0, 3), (args, r.stderr)
    # submit, with the deep file still there to import: the job's id is printed, its record kept.
    env = _sbatch_env(tmp_path)
    legacy_record_path("deep-2", "local").write_text(json.dumps({"id": "deep-2", "backend": "local", "x": _deep(600)}))
    r = run("submit", str(example_job(tmp_path, 29555)), "--backend", "slurm", env=env)
    _clean(r)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "4242", (r.stdout, r.stderr)
    assert records.find("4242", "slurm")[0]["name"] == "ddp-cpu"


def test_a_row_nested_too_deeply_in_the_store_is_unreadable_not_an_error():
    """A row written before the bound existed (here: by hand): skipped, the others listed."""
    from halo_sched import db

    _rec("good-1", 10.0)
    with db.write() as con:
        for i, levels in ((1, 600), (2, 3000)):  # 3000: deeper than json.loads itself can go
            text = f'{{"id": "deep-{i}", "backend": "local", "x": ' + '{"x": ' * levels + "1" + "}" * (levels + 1)
            con.execute("INSERT INTO jobs (id, backend, submitted, data) VALUES (?, 'local', 20.0, ?)", (f"deep-{i}", text))
    bad = []
    assert [r["id"] for r in records.page(0, on_bad=bad.append) if isinstance(r, dict)] == ["good-1"]
    assert sorted(b.id for b in bad) == ["deep-1", "deep-2"]
    for args in (["status", "deep-1"], ["status", "deep-2", "good-1"], ["list"]):
        _clean(run(*args))


def test_submit_prints_the_id_of_the_job_it_started_whatever_recording_does(tmp_path, monkeypatch, capsys):
    from halo_sched import cli

    for k, v in _sbatch_env(tmp_path).items():
        monkeypatch.setenv(k, v)

    def broken(*a, **k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(records, "save_new", broken)
    assert cli.main(["submit", str(example_job(tmp_path, 29555)), "--backend", "slurm"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "4242", (out, err)
    assert "the job record was not kept: RecursionError" in err and "internal error" not in err
