"""The trainer of examples/sweep.py: gradient descent on a toy loss, (w - 3)^2, so that a sweep
runs in seconds on a laptop (no torch import of its own; torchrun starts it). A learning rate of
1.0 or more diverges: the last rank raises, as a real run that goes NaN would, and halo-sched's
failure report names it. Rank 0 prints ``final loss=...``, which the sweep reads back."""
import argparse
import os

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float, required=True)
ap.add_argument("--steps", type=int, default=50)
args = ap.parse_args()
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

w = 0.0
for step in range(args.steps):
    w -= args.lr * 2 * (w - 3)
    loss = (w - 3) ** 2
    if loss > 1e6 and rank == world - 1:
        raise FloatingPointError(f"loss diverged at step {step}: {loss:.3g} (lr {args.lr})")
if rank == 0:
    print(f"final loss={loss:.6g} lr={args.lr}", flush=True)
