"""A job's own variables in the submitting environment are another job's (issue 43, item 10).

``HALO_RUN_ID``/``HALO_RUN_ATTEMPT``/``HALO_RUN_EXCLUDED`` in a submitting shell made a SLURM
job's first attempt "attempt 3 of run 999" with node3 excluded (``HALO_RESTART_COUNT=1`` on its
ranks). ``submit`` now leaves out every variable halo-sched itself gives a job's processes (a
run's identity and state, a node's part in its job, the layout and server roles), on every
backend, with one warning line naming them; the user's own settings stay. No real cluster here:
the local backend with a recording torchrun, sbatch as a stand-in (the cli transport) and
slurmrestd's stand-in (the rest transport), and Nomad's fake API.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

import halo_sched
from halo_sched.backends.base import inherited_job_names
from helpers import FAKE_TORCHRUN, cli, load_nomad_helper, records, run_sbatch, write_tool

#: What the issue's shell held, and more of the same kind: a rank that submits a job of its own has all of these.
LEAKED = {"HALO_RUN_ID": "999", "HALO_RUN_ATTEMPT": "2", "HALO_RUN_EXCLUDED": "node3", "HALO_RESTART_COUNT": "1",
          "HALO_LOCAL_JOB": "/elsewhere/job", "HALO_NODE_TAG": "node0-other", "HALO_NODE_RANK": "3",
          "HALO_LOG_DIR": "/elsewhere/logs", "HALO_PARALLEL_TP": "8", "HALO_SERVER_ROLLOUT_URLS": "http://10.9.9.9:1",
          "HALO_PROGRESS_MIRROR": "/elsewhere/mirror", "HALO_SECRET_NAMES": "OTHER_TOKEN"}
#: The user's own settings: they stay.
KEPT = {"HALO_SUBMIT_RETRY_S": "3", "HALO_OUTAGE_S": "30"}
WATCHED = sorted({*LEAKED, *KEPT, "HALO_FAILURE_KEY", "HALO_SCHED_HOME"})


def _spec(tmp_path: Path, **over) -> Path:
    data = {"name": "envjob", "nodes": 1, "nproc_per_node": 1, "trainer": {"script": "train.py"},
            "retry": {"attempts": 3, "on": ["node"]}, **over}
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    (tmp_path / "train.py").touch()  # its trainer.script, beside it (checked at submit)
    return p


def _warning(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "another job's run, attempt or node" in ln]


def test_the_names_are_a_jobs_own_and_never_the_users_settings():
    environ = {**LEAKED, **KEPT, "HALO_SCHED_HOME": "/h", "HALO_SCHED_BACKEND": "local", "HALO_SLURM_TRANSPORT": "rest",
               "HALO_FORGET_JOB": "x", "PATH": "/bin"}
    assert inherited_job_names(environ) == sorted(LEAKED)


def test_local_a_leaked_run_never_reaches_the_first_attempt(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_tool(bindir, "torchrun", FAKE_TORCHRUN)  # records its argv and the environment it was given
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NOMAD_"))}
    env.update(LEAKED, **KEPT, PATH=f"{bindir}:{env['PATH']}", FAKE_TORCHRUN_DIR=str(out),
               FAKE_TORCHRUN_ENV=",".join(WATCHED))
    # The supervisor puts its own python's directory first on PATH: setup puts the recorder before it.
    job = _spec(tmp_path, setup=[f"export PATH={bindir}:$PATH"])
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", "--timeout", "120",
            env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    [warning] = _warning(r.stderr)
    assert all(k in warning for k in LEAKED) and not any(v in warning for v in LEAKED.values()), warning
    [node] = records(out).values()
    got = {k: bytes.fromhex(v).decode() for k, v in node["env_hex"].items()}
    assert got["HALO_RESTART_COUNT"] == "0"  # the first attempt, as the job's own
    assert got["HALO_LOCAL_JOB"] != LEAKED["HALO_LOCAL_JOB"] and got["HALO_NODE_RANK"] == "0"
    for k in ("HALO_RUN_ID", "HALO_RUN_ATTEMPT", "HALO_RUN_EXCLUDED", "HALO_PARALLEL_TP", "HALO_SERVER_ROLLOUT_URLS",
              "HALO_PROGRESS_MIRROR", "HALO_SECRET_NAMES", "HALO_FAILURE_KEY"):
        assert k not in got, (k, got)
    assert {k: got.get(k) for k in KEPT} == KEPT


def test_slurm_cli_sbatch_gets_none_and_the_script_runs_as_the_runs_first_attempt(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    call = tmp_path / "call.json"
    # The attempt's sbatch is kept; its guardian's (--dependency=afternotok, docs/recovery.md) comes next.
    (bindir / "sbatch").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"guard = any(a.startswith('--dependency=afternotok:') for a in sys.argv)\n"
        f"json.dump({{'env': dict(os.environ), 'script': sys.stdin.read()}}, "
        f"open({str(call)!r} + ('.guardian' if guard else ''), 'w'))\nprint('4243' if guard else '4242')\n")
    (bindir / "sbatch").chmod(0o755)
    for tool in ("scontrol", "squeue", "sacct", "sinfo"):  # no real SLURM client is asked anything
        (bindir / tool).write_text(f"#!/bin/sh\necho '{tool}: stand-in: no cluster here' >&2\nexit 1\n")
        (bindir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NOMAD_"))}
    env.update(LEAKED, **KEPT, PATH=f"{bindir}:{env['PATH']}", HALO_SLURM_TRANSPORT="cli")
    r = cli("submit", str(_spec(tmp_path)), "--backend", "slurm", env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(_warning(r.stderr)) == 1, r.stderr
    sent = json.loads(call.read_text())
    guard = json.loads((tmp_path / "call.json.guardian").read_text())  # the run's guardian: the same environment
    assert guard["env"] == sent["env"] and guard["script"].endswith(sent["script"])
    assert not set(LEAKED) & set(sent["env"]), sorted(set(LEAKED) & set(sent["env"]))
    assert len(sent["env"]["HALO_FAILURE_KEY"]) == 64 and all(sent["env"][k] == v for k, v in KEPT.items())
    # The batch script, run with the HALO_* that sbatch exported, starts attempt 1 of its own run.
    halo = {k: v for k, v in sent["env"].items() if k.startswith("HALO_") and k != "HALO_FAILURE_KEY"}
    done, recs = run_sbatch(sent["script"], tmp_path / "batch", ["node1"], env_names=WATCHED,
                            extra_env={**halo, "SLURM_JOB_ID": "4242"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = {k: bytes.fromhex(v).decode() for k, v in recs[0]["env_hex"].items()}
    assert got["HALO_RESTART_COUNT"] == "0" and not {"HALO_RUN_ID", "HALO_RUN_ATTEMPT", "HALO_RUN_EXCLUDED"} & set(got)
    # The submitter's history home (its failure key in the store) reaches no rank, as on local.
    assert sent["env"].get("HALO_SCHED_HOME") and "HALO_SCHED_HOME" not in got, sorted(got)
    # What the leak did (the issue): the same script given the leaked run is "attempt 3 of run 999".
    done, recs = run_sbatch(sent["script"], tmp_path / "leaked", ["node1"], env_names=WATCHED,
                            extra_env={**halo, **LEAKED, "SLURM_JOB_ID": "4243"})
    assert bytes.fromhex(recs[0]["env_hex"]["HALO_RESTART_COUNT"]).decode() == "2"


def test_slurm_rest_sends_none_in_the_jobs_environment(tmp_path, monkeypatch, capsys):
    from halo_sched.backends.slurm import SlurmScheduler
    from halo_sched.backends.slurm.transport import RestTransport
    from slurmrestd_stub import Slurmrestd

    for k, v in {**LEAKED, **KEPT}.items():
        monkeypatch.setenv(k, v)
    with Slurmrestd("25.11") as stub:
        sched = SlurmScheduler(transport=RestTransport(url=stub.url, token="t", user="alice", retries=1))
        sched.submit(halo_sched.load(_spec(tmp_path)))
        body, guard = [b for m, _, b in stub.requests if m == "POST"]  # the job, then its guardian (retry:)
    sent = body["job"]["environment"]
    sent = dict(x.split("=", 1) for x in sent) if isinstance(sent, list) else sent
    assert guard["job"]["environment"] == body["job"]["environment"]
    assert not set(LEAKED) & set(sent) and "HALO_FAILURE_KEY" in sent and all(sent[k] == v for k, v in KEPT.items())
    assert len(_warning(capsys.readouterr().err)) == 1
    assert all(os.environ[k] == v for k, v in LEAKED.items())  # this process's own environment, as it was


def test_nomad_the_registered_job_carries_none(tmp_path, monkeypatch, capsys):
    from halo_sched.backends.nomad import NomadScheduler
    from halo_sched.backends.nomad.client import NomadClient, NomadConfig

    fake_api = load_nomad_helper("fake_api")
    for k, v in {**LEAKED, **KEPT}.items():
        monkeypatch.setenv(k, v)
    spec = halo_sched.load(_spec(tmp_path, nomad={"driver": "raw_exec"}))
    with fake_api.FakeNomad([fake_api.FakeNode("a")], token="tok") as fake:
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token="tok", retry_attempts=1)))
        handle = sched.submit(spec)
        registered = json.dumps(fake.job_record(handle.id))
        sent = json.dumps([r.body for r in fake.requests])
    for k, v in LEAKED.items():
        assert f"{k}={v}" not in sent and f'"{k}": "{v}"' not in sent and f'"{k}":"{v}"' not in sent, k
    assert "HALO_RUN_" not in registered and "/elsewhere" not in registered and "node0-other" not in registered
    assert len(_warning(capsys.readouterr().err)) == 1
