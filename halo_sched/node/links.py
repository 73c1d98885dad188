"""What the kernel says about the ranks' connections to other hosts: each TCP socket of a node's
ranks, its smoothed round-trip time and retransmits, as ``ss -ti`` shows them, read the way ``ss``
reads them (a ``sock_diag`` netlink dump with ``INET_DIAG_INFO``, ``include/uapi/linux/inet_diag.h``
and ``struct tcp_info`` of ``include/uapi/linux/tcp.h``; no privilege needed). The hang monitor
writes them every ``LINKS_S`` to ``$HALO_PROGRESS_DIR/links``, which is copied with the progress
files, and ``stragglers.py`` names the host whose links are slow from several peers' view.

A rank that waits on a slow link looks, by when it reports, like a rank that computes slowly; the
kernel's round-trip time of its connections does not. The file: a line ``host NAME``, then a line
per connection ``SRC DST RTT_US RETRANS`` (addresses without ports). Standard library only.
"""
from __future__ import annotations

import os
import socket
import struct

#: How often the hang monitor samples the ranks' connections.
LINKS_S = 5.0
#: The most connections written per sample, and the file's most bytes (the hang monitor's mirror
#: copies a file of 8 KiB or less whole).
MAX_LINKS = 256
MAX_BYTES = 8000

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
# struct tcp_info: 8 bytes of u8 fields, then u32s: tcpi_rtt is the 16th, tcpi_total_retrans the 24th.
_RTT_AT, _RETRANS_AT = 8 + 4 * 15, 8 + 4 * 23


def _dump(family: int) -> list[tuple[str, str, int, int, int]]:
    """(src, dst, inode, rtt_us, total_retrans) of every established TCP socket of ``family`` in
    this network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    sock.settimeout(2.0)
    try:
        # struct inet_diag_req_v2: family, protocol, ext, pad, states; then an empty inet_diag_sockid.
        req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 1 << TCP_ESTABLISHED)
        req += b"\0" * 48
        sock.sendto(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req,
                    (0, 0))
        out = []
        while True:
            data = sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if length < 16 or kind in (NLMSG_DONE, NLMSG_ERROR):
                    return out
                got = _one(data[off + 16:off + length], family)
                if got:
                    out.append(got)
                off += (length + 3) & ~3
    finally:
        sock.close()


def _one(msg: bytes, family: int):
    # struct inet_diag_msg: family, state, timer, retrans; sockid (sport, dport, src[16], dst[16],
    # if, cookie[2]); expires, rqueue, wqueue, uid, inode: 72 bytes; then attributes.
    if len(msg) < 72:
        return None
    size = 4 if family == socket.AF_INET else 16
    src = socket.inet_ntop(family, msg[8:8 + size])
    dst = socket.inet_ntop(family, msg[24:24 + size])
    (inode,) = struct.unpack_from("=I", msg, 68)
    a = 72
    while a + 4 <= len(msg):
        alen, atype = struct.unpack_from("=HH", msg, a)
        if alen < 4:
            break
        if atype == INET_DIAG_INFO and alen >= 4 + _RETRANS_AT + 4:
            (rtt,) = struct.unpack_from("=I", msg, a + 4 + _RTT_AT)
            (retrans,) = struct.unpack_from("=I", msg, a + 4 + _RETRANS_AT)
            return _plain(src), _plain(dst), inode, rtt, retrans
        a += (alen + 3) & ~3
    return None


def _plain(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") else addr  # an IPv4 peer of an IPv6 socket


def _inodes(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


def sample(pids) -> list[tuple[str, str, int, int]]:
    """(src, dst, rtt_us, retrans) of the connections of processes ``pids`` to other hosts'
    addresses (a connection within the host is left out: it is no link)."""
    mine = _inodes(pids)
    rows = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            rows += _dump(family)
        except OSError:
            continue
    local = {src for src, _, _, _, _ in rows}
    return [(src, dst, rtt, retrans) for src, dst, inode, rtt, retrans in rows
            if inode in mine and dst not in local and not dst.startswith("127.") and dst != "::1"][:MAX_LINKS]


def host_name(text: str) -> str:
    """A host name as this file carries it: letters, digits, ``-._`` (what a node writes is hostile)."""
    return "".join(c for c in text if c.isascii() and (c.isalnum() or c in "-._"))[:64]


def write(path: str, host: str, links: list[tuple[str, str, int, int]]) -> None:
    """The file, replaced whole (a reader sees the old one or the new)."""
    text = "host " + host_name(host) + "\n"
    for s, d, rtt, retrans in links:
        line = f"{s} {d} {rtt} {retrans}\n"
        if len(text) + len(line) > MAX_BYTES:
            break
        text += line
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read(path) -> tuple[str, list[tuple[str, str, int, int]]]:
    """(host, connections) of one node's file; ("", []) where there is none."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except OSError:
        return "", []
    host, out = "", []
    for line in lines[:MAX_LINKS + 1]:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "host":
            host = host_name(parts[1])
        elif len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            out.append((parts[0][:64], parts[1][:64], int(parts[2]), int(parts[3])))
    return host, out
