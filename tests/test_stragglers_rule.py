"""The stragglers' rule on synthetic progress (halo_sched/node/stragglers.py): a rank that computes
slowly, a rank that waits on a slow peer and a host whose network is slow, with the figures
measured on the multi-host rig (docs/failures.md, "Stragglers": 3 hosts x 2 ranks, 0.1 s of
compute a step, `delay h1 50`). No torch, no cluster."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest

from halo_sched.node import links, progress, stragglers

T0 = 1.7e9
# Round trips (us) as `ss -ti` showed them with `delay h1 50`: h1's connections 50 ms, h0-h2 5 us.
ADDR = {0: "10.78.0.10", 1: "10.78.0.11", 2: "10.78.0.12"}


def run(steps: int = 60, compute=None, late=None, wait: float = 0.102):
    """Ranks 0-5 on nodes 0-2: (reports, left). Each step a rank computes ``compute[rank]`` (0.1 s)
    and reports; the collective ends ``wait`` after the first rank arrived (the slow link's own
    time: measured, every rank waited 0.102 s), or 1 ms after the last, whichever is later; a rank
    behind a slow link leaves it ``late[rank]`` later (measured: it also waited 0.102 s)."""
    compute, late = compute or {}, late or {}
    reports = {(r // 2, r): [] for r in range(6)}
    left = {(r // 2, r): {} for r in range(6)}
    out = {r: T0 for r in range(6)}
    for s in range(steps):
        enter = {r: out[r] + compute.get(r, 0.1) for r in range(6)}
        done = max(min(enter.values()) + wait, max(enter.values()) + 0.001)
        for r in range(6):
            reports[(r // 2, r)].append((s, enter[r]))
            out[r] = done + late.get(r, 0.0)
            left[(r // 2, r)][s] = out[r]
    return reports, left


def link_files(slow_host: int | None, rtt_us: int = 50400, nodes: int = 3):
    """Each node's connections, one to each other node's two ranks, as the hang monitor writes them."""
    out = {}
    for n in range(nodes):
        conns = []
        for p in range(nodes):
            if p != n:
                rtt = rtt_us if slow_host in (n, p) else 5
                conns += [(ADDR[n], ADDR[p], rtt, 0)] * 2
        out[n] = (f"h{n}", conns)
    return out


def test_a_rank_that_computes_slowly_is_named_a_slow_rank():
    reports, left = run(compute={3: 0.2}, wait=0.001)
    s = stragglers.summary(reports, left, link_files(None))
    assert s["network"] is None
    sl = s["slowest"]
    assert (sl["node"], sl["rank"], sl["kind"]) == (1, 3, "compute") and sl["delay"] == pytest.approx(0.1, abs=0.002)
    text = stragglers.describe(s)
    assert "slowest: rank 3 (node 1), 0.10 s behind the median rank each step (50% of the 0.20 s step)" in text, text
    assert "a slow rank (it computes 0.10 s longer: it waits 0.00 s in each step's collective, the median rank 0.10 s)" in text


def test_a_slow_host_is_named_by_its_links_and_the_rank_behind_it_is_not():
    # Measured: every rank computes 0.1 s and waits 0.102 s; rank 1 (h0) leaves 50 ms after the others.
    reports, left = run(late={1: 0.050})
    s = stragglers.summary(reports, left, link_files(1))
    assert s["slowest"] is None, s
    net = s["network"]
    assert (net["kind"], net["node"], net["host"], net["ranks"]) == ("host", 1, "h1", [2, 3])
    text = stragglers.describe(s)
    assert ("slowest: node 1 (h1; ranks 2, 3), a slow host's network: round trip 50.4 ms to node 0 (h0), "
            "50.4 ms to node 2 (h2), 0.01 ms between the others; every rank waits 0.10 s or more") in text, text


def test_by_report_times_alone_the_rank_behind_a_slow_link_looks_slow():
    """Why the second time: without it (and without links) the rank behind the slow link is named,
    as on the rig before this rule (rank 1 on h0, 0.05 s behind)."""
    reports, _ = run(late={1: 0.050})
    sl = stragglers.summary(reports)["slowest"]
    assert (sl["rank"], sl["kind"]) == (1, None) and sl["delay"] == pytest.approx(0.05, abs=0.002)
    # With the times out of the collective, it waits as long as the others: not a slow rank.
    _, left = run(late={1: 0.050})
    assert stragglers.summary(reports, left)["slowest"] is None


def test_two_hosts_name_a_slow_link_by_both_ends_and_no_host():
    """One pair: its round trip is the same from both ends and the delay one-way, so no host; the
    link is slow against the step alone (50 ms of a 0.2 s step; 5 ms is not)."""
    reports, left = run(late={1: 0.050})
    two = {k: v for k, v in reports.items() if k[0] < 2}
    s = stragglers.summary(two, {k: v for k, v in left.items() if k[0] < 2}, link_files(1, nodes=2))
    assert s["slowest"] is None and s["network"]["kind"] == "link", s
    assert ("slow link: node 0 (h0) <-> node 1 (h1), round trip 50.4 ms (two nodes: which end is slow cannot be "
            "told); every rank waits 0.10 s or more") in stragglers.describe(s)
    assert stragglers.summary(two, left, link_files(1, rtt_us=5000, nodes=2))["network"] is None


def test_one_slow_pair_is_a_link_named_by_both_ends():
    files = link_files(None)
    files[0] = ("h0", [(a, b, 50400 if b == ADDR[2] else 5, 0) for a, b, _, _ in files[0][1]])
    reports, left = run()
    s = stragglers.summary(reports, left, files)
    assert s["network"]["kind"] == "link" and (s["network"]["node"], s["network"]["peer"]) == (0, 2)
    assert "slow link: node 0 (h0) <-> node 2 (h2), round trip" in stragglers.describe(s)


def test_a_link_fast_against_the_step_is_not_slow():
    """4 times the fastest pair is not enough: the extra round trip must be 10% of a step."""
    reports, left = run()
    s = stragglers.summary(reports, left, link_files(1, rtt_us=5000))  # 5 ms on a 0.2 s step
    assert s["network"] is None


def test_the_links_file_is_read_bounded_and_escaped(tmp_path):
    p = tmp_path / "links"
    p.write_text("host h1\x1b[31m;rm\n10.0.0.1 10.0.0.2 notanumber 0\n10.0.0.1 10.0.0.2 50 1 extra\n"
                 + "10.0.0.1 10.0.0.2 50400 3\n" * 1000)
    host, conns = stragglers.read_links_file(p)
    assert host == "h131mrm"
    assert len(conns) <= links.MAX_LINKS and conns[0] == ("10.0.0.1", "10.0.0.2", 50400, 3)
    links.write(str(p), "h1\x1b[31m;rm -rf /", [("10.0.0.1", "10.0.0.2", 7, 0)] * 1000)
    host, conns = stragglers.read_links_file(p)
    assert host == "h131mrm-rf" and p.stat().st_size <= links.MAX_BYTES


def test_a_host_name_from_a_node_reaches_the_line_escaped(tmp_path):
    reports, left = run(late={1: 0.050})
    files = link_files(1)
    (tmp_path / "node-1" / "progress").mkdir(parents=True)
    (tmp_path / "node-1" / "progress" / "links").write_text("host h1\x1b]0;x\x07\n")
    files[1] = (stragglers.read_links(tmp_path)[1][0], files[1][1])
    text = stragglers.describe(stragglers.summary(reports, left, files))
    assert "\x1b" not in text and "\x07" not in text, text


def test_the_kernel_dump_finds_a_real_connection():
    """links.py's netlink dump against this kernel: a loopback connection, its inode and a round trip."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        cli.sendall(b"x" * 1000)
        acc.recv(1000)
        inode = os.fstat(cli.fileno()).st_ino
        rows = {r[2]: r for r in links._dump(socket.AF_INET)}
        # A loopback round trip: some microseconds (tcp_info's neighbours hold 64 KiB thresholds, 1448 mss).
        assert inode in rows and rows[inode][:2] == ("127.0.0.1", "127.0.0.1") and 0 < rows[inode][3] < 5000, rows
        ss = subprocess.run(["ss", "-tinH", "src", f"127.0.0.1:{cli.getsockname()[1]}"], capture_output=True,
                            text=True, timeout=10).stdout if shutil.which("ss") else ""
        m = re.search(r"\brtt:([0-9.]+)/", ss)
        assert not m or abs(float(m[1]) * 1000 - rows[inode][3]) < 1000, (ss, rows[inode])
        assert rows[inode][5] < links.ACTIVE_MS, rows[inode]  # it just sent: ms since its last data
        assert links.sample([os.getpid()]) == []  # within the host: no link
    finally:
        cli.close()
        acc.close()
        srv.close()


def test_a_link_turned_slow_mid_run_shows_through_its_live_connections(monkeypatch):
    """Three connections between two hosts: two idle since the start (their round trip, the start's),
    one carrying the steps (the link's now, 50 ms). The sample is the live one's; over all three,
    the median was the start's 0.3 ms, and a host slowed mid-run was never named (the rig)."""
    socks = [socket.socket() for _ in range(3)]
    try:
        inodes = [os.fstat(s.fileno()).st_ino for s in socks]
        rows = [("10.9.0.1", "10.9.0.2", inodes[0], 50000, 1, 200), ("10.9.0.1", "10.9.0.2", inodes[1], 200, 0, 90000),
                ("10.9.0.1", "10.9.0.2", inodes[2], 300, 0, 90000)]
        monkeypatch.setattr(links, "_dump", lambda family: rows if family == socket.AF_INET else [])
        assert links.sample([os.getpid()]) == [("10.9.0.1", "10.9.0.2", 50000, 1)]
        rows[0] = rows[0][:5] + (90000,)  # all idle: the median of all, as before
        assert links.sample([os.getpid()]) == [("10.9.0.1", "10.9.0.2", 300, 1)]
    finally:
        for s in socks:
            s.close()


def test_left_is_written_for_the_written_reports_and_read_back(tmp_path, monkeypatch):
    d = tmp_path / "node-0" / "progress"
    d.mkdir(parents=True)
    monkeypatch.setenv("HALO_PROGRESS_DIR", str(d))
    monkeypatch.setenv("RANK", "0")
    for name, value in (("_fd", None), ("_ring", None), ("_left", None), ("_left_count", 0), ("_mask", 0),
                        ("_prev", -2), ("_written", (-2, 0.0)), ("_looking", True)):
        monkeypatch.setattr(progress, name, value)
    for step in range(5):
        progress.report(step)
        progress.left(step)
    got = stragglers.read_left(tmp_path)[(0, 0)]
    rep = dict(stragglers.read(tmp_path)[(0, 0)])
    # Fast steps are written with a stride (progress.GAP_S): the same steps in both rings.
    assert 0 in got and sorted(got) == sorted(rep), (got, rep)
    assert all(got[s] >= rep[s] for s in got)
