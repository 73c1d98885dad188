"""A trainer whose node 1 (``FAULT_NODE``) fails as a bad node would on its run's first attempt only
(``HALO_RESTART_COUNT`` 0, or each count ``FAULT_COUNTS`` lists, "0,1": see tests/trainers/node_fault.py
for the lines it prints and the SIGKILL that is the node's evidence); every later attempt
(``HALO_RESTART_COUNT`` 1, 2, ...) ends cleanly on every node. Each rank writes the count it saw to ``attempts.log`` in the working directory.
With ``--progress``, each rank reports steps through the progress protocol first, 0.25 s apart:
steps 1-4 on the first attempt (rank 0 reports a checkpoint of step 2 that took 0.5 s), steps 3-8
on a later one (resumed from that checkpoint: steps 3 and 4 are done twice).
``JOB_FAULT_COUNTS`` ("1"): on those counts node ``JOB_FAULT_NODE`` (1) fails by the job's own fault
instead, a Python exception after reporting step ``JOB_FAULT_STEP`` (5) through the progress protocol.
No torch needed (torchrun starts it)."""
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
progress = os.environ.get("HALO_PROGRESS_DIR") if "--progress" in sys.argv else None
if progress:
    for step in range(1, 5) if count == "0" else range(3, 9):
        time.sleep(0.25)
        with open(f"{progress}/rank-{rank}", "a") as f:
            f.write(f"{step} {time.time()}\n")
        if step == 2 and rank == 0 and count == "0":
            with open(f"{progress}/rank-{rank}.checkpoints", "a") as f:
                f.write(f"{step} {time.time()} 0.5\n")
if count in os.environ.get("JOB_FAULT_COUNTS", "").split(",") and node == int(os.environ.get("JOB_FAULT_NODE", "1")):
    step = int(os.environ.get("JOB_FAULT_STEP", "5"))
    if "HALO_PROGRESS_DIR" in os.environ:
        with open(os.path.join(os.environ["HALO_PROGRESS_DIR"], f"rank-{rank}"), "a") as f:
            f.write(f"{step} {time.time()}\n")
    raise ValueError(f"bad batch at step {step + 1}")
faulty = os.environ.get("FAULT_COUNTS", "0").split(",")  # the counts it fails on: the first attempt's, by default
if count in faulty and node == int(os.environ.get("FAULT_NODE", "1")) and int(os.environ.get("LOCAL_RANK", "0")) == 0:
    print(f"{host}:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
          "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print(f"[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's side: a signal nothing in the job sent
time.sleep(2)
