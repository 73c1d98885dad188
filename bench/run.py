"""Speed, side by side with what users would pick instead (issue 13). Ratios are measured in one
run, each pair alternating (medians); never asserted in tests.

    make bench          # or: python bench/run.py [--quick]

Rows: `render` start-up vs the import floor (`import pydantic, jinja2, yaml`) and vs TorchX's
dry run (installed by `make bench` into .bench/torchx, never into the project's environment);
a 2-node local `submit --wait` with a trivial trainer vs two bare `torchrun --nnodes=2`; library
`submit` vs raw `sbatch` (only when the local SLURM cluster answers); peak memory of `render` vs
the import floor. Then renders/s at 2, 256 and 1,024 nodes per backend, and scheduler queries
to poll 1,000 job handles.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable
BIN = Path(PY).parent
TORCHX = REPO / ".bench" / "torchx"
# Compiled modules kept between runs, as an installed package has them (this machine's shells set
# PYTHONDONTWRITEBYTECODE, which would make every run compile halo_sched from source).
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
       "PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / "halo-bench-pycache"),
       "HALO_SCHED_HOME": str(Path(tempfile.gettempdir()) / "halo-bench-home")}
rows: list[tuple[str, str, str, str, str]] = []


def run(cmd, env=None, cwd=REPO) -> tuple[float, int]:
    """(wall seconds, peak RSS KiB) of one command."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env or ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, cmd)
    return time.perf_counter() - t, usage.ru_maxrss


def side_by_side(a, b, n: int) -> tuple[float, float, int, int]:
    """Alternate a and b n times (one warm-up each); medians of wall time and peak RSS."""
    a(), b()
    ta, tb = [], []
    for _ in range(n):
        ta.append(a())
        tb.append(b())
    return (statistics.median(x[0] for x in ta), statistics.median(x[0] for x in tb),
            int(statistics.median(x[1] for x in ta)), int(statistics.median(x[1] for x in tb)))


def row(what, ours, anchor, ratio, goal):
    rows.append((what, ours, anchor, ratio, goal))
    print(f"  {what}: {ours} vs {anchor} = {ratio} (goal {goal})", flush=True)


def startup(n: int) -> None:
    render = [PY, "-m", "halo_sched.cli", "render", "examples/ddp-gpu.yaml", "--backend", "slurm"]
    floor = [PY, "-c", "import pydantic, jinja2, yaml"]
    t_r, t_f, m_r, m_f = side_by_side(lambda: run(render), lambda: run(floor), n)
    row("`render --backend slurm`, whole process", f"{t_r:.3f} s", f"`import pydantic, jinja2, yaml` {t_f:.3f} s",
        f"{t_r / t_f:.2f}x", "<= 1.3x")
    if (TORCHX / "torchx").is_dir():
        tx = [PY, "-m", "torchx.cli.main", "run", "-s", "slurm", "--dryrun", "dist.ddp", "-j", "2x2", "--script", "train.py"]
        tx_env = {**ENV, "PYTHONPATH": str(TORCHX)}
        t_r2, t_x, _, _ = side_by_side(lambda: run(render), lambda: run(tx, env=tx_env, cwd=tempfile.gettempdir()), n)
        row("the same", f"{t_r2:.3f} s", f"TorchX `torchx run -s slurm --dryrun dist.ddp -j 2x2` {t_x:.3f} s",
            f"{t_r2 / t_x:.2f}x", "<= 0.5x")
    else:
        row("the same", "-", "TorchX not installed (make bench installs it into .bench/torchx)", "-", "<= 0.5x")
    row("peak memory of `render`", f"{m_r / 1024:.1f} MiB", f"the import floor {m_f / 1024:.1f} MiB",
        f"{m_r / m_f:.2f}x", "<= 1.2x")


def local_launch(n: int) -> None:
    submit = [str(BIN / "halo-sched"), "submit", "bench/trivial.yaml", "--backend", "local", "--wait", "-q"]
    env = {**ENV, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}

    def bare():
        t = time.perf_counter()
        procs = [subprocess.Popen([str(BIN / "torchrun"), "--nnodes=2", "--nproc_per_node=1", f"--node_rank={k}",
                                   "--master_addr=127.0.0.1", "--master_port=29643", "bench/trivial.py"],
                                  cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in range(2)]
        assert all(p.wait() == 0 for p in procs)
        return time.perf_counter() - t, 0

    t_h, t_b, _, _ = side_by_side(lambda: run(submit, env=env), bare, n)
    row("2-node local job, trivial trainer, `submit --wait`", f"{t_h:.2f} s",
        f"two bare `torchrun --nnodes=2` processes {t_b:.2f} s", f"{t_h / t_b:.2f}x", "<= 1.15x")
    row("same on two H200s (nccl), `submit --wait`", "-", "not measured here (no GPU on this machine)", "-", "<= 1.15x")


def slurm_submit(n: int) -> None:
    if not shutil.which("sbatch") or subprocess.run(["squeue", "-h"], capture_output=True).returncode:
        row("`submit` in process (library)", "-", "raw `sbatch`: skipped, no SLURM cluster answers here "
            "(tests/cluster/slurm-cluster.sh up)", "-", "<= 1.1x")
        return
    import halo_sched
    from halo_sched.backends import get

    spec = halo_sched.load(REPO / "examples" / "ddp-cpu.yaml")
    sched = get("slurm")
    script = sched.render(spec)
    ids: list[str] = []

    def ours():
        t = time.perf_counter()
        ids.append(sched.submit(spec).id)
        return time.perf_counter() - t, 0

    def raw():
        t = time.perf_counter()
        out = subprocess.run(["sbatch", "--parsable", "--hold"], input=script, capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip().split(";")[0])
        return time.perf_counter() - t, 0

    with open("/tmp/halo-slurm-cluster.lock", "w") as lock:  # the shared test cluster
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            t_o, t_r, _, _ = side_by_side(ours, raw, n)
        finally:
            subprocess.run(["scancel", *ids], capture_output=True)
    row("`submit` in process (library)", f"{t_o * 1000:.1f} ms", f"raw `sbatch` {t_r * 1000:.1f} ms",
        f"{t_o / t_r:.2f}x", "<= 1.1x")


def per_call(fn, seconds: float = 0.3) -> float:
    fn()
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        k += 1
    return (time.perf_counter() - t0) / k


def render_rates() -> None:
    import halo_sched

    base = {"slurm": "ddp-gpu.yaml", "nomad": "nomad-gpu.yaml", "local": "ddp-cpu.yaml"}
    print("renders/s by node count (in process):")
    for backend, f in base.items():
        spec = halo_sched.load(REPO / "examples" / f)
        rates = []
        for nodes in (2, 256, 1024):
            s = spec.model_copy(update={"nodes": nodes})
            rates.append(f"{nodes} nodes {1 / per_call(lambda: halo_sched.render(s, backend)):7.0f}/s")
        print(f"  {backend:6s} " + "   ".join(rates))


def poll_calls() -> None:
    """1,000 handles waited on from 1,000 threads: scheduler queries per poll (the watcher)."""
    from halo_sched.backends.base import Job, JobState, JobStatus
    from halo_sched.backends.slurm import SlurmScheduler

    class Fake:
        queries = 0

        def query(self, ids):
            Fake.queries += 1
            return {i: JobState(i, JobStatus.COMPLETED if Fake.queries >= 3 else JobStatus.RUNNING) for i in ids}

    sched = SlurmScheduler(transport=Fake())
    ts = [threading.Thread(target=lambda i=i: Job(sched, str(i)).wait(poll=0.05, max_poll=0.1)) for i in range(1000)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"scheduler calls to poll 1,000 jobs (1,000 threads waiting, jobs end at the 3rd poll): "
          f"{Fake.queries} queries in all (per-handle polling: >= 3,000); the CLI transport sends "
          "one sacct per 1,000 ids")


def main() -> int:
    quick = "--quick" in sys.argv
    n = 3 if quick else 9
    print(f"halo-sched bench, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
          flush=True)
    startup(n)
    local_launch(2 if quick else 4)
    slurm_submit(n)
    print("\n| what | halo-sched | anchor | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    render_rates()
    poll_calls()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
