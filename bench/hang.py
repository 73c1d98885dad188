"""Hang detection's cost and speed (issue 21), on the local backend with real torchrun and gloo.

    python bench/hang.py [--pairs N] [--steps N]

1. A healthy trainer's step rate (2 nodes x 2 ranks, a progress report per step) with the hang
   monitor on (`hang: {timeout_s: 300}`) and off (`hang: null`), runs alternated, medians; the
   ratio on/off is the goal's (>= 0.99x). This machine is noisy: read the spread too.
2. Time from a rank's stop (its last progress report) to the job ended as HUNG with the culprit
   named, for hang.timeout_s = 30, against gloo's default collective timeout (1,800 s; NCCL: 600 s).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp: Path, name: str, trainer: dict, hang) -> Path:
    import yaml

    data = {"name": name, "nodes": 2, "nproc_per_node": 2, "trainer": trainer, "env": {"OMP_NUM_THREADS": "1"},
            "rendezvous": {"port": _port(), "timeout_s": 120}, "hang": hang}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _submit(job: Path, env: dict) -> str:
    r = subprocess.run([PY, "-m", "halo_sched.cli", "submit", str(job), "--backend", "local", "--wait", "--quiet"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def step_rate(pairs: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HALO_SCHED_HOME": str(tmp / "home")}
        trainer = {"script": str(REPO / "bench" / "hang_trainer.py"), "args": ["200", str(steps)]}
        rates = {"on": [], "off": []}
        for i in range(pairs):
            for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                out = tmp / f"rate-{mode}-{i}"
                job = _job(tmp, f"rate-{mode}", trainer, {"timeout_s": 300} if mode == "on" else None)
                _submit(job, {**env, "HALO_BENCH_OUT": str(out)})
                rates[mode].append(float(out.read_text()))
                print(f"  pair {i}: {mode:3s} {rates[mode][-1]:8.1f} steps/s", flush=True)
        on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
        print(f"step rate, monitor on: {on:.1f}/s, off: {off:.1f}/s (medians of {pairs}); ratio {on / off:.3f}x")
        print(f"  on:  {sorted(round(r, 1) for r in rates['on'])}\n  off: {sorted(round(r, 1) for r in rates['off'])}")


def detection(timeout_s: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HALO_SCHED_HOME": str(tmp / "home")}
        trainer = {"script": str(REPO / "tests" / "trainers" / "hang.py"), "args": ["--stuck-rank", "3"]}
        job_id = _submit(_job(tmp, "hang", trainer, {"timeout_s": timeout_s}), env)
        st = json.loads(subprocess.run([PY, "-m", "halo_sched.cli", "status", job_id, "--json"], cwd=REPO, env=env,
                                       capture_output=True, text=True, timeout=60).stdout)
        state = json.loads((tmp / "home" / "local" / job_id / "state.json").read_text())
        took = state["ended"] - st["failure"]["first"]["last_progress"]
        print(f"local: stop -> job ended HUNG naming rank {st['failure']['first']['rank']}: {took:.1f} s "
              f"(hang.timeout_s {timeout_s}; goal <= {timeout_s + 30}; gloo's default timeout 1800 s)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--timeout-s", type=int, default=30)
    ap.add_argument("--skip-detection", action="store_true")
    a = ap.parse_args()
    step_rate(a.pairs, a.steps)
    if not a.skip_detection:
        detection(a.timeout_s)
