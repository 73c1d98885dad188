"""The bench's healthy trainer (bench/hang.py): gloo, a small step (a matmul and one all_reduce),
a progress report after each step (a no-op when the job runs with `hang: null`). Rank 0 writes
its steps per second over the timed steps to $HALO_BENCH_OUT."""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from halo_sched.node.progress import report


def main() -> None:
    warmup, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    a = torch.randn(64, 64)
    t = torch.zeros(256)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        (a @ a).sum()
        dist.all_reduce(t)
        report(step)
    dist.barrier()
    rate = steps / (time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(os.environ["HALO_BENCH_OUT"], "w") as f:
            f.write(f"{rate}\n")
    dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as examples/train_ddp.py: no interpreter shutdown under gloo (README)
