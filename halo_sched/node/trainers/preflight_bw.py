"""halo-sched preflight, the program every rank runs in place of the trainer.

Started by torchrun exactly as the job's trainer would be (same nodes, environment, setup), it
1. checks each node before any collective (the fabric interface exists and has an address, the
   node sees its GPUs, /dev/infiniband and /dev/gdrdrv where the fabric needs them) and prints
   one ``halo-sched-preflight-node {json}`` line per node: a node that fails here exits before
   the process group forms, so its line is all that is left to tell why;
2. forms the process group (nccl on GPUs, gloo on CPUs) and checks across nodes: rank 0's
   address is not loopback when the nodes are different hosts; the NCCL/gloo/DIST variables
   are identical on every node;
3. runs the NCCL guide's speed test: warm-up, then a timed send/recv of ``--size`` bytes from
   each node's first rank to rank 0 in turn (unidirectional), and an all_gather across every
   rank (bidirectional) whose output is ``--size`` bytes. torch returns from send/recv before
   the data has arrived, so each timing ends only after the result is read
   (``tensor.sum().item()``);
4. prints one ``halo-sched-preflight {json}`` line from rank 0 with everything.

MiB/s is bytes moved (the received tensor; the all_gather's whole output) / seconds / 2**20, as
the guide computes it. Each timing is repeated ``--iters`` times; the median is reported.

Self-contained on purpose: halo-sched sends this file's text inside the job (a setup line
writes it on each node), so it must run where only torch is installed. torch is imported in
``main()`` only, so halo-sched can import this module for its constants without torch.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import struct
import sys
import time

RESULT_MARK = "halo-sched-preflight"
NODE_MARK = "halo-sched-preflight-node"
# Variables that must be identical on every rank (DOMAIN: a difference kills the job or, for
# NCCL_PROTO and the EFA plugin settings, hangs or slows it).
SAME_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "DIST_", "HALO_PARALLEL_")
SAME_ENV_NAMES = ("NVLINK_DOMAIN_SIZE",)
LOOPBACK = ("127.", "localhost", "::1")
#: The gate's reachability check gives up after this long (or rendezvous.timeout_s, if shorter).
REACH_TIMEOUT_S = 20.0


def parse_bytes(text: str) -> int:
    """'4M', '1G', '512K', '1GiB', '1048576' -> bytes (binary units, as the guide's script)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    if t and t[-1] in mult:
        return int(t[:-1]) * mult[t[-1]]
    return int(t)


# ---- node checks (no torch) -------------------------------------------------------------------


def _check(name: str, ok: bool, detail: str, fix: str = "", fatal: bool = False) -> dict:
    return {"check": name, "ok": ok, "detail": detail, "fix": "" if ok else fix, "fatal": fatal and not ok}


def interface_addresses(name: str) -> list[str]:
    """IPv4 (SIOCGIFADDR) and IPv6 (/proc/net/if_inet6) addresses of one interface."""
    out = []
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            out.append(socket.inet_ntoa(packed[20:24]))
    except (OSError, ImportError):
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5] == name:
                    h = parts[0]
                    out.append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(h)))
    except OSError:
        pass
    return out


def check_interface(name: str) -> dict:
    what = f"interface {name}"
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        prefixed = [n for n in names if n.startswith(name)]
        why = (f"; NCCL would read {name!r} as a prefix of {', '.join(prefixed)}, but gloo needs the exact name"
               if prefixed else "")
        return _check(what, False, f"no interface {name} on this node (it has {', '.join(names) or 'none'}){why}",
                      f"set network.interface to this node's fabric NIC (one of: {', '.join(names)}), the same "
                      "name on every node", fatal=True)
    addrs = interface_addresses(name)
    if not addrs:
        return _check(what, False, f"{name} exists but has no IP address",
                      f"bring {name} up with an address on the fabric, or set network.interface to the NIC that has one",
                      fatal=True)
    # A NIC whose link is down (cable pulled, switch port off) keeps its address and routes: only
    # its carrier tells (Documentation/ABI/testing/sysfs-class-net: operstate, carrier).
    state = _read(f"/sys/class/net/{name}/operstate")
    carrier = _read(f"/sys/class/net/{name}/carrier")
    if state in ("down", "lowerlayerdown") or carrier == "0":
        return _check(what, False, f"{name} ({', '.join(addrs)}) has no link (operstate {state or '?'}, carrier "
                      f"{carrier or '?'})", f"check {name}'s cable and switch port on this node", fatal=True)
    return _check(what, True, f"{name} {', '.join(addrs)}")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def check_reach(name: str, addr: str, port: int, timeout: float) -> dict:
    """This node reaches rank 0's address through ``name``: a TCP connection to ``addr:port`` from
    that interface (SO_BINDTODEVICE) that is accepted or refused within ``timeout`` seconds; a
    refusal is rank 0's host answering (its torchrun may not listen yet), so both pass. No route,
    an unreachable host or silence until the deadline fail."""
    what = f"reach rank 0 on {name}"
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        except OSError as e:
            return _check(what, False, f"rank 0's address {addr} does not resolve: {e}",
                          "set network.interface to the NIC the nodes share", fatal=True)
        s = socket.socket(family, kind, proto)
        try:
            try:
                s.setsockopt(socket.SOL_SOCKET, 25, name.encode())  # SO_BINDTODEVICE
            except OSError:
                pass
            s.settimeout(max(0.2, min(5.0, deadline - time.monotonic())))
            s.connect(sockaddr)
            return _check(what, True, f"{addr}:{port} answers on {name}")
        except ConnectionRefusedError:
            return _check(what, True, f"{addr} answers on {name} (port {port} not open yet)")
        except OSError as e:
            last = e
        finally:
            s.close()
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    why = last.strerror if last and last.strerror else (type(last).__name__ if last else "no answer")
    return _check(what, False, f"cannot reach rank 0's address {addr}:{port} on {name} within {timeout:g} s ({why})",
                  f"check that {name} on this node and on node 0 are on one network (address, subnet, link), or set "
                  "network.interface to the NIC the nodes share", fatal=True)


def check_gpus(want: int, nproc: int) -> dict:
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if seen < want:
        return _check("gpus", False, f"sees {seen} GPU(s){where}, gpus_per_node is {want}",
                      "give every node gpus_per_node GPUs (SLURM --gpus-per-node, Nomad device count) or lower "
                      "gpus_per_node; check the driver with nvidia-smi", fatal=seen < nproc)
    if seen > want:
        return _check("gpus", False, f"sees {seen} GPUs{where}, more than gpus_per_node {want}: another job's "
                      "GPUs may be visible", "let the scheduler set CUDA_VISIBLE_DEVICES (do not set it yourself)")
    return _check("gpus", True, f"{seen} GPU(s){where}")


def check_device(path: str, why: str, fix: str) -> dict:
    if os.path.exists(path):
        return _check(path, True, f"{path} present")
    return _check(path, False, f"{path} missing ({why})", fix)


def node_checks(args) -> list[dict]:
    checks = []
    if args.interface:
        checks.append(check_interface(args.interface))
    if args.gpus_per_node:
        checks.append(check_gpus(args.gpus_per_node, args.nproc_per_node))
    if args.fabric in ("infiniband", "roce", "efa"):
        # RoCE NICs are RDMA devices too: their verbs live under /dev/infiniband as well.
        checks.append(check_device(
            "/dev/infiniband", f"network.fabric {args.fabric} needs the RDMA devices",
            "pass the host's /dev/infiniband into the container (docker --device /dev/infiniband, pyxis mounts "
            "it by default) and check the RDMA driver (ibv_devices); NCCL would fall back to TCP sockets"))
    if args.gdr:
        checks.append(check_device(
            "/dev/gdrdrv", "cross-node expert parallelism needs GPUDirect RDMA (NCCL_GIN_TYPE=2)",
            "load the gdrdrv kernel module (gdrcopy) on the host and pass /dev/gdrdrv into the container"))
    return checks


def host_identity() -> tuple[str, str]:
    """(hostname, boot id): the boot id tells hosts apart even when their names are equal."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def same_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(SAME_ENV_PREFIXES) or k in SAME_ENV_NAMES}


def cross_node_checks(infos: list[dict], master: str) -> list[dict]:
    """Checks that need every rank's view (``infos``: one per rank, in rank order)."""
    out = []
    node0 = next(i for i in infos if i["node"] == 0)
    leaders = {}
    for i in infos:
        leaders.setdefault(i["node"], i)
    if master.startswith(LOOPBACK) or master == "localhost":
        for node, i in sorted(leaders.items()):
            if i["boot"] != node0["boot"] or i["host"] != node0["host"]:
                out.append({**_check(
                    "master address", False,
                    f"rank 0's address {master} is loopback, but this node ({i['host']}) is not node 0's host ({node0['host']})",
                    "set network.interface to the fabric NIC (rank 0's address is taken from it) or fix the "
                    "scheduler's node address (SLURM NodeAddr)"), "node": node, "host": i["host"]})
    if not out:
        hosts = len({(i["host"], i["boot"]) for i in leaders.values()})
        out.append({**_check("master address", True, f"{master or '?'} ({hosts} host{'s' if hosts != 1 else ''})"),
                    "node": None, "host": None})
    # Every variable whose value differs between ranks, with which nodes hold which value.
    names = sorted({k for i in infos for k in i["env"]})
    for name in names:
        values: dict[str, list[int]] = {}
        for i in infos:
            values.setdefault(i["env"].get(name, "<unset>"), []).append(i["node"])
        if len(values) > 1:
            by_node = "; ".join(f"node {', '.join(map(str, sorted(set(n))))}: {v[:80]!r}" for v, n in values.items())
            # Named: the first node whose value is not rank 0's.
            ref = infos[0]["env"].get(name, "<unset>")
            odd = min(i["node"] for i in infos if i["env"].get(name, "<unset>") != ref)
            out.append({**_check(
                f"same {name}", False, f"{name} differs between nodes ({by_node})",
                f"set {name} once in the job file (env: or network:), not per node in setup or the node's environment"),
                "node": odd, "host": leaders[odd]["host"]})
    if not any(c["check"].startswith("same ") for c in out):
        out.append({**_check("same NCCL env", True, f"{len(names)} NCCL/gloo/DIST variables identical on every rank"),
                    "node": None, "host": None})
    return out


def remove_own_copy(local_rank: int) -> None:
    """halo-sched wrote this file into a fresh halo-preflight.* directory on each node: the
    node's first rank removes it once every rank of the node has started (they have read it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if local_rank == 0 and os.path.basename(here).startswith("halo-preflight."):
        try:
            os.unlink(os.path.abspath(__file__))
            os.rmdir(here)
        except OSError:
            pass


#: srun relays at most 1024 bytes of a line in one piece (SLURM_IO_MAX_MSG_LEN, slurmstepd io.c
#: _task_build_message) and labels each piece, so a longer line reaches the output file cut in two
#: and neither half parses (a 3-node result over 4 MiB was 1,024+ bytes on the multi-host rig).
#: A record longer than LINE_MAX goes out as PART lines, each ``MARK-part {"id", "k", "n", "b64"}``
#: with at most PART_BYTES of the record's JSON (base64: 4/3 of that), reassembled by the reader
#: (halo_sched/preflight.py parse_lines).
LINE_MAX = 900
PART_BYTES = 600
PART_SUFFIX = "-part"


def emit(mark: str, data: dict) -> None:
    # Whole lines, flushed at once: the backends' log readers see each whole.
    text = json.dumps(data, separators=(',', ':'), sort_keys=True)
    if len(mark) + 1 + len(text.encode()) <= LINE_MAX:
        sys.stdout.write(f"{mark} {text}\n")
    else:
        import base64

        raw = text.encode()
        ident = f"{os.getpid():x}.{time.time_ns():x}"
        parts = [raw[i:i + PART_BYTES] for i in range(0, len(raw), PART_BYTES)]
        for k, part in enumerate(parts):
            body = json.dumps({"id": ident, "k": k, "n": len(parts), "b64": base64.b64encode(part).decode()},
                              separators=(",", ":"), sort_keys=True)
            sys.stdout.write(f"{mark}{PART_SUFFIX} {body}\n")
    sys.stdout.flush()


# ---- the speed test ---------------------------------------------------------------------------


FAILURE_TAG = "halo-sched-failure"  # halo_sched/node/failures.py TAG: every backend reads these lines


def busbw_verdict(pairs: dict[int, float], floor: float) -> dict[int, tuple[float, bool]]:
    """Each node's bus bandwidth and whether it is below ``floor`` (GB/s), from ``pairs``: node i's
    send/recv to node 0 in GB/s, for i = 1..N-1. Node i's figure is its pair's; node 0's is its
    best pair (node 0 is slow only if every pair is). With 3 or more nodes and every pair slow,
    node 0, their one common end, is the node that fails, alone. With 2 nodes there is one pair
    and nothing tells its ends apart: node 1 fails (one node, the same one every time, so one node
    is ledgered; node 0 is stopped with the job, as for any node that fails, and its own line says
    it was below the floor too). A node below the floor that is not failed says so, not fatal."""
    if not pairs:
        return {}
    out = {i: (v, v < floor) for i, v in pairs.items()}
    best = max(pairs.values())
    all_slow = best < floor
    if all_slow and len(pairs) >= 2:
        out = {i: (v, False) for i, v in pairs.items()}
    out[0] = (best, all_slow and len(pairs) >= 2)
    return dict(sorted(out.items()))


def time_pair(rank: int, src: int, n: int, dev, iters: int, sync) -> list[float]:
    """Seconds of each of ``iters`` sends of ``n`` fp32 elements from rank ``src`` to rank 0, as
    rank 0 sees them (other ranks: an empty list), after one small warm-up transfer (NCCL connects
    a pair at its first). ``sync`` lines every rank up before each transfer."""
    import torch
    import torch.distributed as dist

    if rank in (0, src):
        v = torch.rand(n, device=dev) if rank == src else torch.zeros(n, device=dev)
        warm = torch.rand(max(1, n >> 10), device=dev)
    sync()
    if rank == src:
        dist.send(warm, 0)
    elif rank == 0:
        dist.recv(warm, src)
        warm.sum().item()
    samples = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        if rank == src:
            dist.send(v, 0)
        elif rank == 0:
            dist.recv(v, src)
            v.sum().item()  # forces completion: recv returns before the data has arrived
            samples.append(time.perf_counter() - t0)
    return samples


def gate_busbw(args, host: str) -> tuple[dict[int, tuple[float, bool]], str]:
    """The bandwidth part of the gate: one process per node (no torchrun), its own process group
    on rank 0's address and port, then a warm-up and a timed send/recv of ``--size`` bytes from
    each node to node 0 in turn (median of ``--iters``; completion forced by reading the result).
    Returns every node's (GB/s, below the floor) and how it was measured. Node 0's store closes
    before the other nodes return, so no torchrun agent started next can reach this store."""
    # This process only: c10's warning (with a C++ stack) when node 0's store closes under the
    # wait below is the expected end, not news.
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    import torch
    import torch.distributed as dist

    rank, world = args.node, args.nodes
    timeout = datetime.timedelta(seconds=args.timeout_s)
    base = dist.TCPStore(args.master_addr, args.master_port, world, rank == 0, timeout=timeout,
                         wait_for_workers=True)
    store = dist.PrefixStore("halo-sched-gate", base)
    cuda = args.gpus_per_node > 0
    if cuda:
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timeout, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    size = parse_bytes(args.size)
    n = max(1, size // 4)
    pairs: dict[int, float] = {}
    for src in range(1, world):
        samples = time_pair(rank, src, n, dev, args.iters, dist.barrier)
        if rank == 0:
            pairs[src] = round(n * 4 / statistics.median(samples) / 1e9, 3)
    verdict = [busbw_verdict(pairs, args.min_busbw) if rank == 0 else None]
    dist.broadcast_object_list(verdict, src=0)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        del store, base  # the store's server stops here
    else:
        # Wait (bounded) until node 0's store is gone: then a torchrun agent of this node finds
        # nothing at the port until node 0's own torchrun listens there.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                base.check(["halo-sched-gate-closed"])
            except Exception:  # noqa: BLE001 - the connection closed: what we wait for
                break
            time.sleep(0.1)
        del store, base
    how = (f"send/recv to node 0, {size / 2**20:g} MiB, median of {args.iters}, "
           f"{'nccl' if cuda else 'gloo'}, one process per node")
    return {int(k): v for k, v in verdict[0].items()}, how


def failure_body(record: dict, key: str) -> str:
    """The gate's failure record as JSON, signed with the job's failure key (``mac``, as
    node/failure_collector.py signs), under 1,000 bytes with its label, as that module's
    LINE_MAX: srun cuts a longer line in two (the mac's 72 bytes took a busbw line past it). The
    error gives way; the evidence's check line stays whole (the failure class reads it)."""
    import hashlib
    import hmac

    record = dict(record)
    while True:
        body = json.dumps(record, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()}"}}'
        if len(FAILURE_TAG) + len(body) < 980 or len(record["error"]) < 80:
            return body
        record["error"] = record["error"][:len(record["error"]) * 3 // 4]


def gate(argv: list[str]) -> int:
    """The job's own preflight gate (``preflight: {gate: true}``): the node checks above, run by
    the entry script on each node after setup and before torchrun, no process group. Prints this
    node's NODE_MARK line; a fatal check also prints one failure line (the failure report's
    format, the failed check as its ``evidence``, so the submitter classifies it a node fault and
    ledgers the node: the node's own word, never a rank's) and returns 1: the attempt fails in
    seconds, before the training starts."""
    ap = argparse.ArgumentParser(prog="halo-sched gate")
    ap.add_argument("--node", type=int, required=True)
    ap.add_argument("--interface", default="")
    ap.add_argument("--fabric", default="default")
    ap.add_argument("--gdr", type=int, default=0)
    ap.add_argument("--gpus-per-node", type=int, default=0)
    ap.add_argument("--nproc-per-node", type=int, default=1)
    # preflight.min_busbw: the bandwidth floor (GB/s); 0: no bandwidth test.
    ap.add_argument("--min-busbw", type=float, default=0.0)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--master-addr", default="")
    ap.add_argument("--master-port", type=int, default=0)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args(argv)
    host, _ = host_identity()
    checks = [{**c, "node": args.node, "host": host} for c in node_checks(args)]
    # Every other node reaches rank 0's address on the interface the ranks will use.
    if (args.node != 0 and args.interface and args.master_addr and args.master_port
            and not any(c["fatal"] for c in checks)):
        checks.append({**check_reach(args.interface, args.master_addr, args.master_port,
                                     min(args.timeout_s, REACH_TIMEOUT_S)), "node": args.node, "host": host})
    if args.min_busbw > 0 and args.nodes > 1 and not any(c["fatal"] for c in checks):
        try:
            figures, how = gate_busbw(args, host)
        except Exception as e:  # noqa: BLE001 - a peer gone mid-test: not this node's figure
            print(f"halo-sched gate: node {args.node}: the bandwidth test did not complete: "
                  f"{type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
            return 3
        got, slow = figures.get(args.node, (0.0, True))
        floor = f"{args.min_busbw:g} GB/s"
        if slow:
            checks.append({**_check(
                "busbw", False, f"node {args.node} ({host}) measured {got:g} GB/s, below preflight.min_busbw "
                f"{floor} ({how}; every node: {', '.join(f'{k}: {v[0]:g}' for k, v in figures.items())} GB/s)",
                "check this node's fabric link (NIC, cable, switch port) or lower preflight.min_busbw; "
                "halo-sched preflight measures every pair", fatal=True), "node": args.node, "host": host})
        elif got < args.min_busbw:
            checks.append({**_check(
                "busbw", False, f"node {args.node} ({host}) measured {got:g} GB/s, below preflight.min_busbw {floor}, "
                f"but its slow pair is blamed on the other end ({how}; every node: "
                f"{', '.join(f'{k}: {v[0]:g}' for k, v in figures.items())} GB/s)",
                "if the next attempt fails the same way on a new node, this node is the slow one"),
                "node": args.node, "host": host})
        else:
            checks.append({**_check("busbw", True, f"{got:g} GB/s, at least preflight.min_busbw {floor} ({how})"),
                           "node": args.node, "host": host})
    line = f"{NODE_MARK} {json.dumps({'node': args.node, 'host': host, 'checks': checks}, separators=(',', ': '), sort_keys=True)}"
    print(line, file=sys.stderr, flush=True)
    fatal = [c for c in checks if c["fatal"]]
    if not fatal:
        return 0
    c = fatal[0]
    # The node's own evidence (failures.py RankFailure.evidence), short: the class reads it there.
    brief = {**c, "detail": str(c.get("detail", ""))[:120], "fix": str(c.get("fix", ""))[:60]}
    evidence = f"{NODE_MARK} {json.dumps({'node': args.node, 'host': host, 'checks': [brief]}, separators=(',', ': '), sort_keys=True)}"
    record = {"node": args.node, "rank": None, "host": host, "exit_code": 1, "time": time.time(),
              "error": f"preflight gate: {c['check']}: {c['detail']}; fix: {c['fix']}", "tail": [],
              "evidence": [evidence[:400]]}
    name = os.environ.get("SLURMD_NODENAME", "")
    if name:
        record["node_name"] = name  # SLURM's name for the node: what the ledger and --exclude take
    key = os.environ.pop("HALO_FAILURE_KEY", "")  # the job's key (node/failure_collector.py sign)
    body = failure_body(record, key)
    print(f"{FAILURE_TAG} {body}", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--gate"]:
        return gate(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="bytes per transfer: 4M, 1G, ... (binary units)")
    ap.add_argument("--iters", type=int, default=3, help="timed repetitions of each test (the median is reported)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--interface", default="")
    ap.add_argument("--fabric", default="default")
    ap.add_argument("--gdr", type=int, default=0, help="1: cross-node expert parallelism (check /dev/gdrdrv)")
    ap.add_argument("--gpus-per-node", type=int, default=0)
    ap.add_argument("--nproc-per-node", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    ap.add_argument("--timeout-s", type=float, default=600, help="process group timeout")
    ap.add_argument("--pair-ranks", action="store_true",
                    help="time rank 0 with every other rank, not with every other node (a one-node anchor run)")
    args = ap.parse_args(argv)
    size = parse_bytes(args.size)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    node = int(os.environ.get("GROUP_RANK", "0"))
    host, boot = host_identity()
    t_start = time.monotonic()

    checks = [{**c, "node": node, "host": host} for c in node_checks(args)]
    if local_rank == 0:
        emit(NODE_MARK, {"node": node, "host": host, "checks": checks})
    fatal = [c for c in checks if c["fatal"]]
    if fatal:
        for c in fatal:
            print(f"halo-sched preflight: node {node} ({host}): {c['check']}: {c['detail']}; fix: {c['fix']}",
                  file=sys.stderr, flush=True)
        # Let the other nodes print their own checks before the scheduler stops them.
        time.sleep(2)
        remove_own_copy(local_rank)
        return 3

    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    timeout = datetime.timedelta(seconds=args.timeout_s)
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=dev, timeout=timeout)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    world = dist.get_world_size()
    comm = dist.get_backend()

    info = {"rank": rank, "node": node, "local_rank": local_rank, "host": host, "boot": boot, "env": same_env()}
    infos: list = [None] * world
    dist.all_gather_object(infos, info)
    checks_all = [c for c in checks]
    gathered_checks: list = [None] * world
    dist.all_gather_object(gathered_checks, checks if local_rank == 0 else [])
    checks_all = [c for cs in gathered_checks for c in cs] + cross_node_checks(infos, os.environ.get("MASTER_ADDR", ""))
    hosts = {i["node"]: i["host"] for i in infos if i["local_rank"] == 0}

    if args.pair_ranks:
        peers = [(i["rank"], i["rank"]) for i in infos if i["rank"] != 0]
    else:
        first = {}
        for i in infos:
            first.setdefault(i["node"], i["rank"])
        peers = [(n, r) for n, r in sorted(first.items()) if n != 0]

    def sync() -> None:
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()

    # Send/recv, each peer to rank 0 in turn (the guide: the other side sends, rank 0 receives).
    n_pair = max(1, size // 4)  # fp32 elements
    pairs = []
    for label, src in peers:
        samples = time_pair(rank, src, n_pair, dev, args.iters, sync)
        if rank == 0:
            pairs.append({"src": label, "dst": 0, "src_rank": src, "bytes": n_pair * 4, "seconds": samples})

    # all_gather across every rank: each contributes size/world bytes, the output is size bytes.
    chunk = max(1, size // (4 * world))
    inp = torch.rand(chunk, device=dev)
    out = torch.zeros(chunk * world, device=dev)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    warm_in = torch.rand(max(1, chunk >> 10), device=dev)
    gather(torch.zeros(warm_in.numel() * world, device=dev), warm_in)
    own = []
    for _ in range(args.iters):
        sync()
        t0 = time.perf_counter()
        gather(out, inp)
        out.sum().item()
        own.append(time.perf_counter() - t0)
    # The collective is done when its slowest rank has the data: the max across ranks, per run.
    per_rank: list = [None] * world
    dist.all_gather_object(per_rank, own)
    ag_seconds = [max(r[i] for r in per_rank) for i in range(args.iters)]

    ok_checks = all(c["ok"] for c in checks_all)
    if rank == 0:
        def mibps(nbytes: int, seconds: list[float]) -> float:
            return round(nbytes / statistics.median(seconds) / 2**20, 1) if seconds else 0.0

        for p in pairs:
            p["mib_s"] = mibps(p["bytes"], p["seconds"])
            print(f"send/recv {'rank' if args.pair_ranks else 'node'} {p['src']} -> 0: {p['mib_s']} MiB/s", flush=True)
        ag = {"ranks": world, "bytes": chunk * world * 4, "seconds": ag_seconds, "mib_s": mibps(chunk * world * 4, ag_seconds)}
        print(f"all_gather over {world} ranks: {ag['mib_s']} MiB/s", flush=True)
        emit(RESULT_MARK, {
            "version": 1, "nodes": len(hosts), "world": world, "nproc_per_node": args.nproc_per_node,
            "device": args.device, "comm": comm, "size_bytes": size, "iters": args.iters,
            "pair_unit": "rank" if args.pair_ranks else "node", "hosts": {str(k): v for k, v in sorted(hosts.items())},
            "master_addr": os.environ.get("MASTER_ADDR", ""), "checks": checks_all, "pairs": pairs,
            "all_gather": ag, "elapsed_s": round(time.monotonic() - t_start, 3),
        })
    # Leave together: a rank that tears down gloo while a peer still talks to it aborts the peer.
    dist.barrier()
    dist.destroy_process_group()
    remove_own_copy(local_rank)
    return 0 if ok_checks else 1


if __name__ == "__main__":
    sys.exit(main())
