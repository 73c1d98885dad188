"""The trainer of bench/spares.py (real torchrun, gloo): every rank joins the process group and
logs ``COUNT NODE train EPOCH`` after its first all_reduce ("training"). On the first step
(HALO_RESTART_COUNT 0) node rank 1's first rank logs ``fault EPOCH`` after 2 s and dies as a bad
node would (an NCCL NET/IB error, tests/trainers/node_fault.py's words, then the SIGKILL that is
the node's evidence), or with ``SPARE_BENCH_FAULT=job`` by the job's own fault (a Python exception
after reporting step 1 through the progress protocol); every later step runs a few all_reduces
and ends 0. With ``SPARE_BENCH_FAULT=planned`` nothing fails: node rank 1's first rank logs
``on:HOST`` (the node to drain), and every rank trains (an all_reduce every 0.1 s) until the
warning signal (``HALO_WARNING_SIGNAL``) reaches any of them, then all stop at the same step
(logged ``stop``) and exit 0, as a trainer saving its checkpoint at the warning does (it saves
nothing: the time measured is the tool's, not a checkpoint's); at most SPARE_BENCH_WAIT_S (240)
seconds, then it exits 3."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

count = os.environ.get("HALO_RESTART_COUNT", "?")
node = int(os.environ.get("GROUP_RANK", "0"))
local = int(os.environ.get("LOCAL_RANK", "0"))
log = os.environ.get("SPARE_BENCH_LOG", "spare_bench.log")


def say(what: str) -> None:
    with open(log, "a") as f:
        f.write(f"{count} {node} {what} {time.time():.3f}\n")


planned = os.environ.get("SPARE_BENCH_FAULT") == "planned"
warned: list[float] = []
if planned:  # before anything else: until then the warning is ignored (torchrun's), and held
    signal.signal(getattr(signal, "SIG" + os.environ.get("HALO_WARNING_SIGNAL", "USR2")),
                  lambda *_: warned.append(time.time()))
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
say("train")
if count == "0" and planned:
    if node == 1 and local == 0:
        say("on:" + os.environ.get("SLURMD_NODENAME", "?"))
    stop = torch.zeros(1)
    deadline = time.time() + float(os.environ.get("SPARE_BENCH_WAIT_S", "240"))
    while True:  # every rank leaves at the same step, whichever got the warning first
        stop.fill_(1.0 if warned else 0.0)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        if time.time() > deadline:
            print("spare_trainer: no warning came", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(0.1)
    say("stop")
    dist.destroy_process_group()
    sys.exit(0)
if count == "0":
    if node == 1 and local == 0:
        time.sleep(2)
        say("fault")
        if os.environ.get("SPARE_BENCH_FAULT") == "job":
            if "HALO_PROGRESS_DIR" in os.environ:
                with open(os.path.join(os.environ["HALO_PROGRESS_DIR"], f"rank-{os.environ['RANK']}"), "a") as f:
                    f.write(f"1 {time.time()}\n")
            raise ValueError("bad batch at step 2")  # the job's own fault: restarted in place
        host = os.environ.get("SLURMD_NODENAME", "node")
        print(f"{host}:4242:4250 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer "
              "10.0.0.1<35162> with status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # the node's side (halo_sched/node/failure_classes.py)
    while True:  # the peers wait in a collective until the bad node's end reaches them
        dist.all_reduce(t)
        time.sleep(0.1)
for _ in range(3):
    dist.all_reduce(t)
dist.destroy_process_group()
