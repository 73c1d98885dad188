"""A trainer whose one rank fails first, for the failure-report tests.

Every rank joins one all_reduce (the world formed), then ``--fail-rank`` fails in the way
``--how`` says while the others wait in a second all_reduce: they fail later, when gloo notices
the dead peer or its ``--timeout`` runs out, or they are stopped by the scheduler.
"""
from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fail-rank", type=int, default=3)
    ap.add_argument("--how", choices=("raise", "exit", "kill"), default="raise")
    # The others learn of the failed rank from its closed connections at once; the timeout only bounds a
    # rank that never fails. Tests use 30 s: with 6 s, beside the whole suite on 2 cores, rank 0's wait ran
    # out before rank 3 had raised (1 s after the world formed, on an idle machine), and rank 0 failed first.
    ap.add_argument("--timeout", type=float, default=30.0, help="the others' collective timeout (s)")
    ap.add_argument("--others", choices=("wait", "sleep"), default="wait",
                    help="wait: block in a collective (fail at gloo's error/timeout); sleep: until stopped")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {rank}: world of {int(t.item())} formed", flush=True)
    if rank == args.fail_rank:
        time.sleep(1.0)
        if args.how == "raise":
            raise ValueError(f"rank {rank} fails on purpose")
        if args.how == "exit":
            print(f"rank {rank}: exiting 3 on purpose", file=sys.stderr, flush=True)
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    if args.others == "sleep":
        time.sleep(600)
    dist.all_reduce(t)  # the failed rank never joins: fails later here
    print(f"rank {rank}: unexpectedly completed", flush=True)


if __name__ == "__main__":
    (record(main) if os.environ.get("TRAINER_RECORD") == "1" else main)()
