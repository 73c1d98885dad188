"""A trainer for recovery on Nomad: the rank on allocation slot ``FAULT_SLOT`` (``NOMAD_ALLOC_INDEX``,
default 1) fails as a bad node does once the world has formed (the first all_reduce done: an NCCL
line, then a SIGKILL nothing in the job sent), in an attempt ``FAULT_COUNTS`` lists
(``HALO_RESTART_COUNT``, default "0": the run's first); otherwise it trains ``--steps`` all_reduces
with gloo. Each rank appends ``start SLOT NODE_RANK TIME`` to ``starts.log`` in its task directory
when it starts, ``trained SLOT NODE_RANK TIME`` after its first step, and the faulting one ``fault
SLOT NODE_RANK TIME`` just before it dies."""
import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()
slot = os.environ.get("NOMAD_ALLOC_INDEX", "?")
node = os.environ.get("GROUP_RANK", "?")


def mark(what: str) -> None:
    with open("starts.log", "a") as f:
        f.write(f"{what} {slot} {node} {time.time():.3f}\n")


mark("start")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(4)
dist.all_reduce(t)
mark("trained")
if slot == os.environ.get("FAULT_SLOT", "1") and os.environ.get("LOCAL_RANK", "0") == "0" \
        and os.environ.get("HALO_RESTART_COUNT", "0") in os.environ.get("FAULT_COUNTS", "0").split(","):
    mark("fault")
    print(f"{os.uname().nodename}:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(args.steps):
    dist.all_reduce(t)
    time.sleep(0.1)
dist.destroy_process_group()
print(f"slot {slot} node {node} rank {dist.get_rank() if dist.is_initialized() else os.environ.get('RANK')}: done",
      flush=True)
