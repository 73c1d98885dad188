"""The entry script holds the preemption warning until each rank can take it.

SLURM's batch script passes the warning on as SIGURG to every process of the steps (see
tests/test_slurm_render.py); each node's entry hands the warning signal to the ranks torchrun
started, each once, as soon as the rank handles it. Here a fake torchrun (it keeps the warning
ignored, as the real one inherits it) starts its ranks in sessions of their own, as torchrun
does: rank 0 handles the signal from the start and has a forked worker, rank 1 installs its
handler late, rank 2 never does. The whole process group gets URG, as a step's processes do.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import halo_sched
from halo_sched.errors import SpecError
from helpers import entry_script
from helpers import base_env, cli as cli_run, write_tool

SPEC = """
name: warn
nodes: 2
nproc_per_node: 3
trainer: {script: train.py}
"""

FAKE_TORCHRUN = """#!{python}
import os, subprocess, sys
out = os.environ["WARN_DIR"]
ranks = [subprocess.Popen([sys.executable, os.path.join(out, "rank.py"), str(r)], start_new_session=True,
                          env={{**os.environ, "RANK": str(r)}}) for r in range(3)]
sys.exit(max(p.wait() for p in ranks))
"""

# Each rank: says it started; installs its handler at once (HANDLER_<rank>=now), once the test
# creates install<rank> (=file), or never (unset); its handler appends one line per signal to
# rank<rank>.got (the rank's own proof of receipt); it lives until the test creates "done".
RANK = """
import json, os, signal, sys, time
rank = int(sys.argv[1])
out = os.environ["WARN_DIR"]
sig = getattr(signal, "SIG" + os.environ["HALO_WARNING_SIGNAL"])
assert signal.getsignal(sig) == signal.SIG_IGN, "the warning must reach a rank as ignored"

def wait_for(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, name)) and time.monotonic() < deadline:
        time.sleep(0.02)

def receipt(name):
    def handler(s, f):
        with open(os.path.join(out, name), "a") as fh:
            fh.write(f"{time.time():.6f} {os.getpid()}\\n")
    return handler

open(os.path.join(out, f"rank{rank}.started"), "w").close()
how = os.environ.get(f"HANDLER_{rank}")
installed = pid = None
if how is not None:
    if how == "file":
        wait_for(f"install{rank}")
    if how == "exit":  # saves at once and ends, as a rank whose checkpoint is quick does
        def save_and_exit(s, f, record=receipt(f"rank{rank}.got")):
            record(s, f)
            os._exit(0)
        signal.signal(sig, save_and_exit)
    else:
        signal.signal(sig, receipt(f"rank{rank}.got"))
    installed = time.time()
    if rank == 0:
        # A worker forked after the handler: it inherits it; the rank, not halo-sched, decides for it.
        pid = os.fork()
        if pid == 0:
            signal.signal(sig, receipt("worker.got"))
            wait_for("done")
            os._exit(0)
    open(os.path.join(out, f"rank{rank}.ready"), "w").close()
wait_for("done")
if pid:
    os.waitpid(pid, 0)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"installed": installed, "pid": os.getpid()}, f)
"""


def _start(tmp_path, spec_text: str, **env_extra) -> subprocess.Popen:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (bindir / "torchrun").chmod(0o755)
    (tmp_path / "rank.py").write_text(RANK)
    env = {**base_env(bindir, tmp_path), "WARN_DIR": str(tmp_path), "HALO_NODE_RANK": "1",
           "HALO_MASTER_ADDR": "127.0.0.1", "HALO_MASTER_PORT": "29500", **env_extra}
    script = tmp_path / "entry.sh"
    script.write_text(entry_script(halo_sched.loads(spec_text)))
    return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _wait_for(path, proc, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (path, proc.poll())
        time.sleep(0.02)


def _result(tmp_path, name):
    return json.loads((tmp_path / name).read_text())


def _receipts(tmp_path, name) -> list[tuple[float, int]]:
    """(time, pid) of each warning a process's own handler recorded in ``name``."""
    path = tmp_path / name
    return [(float(t), int(p)) for t, p in (ln.split() for ln in path.read_text().splitlines())] if path.exists() else []


def _touch(tmp_path, name) -> None:
    (tmp_path / name).touch()


def _warn(tmp_path, proc, before=lambda: None, after=lambda: None) -> tuple[float, str]:
    """Send URG to the entry's whole process group once ``before`` returns, as `scancel
    --signal=URG` reaches every process of a step; then ``after``; then let the ranks end (a
    second delivery would have had a second to show). (when it was sent, the entry's stderr)."""
    try:
        before()
        sent = time.time()
        os.killpg(proc.pid, signal.SIGURG)
        after()
        time.sleep(1)
        _touch(tmp_path, "done")
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err  # torchrun and any rank that never handled it lived on
    return sent, err


def test_each_rank_gets_the_warning_once_when_it_handles_it(tmp_path):
    proc = _start(tmp_path, SPEC, HANDLER_0="now", HANDLER_1="file")

    def then_rank_1_installs_its_handler():
        _wait_for(tmp_path / "rank0.got", proc)  # rank 0 handles it already: it gets it
        assert not (tmp_path / "rank1.got").exists()
        _touch(tmp_path, "install1")
        _wait_for(tmp_path / "rank1.got", proc)  # held for rank 1 until it handles it

    warned, err = _warn(tmp_path, proc, lambda: _wait_for(tmp_path / "rank0.ready", proc), then_rank_1_installs_its_handler)
    r0, r1, r2 = (_result(tmp_path, f"rank{r}.json") for r in range(3))
    got0, got1 = _receipts(tmp_path, "rank0.got"), _receipts(tmp_path, "rank1.got")
    assert len(got0) == 1 and got0[0][1] == r0["pid"] and got0[0][0] >= warned, (got0, r0, err)
    # Rank 1 was still starting: it got the warning once, after its handler was in place.
    assert len(got1) == 1 and got1[0][1] == r1["pid"] and got1[0][0] >= r1["installed"] > warned, (got1, r1, err)
    assert r2["installed"] is None and not (tmp_path / "rank2.got").exists()
    assert _receipts(tmp_path, "worker.got") == [], "a rank's own worker is the rank's to warn"
    assert "SIGUSR2 to rank 0 (pid" in err and "SIGUSR2 to rank 1 (pid" in err, err
    assert "to rank 2" not in err and "no rank handled" not in err, err


def test_the_warning_line_names_a_rank_that_saved_and_ended_at_once(tmp_path):
    """A rank that ends the moment it has the signal has no /proc environ left to read its rank
    from: the entry reads it before it signals (seen as "SIGUSR2 to rank ? (pid ...)" under load)."""
    proc = _start(tmp_path, SPEC, HANDLER_0="exit", HANDLER_1="exit", HANDLER_2="exit")

    def all_ready():
        for r in range(3):
            _wait_for(tmp_path / f"rank{r}.ready", proc)

    def all_got_it():
        for r in range(3):
            _wait_for(tmp_path / f"rank{r}.got", proc)

    _, err = _warn(tmp_path, proc, all_ready, all_got_it)
    for r in range(3):
        assert f"SIGUSR2 to rank {r} (pid" in err, err
    assert "rank ?" not in err, err


def test_a_warning_during_setup_is_held_for_the_ranks(tmp_path):
    # setup waits for the test's go: the warning certainly comes while setup runs.
    spec = SPEC + ("setup: ['touch \"$WARN_DIR/in-setup\"; while [ ! -e \"$WARN_DIR/setup-go\" ]; do sleep 0.05; done']\n"
                   "slurm: {signal: HUP@300}\n")
    proc = _start(tmp_path, spec, HANDLER_0="now", HANDLER_1="now")

    def in_setup():
        _wait_for(tmp_path / "in-setup", proc)  # the entry's trap is set before setup runs
        assert not list(tmp_path.glob("rank*.started"))  # no torchrun yet

    def setup_ends():
        _touch(tmp_path, "setup-go")
        for r in (0, 1):
            _wait_for(tmp_path / f"rank{r}.got", proc)

    _, err = _warn(tmp_path, proc, in_setup, setup_ends)
    for r in (0, 1):
        rec, got = _result(tmp_path, f"rank{r}.json"), _receipts(tmp_path, f"rank{r}.got")
        assert len(got) == 1 and got[0][1] == rec["pid"] and got[0][0] >= rec["installed"], (r, got, rec, err)
    assert "SIGHUP to rank 0" in err and "SIGHUP to rank 1" in err, err


def test_a_warning_no_rank_handles_is_said_to_have_reached_no_trainer(tmp_path):
    proc = _start(tmp_path, SPEC)

    def ranks_run():
        for r in range(3):
            _wait_for(tmp_path / f"rank{r}.started", proc)

    _, err = _warn(tmp_path, proc, ranks_run)
    assert "no rank handled SIGUSR2 before torchrun ended" in err, err
    assert not list(tmp_path.glob("*.got"))


@pytest.mark.parametrize("signal_text, field_msg", [
    ("URG@60", "URG carries the warning"),
    ("TERM@60", "cannot be the warning"),
    ("WINCH@60", "cannot be the warning"),
])
def test_signals_that_cannot_be_the_warning_are_refused(signal_text, field_msg):
    with pytest.raises(SpecError) as e:
        halo_sched.loads(SPEC + f"slurm: {{signal: '{signal_text}'}}\n")
    assert "slurm.signal" in str(e.value) and field_msg in str(e.value)


def test_a_warning_slurm_would_send_at_the_start_is_noted():
    with pytest.warns(UserWarning, match=r"slurm.signal.*comes 100 s before the time limit.*up to 30 s earlier"):
        halo_sched.loads(SPEC + "slurm: {signal: 'USR2@100', time: '2'}\n")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        halo_sched.loads(SPEC + "slurm: {signal: 'USR2@100', time: '3'}\n")
        halo_sched.loads(SPEC + "slurm: {signal: 'USR2', time: '1:31'}\n")  # the default 60 s, 91 s limit


def _cancel(tmp_path, *args):
    """`halo-sched cancel` with a scancel stand-in that logs its argv."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    write_tool(b, "scancel", f'#!/bin/bash\necho "$*" >> {tmp_path}/scancel.log\n')
    env = {**os.environ, "PATH": f"{b}:{os.environ['PATH']}"}
    return cli_run("cancel", *args, env=env)


@pytest.mark.parametrize("job_signal, given, ok", [
    (None, "USR2", True), (None, "SIGUSR2", True), ("B:HUP@90", "HUP", True),
    (None, "HUP", False),          # the batch script traps USR2 alone: HUP would end it
    ("USR2@60", "KILL", False), (None, "URG", False), (None, "USR2@5", False),
])
def test_cancel_signal_must_be_the_jobs_warning(tmp_path, job_signal, given, ok):
    from halo_sched import records

    records.write({"version": records.VERSION, "id": "77", "backend": "slurm", "name": "warn",
                   "spec": {"slurm": {"signal": job_signal}}})
    r = _cancel(tmp_path, "77", "--signal", given)
    log = tmp_path / "scancel.log"
    if ok:
        assert r.returncode == 0, r.stderr
        assert log.read_text().split() == ["--batch", f"--signal={given.removeprefix('SIG')}", "77"]
    else:
        assert r.returncode == 2 and "--signal" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not log.exists(), "nothing may be sent"
