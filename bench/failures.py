"""What automatic retry and the preflight gate buy after a bad node (issue 22), measured on the
local backend with real torchrun and gloo (2 nodes x 1 process), one run of each side, alternated.

    python bench/failures.py [--pairs N] [--notice-min M] [--load-s S]
    python bench/run.py --failures          # the same rows, in the bench's table

1. Recovery: from a node's failure (the moment its rank fails) to the run training again (the
   next attempt's first all_reduce returned on rank 0).
   - automatic: ``retry: {attempts: 2, "on": [node]}`` and ``submit --wait``; the failed node's
     host excluded (the local backend has one host: the retry's exclusion is a no-op here; the
     trainer fails on the first attempt only);
   - manual, ASSUMED: a person notices ``--notice-min`` minutes after halo-sched reported the
     failure (``submit --wait`` returned FAILED; default 15 minutes: a person at a desk, watching;
     at night it is hours), then runs ``submit`` again with the node excluded. The measured part
     is failure -> FAILED reported, plus resubmit -> training; the notice time is the assumption,
     printed with the figure.
2. What the gate saves: node 1's gloo interface is missing (its setup points GLOO_SOCKET_IFNAME at
   ``nosuchif0``). With ``preflight: {gate: true}`` the attempt fails in the gate, before torchrun;
   without it, every node starts torchrun, loads for ``--load-s`` seconds (default 30: a small
   checkpoint and data; real loads take minutes), and the job fails at its first collective.
   Node-hours are the ones ``halo-sched status RUN`` counts (nodes x the supervisor's start to
   end); GPU-hours at 8 GPUs per node would be 8 times as many.
"""
from __future__ import annotations

import argparse
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
TRAINER = REPO / "bench" / "failure_trainer.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp: Path, name: str, load_s: float, fault: str, **extra) -> Path:
    import yaml

    data = {"name": name, "nodes": 2, "nproc_per_node": 1,
            "trainer": {"script": str(TRAINER), "args": [str(tmp), str(load_s)]},
            "env": {"OMP_NUM_THREADS": "1", "BENCH_FAULT": fault},
            "rendezvous": {"port": _port(), "timeout_s": 120}, **extra}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _env(tmp: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HALO_SCHED_HOME": str(tmp / "home"),
            "PATH": f"{Path(PY).parent}:{os.environ.get('PATH', '')}"}


def _submit(job: Path, env: dict, want: int) -> tuple[str, float]:
    """(job id, the time submit --wait returned)."""
    r = subprocess.run([PY, "-m", "halo_sched.cli", "submit", str(job), "--backend", "local", "--wait", "--quiet",
                        "--timeout", "300"], cwd=job.parent, env=env, capture_output=True, text=True, timeout=400)
    ended = time.time()
    if r.returncode != want:
        raise RuntimeError(f"{job.name}: exit {r.returncode}, wanted {want}: {r.stderr.strip()[-600:]}")
    return r.stdout.strip().splitlines()[-1], ended


def _events(tmp: Path) -> list[tuple[str, float]]:
    out = []
    for line in (tmp / "events.log").read_text().splitlines():
        *what, t = line.split()
        out.append((" ".join(what), float(t)))
    return out


def recovery_auto(tmp: Path) -> float:
    env = _env(tmp)
    _submit(_job(tmp, "auto", 0, "node", retry={"attempts": 2, "on": ["node"]}), env, 0)
    ev = _events(tmp)
    fail = next(t for w, t in ev if w == "fail")
    train = next(t for w, t in ev if w == "train 1")
    return train - fail


def recovery_manual(tmp: Path) -> tuple[float, float]:
    """(failure -> FAILED reported, resubmit -> training): the measured parts of the manual path."""
    env = _env(tmp)
    _, reported = _submit(_job(tmp, "manual", 0, "node"), env, 1)
    fail = next(t for w, t in _events(tmp) if w == "fail")
    # The person resubmits with the node excluded: the same job on healthy nodes (no fault).
    again = time.time()
    _submit(_job(tmp, "manual-again", 0, "none"), env, 0)
    train = next(t for w, t in _events(tmp) if w == "train 0")
    return reported - fail, train - again


BAD_NODE_1 = 'if [ "$halo_rank" = 1 ]; then export GLOO_SOCKET_IFNAME=nosuchif0; fi'


def lost(tmp: Path, gate: bool, load_s: float) -> tuple[float, float, str]:
    """(node-hours, wall seconds, failure class) of the failed attempt."""
    from halo_sched import records
    from halo_sched.runs import row_of

    env = _env(tmp)
    job = _job(tmp, "gate" if gate else "nogate", load_s, "none", setup=[BAD_NODE_1], preflight={"gate": gate})
    job_id, _ = _submit(job, env, 1)
    # The attempt's record, read as `status RUN` reads it (the supervisor's start and end).
    before = os.environ.get("HALO_SCHED_HOME")
    os.environ["HALO_SCHED_HOME"] = env["HALO_SCHED_HOME"]
    try:
        row = row_of(records.find(job_id, "local")[0])
        fc = records.find(job_id, "local")[0]["last_state"].get("failure_class") or {}
    finally:
        if before is None:
            os.environ.pop("HALO_SCHED_HOME", None)
        else:
            os.environ["HALO_SCHED_HOME"] = before
    return row.node_hours, row.wall_s, f"{fc.get('class')}/{fc.get('by', '-')}"


def healthy(tmp: Path, floor: str | None) -> float:
    """Seconds from submit to COMPLETED of a healthy 2-node job, with the gate's bandwidth floor or
    with no gate."""
    extra = {"preflight": {"gate": True, "min_busbw": floor}} if floor else {}
    t = time.time()
    _, ended = _submit(_job(tmp, "healthy", 0, "none", **extra), _env(tmp), 0)
    return ended - t


def measure(pairs: int, notice_min: float, load_s: float, emit=print) -> list[tuple[str, str, str, str, str]]:
    rows = []
    auto, rep, resub = [], [], []
    for i in range(pairs):
        for side in (("auto", "manual") if i % 2 == 0 else ("manual", "auto")):
            with tempfile.TemporaryDirectory(prefix="halo-bench-fail-") as d:
                if side == "auto":
                    auto.append(recovery_auto(Path(d)))
                    emit(f"  pair {i}: automatic retry: failure -> training again {auto[-1]:.1f} s")
                else:
                    a, b = recovery_manual(Path(d))
                    rep.append(a)
                    resub.append(b)
                    emit(f"  pair {i}: manual: failure -> FAILED reported {a:.1f} s; resubmit -> training {b:.1f} s")
    t_auto = statistics.median(auto)
    t_rep, t_resub = statistics.median(rep), statistics.median(resub)
    t_manual = t_rep + notice_min * 60 + t_resub
    rows.append(("recovery after a node fault, local, 2 nodes: failure -> the next attempt trains",
                 f"automatic retry {t_auto:.1f} s",
                 f"manual {t_manual:.0f} s = reported {t_rep:.1f} s + ASSUMED notice {notice_min:g} min + "
                 f"resubmit -> training {t_resub:.1f} s (measured parts alone: {t_rep + t_resub:.1f} s)",
                 f"{t_auto / t_manual:.3f}x ({t_auto / (t_rep + t_resub):.2f}x of the measured parts)",
                 "automatic within seconds of the failure; no person in the loop"))
    nh = {True: [], False: []}
    wall = {True: [], False: []}
    cls = {}
    for i in range(pairs):
        for gate in ((True, False) if i % 2 == 0 else (False, True)):
            with tempfile.TemporaryDirectory(prefix="halo-bench-gate-") as d:
                h, w, c = lost(Path(d), gate, load_s)
            nh[gate].append(h)
            wall[gate].append(w)
            cls[gate] = c
            emit(f"  pair {i}: gate {'on ' if gate else 'off'}: failed attempt {w:.1f} s, {h:.5f} node-h, class {c}")
    g, n = statistics.median(nh[True]), statistics.median(nh[False])
    rows.append((f"node-hours lost to a bad node (gloo interface missing), local, 2 nodes, load {load_s:g} s",
                 f"gate on {g:.5f} node-h ({statistics.median(wall[True]):.1f} s; {cls[True]})",
                 f"gate off {n:.5f} node-h ({statistics.median(wall[False]):.1f} s: load, then the first collective; "
                 f"{cls[False]})",
                 f"{g / n:.3f}x; saves {(n - g) * 3600:.0f} node-s per incident = {n - g:.4f} node-h "
                 f"({8 * (n - g):.4f} GPU-h at 8 GPUs/node)",
                 "a bad node costs seconds, not a load; the node is named and ledgered"))
    took = {True: [], False: []}
    for i in range(pairs):
        for floor in ((True, False) if i % 2 == 0 else (False, True)):
            with tempfile.TemporaryDirectory(prefix="halo-bench-floor-") as d:
                took[floor].append(healthy(Path(d), "1MB/s" if floor else None))
            emit(f"  pair {i}: healthy job, {'gate with min_busbw' if floor else 'no gate':19s} "
                 f"submit -> COMPLETED {took[floor][-1]:.1f} s")
    on, off = statistics.median(took[True]), statistics.median(took[False])
    rows.append(("a healthy 2-node job, local: submit -> COMPLETED", f"gate with min_busbw {on:.1f} s",
                 f"no gate {off:.1f} s", f"{on / off:.2f}x (+{on - off:.1f} s: torch imported, one 64 MiB "
                 "send/recv x 4 per node)", "seconds per attempt"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1, help="runs of each side (alternated; medians)")
    ap.add_argument("--notice-min", type=float, default=15.0,
                    help="ASSUMED minutes from the failure's report to a person resubmitting (manual path)")
    ap.add_argument("--load-s", type=float, default=30.0, help="the trainer's load before its first collective")
    args = ap.parse_args()
    print(f"halo-sched failure bench, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs", flush=True)
    rows = measure(args.pairs, args.notice_min, args.load_s, emit=lambda s: print(s, flush=True))
    print("\n| what | halo-sched | anchor | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
