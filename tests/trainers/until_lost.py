"""A trainer that runs until its node is lost, on its run's first attempt only: each rank writes
``COUNT NODE HOST TIME`` to ``attempts.log`` and then waits (up to 240 s; the test takes a node
away meanwhile); every later attempt ends cleanly 2 s after it started. No torch needed
(torchrun starts it)."""
import os
import sys
import time

node = int(os.environ.get("GROUP_RANK", "0"))
count = os.environ.get("HALO_RESTART_COUNT", "unset")
host = os.environ.get("SLURMD_NODENAME", "node")
with open("attempts.log", "a") as f:
    f.write(f"{count} {node} {host} {time.time():.3f}\n")
time.sleep(2 if count != "0" else 240)
sys.exit(0)
