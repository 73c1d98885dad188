"""A fixed delay on the packets of one NFQUEUE, for the multi-host rig's `delay HOST MS` on a
kernel without netem (tests/cluster/multihost.sh). Standard library only: it speaks nfnetlink's
queue protocol itself (include/uapi/linux/netfilter/nfnetlink_queue.h, the kernel's
net/netfilter/nfnetlink_queue.c): bind the queue, ask for packet metadata only, and accept each
packet ``--delay-ms`` after it was queued. The delay is the same for every packet, so packets
leave in the order they came, and one batch verdict (NFQNL_MSG_VERDICT_BATCH: every id up to N)
lets go all that are due.

Run in the host's network namespace, before the iptables rule that sends packets to the queue;
the rule has --queue-bypass, so packets pass undelayed once this program is gone."""
from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def request(sock: socket.socket, msg: bytes) -> None:
    """Send a request that asks for an ack; raise on the kernel's error."""
    sock.send(msg)
    data = sock.recv(65536)
    length, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, 16)
        if err:
            raise OSError(-err, os.strerror(-err))


def packet_ids(data: bytes):
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            a = off + 20
            while a + 4 <= off + length:
                alen, atype = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if atype & 0x3FFF == NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, a + 4)[0]
                a += (alen + 3) & ~3
        off += (length + 3) & ~3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--pid-file", default="")
    args = ap.parse_args()
    delay = args.delay_ms / 1000
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    request(sock, message(NFQNL_MSG_CONFIG, args.queue,
                          attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)), NLM_F_REQUEST | NLM_F_ACK))
    request(sock, message(NFQNL_MSG_CONFIG, args.queue,
                          attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                          + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 1 << 16)), NLM_F_REQUEST | NLM_F_ACK))
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"bound queue {args.queue}, delay {args.delay_ms:g} ms", flush=True)
    due: collections.deque[tuple[float, int]] = collections.deque()
    passed = 0
    while True:
        wait = max(0.0, due[0][0] - time.monotonic()) if due else None
        ready, _, _ = select.select([sock], [], [], wait)
        if ready:
            try:
                data = sock.recv(1 << 20)
            except OSError:  # ENOBUFS: the kernel dropped messages; the packets stay queued
                data = b""
            now = time.monotonic()
            due.extend((now + delay, pid) for pid in packet_ids(data))
        now = time.monotonic()
        last = None
        while due and due[0][0] <= now:
            last = due.popleft()[1]
            passed += 1
        if last is not None:
            sock.send(message(NFQNL_MSG_VERDICT_BATCH, args.queue,
                              attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last))))


if __name__ == "__main__":
    sys.exit(main())
