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
from halo_sched.launch import entry_script
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

# Each rank: installs the handler after HANDLER_AFTER_<rank> seconds (never when unset), records
# every signal it got, and exits LIVE seconds after the handler is in place (or after LIVE).
RANK = """
import json, os, signal, sys, time
rank = int(sys.argv[1])
out = os.environ["WARN_DIR"]
sig = getattr(signal, "SIG" + os.environ["HALO_WARNING_SIGNAL"])
got, worker_got = [], []
start = time.time()
assert signal.getsignal(sig) == signal.SIG_IGN, "the warning must reach a rank as ignored"
after = os.environ.get(f"HANDLER_AFTER_{rank}")
installed = pid = None
if after is not None:
    time.sleep(float(after))
    signal.signal(sig, lambda s, f: got.append(time.time()))
    installed = time.time()
    if rank == 0:
        # A worker forked after the handler: it inherits it; the rank, not halo-sched, decides for it.
        pid = os.fork()
        if pid == 0:
            signal.signal(sig, lambda s, f: worker_got.append(time.time()))
            time.sleep(float(os.environ["LIVE"]))
            with open(os.path.join(out, "worker.json"), "w") as f:
                json.dump(worker_got, f)
            os._exit(0)
    open(os.path.join(out, f"rank{rank}.ready"), "w").close()
time.sleep(float(os.environ["LIVE"]))
if pid:
    os.waitpid(pid, 0)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"got": got, "installed": installed, "start": start}, f)
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


def _wait_for(path, proc, timeout=20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def _result(tmp_path, name):
    return json.loads((tmp_path / name).read_text())


def _warn(proc, before=lambda: None) -> tuple[float, str]:
    """Send URG to the entry's whole process group once ``before`` returns, as `scancel
    --signal=URG` reaches every process of a step; (when it was sent, the entry's stderr)."""
    try:
        before()
        sent = time.time()
        os.killpg(proc.pid, signal.SIGURG)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err  # torchrun and any rank that never handled it lived on
    return sent, err


def test_each_rank_gets_the_warning_once_when_it_handles_it(tmp_path):
    proc = _start(tmp_path, SPEC, HANDLER_AFTER_0="0", HANDLER_AFTER_1="2.5", LIVE="4")
    warned, err = _warn(proc, lambda: _wait_for(tmp_path / "rank0.ready", proc))
    r0, r1, r2 = (_result(tmp_path, f"rank{r}.json") for r in range(3))
    assert len(r0["got"]) == 1 and r0["got"][0] - warned < 1.0, (r0, err)
    # Rank 1 was still starting: it got the warning once, after its handler was in place.
    assert len(r1["got"]) == 1 and r1["installed"] > warned and 0 <= r1["got"][0] - r1["installed"] < 1.0, (r1, err)
    assert r2["got"] == [], r2
    assert _result(tmp_path, "worker.json") == [], "a rank's own worker is the rank's to warn"
    assert "SIGUSR2 to rank 0 (pid" in err and "SIGUSR2 to rank 1 (pid" in err, err
    assert "to rank 2" not in err and "no rank handled" not in err, err


def test_a_warning_during_setup_is_held_for_the_ranks(tmp_path):
    spec = SPEC + "setup: ['sleep 2']\nslurm: {signal: HUP@300}\n"
    proc = _start(tmp_path, spec, HANDLER_AFTER_0="0", HANDLER_AFTER_1="0", LIVE="2")

    def in_setup():
        time.sleep(0.5)  # no torchrun yet
        assert not (tmp_path / "rank0.ready").exists()

    _, err = _warn(proc, in_setup)
    for r in (0, 1):
        rec = _result(tmp_path, f"rank{r}.json")
        assert len(rec["got"]) == 1 and rec["got"][0] >= rec["installed"], (r, rec, err)
    assert "SIGHUP to rank 0" in err and "SIGHUP to rank 1" in err, err


def test_a_warning_no_rank_handles_is_said_to_have_reached_no_trainer(tmp_path):
    proc = _start(tmp_path, SPEC, LIVE="1.5")
    _, err = _warn(proc, lambda: time.sleep(0.5))
    assert "no rank handled SIGUSR2 before torchrun ended" in err, err


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
