"""The trainer of examples/sweep.py: gradient descent on a toy loss, (w - 3)^2, so that a sweep
runs in seconds on a laptop (no torch import of its own; torchrun starts it). A learning rate of
1.0 or more diverges: the last rank raises, as a real run that goes NaN would, and halo-sched's
failure report names it. Rank 0 hands its final loss back as the job's result (``HALO_RESULT_FILE``,
halo_sched.node.result), which the sweep gets as ``run.result().value``; it prints it too."""
import argparse
import json
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
    result = {"loss": loss, "lr": args.lr, "steps": args.steps}
    try:
        from halo_sched.node.result import write
    except ImportError:  # no halo-sched where the trainer runs: the protocol itself (one JSON file)
        if os.environ.get("HALO_RESULT_FILE"):
            with open(os.environ["HALO_RESULT_FILE"], "w") as f:
                json.dump(result, f)
    else:
        write(result)  # rank 0 only; bounded (64 KiB of JSON); does nothing outside halo-sched
