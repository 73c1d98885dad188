"""A small DDP training run for halo-sched's examples: synthetic regression, a few steps, then
checks that the world formed as the job file says (one all_reduce over every rank).

Runs on CPU with gloo (default) or on GPUs with NCCL (``--device cuda``). Started by torchrun, so
RANK/WORLD_SIZE/LOCAL_RANK/GROUP_RANK (the node rank) come from the environment.

Progress: each rank reports its step after it (``report_progress``), so that halo-sched's hang
monitor ends a job one of whose ranks stopped (``hang.timeout_s``) and names that rank.

Preemption: the warning signal (``HALO_WARNING_SIGNAL``, USR2 by default; torchrun ignores it)
makes every rank stop at the same step, save a checkpoint (``--checkpoint-dir``) and exit 0; the
next run (``HALO_RESTART_COUNT`` > 0 after a requeue) resumes from it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # halo-sched's progress helper (it also lets the hang monitor read this rank's stack live)
    from halo_sched.node.progress import report as report_progress
except ImportError:  # halo-sched not installed on the node: the protocol is one line (README: "Hangs")
    def report_progress(step: int) -> None:
        if "HALO_PROGRESS_DIR" in os.environ:
            with open(f"{os.environ['HALO_PROGRESS_DIR']}/rank-{os.environ['RANK']}", "a") as f:
                f.write(f"{step} {time.time()}\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--report-dir", default=None, help="write one JSON report per rank here")
    ap.add_argument("--echo-env", action="append", default=[], help="record this variable's exact bytes in the report")
    ap.add_argument("--fail-rank", type=int, default=None, help="this rank exits 3 after the first step (tests)")
    ap.add_argument("--checkpoint-dir", default=None, help="save here on the warning; resume from here on start")
    ap.add_argument("--step-time", type=float, default=0.0, help="sleep this long each step (tests: a job to warn)")
    ap.add_argument("--fail-on-warning", type=int, default=None, help="this rank exits 3 when warned (tests)")
    ap.add_argument("--handler-after", type=float, default=0.0,
                    help="install the warning handler this many seconds late (tests: a warning held until then)")
    ap.add_argument("--hold-at", type=int, default=None,
                    help="in the first run, wait at this step until warned, at most 300 s (tests: the warning comes "
                         "while training, however slowly the machine reaches it)")
    ap.add_argument("--warning-dir", default=None,
                    help="the handler appends a line to DIR/rank<R>[-restart<n>].warned each time this rank gets the "
                         "warning (tests: proof of receipt by every rank, from the rank itself)")
    args = ap.parse_args()

    # Installed first: until then the warning is ignored (inherited from torchrun), not fatal, and
    # halo-sched holds a warning that comes meanwhile until this handler is in place.
    time.sleep(args.handler_after)
    warned: list[float] = []
    sig_name = os.environ.get("HALO_WARNING_SIGNAL", "USR2")
    restart = int(os.environ.get("HALO_RESTART_COUNT", "0"))
    receipt = None
    if args.warning_dir:
        os.makedirs(args.warning_dir, exist_ok=True)
        suffix = f"-restart{restart}" if restart else ""
        receipt = os.path.join(args.warning_dir, f"rank{os.environ['RANK']}{suffix}.warned")

    def on_warning(signum, frame):
        warned.append(time.time())
        if receipt:  # one line per signal this process got: when, and which process got it
            fd = os.open(receipt, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, f"{warned[-1]:.6f} {os.getpid()}\n".encode())
            os.close(fd)

    signal.signal(getattr(signal, "SIG" + sig_name), on_warning)

    cuda = args.device == "cuda"
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
    if cuda:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node_rank = int(os.environ["GROUP_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    w_true = torch.arange(16, dtype=torch.float32, device=device) / 16

    first_step, resumed_from = 0, None
    ckpt = os.path.join(args.checkpoint_dir, "checkpoint.pt") if args.checkpoint_dir else None
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        resumed_from = state["step"]
        first_step = resumed_from + 1
        if rank == 0:
            print(f"run {restart + 1}: resumed from the checkpoint of step {resumed_from}", flush=True)

    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)  # each rank its own data shard
    stop = torch.zeros(1, device=device)
    loss = torch.zeros((), device=device)  # no step may run (warned at once, or resumed at the end)
    saved_step = saved_at = None
    stopped = False
    step = first_step - 1
    for step in range(first_step, args.steps):
        # All ranks leave the loop at the same step, whichever got the signal first (a rank that
        # left alone would abort its peers in their next collective). From here on every rank
        # acts on that shared decision, never on its own signal: a rank whose signal is still on
        # its way (another node's) must save with the others, or the collectives below pair up
        # wrongly and every rank waits forever.
        if step == args.hold_at and restart == 0:
            held_until = time.monotonic() + 300
            while not warned and time.monotonic() < held_until:
                time.sleep(0.05)
        stop.fill_(1.0 if warned else 0.0)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            stopped = True
            step -= 1  # this step did not run
            break
        if args.step_time:
            time.sleep(args.step_time)
        x = torch.randn(args.batch, 16, generator=gen).to(device)
        y = (x @ w_true).unsqueeze(1) + 0.01 * torch.randn(args.batch, 1, generator=gen).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:4d} loss {loss.item():.5f}", flush=True)
        if args.fail_rank == rank:
            print(f"rank {rank}: failing on purpose (--fail-rank)", file=sys.stderr, flush=True)
            sys.exit(3)
        report_progress(step)  # the hang monitor's evidence that this rank still steps

    if stopped:
        if args.fail_on_warning == rank:
            print(f"rank {rank}: failing on the warning on purpose (--fail-on-warning)", file=sys.stderr, flush=True)
            sys.exit(3)
        if ckpt and step >= 0:
            # Shared storage: rank 0 writes; per-node disks: each node's local rank 0.
            shared = os.environ.get("DIST_OUTPUT_SHARED_FILESYSTEM", os.environ.get("DIST_SHARED_FILESYSTEM", "1")) == "1"
            if (rank if shared else local_rank) == 0:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()  # every rank returns once the checkpoint is on disk
            saved_step, saved_at = step, time.time()
        if not warned:
            since = " (stopped with the others before its own signal came)"
        else:
            since = f" {saved_at - warned[0]:.2f}s after the signal" if saved_at else ""
        print(f"rank {rank}: SIG{sig_name} at step {step}; checkpoint {'saved' if saved_at else 'not saved'}{since}",
              flush=True)

    # The world check: every rank contributes its rank; the sum is fixed by the world size.
    t = torch.tensor([float(rank)], device=device)
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    # DDP keeps replicas identical: the spread of a parameter checksum across ranks must be 0.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    lo, hi = checksum.clone(), checksum.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    pair = torch.tensor([rank, node_rank], device=device)
    gathered = [torch.zeros_like(pair) for _ in range(world)]
    dist.all_gather(gathered, pair)
    members = [{"rank": int(g[0]), "node_rank": int(g[1])} for g in gathered]
    ok = t.item() == expected and (hi - lo).abs().item() < 1e-9
    if rank == 0:
        nodes = sorted({m["node_rank"] for m in members})
        print(
            f"world: {world} ranks on {len(nodes)} nodes (node ranks {nodes}); "
            f"all_reduce sum {t.item():g} (expected {expected:g}); replicas in sync: {(hi - lo).abs().item() < 1e-9}; "
            f"final loss {loss.item():.5f}; {'OK' if ok else 'MISMATCH'}",
            flush=True,
        )
    if args.report_dir:
        os.makedirs(args.report_dir, exist_ok=True)
        report = {
            "rank": rank, "pid": os.getpid(), "world_size": world, "node_rank": node_rank, "local_rank": local_rank,
            "members": members, "all_reduce": t.item(), "ok": ok,
            "env_hex": {name: os.environb.get(name.encode(), b"").hex() for name in args.echo_env},
            "restart_count": restart, "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "warned_at": warned[0] if warned else None, "warnings": len(warned), "stopped": stopped, "saved_step": saved_step, "saved_at": saved_at,
            "resumed_from": resumed_from, "last_step": step,
        }
        name = f"rank{rank}.json" if restart == 0 else f"rank{rank}-restart{restart}.json"
        with open(os.path.join(args.report_dir, name), "w") as f:
            json.dump(report, f)
    if stopped and receipt and not warned:
        # Stopped by another rank's signal before its own came (another node's, milliseconds
        # apart): stay a while for it, so that its receipt is recorded, not lost with the process.
        deadline = time.monotonic() + 10
        while not warned and time.monotonic() < deadline:
            time.sleep(0.05)
    # Leave together: a rank that tears down gloo while a peer still talks to it aborts that peer.
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Leave without Python's interpreter shutdown. gloo's worker threads outlive
    # destroy_process_group() here (DDP keeps the group alive), and one may still be releasing the
    # last collectives' work when Python finalizes: freeing a tensor that Python owned then takes
    # the GIL, which ends that thread from inside a C++ destructor, and the rank dies of SIGABRT
    # ("terminate called without an active exception") after a successful run, failing its node
    # (3 of 62 `make demo` runs beside two CPU hogs on a 2-core machine; more under heavier load).
    # Everything this process wrote is closed; its output is flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
