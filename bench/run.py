"""Performance goals, measured as ratios within one run (never asserted in tests).

- CLI start-up: `halo-sched render` end to end vs a bare interpreter start (goal: <= 25x; building
  the pydantic models is most of it), and vs `import torch` (goal: >= 5x faster: the CLI never
  imports torch).
- Rendering: time to render a 64-node job for each backend (pure; goal: < 50 ms each).
- Nomad job size: payload bytes, HCL bytes and render time at 2, 256 and 1,024 nodes (goal: 1,024
  nodes within 1.2x of 2 nodes, all three: the job is node-0 + one workers group of count N-1, so
  it does not grow with N; every allocation carries the whole job on the servers and clients).

    python bench/run.py
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def wall(cmd: list[str], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    py = sys.executable
    bare = wall([py, "-c", "pass"])
    rows = [("python -c pass", bare)]
    for backend in ("local", "slurm"):
        rows.append((f"halo-sched render --backend {backend}", wall([py, "-m", "halo_sched.cli", "render", "examples/ddp-gpu.yaml", "--backend", backend])))
    rows.append(("halo-sched render --backend nomad", wall([py, "-m", "halo_sched.cli", "render", "examples/nomad-gpu.yaml", "--backend", "nomad"])))
    rows.append(("halo-sched validate", wall([py, "-m", "halo_sched.cli", "validate", "examples/ddp-gpu.yaml"])))
    try:
        rows.append(("python -c 'import torch'", wall([py, "-c", "import torch"], n=3)))
    except subprocess.CalledProcessError:
        pass
    print("start-up (median wall time, ratio to a bare interpreter):")
    for name, t in rows:
        print(f"  {name:42s} {t * 1000:8.1f} ms  {t / bare:6.2f}x")

    import halo_sched
    from halo_sched.backends.nomad.render import job_payload

    spec = halo_sched.load(REPO / "examples" / "ddp-gpu.yaml").model_copy(update={"nodes": 64})
    nomad_spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml").model_copy(update={"nodes": 64})
    print("rendering a 64-node job (pure, in process):")
    for name, fn in (
        ("sbatch", lambda: halo_sched.render(spec, "slurm")),
        ("nomad hcl", lambda: halo_sched.render(nomad_spec, "nomad")),
        ("nomad json payload", lambda: job_payload(nomad_spec)),
        ("local plan", lambda: halo_sched.render(spec, "local")),
    ):
        fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            fn()
            n += 1
        per = (time.perf_counter() - t0) / n
        print(f"  {name:42s} {per * 1000:8.2f} ms per render")
    import json

    from halo_sched.backends.nomad.render import render_hcl

    print("nomad job size and render time by node count (examples/nomad-gpu.yaml):")
    base = None
    for nodes in (2, 256, 1024):
        s = nomad_spec.model_copy(update={"nodes": nodes})
        payload = len(json.dumps(job_payload(s, "ddp-nomad-bench")).encode())
        hcl = len(render_hcl(s, "ddp-nomad-bench").encode())
        per = per_call(lambda: job_payload(s, "ddp-nomad-bench"))
        per_hcl = per_call(lambda: render_hcl(s, "ddp-nomad-bench"))
        row = (payload, hcl, per, per_hcl)
        base = base or row
        print(f"  {nodes:5d} nodes: payload {payload:6d} B ({payload / base[0]:4.2f}x)  hcl {hcl:6d} B "
              f"({hcl / base[1]:4.2f}x)  payload render {per * 1000:5.2f} ms ({per / base[2]:4.2f}x)  "
              f"hcl render {per_hcl * 1000:5.2f} ms ({per_hcl / base[3]:4.2f}x)")
    return 0


def per_call(fn, seconds: float = 0.5) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


if __name__ == "__main__":
    raise SystemExit(main())
