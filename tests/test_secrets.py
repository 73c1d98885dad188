"""Secrets by name (``secret_env``): the value reaches every rank and appears nowhere else.

Each backend: the local backend with real torchrun; Nomad through the fake API (submit writes the
Variable) and the client simulator (the task reads it through the guarded template); SLURM on the
real cluster in tests/test_slurm_exactly_once.py. Every test greps what halo-sched wrote or printed
for the value.
"""
from __future__ import annotations

import json
import subprocess
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

import halo_sched
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadAPIError, NomadClient, NomadConfig
from halo_sched.backends.nomad.render import job_payload, render_hcl, variable_path
from halo_sched.errors import SpecError
from halo_sched.node_runtime import ITEM, runtime
from halo_sched.spec import loads
from helpers import REPO, cli, free_port, load_nomad_helper, loopback_hosts

fake_api = load_nomad_helper("fake_api")
client_sim = load_nomad_helper("client_sim")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode

# A value every layer could mangle or leak: quotes, shell and template syntax, a newline, a
# leading '+' (the Nomad file's own marker) and a unique part to grep for.
MARK = "s3cr3t-6f1d0a9c"
VALUE = f"+{MARK} it's \"q\" $(rm -rf /) ${{HOME}} {{{{ .x }}}} %{{y}} \\\n`date`"
TOKEN = "nomad-acl-token-4b7e"


def job(tmp_path: Path, backend_extra=None, **over) -> Path:
    data = {
        "name": "secret-job", "nodes": 2, "nproc_per_node": 1,
        "trainer": {"script": str(REPO / "examples" / "train_ddp.py"),
                    "args": ["--steps", "2", "--report-dir", str(tmp_path / "reports"), "--echo-env", "HF_TOKEN",
                             "--echo-env", "WANDB_API_KEY"]},
        "env": {"OMP_NUM_THREADS": "1"},
        "secret_env": ["HF_TOKEN", "WANDB_API_KEY"],
        "rendezvous": {"port": free_port(), "timeout_s": 60},
        "nomad": {"driver": "raw_exec"},
        **(backend_extra or {}),
        **over,
    }
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def secret_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    env.update(HF_TOKEN=VALUE, WANDB_API_KEY="wandb-" + MARK, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               **extra)
    return env


def assert_nowhere(texts: dict[str, str | bytes]) -> None:
    for where, text in texts.items():
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        assert MARK.encode() not in raw, f"the secret leaked into {where}"


def files_under(root: Path, skip=()) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and not any(s in p.parts for s in skip)}


# ---- validation ------------------------------------------------------------------------------


BASE = "name: j\nnodes: 1\nnproc_per_node: 1\ntrainer: {script: t.py}\n"


@pytest.mark.parametrize("extra, field, words", [
    ("secret_env: [1TOKEN]", "secret_env", "not a valid environment variable name"),
    ("secret_env: [HALO_X]", "secret_env", "cannot be set here"),
    ("secret_env: [SLURM_JWT]", "secret_env", "cannot be set here"),
    ("secret_env: [RANK]", "secret_env", "cannot be set here"),
    ("secret_env: [IFS]", "secret_env", "bash variable"),
    ("secret_env: [A, A]", "secret_env", "named twice"),
    ("secret_env: [A]\nenv: {A: x}", "secret_env", "also set in env"),
    ("secret_env: [NCCL_SOCKET_IFNAME]\nnetwork: {interface: ib0}", "secret_env", "also set in env"),
    ("secret_env: HF_TOKEN", "secret_env", "list"),
    ("secret_env: [{a: 1}]", "secret_env", "string"),
])
def test_secret_names_are_validated(extra, field, words):
    with pytest.raises(SpecError) as info:
        loads(BASE + extra)
    assert any(f.startswith(field) and words in m for f, m in info.value.problems), info.value.problems


SERVERS = BASE + "servers: [{name: vllm, nodes: 1, command: [serve], port: 8000, %s}]\n"


@pytest.mark.parametrize("extra, words", [
    ("secret_env: [1TOKEN]", "not a valid environment variable name"),
    ("secret_env: [HALO_X]", "cannot be set here"),
    ("secret_env: [A, A]", "named twice"),
    ("secret_env: [A], env: {A: x}", "also set in its env"),
])
def test_server_secret_names_are_validated(extra, words):
    with pytest.raises(SpecError) as info:
        loads(SERVERS % extra)
    assert any(f.startswith("servers") and words in m for f, m in info.value.problems), info.value.problems


def test_server_secrets_render_by_name_on_every_backend_and_are_taken_at_submit(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(SERVERS.replace("name: j", "name: srv") % "secret_env: [HF_TOKEN, ROLLOUT_KEY]"
                 + "secret_env: [HF_TOKEN]\nnomad: {driver: raw_exec}\n")
    (tmp_path / "t.py").touch()  # its trainer.script
    env = secret_env(ROLLOUT_KEY="rk-" + MARK)
    spec = halo_sched.load(p)
    assert spec.secret_names == ["HF_TOKEN", "ROLLOUT_KEY"]
    assert spec.secret_values(env) == {"HF_TOKEN": VALUE, "ROLLOUT_KEY": "rk-" + MARK}
    for backend in ("local", "slurm", "nomad"):
        r = cli("render", str(p), "--backend", backend, env=env)
        assert r.returncode == 0 and r.stdout.count("halo_secret ROLLOUT_KEY") == 1, (backend, r.stderr)
        assert_nowhere({backend: r.stdout + r.stderr})
    server_task = job_payload(spec, "srv-1")["Job"]["TaskGroups"][-1]["Tasks"][0]
    assert server_task["Env"]["HALO_SECRETS_DIR"] == "${NOMAD_SECRETS_DIR}"
    assert [t["DestPath"] for t in server_task["Templates"] if "secret" in t["DestPath"]] == [
        "secrets/halo-secret-HF_TOKEN", "secrets/halo-secret-ROLLOUT_KEY"]
    del env["ROLLOUT_KEY"]
    for backend in ("local", "slurm", "nomad"):
        r = cli("submit", str(p), "--backend", backend, env={**env, "NOMAD_ADDR": "http://127.0.0.1:9"}, timeout=60)
        assert r.returncode == 2 and "servers[0].secret_env[1]" in r.stderr and "ROLLOUT_KEY is not set" in r.stderr, \
            (backend, r.stderr)


def test_missing_secret_at_submit_is_exit_2_naming_it(tmp_path):
    f = job(tmp_path)
    env = secret_env()
    del env["WANDB_API_KEY"]
    for backend in ("local", "slurm", "nomad"):
        r = cli("submit", str(f), "--backend", backend, env={**env, "NOMAD_ADDR": "http://127.0.0.1:9"}, timeout=60)
        assert r.returncode == 2, (backend, r.stderr)
        assert "secret_env[1]" in r.stderr and "WANDB_API_KEY is not set" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert_nowhere({"stderr": r.stderr, "stdout": r.stdout})
    # Rendering needs no value: the job file is the same wherever it is rendered.
    for backend in ("local", "slurm", "nomad"):
        r = cli("render", str(f), "--backend", backend, env={k: v for k, v in env.items() if k != "HF_TOKEN"})
        assert r.returncode == 0, r.stderr


def test_rendered_files_and_dry_runs_carry_names_not_values(tmp_path):
    f = job(tmp_path, backend_extra={"nomad": {"driver": "raw_exec"}})
    env = secret_env()
    out = {}
    for backend in ("local", "slurm", "nomad"):
        for cmd in (["render"], ["submit", "--dry-run"]):
            r = cli(cmd[0], str(f), *cmd[1:], "--backend", backend, env=env)
            assert r.returncode == 0, r.stderr
            assert "HF_TOKEN" in r.stdout
            out[f"{backend} {' '.join(cmd)}"] = r.stdout + r.stderr
    r = cli("render", str(f), "--backend", "nomad", "--format", "json", env=env)
    out["nomad json"] = r.stdout
    assert_nowhere(out)


# ---- local: real torchrun --------------------------------------------------------------------


@pytest.mark.torch
def test_local_secret_reaches_every_rank_and_nothing_else(tmp_path):
    f = job(tmp_path)
    home = tmp_path / "home"
    env = secret_env(HALO_SCHED_HOME=str(home))
    r = cli("submit", str(f), "--backend", "local", "--wait", env=env, timeout=240)
    assert r.returncode == 0, r.stderr
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("rank*.json"))]
    assert len(reports) == 2
    for rep in reports:
        assert bytes.fromhex(rep["env_hex"]["HF_TOKEN"]) == VALUE.encode()
        assert bytes.fromhex(rep["env_hex"]["WANDB_API_KEY"]) == ("wandb-" + MARK).encode()
    job_id = r.stdout.strip().splitlines()[-1]
    logs = cli("logs", job_id, "--backend", "local", env=env)
    assert_nowhere({"submit output": r.stdout + r.stderr, "logs": logs.stdout + logs.stderr,
                    **files_under(home)})


# ---- Nomad: submit writes the Variable; the task reads it ------------------------------------


def nomad_spec(tmp_path, **over):
    return halo_sched.load(job(tmp_path, backend_extra={"nomad": {"driver": "raw_exec"}}, **over))


def scheduler(fake, token=TOKEN):
    cfg = NomadConfig.from_env(env={}, address=fake.address, token=token, retry_base_s=0.01, retry_max_wait_s=0.05)
    return NomadScheduler(client=NomadClient(cfg, sleep=lambda s: None), retry_s=5)


def run_sim(job_dict: dict, tmp_path: Path, variables: dict, timeout=240):
    host = secret_env()
    # The client's own environment must not be where the value comes from.
    host.pop("HF_TOKEN")
    host.pop("WANDB_API_KEY")
    nodes = sum(int(g.get("Count") or 1) for g in job_dict["TaskGroups"])
    with client_sim.SimCluster(job_dict, tmp_path / "nomad", host_env=host, hosts=loopback_hosts(nodes)) as cluster:
        for path, items in variables.items():
            cluster.set_variable(path, items)
        cluster.place()
        cluster.start()
        codes = cluster.wait(timeout=timeout)
        logs = {n: cluster.stdout(n) + cluster.stderr(n) for n in codes}
    return codes, logs


@pytest.mark.torch
def test_nomad_secret_reaches_every_rank_through_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-" + MARK)
    spec = nomad_spec(tmp_path)
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        sched = scheduler(fake)
        handle = sched.submit(spec)
        (ns, path), var = next(iter(fake.variables.items()))
        assert path == variable_path(handle.id) and ns == "default"
        assert var["Items"] == {"HF_TOKEN": VALUE, "WANDB_API_KEY": "wandb-" + MARK, ITEM: runtime(batch=False).base64}
        registered = fake.job_record(handle.id)
        assert_nowhere({"registered job": json.dumps(registered),
                        "requests but the Variable write": json.dumps(
                            [(r.path, r.query, r.body) for r in fake.requests if not r.path.startswith("/v1/var/")])})
        # Every request carried the ACL token in its header, never in a URL.
        assert all(TOKEN not in r.path + json.dumps(r.query) for r in fake.requests)
    codes, logs = run_sim(registered, tmp_path, {path: var["Items"]})
    assert set(codes.values()) == {0}, logs
    # The node runtime reached every task from the same Variable, byte for byte (its template).
    carried = sorted((tmp_path / "nomad").rglob("local/halo-node.b64"))
    assert len(carried) == 2 and {f.read_text() for f in carried} == {runtime(batch=False).base64}, carried
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "reports").glob("rank*.json"))]
    assert len(reports) == 2
    for rep in reports:
        assert bytes.fromhex(rep["env_hex"]["HF_TOKEN"]) == VALUE.encode()
    assert_nowhere({f"task output of {n}": text for n, text in logs.items()})


@pytest.mark.torch
@pytest.mark.parametrize("variables", ["no variable", "no item"])
def test_nomad_missing_secret_fails_the_task_naming_it_never_blocks(tmp_path, variables):
    spec = nomad_spec(tmp_path, rendezvous={"port": free_port(), "timeout_s": 60})
    job_dict = job_payload(spec, "secret-job-1")["Job"]
    given = {} if variables == "no variable" else {variable_path("secret-job-1"): {"HF_TOKEN": "x"}}
    t0 = time.monotonic()
    codes, logs = run_sim(job_dict, tmp_path, given, timeout=60)
    assert time.monotonic() - t0 < 30
    assert codes and all(c != 0 for c in codes.values()), logs
    missing = "HF_TOKEN" if variables == "no variable" else "WANDB_API_KEY"
    for text in logs.values():
        assert f"secret {missing} (secret_env) is missing" in text, text
        assert "nomad/jobs/secret-job-1" in text


def test_nomad_variable_write_refused_names_the_command_not_the_value(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-" + MARK)
    spec = nomad_spec(tmp_path)
    with FakeNomad([FakeNode("a"), FakeNode("b")], acl_tokens={TOKEN: "jobs"}) as fake:
        with pytest.raises(NomadAPIError) as info:
            scheduler(fake).submit(spec)
        assert fake._jobs == {}  # nothing was submitted
    msg = str(info.value)
    assert info.value.status == 403
    assert 'nomad var put nomad/jobs/secret-job-' in msg and 'HF_TOKEN="$HF_TOKEN" WANDB_API_KEY="$WANDB_API_KEY"' in msg
    assert 'variables { path "nomad/jobs/*"' in msg
    assert_nowhere({"error": msg + repr(info.value)})
    assert TOKEN not in msg


def test_nomad_secret_needs_a_name_a_variable_path_can_carry(tmp_path):
    spec = nomad_spec(tmp_path, name="my.job")
    with pytest.raises(SpecError, match="may not contain '.'"):
        render_hcl(spec)


def test_credentials_appear_in_no_repr_or_error(tmp_path):
    cfg = NomadConfig.from_env(env={"NOMAD_TOKEN": TOKEN, "NOMAD_CLIENT_KEY": "/keys/client-key.pem",
                                    "NOMAD_CLIENT_CERT": "/keys/c.pem", "NOMAD_ADDR": "http://127.0.0.1:9"})
    for text in (repr(cfg), str(cfg)):
        assert TOKEN not in text and "client-key.pem" not in text
    env = secret_env(NOMAD_TOKEN=TOKEN, NOMAD_ADDR="http://127.0.0.1:9", HALO_SUBMIT_RETRY_S="1",
                     SLURM_JWT="jwt-" + MARK, HALO_SLURM_TRANSPORT="rest", HALO_SLURMRESTD_URL="http://127.0.0.1:9")
    f = job(tmp_path, backend_extra={"nomad": {"driver": "raw_exec"}})
    for backend, cmd in (("nomad", "submit"), ("nomad", "status"), ("slurm", "status"), ("slurm", "submit")):
        args = [str(f)] if cmd == "submit" else ["123"]
        r = cli(cmd, *args, "--backend", backend, env=env, timeout=120)
        assert r.returncode != 0
        assert TOKEN not in r.stdout + r.stderr, r.stderr
        assert_nowhere({f"{backend} {cmd}": r.stdout + r.stderr})


def test_nomad_purge_deletes_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("WANDB_API_KEY", "x")
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        sched = scheduler(fake)
        handle = sched.submit(nomad_spec(tmp_path))
        assert fake.variables
        sched.cancel([handle.id], purge=True)
        assert fake.variables == {}


def test_subprocess_environment_of_sbatch_has_the_secret(tmp_path):
    """SLURM: the values travel in sbatch's own environment (sbatch --export semantics; the real
    cluster test proves they reach srun tasks), never on its command line or in the script."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv, 'env': dict(os.environ), 'script': sys.stdin.read()}}, open({str(tmp_path / 'call.json')!r}, 'w'))\n"
        "print('4242')\n")
    (bindir / "sbatch").chmod(0o755)
    f = job(tmp_path)
    env = secret_env()
    env["PATH"] = f"{bindir}:{env['PATH']}"
    env["SBATCH_EXPORT"] = "NONE"  # a user default that would drop them: halo-sched overrides it
    r = cli("submit", str(f), "--backend", "slurm", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    call = json.loads((tmp_path / "call.json").read_text())
    assert call["env"]["HF_TOKEN"] == VALUE
    assert "--export=ALL" in call["argv"]
    assert_nowhere({"sbatch argv": " ".join(call["argv"]), "script": call["script"], "output": r.stdout + r.stderr})


# ---- Nomad: the Variable is gone once the job ended ----------------------------------------


def cli_env(fake, home: Path, **extra) -> dict:
    return secret_env(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(home),
                      HALO_SUBMIT_RETRY_S="2", **extra)


def submit_nomad(tmp_path, fake, env, *flags) -> subprocess.CompletedProcess:
    f = job(tmp_path, backend_extra={"nomad": {"driver": "raw_exec"}})
    return cli("submit", str(f), "--backend", "nomad", *flags, env=env, timeout=120)


def end_job(fake, job_id: str, code: int) -> None:
    for group in ("trainer[0]", "trainer[1]"):
        fake.finish(job_id, group, exit_code=code if group == "trainer[1]" else 0)


@pytest.mark.parametrize("code, status", [(0, "COMPLETED"), (3, "FAILED")])
def test_nomad_variable_is_gone_after_the_next_status_once_the_job_ended(tmp_path, code, status):
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        env = cli_env(fake, tmp_path / "home")
        r = submit_nomad(tmp_path, fake, env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().splitlines()[-1]
        outputs = {"submit": r.stdout + r.stderr}
        # Running: the Variable stays (a rank starting late still reads it).
        r = cli("status", job_id, env=env)
        outputs["status while running"] = r.stdout + r.stderr
        assert "RUNNING" in r.stdout and fake.variables, r.stderr
        end_job(fake, job_id, code)
        assert fake.variables  # nobody has looked yet
        r = cli("status", job_id, env=env)
        outputs["status after the end"] = r.stdout + r.stderr
        assert r.returncode == 0 and status in r.stdout, r.stderr
        assert fake.variables == {}, "the ended job's Variable is still there"
        assert fake.requests_to(f"/v1/var/{variable_path(job_id)}", method="DELETE")
        # Seen again: a second delete of nothing is harmless and silent.
        r = cli("list", env=env)
        outputs["list"] = r.stdout + r.stderr
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert_nowhere(outputs)


@pytest.mark.parametrize("code, status, rc", [(0, "COMPLETED", 0), (3, "FAILED", 1)])
@pytest.mark.parametrize("how", ["submit --wait", "watch"])
def test_nomad_variable_is_gone_after_a_wait_sees_the_end(tmp_path, code, status, rc, how):
    import threading

    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        env = cli_env(fake, tmp_path / "home")
        stop = threading.Event()

        def finisher() -> None:  # ends whichever job appears, once both ranks run
            while not stop.is_set():
                ids = [j for (_, j) in list(fake._jobs)]
                if ids and len(fake.allocs_of(ids[0])) == 2 and all(
                        a["ClientStatus"] == "running" for a in fake.allocs_of(ids[0])):
                    time.sleep(0.5)
                    end_job(fake, ids[0], code)
                    return
                time.sleep(0.1)

        t = threading.Thread(target=finisher, daemon=True)
        if how == "submit --wait":
            t.start()
            r = submit_nomad(tmp_path, fake, env, "--wait", "--quiet", "--timeout", "60")
        else:
            r = submit_nomad(tmp_path, fake, env)
            assert r.returncode == 0 and fake.variables, r.stderr
            t.start()
            r = cli("watch", r.stdout.strip().splitlines()[-1], "--quiet", "--timeout", "60", env=env, timeout=120)
        stop.set()
        t.join(timeout=10)
        assert r.returncode == rc and status in r.stderr, r.stderr
        assert fake.variables == {}, "the ended job's Variable is still there"
    assert_nowhere({how: r.stdout + r.stderr})


def test_nomad_failed_delete_is_one_warning_and_never_fails_status(tmp_path):
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        env = cli_env(fake, tmp_path / "home")
        r = submit_nomad(tmp_path, fake, env)
        job_id = r.stdout.strip().splitlines()[-1]
        end_job(fake, job_id, 0)
        fake.fail_next(50, status=403, body="Permission denied", path_contains="/v1/var/")
        r = cli("status", job_id, env=env)
        assert r.returncode == 0 and "COMPLETED" in r.stdout, r.stderr
        warnings = [line for line in r.stderr.splitlines() if "warning" in line]
        assert len(warnings) == 1 and "halo-sched gc" in warnings[0] and "\"destroy\"" in warnings[0], r.stderr
        assert len(warnings[0]) < 200, warnings
        assert fake.variables  # still there: gc gets it
        # gc while deletes still fail: exit 1, one warning and one line naming the job, nothing claimed.
        fake.fail_next(50, status=403, body="Permission denied", path_contains="/v1/var/")
        r = cli("gc", env=env)
        assert r.returncode == 1 and r.stdout == "", r.stderr
        assert r.stderr.count("warning") == 1 and r.stderr.count("could not be deleted") == 1, r.stderr
        fake._fail_queue.clear()
        r = cli("gc", env=env)
        assert r.returncode == 0 and r.stdout.split() == [job_id, variable_path(job_id)], r.stderr
        assert fake.variables == {}
    assert_nowhere({"status": r.stdout + r.stderr})


def test_nomad_gc_clears_an_unwatched_ended_job_and_keeps_a_running_one(tmp_path):
    with FakeNomad([FakeNode("a"), FakeNode("b"), FakeNode("c"), FakeNode("d")], token=TOKEN) as fake:
        env = cli_env(fake, tmp_path / "home")
        ids = []
        for _ in range(3):
            r = submit_nomad(tmp_path, fake, env)
            assert r.returncode == 0, r.stderr
            ids.append(r.stdout.strip().splitlines()[-1])
        ended, running, purged = ids
        fake.set_running(running)
        end_job(fake, ended, 0)
        # One that Nomad no longer knows, its Variable left behind (a purge by hand, say).
        fake.finish(purged, "trainer[0]", 0)
        fake.finish(purged, "trainer[1]", 1)
        with fake._lock:
            del fake._jobs[("default", purged)]
        assert len(fake.variables) == 3
        r = cli("gc", env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.splitlines()) == sorted(f"{i}\t{variable_path(i)}" for i in (ended, purged))
        assert [p for _, p in fake.variables] == [variable_path(running)]
        assert "1 job still pending or running" in r.stderr and "2 ended jobs" in r.stderr, r.stderr
        # Nothing left to do: nothing reported, still exit 0.
        r2 = cli("gc", env=env)
        assert r2.returncode == 0 and r2.stdout == "" and [p for _, p in fake.variables] == [variable_path(running)]
        # Nomad unreachable: exit 1, nothing claimed.
    r3 = cli("gc", env={**env, "NOMAD_ADDR": "http://127.0.0.1:9", "HALO_SUBMIT_RETRY_S": "1"}, timeout=120)
    assert r3.returncode == 1 and r3.stdout == "" and "Traceback" not in r3.stderr, r3.stderr
    assert_nowhere({"gc": r.stdout + r.stderr, "gc again": r2.stdout + r2.stderr, "gc unreachable": r3.stderr})


# ---- Nomad: the task's own user reads its secret -------------------------------------------

NON_ROOT = (1000, 1000)


def write_as_nomad_renders(path: Path, content: str, tpl: dict) -> None:
    """A rendered template as the Nomad client leaves it: written by the agent (root), mode from
    Perms, owner changed only when Uid/Gid are set (client/allocrunner/taskrunner/template/
    template.go:814-826@v2.0.5; consul-template renderer sets them on the file it writes)."""
    path.write_text(content)
    os.chmod(path, int(tpl["Perms"], 8))
    uid, gid = tpl.get("Uid"), tpl.get("Gid")
    if (uid is not None and uid >= 0) or (gid is not None and gid >= 0):
        os.chown(path, uid if uid is not None and uid >= 0 else -1, gid if gid is not None and gid >= 0 else -1)


def run_secret_part_as(spec, job_id: str, task_dir: Path, user: tuple[int, int], values: dict | None) -> subprocess.CompletedProcess:
    """The job's own rendered entry script, up to its secret reads, run as ``user`` in a task dir
    laid out as the client does (secrets/ 0777, client/allocdir/task_dir.go:326@v2.0.5), each secret
    file written as Nomad would from the job's own template (its Perms, Uid, Gid)."""
    task = job_payload(spec, job_id)["Job"]["TaskGroups"][0]["Tasks"][0]
    secrets_dir = task_dir / "secrets"
    secrets_dir.mkdir(parents=True)
    os.chmod(task_dir, 0o777)
    os.chmod(secrets_dir, 0o777)
    for tpl in task["Templates"]:
        name = tpl["DestPath"].rsplit("halo-secret-", 1)[-1]
        if tpl["DestPath"].startswith("secrets/") and values is not None and name in values:
            write_as_nomad_renders(task_dir / tpl["DestPath"], "+" + values[name], tpl)
    entry = task["Templates"][0]["EmbeddedTmpl"]
    lines = entry.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith("halo_secret "))
    script = "".join(lines[:last + 1]) + 'printf "%s" "$HF_TOKEN" | od -An -tx1 | tr -d " \\n"\n'
    (task_dir / "run.sh").write_text(script)
    os.chmod(task_dir / "run.sh", 0o755)
    env = {"PATH": "/usr/bin:/bin", "HALO_NODE_RANK": "0", "HALO_SECRETS_DIR": str(secrets_dir),
           "NOMAD_JOB_ID": job_id, **({"NOMAD_TASK_DIR": str(task_dir)})}
    return subprocess.run(["/bin/bash", str(task_dir / "run.sh")], env=env, capture_output=True, text=True,
                          timeout=30, cwd="/", preexec_fn=lambda: (os.setgroups([]), os.setgid(user[1]), os.setuid(user[0])))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner and the task's user needs root")


@pytest.fixture
def open_dir():
    """A directory another user can reach (pytest's tmp_path lies under a 0700 directory)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="halo-secrets-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_nomad_non_root_task_reads_its_secret_rendered_for_nomad_user(tmp_path, open_dir):
    spec = halo_sched.load(job(tmp_path, image="trainer:1", nomad={"driver": "docker", "user": "1000:1000"}))
    task = job_payload(spec, "secret-job-1")["Job"]["TaskGroups"][0]["Tasks"][0]
    # The container runs as that user whatever the image's USER (drivers/docker/driver.go:1055@v2.0.5).
    assert task["User"] == "1000:1000"
    secret_tpls = [t for t in task["Templates"] if t["DestPath"].startswith("secrets/")]
    assert secret_tpls and all((t["Perms"], t["Uid"], t["Gid"]) == ("0400", 1000, 1000) for t in secret_tpls)
    hcl = render_hcl(spec, "secret-job-1")
    assert 'user         = "1000:1000"' in hcl and "uid         = 1000" in hcl and "gid         = 1000" in hcl
    r = run_secret_part_as(spec, "secret-job-1", open_dir / "task", NON_ROOT,
                           {"HF_TOKEN": VALUE, "WANDB_API_KEY": "wandb-" + MARK})
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(r.stdout) == VALUE.encode()
    assert_nowhere({"stderr": r.stderr})


@needs_root
def test_nomad_unreadable_secret_is_named_as_such_not_as_missing(tmp_path, open_dir):
    # No nomad.user: the file stays the agent's (root's), 0400; the image's user is not root.
    spec = halo_sched.load(job(tmp_path, image="trainer:1", nomad={"driver": "docker"}))
    assert "User" not in job_payload(spec, "secret-job-1")["Job"]["TaskGroups"][0]["Tasks"][0]
    r = run_secret_part_as(spec, "secret-job-1", open_dir / "a", NON_ROOT,
                           {"HF_TOKEN": VALUE, "WANDB_API_KEY": "wandb-" + MARK})
    assert r.returncode == 1
    assert "secret HF_TOKEN (secret_env) is there but this task's user (uid 1000, gid 1000) cannot read it" in r.stderr
    assert "owner uid:gid 0:0 and mode 400" in r.stderr and "nomad.user" in r.stderr and "missing" not in r.stderr
    # No file at all, and an empty file (the store has no item): "missing", each with its cause.
    r = run_secret_part_as(spec, "secret-job-1", open_dir / "b", NON_ROOT, None)
    assert r.returncode == 1 and "HF_TOKEN (secret_env) is missing: there is no file" in r.stderr, r.stderr
    r = run_secret_part_as(spec, "secret-job-1", open_dir / "c", (0, 0), {"HF_TOKEN": VALUE})
    assert r.returncode == 1 and "WANDB_API_KEY (secret_env) is missing: there is no file" in r.stderr, r.stderr
    assert_nowhere({"stderr": r.stderr})


def test_nomad_exec_with_secrets_needs_nomad_user(tmp_path):
    spec = halo_sched.load(job(tmp_path, nomad={"driver": "exec"}))
    with pytest.raises(SpecError) as info:
        job_payload(spec, "secret-job-1")
    assert info.value.problems[0][0] == "nomad.user" and "nobody" in info.value.problems[0][1]
    spec = halo_sched.load(job(tmp_path, nomad={"driver": "exec", "user": "65534:65534"}))
    task = job_payload(spec, "secret-job-1")["Job"]["TaskGroups"][0]["Tasks"][0]
    assert "User" not in task  # exec takes a host user name: nobody runs it
    assert {(t["Uid"], t["Gid"]) for t in task["Templates"] if t["DestPath"].startswith("secrets/")} == {(65534, 65534)}


def test_nomad_secrets_too_large_for_the_variable_are_refused_before_any_write(tmp_path):
    """Nomad refuses a Variable over 64 KiB (nomad/structs/variables.go maxVariableSize): halo-sched
    says so at submit, exit 2 naming secret_env and the sizes, never a value, and writes nothing."""
    big = MARK + "x" * 20000
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        env = {**cli_env(fake, tmp_path / "home"), "HF_TOKEN": big}
        r = submit_nomad(tmp_path, fake, env)
        assert r.returncode == 2, r.stderr
        assert "secret_env" in r.stderr and "Nomad keeps at most 65,536" in r.stderr, r.stderr
        assert "the secrets 20,0" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert fake.variables == {} and not fake._jobs
        refused = r.stdout + r.stderr
        # Within the room, the same job goes.
        env["HF_TOKEN"] = big[:4000]
        r = submit_nomad(tmp_path, fake, env)
        assert r.returncode == 0 and fake.variables, r.stderr
    assert_nowhere({"refused submit": refused})


@pytest.mark.parametrize("bad", ["1000", "me:me", "1000:", "-1:0", "99999999999:0", "1000:1000:1"])
def test_nomad_user_is_numeric_uid_gid(bad):
    with pytest.raises(SpecError) as info:
        loads(BASE + f"nomad: {{user: '{bad}'}}\n")
    assert any(f.startswith("nomad.user") for f, _ in info.value.problems), info.value.problems


def test_nomad_list_deletes_each_ended_job_secrets_once(tmp_path):
    with FakeNomad([FakeNode("a"), FakeNode("b")], token=TOKEN) as fake:
        env = cli_env(fake, tmp_path / "home")
        ids = [submit_nomad(tmp_path, fake, env).stdout.strip().splitlines()[-1] for _ in range(3)]
        for job_id in ids[:2]:
            end_job(fake, job_id, 0)
        r = cli("list", env=env)
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        assert [p for _, p in fake.variables] == [variable_path(ids[2])]  # the running one keeps its own
        deletes = len(fake.requests_to("/v1/var/", method="DELETE"))
        assert deletes == 2
        # Seen again: one listing of what is left, no delete of what is already gone.
        r = cli("list", env=env)
        assert r.returncode == 0 and len(fake.requests_to("/v1/var/", method="DELETE")) == deletes, r.stderr
    assert_nowhere({"list": r.stdout + r.stderr})
