"""``setup`` lines run in the node's own shell, yet cannot swallow the script or fake success.

The rendered entry (and a server role's script) is run for real with bash and a stand-in
torchrun that records its argv, environment and working directory: setup is one quoted string
run by eval (a heredoc it leaves open ends with it), `exit` in it fails the node, a syntax error
fails it before any line runs, and what it exports, sources or `cd`s into reaches the ranks.
"""
from __future__ import annotations

import json

import pytest

import halo_sched
from halo_sched.backends.base import JobStatus
from halo_sched.node_runtime import server_shell
from helpers import entry_script
from helpers import server_script
from helpers import base_env, example_job, fake_bin, free_port, records, run_entry, run_sbatch

JOB = """
name: setup-test
nodes: 2
nproc_per_node: 1
trainer: {script: t.py, args: ["--x", "it's $(x)"]}
rendezvous: {port: 29518, timeout_s: 5}
nomad: {driver: raw_exec}
"""
NODE = {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "127.0.0.1", "HALO_MASTER_PORT": "29500"}


def _spec(setup):
    return halo_sched.loads(JOB + "setup: " + json.dumps(setup) + "\n")


def _run(setup, tmp_path, names=()):
    bindir, out = fake_bin(tmp_path), tmp_path / "out"
    out.mkdir()
    r = run_entry(entry_script(_spec(setup)), tmp_path, NODE, base_env(bindir, out, names))
    return r, records(out).get(1)


def test_an_open_heredoc_ends_with_setup_not_with_the_script(tmp_path):
    """`cat > /dev/null <<'X'` used to read the rest of the entry script as its input: torchrun
    never started and the node ended with exit 0 (the job COMPLETED without training)."""
    r, rec = _run(["cat > /dev/null <<'X'", "echo inside-the-heredoc"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert rec is not None, "torchrun never started"
    assert rec["argv"][-1] == "it's $(x)"
    assert "inside-the-heredoc" not in r.stdout


def test_an_open_heredoc_on_slurm_still_runs_every_node(tmp_path):
    text = halo_sched.render(_spec(["cat > /dev/null <<'HALO_ENTRY_EOF'"]), "slurm")
    r, recs = run_sbatch(text, tmp_path, ["a", "b"])
    assert r.returncode == 0, r.stderr
    assert sorted(recs) == [0, 1]


@pytest.mark.parametrize("line, rc", [("exit 0", 1), ("true; exit", 1), ("exit 3", 3), ("exit 256", 1),
                                      ("f() { exit 0; }; f", 1), ("source /dev/stdin <<< 'exit 0'", 1)])
def test_exit_in_setup_fails_the_node(line, rc, tmp_path):
    r, rec = _run([line, "echo not-reached"], tmp_path)
    assert rec is None
    assert r.returncode == rc, r.stderr
    assert "setup ended the script" in r.stderr and "before torchrun started" in r.stderr, r.stderr
    assert "not-reached" not in r.stdout


def test_exit_in_setup_fails_the_slurm_job(tmp_path):
    r, recs = run_sbatch(halo_sched.render(_spec(["exit 0"]), "slurm"), tmp_path, ["a", "b"])
    assert r.returncode != 0
    assert recs == {}
    assert b"setup ended the script" in r.stderr


def test_setup_shapes_the_ranks_environment(tmp_path):
    """Run in the node's own shell: what setup exports, sources (a venv, `module`) or `cd`s into
    reaches torchrun; a subshell's exit ends only the subshell; a heredoc left open at its end
    takes nothing of the script's."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "activate").write_text("export BAR=from-venv\nmodule() { export MOD=\"$1\"; }\n")
    work = tmp_path / "work dir"
    work.mkdir()
    r, rec = _run(["export FOO=1", f"source '{venv}/activate'", "module load-cuda", f"cd '{work}'",
                   "(exit 3) || true", "x=$(exit 0)", "cat > /dev/null <<'X'"], tmp_path, ["FOO", "BAR", "MOD"])
    assert r.returncode == 0, r.stderr
    assert {k: bytes.fromhex(v).decode() for k, v in rec["env_hex"].items()} == {
        "FOO": "1", "BAR": "from-venv", "MOD": "load-cuda"}
    assert rec["cwd"] == str(work)


def test_a_syntax_error_fails_before_any_of_it_runs(tmp_path):
    mark = tmp_path / "ran"
    r, rec = _run([f"touch '{mark}'", "if then"], tmp_path)
    assert r.returncode != 0
    assert rec is None and not mark.exists()
    assert "setup is not valid bash" in r.stderr and "syntax error" in r.stderr, r.stderr


def test_a_failing_command_fails_loudly(tmp_path):
    r, rec = _run(["false", "echo not-reached"], tmp_path)
    assert r.returncode == 1 and rec is None
    assert "setup failed (exit 1) before torchrun started" in r.stderr, r.stderr


def test_setups_shell_options_do_not_change_the_script(tmp_path):
    """`set -u` in setup used to end the node at the script's next unset variable (the master
    address file, unset on SLURM and local); `set +e` would let its failures pass; IFS would
    change how it splits. Afterwards the script has its own again (the ranks keep setup's env)."""
    r, rec = _run(["set -u", "set +e", "IFS=:", "export FOO=kept"], tmp_path, ["FOO"])
    assert r.returncode == 0, r.stderr
    assert rec["argv"][-1] == "it's $(x)"
    assert bytes.fromhex(rec["env_hex"]["FOO"]) == b"kept"


# ---- server roles ------------------------------------------------------------------------------


def _server_run(setup, tmp_path):
    out = tmp_path / "server-out"
    spec = halo_sched.loads(JOB + f"""
servers:
  - name: srv
    nodes: 1
    port: 18000
    command: [sh, -c, 'printf %s "${{FOO-unset}}" > "$0"', {str(out)!r}]
    setup: {json.dumps(setup)}
""")
    env = {**base_env(fake_bin(tmp_path), tmp_path), "HALO_SERVER_INDEX": "0", "HALO_TRAINER_MASTER_ADDR": "127.0.0.1",
           "HALO_SERVER_SHELL": server_shell()}
    r = run_entry(server_script(spec, spec.servers[0]), tmp_path, {}, env)
    return r, (out.read_text() if out.exists() else None)


@pytest.mark.parametrize("setup, rc, seen", [
    (["export FOO=2", "cat > /dev/null <<'X'", "echo swallowed"], 0, "2"),
    (["exit 0"], 1, None),
    (["if then"], 1, None),
])
def test_server_setup(setup, rc, seen, tmp_path):
    r, got = _server_run(setup, tmp_path)
    assert r.returncode == rc, r.stderr
    assert got == seen
    if rc:
        assert "halo-sched: server srv[0]: " in r.stderr and "before the server started" in r.stderr or (
            "servers[].setup is not valid bash" in r.stderr), r.stderr


# ---- the local backend ---------------------------------------------------------------------------


def test_local_job_whose_setup_exits_fails(tmp_path):
    job = example_job(tmp_path, free_port(), setup=["echo before", "exit 0"])
    handle = halo_sched.submit(halo_sched.load(job), "local")
    state = handle.wait(timeout=60)
    assert state.status is JobStatus.FAILED, state.describe()
    log = "".join(handle.logs())
    assert "setup ended the script (exit 0) before torchrun started" in log, log
