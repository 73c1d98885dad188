"""A trainer whose node 1 fails as a bad node would: its rank prints what NCCL prints on a broken
NIC (the rank's own words: a label, never by itself a node fault), then dies of SIGKILL, which
nothing in the job sends: the node's evidence (torchrun sees the signal; halo_sched/node/
failure_classes.py), standing in for the kernel or a node's health agent killing it (this cluster
has no broken NIC or GPU). Every other rank waits a moment and ends cleanly. No torch needed
(torchrun starts it)."""
import os
import signal
import sys
import time

node = int(os.environ.get("GROUP_RANK", "0"))
rank = int(os.environ.get("RANK", "0"))
if node == 1 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
    host = os.environ.get("SLURMD_NODENAME", "node")
    # NCCL's WARN line (transport/net_ib.cc) and torch's C10D_NCCL_CHECK message (NCCLUtils.hpp).
    print(f"{host}:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print(f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's side: a signal nothing in the job sent
time.sleep(3)
