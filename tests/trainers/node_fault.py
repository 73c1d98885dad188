"""A trainer whose node 1 fails as a bad node would: its rank prints what NCCL and the kernel
driver print on a broken NIC or GPU (stand-ins: this cluster has neither), then exits non-zero.
Every other rank waits a moment and ends cleanly. No torch needed (torchrun starts it)."""
import os
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
    sys.exit(1)
time.sleep(3)
