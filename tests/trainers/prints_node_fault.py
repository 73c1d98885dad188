"""A trainer whose node 1 prints what the kernel driver and NCCL print on a broken GPU or NIC (an
Xid line, NCCL's NET/IB warning, torch's DistBackendError) and exits 1, on every attempt: the
rank's own words and nothing from the node's side. Issue 43: this was classified a node fault,
retried and its host fenced off; it is a label now, never a verdict. Each rank writes
``COUNT NODE`` to ``attempts.log``. No torch needed (torchrun starts it)."""
import os
import sys
import time

node = int(os.environ.get("GROUP_RANK", "0"))
rank = int(os.environ.get("RANK", "0"))
with open("attempts.log", "a") as f:
    f.write(f"{os.environ.get('HALO_RESTART_COUNT', 'unset')} {node}\n")
if node == 1 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
    print("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", file=sys.stderr, flush=True)
    print("node:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print(f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
          file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(2)
