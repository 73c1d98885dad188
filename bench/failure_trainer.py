"""The failure rows' trainer (bench/failures.py), started by torchrun on every node.

    failure_trainer.py EVENTS_DIR LOAD_S

1. ``BENCH_FAULT=node`` and the run's first attempt (``HALO_RESTART_COUNT`` 0): node 1 fails as a
   bad node does (the NCCL NET/IB lines of tests/trainers/node_fault.py, then the SIGKILL
   nothing in the job sends, the node's evidence) before its first collective, writing
   ``fail TIME`` first; every other case goes on.
2. The load: ``LOAD_S`` seconds of sleep (a model and data being read) before the process group.
3. The first collective: ``init_process_group`` and one ``all_reduce``: rank 0 writes
   ``train ATTEMPT TIME`` once it returned (the run trains again). A node whose gloo interface
   is missing (``GLOO_SOCKET_IFNAME`` from setup) fails here, after the load.
"""
import os
import signal
import sys
import time

events, load_s = sys.argv[1], float(sys.argv[2])
node, rank = int(os.environ.get("GROUP_RANK", "0")), int(os.environ.get("RANK", "0"))
attempt = os.environ.get("HALO_RESTART_COUNT", "0")


def event(text: str) -> None:
    with open(os.path.join(events, "events.log"), "a") as f:
        f.write(f"{text} {time.time():.3f}\n")


if os.environ.get("BENCH_FAULT") == "node" and attempt == "0" and node == 1:
    event("fail")
    print("node:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print(f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's side (halo_sched/node/failure_classes.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

time.sleep(load_s)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if rank == 0:
    event(f"train {attempt}")
dist.barrier()
dist.destroy_process_group()
