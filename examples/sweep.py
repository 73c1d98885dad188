"""A hyper-parameter sweep with halo-sched as a library: three jobs submitted together, one per
learning rate, each one's result taken as a value as it ends (rank 0's ``{"loss": ...}``:
``run.result().value``), and the one that fails on purpose (lr 4.0 diverges) reported with its
culprit: the rank, its host, whose fault, the error.

    python examples/sweep.py                       # the local backend ($HALO_SCHED_BACKEND)
    python examples/sweep.py --backend slurm       # the same on a SLURM cluster

It runs from any directory (the trainer is named by its absolute path; SLURM's output files land
in the directory it runs in). Exits 0 once
every job ended and each result or failure is known; 1 when a job's outcome stayed unknown.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import halo_sched

HERE = Path(__file__).resolve().parent


def sweep(lrs: list[float], backend: str | None = None, timeout: float = 300.0) -> dict:
    base = halo_sched.spec_from_yaml(HERE / "sweep.yaml")
    # Submitted together; each is a Run (retry:, records and notify: as `halo-sched submit`).
    runs = {lr: halo_sched.submit(halo_sched.with_changes(base, {"name": f"sweep-lr{lr:g}",
                                                                 "trainer.script": str(HERE / "sweep_train.py"),
                                                                 "trainer.args": ["--lr", str(lr)]}), backend)
            for lr in lrs}
    out: dict = {"results": {}, "failures": {}, "unknown": {}}
    lr_of = {run.id: lr for lr, run in runs.items()}
    try:
        for run in halo_sched.as_completed(runs.values(), timeout=timeout):  # each as it ends
            lr, err = lr_of[run.id], run.exception()  # None, or what run.result() would raise
            if isinstance(err, halo_sched.JobFailed):
                out["failures"][lr] = {"id": run.id, "culprit": err.report.to_dict() if err.report else None,
                                       "status": err.state.status.value}
            elif err is not None:  # cancelled, outcome unknown
                out["unknown"][lr] = {"id": run.id, "error": str(err), "exit_code": err.exit_code}
            else:  # rank 0's result, a value: {"loss": ..., "lr": ..., "steps": ...}
                value = run.result().value
                out["results"][lr] = {"id": run.id, "loss": value.get("loss") if isinstance(value, dict) else None}
    except halo_sched.StillRunning as err:  # past the timeout: the rest are still running
        for lr, run in runs.items():
            if lr not in out["results"] and lr not in out["failures"] and lr not in out["unknown"]:
                out["unknown"][lr] = {"id": run.id, "error": str(err), "exit_code": err.exit_code}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None, help="local, slurm or nomad (default: $HALO_SCHED_BACKEND, else local)")
    ap.add_argument("--lrs", default="0.1,0.3,4.0", help="learning rates, comma-separated")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole sweep")
    ap.add_argument("--json", action="store_true", help="the outcome as one JSON object on stdout")
    args = ap.parse_args(argv)
    out = sweep([float(x) for x in args.lrs.split(",")], args.backend, args.timeout)
    if args.json:
        print(json.dumps(out))
    else:
        for lr, r in sorted(out["results"].items()):
            print(f"lr {lr:<6g} loss {r['loss']:.3g}  ({r['id']})")
        best = min(out["results"].items(), key=lambda kv: kv[1]["loss"] if kv[1]["loss"] is not None else 1e300,
                   default=None)
        if best:
            print(f"best: lr {best[0]:g}")
        for lr, f in sorted(out["failures"].items()):
            c = f["culprit"] or {}
            print(f"lr {lr:<6g} {f['status']}: rank {c.get('rank')} on {c.get('host') or '?'}, "
                  f"{c.get('fault')} fault: {c.get('error')}  ({f['id']})")
        for lr, u in sorted(out["unknown"].items()):
            print(f"lr {lr:<6g} no result: {u['error']}")
    return 1 if out["unknown"] else 0


if __name__ == "__main__":
    sys.exit(main())
