"""Speed, side by side with what users would pick instead (issue 13). Ratios are measured in one
run, each pair alternating (medians); never asserted in tests.

    make bench          # or: python bench/run.py [--quick | --startup | --failures | --spares | --goodput]

``--startup``: the start-up and peak-memory rows alone, medians of 15 (what changes to the
render path move).

``--history [--records N]``: ``status ID`` and ``list`` at N job records (default 50,000) against
50, side by side (bench/history.py; the two state directories are made once).

``--failures`` (``make bench-failures``, about 4 minutes on 2 cores; 2 with ``--quick``): the rows of
bench/failures.py alone, recovery after a node fault with automatic retry vs a person
resubmitting (the notice time ASSUMED, ``--notice-min``, default 15), and node-hours a preflight
gate saves against a job that loads and fails at its first collective. Real torchrun on the local
backend; not in plain ``make bench``: they take minutes, not seconds.

``--spares`` (about 1 minute per rep; 1 rep with ``--quick``, else 3): bench/spares.py on the
local SLURM test cluster, a node fault swapped for a hot spare in the same job vs a resubmission
through the queue. ``--goodput``: bench/goodput.py's tables (a simulation, a few seconds).

Rows: `render` start-up vs the import floor (`import pydantic, jinja2, yaml`) and vs TorchX's
dry run (installed by `make bench` into .bench/torchx, never into the project's environment);
a 2-node local `submit --wait` with a trivial trainer vs two bare `torchrun --nnodes=2`; library
`submit` vs raw `sbatch` and how soon `Job.wait()` returns after a SLURM job ends (the local test
cluster, brought up and down again by the bench when SLURM is installed and it is down); peak memory of `render` vs
the import floor. Then renders/s at 2, 256 and 1,024 nodes per backend, and scheduler queries
to poll 1,000 job handles.
"""
from __future__ import annotations

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
sys.path.insert(0, str(REPO / "bench"))
from testcluster import cluster_down, cluster_lock, cluster_up, slurm_answers  # noqa: E402

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
    """The start-up rows, every process on one CPU (the bench's last): on a many-core host the
    scheduler otherwise moves short processes between cores, and medians of 15 moved by 30%."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(cpus)})
    try:
        _startup(n)
    finally:
        os.sched_setaffinity(0, cpus)


def _startup(n: int) -> None:
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
        f"{m_r / m_f:.2f}x", "<= 1.3x")


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
    if not slurm_answers():
        row("`submit` in process (library)", "-", "raw `sbatch`: skipped, no SLURM cluster answers here "
            "(SLURM not installed)", "-", "<= 1.1x")
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
        out = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip().split(";")[0])
        return time.perf_counter() - t, 0

    # Both sides submit the same script, unheld, from a scratch directory (the jobs' output
    # files land there, not in the repo); every job is cancelled afterwards.
    scratch = tempfile.mkdtemp(prefix="halo-bench-submit-")
    here = os.getcwd()
    with cluster_lock():  # the shared test cluster
        try:
            os.chdir(scratch)
            t_o, t_r, _, _ = side_by_side(ours, raw, n)
        finally:
            subprocess.run(["scancel", *ids], capture_output=True)
            os.chdir(here)
            shutil.rmtree(scratch, ignore_errors=True)
    row("`submit` in process (library)", f"{t_o * 1000:.1f} ms", f"raw `sbatch` {t_r * 1000:.1f} ms",
        f"{t_o / t_r:.2f}x", "<= 1.1x")


def slurm_wait_latency(durations=(4, 12, 27)) -> None:
    """How long after a SLURM job ends ``Job.wait()`` returns: one job per duration, all at once, each
    waited on by its own scheduler object (its own watcher, as separate ``submit --wait`` processes
    are). The scheduler's own delay is the first time a 50 ms ``squeue`` loop sees the job gone or
    finished; the job's end is the time its batch script's last line wrote."""
    if not slurm_answers():
        row("SLURM `submit --wait` returns after the job ends", "-", "skipped, no SLURM cluster", "-", "<= 1 s + scheduler")
        return
    from halo_sched.backends.base import Job
    from halo_sched.backends.slurm import SlurmScheduler
    from halo_sched.backends.slurm.request import request_of
    from halo_sched.backends.slurm.transport import get_transport

    tmp = Path(tempfile.mkdtemp(prefix="halo-bench-wait-"))
    seen: dict[str, float] = {}
    ended: dict[str, float] = {}
    stop = threading.Event()

    def tight_squeue(ids):
        while not stop.is_set() and len(seen) < len(ids):
            out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(ids)],
                                 capture_output=True, text=True).stdout
            now = time.time()
            states = dict(line.split() for line in out.splitlines() if line.strip())
            for i in ids:
                if i not in seen and states.get(i, "GONE") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                    seen[i] = now
            time.sleep(0.05)

    def one(d, job_id, out):
        sched = SlurmScheduler(transport=get_transport("cli"))
        Job(sched, job_id).wait()
        out[job_id] = time.time()

    with cluster_lock():
        jobs = {}
        for d in durations:
            script = request_of(f"#!/bin/bash\nsleep {d}\ndate +%s.%N > {tmp}/end-{d}\n",
                                [f"--job-name=halo-bench-wait-{d}", "--nodes=1", f"--output={tmp}/%j.out"])
            job_id = get_transport("cli").submit(script)
            jobs[job_id.rpartition(":")[2]] = d
        returned: dict[str, float] = {}
        ts = [threading.Thread(target=one, args=(d, i, returned)) for i, d in jobs.items()]
        watcher = threading.Thread(target=tight_squeue, args=(list(jobs),))
        watcher.start()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        stop.set()
        watcher.join()
    lat_end, lat_sched = [], []
    for i, d in jobs.items():
        end = float((tmp / f"end-{d}").read_text())
        lat_end.append(returned[i] - end)
        lat_sched.append(returned[i] - seen.get(i, end))
        print(f"  job of {d:2d} s: wait returned {returned[i] - end:5.2f} s after its last line, "
              f"{returned[i] - seen.get(i, end):5.2f} s after squeue first showed it ended", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    row("SLURM `Job.wait()` returns after the job ends (jobs of " + "/".join(map(str, durations)) + " s)",
        "max " + f"{max(lat_sched):.2f} s", f"the scheduler's own delay (first 50 ms `squeue` that shows it ended): "
        f"max {max(a - b for a, b in zip(lat_end, lat_sched)):.2f} s", f"+{max(lat_sched):.2f} s", "<= 1 s + the scheduler's delay")


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
    if "--startup" in sys.argv:
        startup(15)
        return 0
    if "--history" in sys.argv:
        sys.path.insert(0, str(REPO / "bench"))
        import history

        big = int(sys.argv[sys.argv.index("--records") + 1]) if "--records" in sys.argv else 50_000
        history.measure(run, side_by_side, row, n, big)
        print("\n| what | halo-sched | anchor | ratio | goal |\n|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return 0
    if "--spares" in sys.argv:  # bench/spares.py: a spare swap vs a resubmission, on the test cluster
        sys.path.insert(0, str(REPO / "bench"))
        import spares

        started = cluster_up(ENV)
        try:
            return spares.main(["--reps", "1" if quick else "3"])
        finally:
            if started:
                cluster_down()
    if "--goodput" in sys.argv:  # bench/goodput.py: the simulation, its default table
        sys.path.insert(0, str(REPO / "bench"))
        import goodput

        return goodput.main([])
    if "--failures" in sys.argv:
        sys.path.insert(0, str(REPO / "bench"))
        import failures

        notice = float(sys.argv[sys.argv.index("--notice-min") + 1]) if "--notice-min" in sys.argv else 15.0
        for r in failures.measure(1 if quick else 2, notice, 30.0, emit=lambda line: print(line, flush=True)):
            row(*r)
        print("\n| what | halo-sched | anchor | ratio | goal |\n|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return 0
    startup(n)
    local_launch(2 if quick else 4)
    started = cluster_up(ENV)
    try:
        slurm_submit(n)
        slurm_wait_latency()
    finally:
        if started:
            cluster_down()
    print("\n| what | halo-sched | anchor | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    render_rates()
    poll_calls()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
