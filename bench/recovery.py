"""Recovery with no one watching (issue 32), on the local SLURM test cluster with real torchrun:
a 2-node job whose node 1 fails as a bad node would (tests/trainers/node_fault_on_cue.py, an
NCCL NET/IB error printed, then a SIGKILL nothing in the job sent) once its ranks train. Side by side, alternating, medians:

- ``attempt``: ``retry: {attempts: 2, on: [node]}``, nobody waiting; the failed attempt's batch
  script submits the successor itself (halo_sched/node/successor.py);
- ``client``: the same job without ``retry:``; a client waiting with the library's defaults
  (``Job.wait()``) sees the failure and resubmits (what a waiting client did before, and what a
  person or a pipeline does).

Each row: from the fault (node 1's own clock, written as it fails) to the successor submitted
(the attempt: its marker's ``submitted_at``; the client: ``submit`` returned) and to the next
attempt's ranks running (the first of them to start); and, apart, from the failed trainer step's
end as each side knows it (the attempt: its decision, once it has read and classified the failure
lines; the client: SLURM's EndTime, whole seconds) to the successor submitted. The fault's own teardown (torchrun on the failing node, srun ending the step) comes
before either path can act and varies from 1 to 25 s on this machine. The fault comes ``--train-s`` after the
ranks started (default 60 s: the waiting client's poll has backed off by then, as in any real
run). Never asserted in tests.

    python bench/recovery.py [--rounds N] [--train-s S]     # HALO_CLUSTER_PORT as for the tests
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testcluster import REPO, cluster_down, cluster_up  # noqa: E402

TRAINER = REPO / "tests" / "trainers" / "node_fault_on_cue.py"


def _job(d: Path, retry: bool) -> Path:
    import yaml

    data = yaml.safe_load((REPO / "examples" / "ddp-cpu.yaml").read_text())
    data.update(nproc_per_node=1, trainer={"script": TRAINER.name, "args": []}, hang=None)
    data["rendezvous"]["port"] = 29000 + os.getpid() % 400
    if retry:
        data["retry"] = {"attempts": 2, "on": ["node"]}
    shutil.copy(TRAINER, d / TRAINER.name)
    (d / "job.yaml").write_text(yaml.safe_dump(data))
    return d / "job.yaml"


def _until(pred, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(pred)


def _lines(d: Path) -> list[list[str]]:
    p = d / "attempts.log"
    return [ln.split() for ln in p.read_text().splitlines()] if p.exists() else []


def one(kind: str, train_s: float) -> tuple[float, float, float]:
    import halo_sched
    from halo_sched.backends.base import JobStatus

    d = Path(tempfile.mkdtemp(prefix=f"halo-recovery-{kind}-"))
    # A history of its own each time: one round's culprit is not in the next round's node ledger
    # (on 3 nodes, two ledgered hosts leave no room for a 2-node job).
    os.environ["HALO_SCHED_HOME"] = str(d / "home")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        job = halo_sched.submit(_job(d, kind == "attempt"), "slurm")
        _until(lambda: len(_lines(d)) >= 2, 120)
        waited: list = []
        if kind == "client":  # waiting from the start, as `submit --wait` does: its poll backs off meanwhile
            waiter = threading.Thread(target=lambda: waited.append(job.wait()))
            waiter.start()
        time.sleep(train_s)  # the ranks train
        (d / "fault").write_text("")
        if kind == "client":
            waiter.join(300)
            assert waited and waited[0].status is JobStatus.FAILED, waited
            halo_sched.submit(d / "job.yaml", "slurm")
            submitted = time.time()
            ended = waited[0].ended_at or submitted  # SLURM's EndTime (whole seconds)
        else:
            marker = _until(lambda: next(iter(d.glob(".halo-run-*.attempt-1.json")), None), 120)
            submitted = _until(lambda: json.loads(marker.read_text()).get("submitted_at"), 30)
            ended = json.loads(marker.read_text())["failed_at"]  # the hook's decision: srun had ended
        fault = float(_until(lambda: (d / "fault_at").exists() and (d / "fault_at").read_text(), 30))
        first = len(_lines(d))
        _until(lambda: len(_lines(d)) >= first + 2, 180)
        back = min(float(t) for _, _, _, t in _lines(d)[first:])
        return submitted - fault, back - fault, submitted - ended
    finally:
        os.chdir(cwd)
        time.sleep(3)  # the second job ends (2 s)
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-s", type=float, default=60.0, help="seconds the ranks train before the fault (<= 100)")
    args = ap.parse_args()
    # sbatch exports this environment to the nodes: their torchrun and halo-sched are this venv's.
    os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    os.environ["PYTHONPATH"] = str(REPO)
    started = cluster_up()
    got: dict[str, list[tuple[float, float, float]]] = {"attempt": [], "client": []}
    try:
        # Not under /tmp/halo-slurm-cluster.lock: every worktree's test run holds that one shared,
        # and this cluster (HALO_CLUSTER_PORT) is this worktree's own.
        for k in range(args.rounds):
            for kind in (("attempt", "client") if k % 2 == 0 else ("client", "attempt")):
                got[kind].append(one(kind, args.train_s))
                print(f"  {kind}: fault to successor submitted {got[kind][-1][0]:.2f} s, to ranks running "
                      f"again {got[kind][-1][1]:.2f} s; the trainer step's end to submitted {got[kind][-1][2]:.2f} s",
                      flush=True)
    finally:
        if started:
            cluster_down()
    print(f"\n| from a node fault after {args.train_s:g} s of training (2-node job, median of {args.rounds}) | the failed attempt submits | a waiting "
          "client resubmits | ratio |\n|---|---|---|---|")
    for i, what in enumerate(("successor submitted", "the next attempt's ranks running",
                              "(decided / seen ended to successor submitted)")):
        a = statistics.median(x[i] for x in got["attempt"])
        c = statistics.median(x[i] for x in got["client"])
        print(f"| {what} | {a:.2f} s | {c:.2f} s | {c / a:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
