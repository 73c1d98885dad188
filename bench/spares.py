"""Hot spares against a resubmission through the queue, on the local SLURM test cluster (issue 32,
item 3): a 2-node job (real torchrun, gloo) whose node rank 1 fails as a bad node would 2 s into
its first step (bench/spare_trainer.py). Measured: from that fault to every rank training again
(its first all_reduce of the next step), by the ranks' own clocks.

- spare: ``slurm.spare_nodes: 1`` on the 3-node cluster; the batch script swaps the node for
  the spare in the same job (halo_sched/node/spares.py).
- queue: no spare, ``retry: {attempts: 2, on: [node]}`` with ``submit --wait``: the waiting
  client sees the job FAILED and submits the next attempt, which goes through the queue. The
  queue here is empty, so this is the best case of a resubmission: on a busy cluster the wait
  for nodes comes on top (hours, for a large job).

    python bench/spares.py [--reps N]        # medians of N runs each (default 3); about 1 minute per rep
    python bench/spares.py --write           # the same, and both medians kept in bench/measured.json
                                             # (swap_s, resubmit_s: bench/goodput.py's inputs)
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from run import _cluster_env, _cluster_lock, _slurm_answers  # noqa: E402


def one(kind: str, tmp: Path, env: dict) -> tuple[float, str]:
    """(seconds from the fault to every rank training again, the job ids)."""
    shutil.copy(REPO / "bench" / "spare_trainer.py", tmp / "spare_trainer.py")
    job = {"name": f"spare-bench-{kind}", "nodes": 2, "nproc_per_node": 2,
           "trainer": {"script": "spare_trainer.py"}, "env": {"OMP_NUM_THREADS": "1"},
           "rendezvous": {"timeout_s": 120}}
    if kind == "spare":
        job["slurm"] = {"spare_nodes": 1, "exclusive": True}
    else:
        job["retry"] = {"attempts": 2, "on": ["node"]}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    # A home of its own: each run starts with an empty node ledger (3 nodes, one of them ledgered
    # per run: a second run's retry would find too few).
    env = {**env, "HALO_SCHED_HOME": str(tmp / "home")}
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", "job.yaml", "--backend", "slurm", "--wait",
                        "--quiet", "--timeout", "300"], cwd=tmp, env=env, capture_output=True, text=True, timeout=400)
    if r.returncode != 0:
        raise SystemExit(f"{kind}: submit --wait exited {r.returncode}:\n{r.stderr[-2000:]}")
    rows = [ln.split() for ln in (tmp / "spare_bench.log").read_text().splitlines()]
    fault = float(next(t for c, n, w, t in rows if w == "fault"))
    again = [float(t) for c, n, w, t in rows if c == "1" and w == "train"]
    if len(again) != 4:
        raise SystemExit(f"{kind}: expected 4 ranks training in the next step, got {rows}")
    return max(again) - fault, r.stdout.strip().replace("\n", " ")


def main(argv: list[str]) -> int:
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 3
    os.environ.update(_cluster_env())
    if not _slurm_answers():
        raise SystemExit("no SLURM cluster answers: tests/cluster/slurm-cluster.sh up (with HALO_CLUSTER_PORT)")
    times: dict[str, list[float]] = {"spare": [], "queue": []}
    with _cluster_lock(), tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               "PYTHONPATH": str(REPO)}
        for i in range(reps):
            for kind in ("spare", "queue"):  # alternating
                tmp = Path(d) / f"{kind}{i}"
                tmp.mkdir()
                s, ids = one(kind, tmp, env)
                times[kind].append(s)
                print(f"{kind} rep {i + 1}: {s:.1f} s (job {ids})", flush=True)
    spare, queue = statistics.median(times["spare"]), statistics.median(times["queue"])
    print(f"\nfault -> every rank training again, medians of {reps} (2 nodes x 2 ranks, gloo, Slurm test cluster):")
    print(f"  spare swap in the same job (slurm.spare_nodes: 1): {spare:.1f} s  (goal 30 s, at most 60 s)")
    print(f"  resubmission through an empty queue (retry, submit --wait): {queue:.1f} s  (+ the queue wait on a busy "
          "cluster)")
    if "--write" in argv:
        from measured import write

        where = f"the Slurm test cluster, 2 nodes x 2 ranks, real torchrun, gloo (bench/spares.py, {reps} reps)"
        write("swap_s", spare, f"fault -> every rank training again, a hot spare swapped in the same job "
              f"(slurm.spare_nodes: 1), median of {reps}", "bench/spares.py", where)
        write("resubmit_s", queue, f"fault -> every rank training again, the job resubmitted through an empty queue "
              f"(retry, submit --wait), median of {reps}", "bench/spares.py", where)
        print("kept in bench/measured.json (bench/goodput.py's inputs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
