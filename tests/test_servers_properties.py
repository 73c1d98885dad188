"""Property tests: hostile text in a server role's ``command`` and ``env`` stays literal on every
backend (``setup`` is shell by design and left out).

* Local and SLURM: the server entry script (one script, halo_sched/servers.py) runs under bash
  with a recording command in place of the server; its argv and environment arrive byte-exact.
  SLURM carries the script in the batch script through a quoted heredoc: bash reads that
  assignment back to the same bytes (less the trailing newlines ``$(...)`` drops).
* Nomad: the HCL, read by HashiCorp's parser (tests/hclparse), decodes to the API payload; the
  entry template, rendered as the Nomad client renders it (tests/nomad/client_sim.py: Go
  template with the job's delimiters; task Env through ReplaceEnv), is the same script, and
  run under bash delivers the same bytes. Text HCL would normalize (not NFC) is refused.

``HALO_HYPOTHESIS_EXAMPLES`` sets the example count (default 100; the ``long`` run tries 5x as
many Nomad decodes and renders, without starting a process for each).
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import halo_sched.spec
from halo_sched.backends.nomad.render import job_payload, render_hcl
from halo_sched.backends.slurm.render import render_sbatch
from halo_sched.errors import SpecError
from halo_sched.node.shell import assignment
from halo_sched.node_runtime import server_shell
from helpers import server_script

# The names docs/job-file.md promises every server (not halo-sched's own constants).
SERVER_INDEX_VAR, TRAINER_MASTER_VAR = "HALO_SERVER_INDEX", "HALO_TRAINER_MASTER_ADDR"
from hclparse import hcl2json, jobspec
from helpers import load_nomad_helper

client_sim = load_nomad_helper("client_sim")
EXAMPLES = int(os.environ.get("HALO_HYPOTHESIS_EXAMPLES", "100"))

DANGER = st.sampled_from(["'", '"', "\\", "$", "${x}", "$(id)", "`id`", "%{y}", "$${", "%%{", "{{", "}}", "[[", "]]",
                          "\n", "\r", "\t", "\x01", "\x1b", "\x7f", " ", "ü", "é", "\u00e9", "EOF", "HALO_SERVER_EOF",
                          "HALO_ENTRY_EOF", "#", ";", "&", "|", "*", "~", "!", "-", "${NOMAD_ALLOC_INDEX}"])
TEXT = st.lists(st.one_of(DANGER, st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                          max_size=4)), max_size=10).map("".join)
NFC = TEXT.map(lambda t: unicodedata.normalize("NFC", t))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Stands in for the server: records its argv and the role's env as hex, then exits 0.
RECORDER = ("import json, os, sys; json.dump({'argv': [a.encode('utf-8', 'surrogateescape').hex() for a in sys.argv[1:]], "
            "'env': {k: os.environb[k.encode()].hex() for k in ('V1', 'V2')}}, open(os.environ['REC_OUT'], 'w'))")


def spec_with(args: list[str], env: dict[str, str]):
    return halo_sched.spec.JobSpec.model_validate({
        "name": "prop", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"},
        "nomad": {"driver": "raw_exec"},
        "servers": [{"name": "s", "nodes": 1, "port": 8000,
                     "command": [sys.executable, "-c", RECORDER, *args], "env": env}],
    })


@functools.lru_cache(maxsize=1)
def batch_server_shell() -> str:
    """``$halo_server_shell`` as the SLURM batch script has it: what the node runtime's
    ``python -m halo_sched.node.shell batch server`` prints, evaluated by bash."""
    r = subprocess.run(["bash", "-c", 'eval "$("$1" -m halo_sched.node.shell batch server)"; printf %s "$halo_server_shell"',
                        "t", sys.executable], capture_output=True, timeout=60, check=True)
    return r.stdout.decode()


def run_server(script: str, tmp, shell: str = "file") -> dict:
    """The server entry under bash, with the servers' shell as a file (Nomad's template, local) or
    as HALO_SERVER_SHELL (SLURM: the batch script's copy, handed to the step)."""
    path, out = tmp / "server.sh", tmp / "rec.json"
    path.write_bytes(script.encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALO_", "SLURM_", "NOMAD_"))}
    env.update({SERVER_INDEX_VAR: "0", TRAINER_MASTER_VAR: "127.0.0.1", "REC_OUT": str(out)})
    if shell == "file":
        (tmp / "server-shell.sh").write_text(server_shell())
        env["HALO_SERVER_SHELL_FILE"] = str(tmp / "server-shell.sh")
    else:
        env["HALO_SERVER_SHELL"] = shell
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(out.read_text())


def assert_exact(rec: dict, args: list[str], env: dict[str, str]) -> None:
    assert [bytes.fromhex(a) for a in rec["argv"]] == [a.encode() for a in args]
    assert {k: bytes.fromhex(v) for k, v in rec["env"].items()} == {k: v.encode() for k, v in env.items()}


def check_local_and_slurm(tmp, a1: str, a2: str, v1: str, v2: str) -> None:
    args, env = [a1, a2], {"V1": v1, "V2": v2}
    spec = spec_with(args, env)
    script = server_script(spec, spec.servers[0])
    assert_exact(run_server(script, tmp), args, env)  # local runs this file as it is
    # SLURM: bash reads the heredoc assignment in the batch script back to the same script.
    sbatch = render_sbatch(spec)
    m = re.search(r"^HALO_SERVER_ENTRY_0=\$\(cat <<'([^']+)'\n.*?\n\1\n\)$", sbatch, re.S | re.M)
    assert m, "no server entry heredoc in the batch script"
    r = subprocess.run(["bash", "-c", m.group(0) + '\nprintf %s "$HALO_SERVER_ENTRY_0"'], capture_output=True, timeout=30)
    assert r.returncode == 0 and r.stdout == script.rstrip("\n").encode()
    assert_exact(run_server(script, tmp, shell=batch_server_shell()), args, env)


def check_nomad(tmp, a1: str, a2: str, v1: str, v2: str, run: bool = True) -> None:
    args, env = [a1, a2], {"V1": v1, "V2": v2}
    spec = spec_with(args, env)
    job = job_payload(spec)["Job"]
    assert jobspec.comparable(jobspec.api_job(hcl2json.load(render_hcl(spec)))) == jobspec.comparable(job)
    (group,) = [g for g in job["TaskGroups"] if g["Name"] == "server-s"]
    task = group["Tasks"][0]
    # The task's Env carries only names Nomad defines: no user text is runtime-interpolated.
    task_env = {k: client_sim.replace_env(v, {"NOMAD_ALLOC_INDEX": "0", "NOMAD_IP_http": "127.0.0.1",
                                              "NOMAD_TASK_DIR": "/t/local"}) for k, v in task["Env"].items()}
    assert task_env[SERVER_INDEX_VAR] == "0"
    entry = task["Templates"][0]
    rendered = client_sim.GoTemplate(entry["EmbeddedTmpl"], entry.get("LeftDelim", ""), entry.get("RightDelim", "")).render({})
    assert rendered == server_script(spec, spec.servers[0])
    if run:
        assert_exact(run_server(rendered, tmp), args, env)


def test_the_batch_script_reads_the_servers_shell_back_exactly():
    assert batch_server_shell() == server_shell() and "halo_server_run()" in server_shell()


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(text=TEXT)
def test_the_runtimes_shell_assignment_reads_back_to_the_same_text(text):
    """node/shell.py's ``VAR='...'``: bash evaluates it back to exactly the text, whatever it holds."""
    r = subprocess.run(["bash", "-c", 'eval "$1"; printf %s "$v"', "t", assignment("v", text)],
                       capture_output=True, timeout=30)
    assert r.returncode == 0 and r.stdout == text.encode("utf-8", "surrogateescape")


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(a1=TEXT, a2=TEXT, v1=TEXT, v2=TEXT)
def test_local_and_slurm_server_values_arrive_byte_exact(tmp_path_factory, a1, a2, v1, v2):
    check_local_and_slurm(tmp_path_factory.mktemp("s"), a1, a2, v1, v2)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(a1=NFC, a2=NFC, v1=NFC, v2=NFC)
def test_nomad_server_values_decode_and_arrive_byte_exact(tmp_path_factory, a1, a2, v1, v2):
    check_nomad(tmp_path_factory.mktemp("n"), a1, a2, v1, v2)


def test_nomad_refuses_server_text_hcl_would_normalize():
    spec = spec_with(["e\u0301"], {"V1": "x", "V2": "y"})
    with pytest.raises(SpecError, match=r"servers\[0\]\.command\[3\]"):
        render_hcl(spec)
    spec = spec_with([], {"V1": "e\u0301", "V2": "y"})
    with pytest.raises(SpecError, match=r"servers\[0\]\.env\.V1"):
        render_hcl(spec)
    job_payload(spec)  # the API payload carries it exactly


@pytest.mark.long
@settings(max_examples=EXAMPLES * 5, **SETTINGS)
@given(a1=NFC, a2=NFC, v1=NFC, v2=NFC)
def test_long_run_server_values(tmp_path_factory, a1, a2, v1, v2):
    # 5x, not the marker's 20x: HashiCorp's parser takes ~0.12 s per job here (WebAssembly), and
    # the default selection runs this too. No process per example; the bash runs above stay at
    # the default count.
    check_nomad(tmp_path_factory.mktemp("n"), a1, a2, v1, v2, run=False)


def test_a_server_entry_without_the_servers_shell_fails_at_once_naming_where_it_looks(tmp_path):
    spec = spec_with(["x"], {"V1": "a", "V2": "b"})
    path = tmp_path / "server.sh"
    path.write_text(server_script(spec, spec.servers[0]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALO_", "SLURM_", "NOMAD_"))}
    for extra in ({}, {"HALO_SERVER_SHELL_FILE": str(tmp_path / "absent.sh")}):
        r = subprocess.run(["bash", str(path)], env={**env, SERVER_INDEX_VAR: "0", TRAINER_MASTER_VAR: "127.0.0.1", **extra},
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and r.stderr == ("halo-sched: server s: no server shell (HALO_SERVER_SHELL or "
                                                  "HALO_SERVER_SHELL_FILE; docs/node-runtime.md)\n"), r.stderr
