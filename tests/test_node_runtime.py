"""The node runtime travels as one versioned file (halo_sched/node_runtime.py): the nodes' own
halo-sched when it is the job's version, else the zip the job carries, checked by its SHA-256.

The carried path runs here for real: the node's python is the system's python3, which has no
halo-sched (as on a node where only torch was installed), and torchrun fails so that the failure
collector and the hang monitor run from the zip.
"""
from __future__ import annotations

import base64
import hashlib
import zlib
import io
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

import halo_sched
from halo_sched import node
from halo_sched.backends.slurm.render import render_sbatch
from helpers import entry_script
from halo_sched.node_runtime import runtime
from helpers import base_env

SYSTEM_PY = "/usr/bin/python3"


def _system_python_has_halo_sched(cwd: Path) -> bool:
    return subprocess.run([SYSTEM_PY, "-c", "import halo_sched"], capture_output=True, timeout=30,
                          cwd=cwd).returncode == 0


def _run_entry(tmp: Path, node_env: dict, env: dict) -> subprocess.CompletedProcess:
    """The entry script, run outside the repository (whose halo_sched `python -c` would find)."""
    script = tmp / "entry.sh"
    script.write_text(entry_script(halo_sched.loads(SPEC)))
    return subprocess.run(["bash", str(script)], env={**env, **node_env}, capture_output=True, text=True,
                          timeout=60, cwd=tmp)

SPEC = """
name: carried
nodes: 2
nproc_per_node: 2
trainer: {script: train.py}
hang: {timeout_s: 600}
"""

# torchrun on a node whose python has no halo-sched: rank 1's error file, then exit 3.
FAKE_TORCHRUN = f"""#!{SYSTEM_PY}
import json, os, sys
log_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--log-dir="))
print("halo-test: torchrun under", sys.executable, file=sys.stderr)
sys.exit(3)
"""


def test_the_zip_is_the_same_bytes_at_every_build_and_holds_only_the_carried_modules():
    rt = runtime()
    runtime.cache_clear()
    again = runtime()
    assert again.zip_bytes == rt.zip_bytes and again.sha256 == hashlib.sha256(rt.zip_bytes).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(rt.zip_bytes)).namelist()
    assert names == ["halo_sched/__init__.py"] + [f"halo_sched/node/{m}" for m in node.CARRIED
                                                  if m not in node.KEEPER_ONLY + node.NOMAD_ONLY]
    assert rt.version == node.runtime_version() and re.fullmatch(r"[0-9a-f]{16}", rt.version)


def test_every_carried_module_imports_from_the_zip_alone(tmp_path):
    """A carried module that imports one left out (or the submitter's side) fails here."""
    z = tmp_path / "rt.zip"
    z.write_bytes(runtime().zip_bytes)
    mods = [("halo_sched.node." + m[:-3].replace("/", ".")).removesuffix(".__init__") for m in node.CARRIED
            if m.endswith(".py") and m != "shell.py"  # shell.py prints entry.sh when run, below
            and m not in node.KEEPER_ONLY]  # in the keeper's own copy: test_the_keepers_copy_...
    code = (f"import sys; sys.path[:0] = [{str(z)!r}]\n"
            f"for m in {mods!r}:\n    __import__(m)\n"
            "import halo_sched\nassert halo_sched.__file__.startswith(sys.path[0]), halo_sched.__file__\n"
            "print(sorted(k for k in sys.modules if k.startswith('halo_sched')))")
    r = subprocess.run([SYSTEM_PY, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "halo_sched.node.hang_monitor" in r.stdout
    shell = subprocess.run([SYSTEM_PY, "-I", "-c", f"import sys, runpy; sys.path[:0] = [{str(z)!r}]; "
                            "runpy.run_module('halo_sched.node.shell', run_name='__main__')"],
                           capture_output=True, text=True, timeout=60)
    assert shell.stdout == (Path(node.__file__).parent / "entry.sh").read_text(), shell.stderr


def test_the_sbatch_script_carries_the_zip_on_its_last_lines(tmp_path):
    """What the batch script reads with `tail -n N "$0"` is the zip, once."""
    text = render_sbatch(halo_sched.loads(SPEC))
    m = re.search(r'halo_node_runtime=\$\(tail -n (\d+) "\$0"\)', text)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    carried = subprocess.run(["bash", "-c", f'tail -n {m.group(1)} "$0"', str(script)], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    assert hashlib.sha256(zlib.decompress(base64.b64decode("".join(carried.split())))).hexdigest() == runtime().sha256
    assert text.count(runtime().base64[:76]) == 1
    assert "def main(" not in text  # no node module pasted in


@pytest.mark.skipif(not Path(SYSTEM_PY).exists(), reason="no system python3")
@pytest.mark.parametrize("how", ["variable", "file", "nomad's copy"])
def test_a_node_without_halo_sched_runs_the_carried_zip(tmp_path, how):
    if _system_python_has_halo_sched(tmp_path):
        pytest.skip("the system python3 has a halo-sched")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN)
    (bindir / "torchrun").chmod(0o755)
    env = base_env(bindir, tmp_path)
    node_env = {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "10.0.0.1", "HALO_MASTER_PORT": "29500",
                "HALO_LOG_DIR": str(tmp_path / "logs")}
    if how == "variable":  # SLURM: the batch script hands it to each task
        node_env["HALO_NODE_RUNTIME"] = runtime().base64_lines()
    else:  # Nomad (the Variable's template: its copy without the batch shell's modules) and local: a file
        carried = runtime(batch=how == "file")
        (tmp_path / "rt.b64").write_text(carried.base64_lines() + "\n")
        node_env["HALO_NODE_RUNTIME_FILE"] = str(tmp_path / "rt.b64")
    r = _run_entry(tmp_path, node_env, env)
    assert r.returncode == 3, r.stderr[-3000:]
    assert f"torchrun under {SYSTEM_PY}" in r.stderr
    # The collector ran from the zip: its line for the node, with torchrun's exit code.
    lines = [line for line in r.stderr.splitlines() if line.startswith("halo-sched-failure {")]
    assert lines and '"node": 1' in lines[0].replace('"node":1', '"node": 1') and "Traceback" not in r.stderr, r.stderr
    written = (tmp_path / "logs" / "node-1" / f"halo-node-{runtime().version}.zip").read_bytes()
    assert written == runtime(batch=how != "nomad's copy").zip_bytes


def test_a_damaged_copy_is_refused_before_anything_runs_from_it(tmp_path):
    if _system_python_has_halo_sched(tmp_path):
        pytest.skip("the system python3 has a halo-sched")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN)
    (bindir / "torchrun").chmod(0o755)
    text = runtime().base64
    damaged = text[:100] + ("A" if text[100] != "A" else "B") + text[101:]
    node_env = {"HALO_NODE_RANK": "0", "HALO_MASTER_ADDR": "10.0.0.1", "HALO_MASTER_PORT": "29500",
                "HALO_NODE_RUNTIME": damaged}
    r = _run_entry(tmp_path, node_env, base_env(bindir, tmp_path))
    assert r.returncode == 1
    assert "has no halo-sched of version" in r.stderr and "torchrun under" not in r.stderr


@pytest.mark.parametrize("name", ["entry.sh", "server.sh", "world.sh"])
def test_the_entry_functions_use_only_the_contracts_names(name):
    """halo_sched/node/entry.sh and server.sh are not templates: each HALO_* name in them must be one of NAMES."""
    from halo_sched.node.contract import NAMES

    text = (Path(node.__file__).parent / name).read_text()
    used = set(re.findall(r"\bHALO_[A-Z_]+\b", text))
    known = {getattr(NAMES, k) for k in dir(NAMES) if not k.startswith("_") and isinstance(getattr(NAMES, k), str)}
    assert used and used <= known, used - known


def test_the_nomad_copy_is_the_same_code_without_its_comments():
    """The Nomad copy's Python has its comments cut (room in the Variable): every module parses to
    the same tree, line and column numbers included, so a traceback from a Nomad node points at the
    line of the source it names."""
    import ast

    here = Path(node.__file__).parent
    nomad = zipfile.ZipFile(io.BytesIO(runtime(batch=False).zip_bytes))
    modules = [n for n in nomad.namelist() if n.startswith("halo_sched/node/") and n.endswith(".py")]
    assert len(modules) >= 8, modules
    for name in modules:
        original = (here / name[len("halo_sched/node/"):]).read_text()
        copy = nomad.read(name).decode()
        assert not any(ln.lstrip().startswith("#") for ln in copy.splitlines()), name
        assert copy.count("\n") == original.count("\n"), name
        assert ast.dump(ast.parse(copy), include_attributes=True) == \
            ast.dump(ast.parse(original), include_attributes=True), name


def test_the_carried_copy_fits_where_it_travels():
    """SLURM hands it to each task as one argument of srun (Linux: at most 128 KiB per argument,
    MAX_ARG_STRLEN); Nomad keeps it in the job's Variable (at most 64 KiB with the secrets,
    nomad/structs/variables.go maxVariableSize): room is left for both the entry and the secrets."""
    from halo_sched.node_runtime import ITEM, SERVER_ITEM, server_shell

    assert len(runtime().base64_lines().encode()) <= 96 * 1024
    nomad = runtime(batch=False)
    assert len(ITEM) + len(nomad.base64) <= 52 * 1024, "the node runtime leaves under 12 KiB for secrets"
    assert nomad.version == runtime().version and nomad.sha256 != runtime().sha256
    # A job with servers: their shell too, as text (a second item, halo_sched/node/server.sh).
    assert len(ITEM) + len(nomad.base64) + len(SERVER_ITEM) + len(server_shell()) <= 56 * 1024, \
        "with the servers' shell the Variable leaves under 8 KiB for secrets"


def test_the_nomad_copy_leaves_out_only_what_a_batch_shell_runs():
    names = zipfile.ZipFile(io.BytesIO(runtime(batch=False).zip_bytes)).namelist()
    assert names == ["halo_sched/__init__.py"] + [f"halo_sched/node/{m}" for m in node.CARRIED
                                                  if m not in node.BATCH_ONLY + node.KEEPER_ONLY]
    assert set(node.BATCH_ONLY) < set(node.CARRIED) and set(node.KEEPER_ONLY) < set(node.KEEPER) < set(node.CARRIED)


def test_the_keepers_copy_holds_what_it_imports_and_fits_its_variable(tmp_path):
    """A Nomad run's keeper runs from a copy of its own (node.KEEPER, in a Variable of its own: the
    job's has no room left): every module of it imports from that zip alone, its Python is the
    source without comments, and it fits a Variable (64 KiB, nomad/structs/variables.go
    maxVariableSize) with its item's name."""
    import ast

    from halo_sched.node_runtime import KEEPER_ITEM, keeper_runtime

    rt = keeper_runtime()
    assert rt.version == runtime().version and len(KEEPER_ITEM) + len(rt.base64) <= 60 * 1024
    names = zipfile.ZipFile(io.BytesIO(rt.zip_bytes)).namelist()
    assert names == ["halo_sched/__init__.py"] + [f"halo_sched/node/{m}" for m in node.KEEPER]
    z = tmp_path / "keeper.zip"
    z.write_bytes(rt.zip_bytes)
    mods = [("halo_sched.node." + m[:-3]).removesuffix(".__init__") for m in node.KEEPER]
    code = (f"import sys; sys.path[:0] = [{str(z)!r}]\n"
            f"for m in {mods!r}:\n    __import__(m)\n"
            "import halo_sched\nassert halo_sched.__file__.startswith(sys.path[0]), halo_sched.__file__\n")
    r = subprocess.run([SYSTEM_PY, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    here = Path(node.__file__).parent
    keeper = zipfile.ZipFile(io.BytesIO(rt.zip_bytes))
    for name in (n for n in names if n.startswith("halo_sched/node/")):
        original = (here / name[len("halo_sched/node/"):]).read_text()
        assert ast.dump(ast.parse(keeper.read(name).decode()), include_attributes=True) == \
            ast.dump(ast.parse(original), include_attributes=True), name
