"""A trainer for the multi-host rig's tests: every rank all_reduces ``--numel`` floats a step (so
the collectives' bytes show on the interfaces' counters), sleeps ``--step-time`` and reports its
progress before the step's collective. Each rank first prints where it runs and what it was given:
``net-probe rank R host H master_addr A gloo_ifname I``."""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--step-time", type=float, default=0.0)
    args = ap.parse_args()
    from halo_sched.node.progress import report

    # One write per line: torchrun's tee (tail_log.py tail_logfile) prints what readline() finds,
    # a line whose newline has not come yet included, and glued the next rank's prefix to one
    # ("gloo_ifname data0[rank1]: ..." in a run under load).
    line = (f"net-probe rank {os.environ['RANK']} host {socket.gethostname()} master_addr {os.environ.get('MASTER_ADDR')} "
            f"gloo_ifname {os.environ.get('GLOO_SOCKET_IFNAME', '-')}\n")
    os.write(1, line.encode())
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    t = torch.ones(args.numel)
    for step in range(args.steps):
        time.sleep(args.step_time)
        report(step)
        dist.all_reduce(t)
    dist.barrier()
    os.write(1, f"net-probe rank {dist.get_rank()}: done\n".encode())


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as examples/train_ddp.py: no interpreter shutdown under gloo (docs/failures.md)
