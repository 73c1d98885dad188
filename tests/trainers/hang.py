"""A trainer for the hang tests: every rank steps (an all_reduce per step, a progress report after
it) until ``--stuck-rank`` stops at ``--stuck-step``, asleep forever, while the others wait in the
next step's all_reduce. ``--slow-rank`` only steps slower (a straggler, never hung);
``--first-step-delay`` spends that long, silent, before the first step; ``--no-helper`` writes the
protocol's one line itself instead of importing halo_sched.node.progress. With ``--report-before``
a rank reports after its compute, before the all_reduce, and (with the helper) says when it left
the all_reduce too (``progress.left``)."""
from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000000)
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--stuck-rank", type=int, default=None)
    ap.add_argument("--stuck-step", type=int, default=5)
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--slow-time", type=float, default=1.0)
    ap.add_argument("--first-step-delay", type=float, default=0.0)
    ap.add_argument("--no-helper", action="store_true")
    ap.add_argument("--report-before", action="store_true", help="report after the compute, before the all_reduce")
    args = ap.parse_args()
    if args.no_helper:
        def report(step: int) -> None:
            if "HALO_PROGRESS_DIR" in os.environ:
                open(f"{os.environ['HALO_PROGRESS_DIR']}/rank-{os.environ['RANK']}", "a").write(f"{step} {time.time()}\n")
        left = None
    else:
        from halo_sched.node.progress import left, report
    # Longer than any test: halo-sched's monitor, not gloo, must end the job.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    time.sleep(args.first_step_delay)
    t = torch.ones(1)
    for step in range(args.steps):
        if rank == args.stuck_rank and step == args.stuck_step:
            print(f"rank {rank}: stuck at step {step}", flush=True)
            time.sleep(3600)  # the hang
        time.sleep(args.slow_time if rank == args.slow_rank else args.step_time)
        if args.report_before:
            report(step)
        dist.all_reduce(t)
        if not args.report_before:
            report(step)
        elif left is not None:
            left(step)  # and when it left the all_reduce: how long it waited there
    dist.barrier()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
    # As examples/train_ddp.py: no interpreter shutdown under gloo (docs/failures.md, "A rank that
    # dies after a good run"): one CI run saw rank 1 abort there after "done", failing a no-hang test.
    # (sys is imported here: the tests name this file's line numbers.)
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
