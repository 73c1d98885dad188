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
    if r.returncode:
        print("  " + (r.stderr.strip().splitlines() or ["(no output)"])[-1][:300], flush=True)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def step_rate(pairs: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HALO_SCHED_HOME": str(tmp / "home")}
        trainer = {"script": str(REPO / "bench" / "hang_trainer.py"), "args": ["200", str(steps)]}
        rates = {"on": [], "off": [], "reports": []}
        for i in range(pairs):
            modes = ["on", "off", "reports"]
            for mode in modes[i % 3:] + modes[:i % 3]:
                out = tmp / f"rate-{mode}-{i}"
                # "reports": the trainer writes its progress reports, but the job runs no monitor.
                tr = {**trainer, "args": trainer["args"] + [str(tmp / f"prog-{i}")]} if mode == "reports" else trainer
                job = _job(tmp, f"rate-{mode}", tr, {"timeout_s": 300} if mode == "on" else None)
                for _ in range(3):  # a run that failed (a port taken meanwhile, a loaded machine) is run again
                    _submit(job, {**env, "HALO_BENCH_OUT": str(out)})
                    if out.exists():
                        break
                    print(f"  pair {i}: {mode} failed; again", flush=True)
                rates[mode].append(float(out.read_text()))
                print(f"  pair {i}: {mode:3s} {rates[mode][-1]:8.1f} steps/s", flush=True)
        if pairs:
            on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
            rep = statistics.median(rates["reports"])
            print(f"step rate, monitor on: {on:.1f}/s, off: {off:.1f}/s (medians of {pairs}); ratio {on / off:.3f}x")
            print(f"  reports written, no monitor: {rep:.1f}/s; ratio {rep / off:.3f}x")
            for mode, got in rates.items():
                print(f"  {mode:7s} {sorted(round(r, 1) for r in got)}")
        # One job, monitor on, blocks of steps with and without the report: the report's cost on
        # the trainer's step without the spread between runs (which the medians above carry).
        out = tmp / "rate-ab"
        job = _job(tmp, "rate-ab", {**trainer, "args": ["200", str(steps * 4)]}, {"timeout_s": 300})
        _submit(job, {**env, "HALO_BENCH_OUT": str(out), "HALO_BENCH_AB": "250"})
        if out.exists():
            with_, without = map(float, out.read_text().split())
            print(f"one job, monitor on, blocks of 250 steps: with reports {with_:.1f}/s, without {without:.1f}/s; "
                  f"ratio {with_ / without:.3f}x")


_FAKE_RANK = """
import os, sys, time
d, rank = sys.argv[1], sys.argv[2]
fd = os.open(f"{d}/rank-{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
step = 0
while True:
    os.write(fd, f"{step} {time.time()}\\n".encode())
    step += 1
    time.sleep(0.01)
"""


def monitor_cost(seconds: float) -> None:
    """The monitor's own CPU, watching 4 ranks that report 100 steps/s each, and one report()'s cost."""
    import resource

    from halo_sched.node import progress

    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / "progress"
        prog.mkdir()
        # A stand-in torchrun whose children carry RANK, as torchrun's workers do.
        parent = subprocess.Popen([PY, "-c", "import os, subprocess, sys, time\n"
                                   "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], str(r)], "
                                   "env={**os.environ, 'RANK': str(r), 'LOCAL_RANK': str(r)}) for r in range(4)]\n"
                                   "time.sleep(3600)", _FAKE_RANK, str(prog)])
        time.sleep(1.0)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        mon = subprocess.Popen([PY, "-m", "halo_sched.node.hang_monitor", "0", str(parent.pid), str(prog), d,
                                "4", "300", "600", "0"], cwd=REPO, stdin=subprocess.DEVNULL)
        time.sleep(seconds)
        mon.terminate()
        mon.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        subprocess.run(["pkill", "-P", str(parent.pid)])
        parent.kill()
        parent.wait()
        print(f"monitor CPU: {cpu * 1000:.0f} ms over {seconds:.0f} s watching 4 ranks "
              f"({100 * cpu / seconds:.3f}% of one core, start-up included)")
        os.environ["HALO_PROGRESS_DIR"], os.environ["RANK"] = d, "9"
        progress.report(0)
        n = 100000
        t = time.perf_counter()
        for i in range(n):
            progress.report(i)
        print(f"progress.report(): {1e6 * (time.perf_counter() - t) / n:.2f} us per call (the ring)")
        line_fd = os.open(os.path.join(d, "appended"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        t = time.perf_counter()
        for i in range(n):
            os.write(line_fd, f"{i} {time.time():.3f}\n".encode())
        print(f"  a write() per report instead: {1e6 * (time.perf_counter() - t) / n:.2f} us per call")
        os.close(line_fd)
        del os.environ["HALO_PROGRESS_DIR"], os.environ["RANK"]
        progress._ring.close()
        for fd in (progress._fd, progress._history):
            os.close(fd)
        progress._fd = progress._ring = progress._history = None


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
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--skip-cost", action="store_true", help="not the monitor's CPU and report()'s cost")
    a = ap.parse_args()
    if not a.skip_cost:
        monitor_cost(30.0)
    if not a.skip_rate:
        step_rate(a.pairs, a.steps)
    if not a.skip_detection:
        detection(a.timeout_s)
