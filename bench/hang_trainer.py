"""The bench's healthy trainer (bench/hang.py): gloo, a small step (a matmul and one all_reduce),
a progress report after each step (a no-op when the job runs with `hang: null`). Rank 0 writes
its steps per second over the timed steps to $HALO_BENCH_OUT.

    hang_trainer.py WARMUP STEPS [PROGRESS_DIR]

PROGRESS_DIR: report there although the job has no monitor (`hang: null`). With $HALO_BENCH_AB=N
the timed steps run in blocks of N, reporting in half of them (ABBA order); rank 0 then writes the
median steps per second of the blocks with reports and of those without (one run, one process:
the report's own cost, free of the run-to-run spread). $HALO_BENCH_WRITE=1: report() appends a line
with one write() per report, as before its ring."""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from halo_sched.node.progress import report


def main() -> None:
    warmup, steps = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:  # "progress only": reports written, no monitor (the job has hang: null)
        os.environ["HALO_PROGRESS_DIR"] = sys.argv[3]
        os.makedirs(sys.argv[3], exist_ok=True)
    block = int(os.environ.get("HALO_BENCH_AB", "0"))
    if os.environ.get("HALO_BENCH_WRITE"):  # report() as before its ring: one write() per report
        sys.modules["mmap"] = None  # its import fails: report() falls back to appending lines
    dist.init_process_group("gloo")
    a = torch.randn(64, 64)
    t = torch.zeros(256)
    for step in range(warmup):
        (a @ a).sum()
        dist.all_reduce(t)
        report(step)
    dist.barrier()
    rates: dict[bool, list[float]] = {True: [], False: []}
    # ABBA ABBA ...: a drift over the run, or what a block does to the next, falls on both sides alike.
    blocks = [(block, i % 4 in (0, 3)) for i in range(4 * (steps // (4 * block)))] if block else [(steps, True)]
    step = warmup
    for n, reporting in blocks:
        start = time.perf_counter()
        for _ in range(n):
            (a @ a).sum()
            dist.all_reduce(t)
            if reporting:
                report(step)
            step += 1
        rates[reporting].append(n / (time.perf_counter() - start))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.environ["HALO_BENCH_OUT"], "w") as f:
            f.write(f"{statistics.median(rates[True])} {statistics.median(rates[False])}\n" if block
                    else f"{rates[True][0]}\n")
    dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as examples/train_ddp.py: no interpreter shutdown under gloo (README)
