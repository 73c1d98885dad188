"""A trainer whose node 1 fails as a bad node would (the NCCL NET/IB lines of node_fault_once.py,
then the SIGKILL that is the node's evidence) on its run's first attempt only, and only once the file ``fault`` appears in the working
directory (the test removes whoever submitted the run first); every later attempt (or a
resubmission once ``fault_at`` exists: bench/recovery.py) ends cleanly.
Each rank writes ``COUNT NODE HOST TIME`` to ``attempts.log``; node 1 writes the moment it fails
to ``fault_at``. No torch needed (torchrun starts it)."""
import os
import signal
import sys
import time

node = int(os.environ.get("GROUP_RANK", "0"))
rank = int(os.environ.get("RANK", "0"))
count = os.environ.get("HALO_RESTART_COUNT", "unset")
host = os.environ.get("SLURMD_NODENAME", "node")
with open("attempts.log", "a") as f:
    f.write(f"{count} {node} {host} {time.time():.3f}\n")
if count != "0" or os.path.exists("fault_at"):  # a later attempt, or a resubmission after the fault
    time.sleep(2)
    sys.exit(0)
deadline = time.time() + 120
while not os.path.exists("fault") and time.time() < deadline:
    time.sleep(0.2)
if node == 1 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
    with open("fault_at", "w") as f:
        f.write(f"{time.time():.3f}\n")
    print(f"{host}:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print(f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's side: a signal nothing in the job sent
time.sleep(60)  # the other node trains on until torchrun stops it
