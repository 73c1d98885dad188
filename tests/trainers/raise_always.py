"""A trainer whose rank 0 raises a Python exception (a job's own fault: never retried)."""
import os
import time

if os.environ.get("RANK", "0") == "0":
    with open("attempts.log", "a") as f:
        f.write(os.environ.get("HALO_RESTART_COUNT", "unset") + "\n")
    raise ValueError("bad learning rate: -1")
time.sleep(1)
