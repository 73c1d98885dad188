"""The ranks' TCP links to other hosts as ``ss -ti`` reads them (linux/inet_diag.h, tcp.h)
into ``$HALO_PROGRESS_DIR/links``: ``host NAME``, then ``SRC DST RTT_US RETRANS`` lines."""
from __future__ import annotations

import os
import socket
import struct

LINKS_S = 5.0
MAX_LINKS, MAX_BYTES = 256, 8000  # the mirror copies 8 KiB whole


def _dump(family: int) -> list:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
    s.settimeout(2.0)
    # SOCK_DIAG_BY_FAMILY, dump; inet_diag_req_v2: tcp_info, ESTABLISHED
    s.sendto(struct.pack("=IHHIIBBBxI48x", 72, 20, 0x301, 1, 0, family, 6, 2, 2), (0, 0))
    n, out = 4 if family == socket.AF_INET else 16, []
    try:
        while True:
            data, off = s.recv(1 << 16), 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if length < 16 or kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                    return out
                m = data[off + 16:off + length]  # inet_diag_msg: src at 8, dst at 24, inode at 68
                a = 72
                while len(m) >= 72 and a + 4 <= len(m):
                    alen, atype = struct.unpack_from("=HH", m, a)
                    if alen < 4:
                        break
                    if atype == 2 and alen >= 112:
                        # INET_DIAG_INFO: tcp_info's rtt (at 68), total_retrans (100), last_data_sent (44, ms ago)
                        out.append((_ip(family, m[8:8 + n]), _ip(family, m[24:24 + n]),
                                    *struct.unpack_from("=I", m, 68), *struct.unpack_from("=I", m, a + 72),
                                    *struct.unpack_from("=I", m, a + 104), *struct.unpack_from("=I", m, a + 48)))
                        break
                    a += (alen + 3) & ~3
                off += (length + 3) & ~3
    finally:
        s.close()


def _ip(family: int, raw: bytes) -> str:
    return socket.inet_ntop(family, raw).removeprefix("::ffff:")  # IPv4-mapped


#: A connection that sent data this recently (ms) is live: its round trip is the link's now.
ACTIVE_MS = int(2 * LINKS_S * 1000)


def sample(pids) -> list:
    """(src, dst, median rtt_us, retrans) per address pair of ``pids``' links to other hosts.

    The kernel measures a connection's round trip only as its data is acknowledged: an idle one
    keeps the figure of its last traffic. A job opens many connections between two hosts (its
    rendezvous, each pair of ranks) and uses few every step (a ring all_reduce uses a rank's two
    neighbours), so where a pair of addresses has connections that sent data in the last
    ``ACTIVE_MS``, only those count: a link that turns slow mid-run shows within a sample, where the
    median over every connection kept the start's figure (measured on the multi-host rig)."""
    mine = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                mine.add(int(os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[")[:-1]))
            except (OSError, ValueError):
                continue
    rows = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            rows += _dump(family)
        except OSError:
            pass
    local, by = {r[0] for r in rows}, {}
    for s, d, i, rtt, re, idle_ms in rows:
        if i in mine and d not in local and not d.startswith("127.") and d != "::1":
            by.setdefault((s, d), []).append((rtt, re, idle_ms))
    out = []
    for k, v in by.items():
        live = sorted(rtt for rtt, _, idle_ms in v if idle_ms < ACTIVE_MS) or sorted(rtt for rtt, _, _ in v)
        out.append((*k, live[len(live) // 2], sum(r for _, r, _ in v)))
    return out[:MAX_LINKS]


def host_name(text: str) -> str:
    return "".join(c for c in text if c.isascii() and (c.isalnum() or c in "-._"))[:64]


def write(path: str, host: str, links: list) -> None:
    text = "host " + host_name(host) + "\n"
    for s, d, rtt, re in links:
        if len(text) + 60 > MAX_BYTES:
            break
        text += f"{s} {d} {rtt} {re}\n"
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
