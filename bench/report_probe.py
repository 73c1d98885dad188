"""What progress.report() costs after a rank blocked (issue 28): each call timed alone, after a
0.6 ms spin and after a 0.6 ms sleep (as a rank that waited in its collective), next to the call
alone, the clock, the line's formatting, a binary copy and a stride of 8 (docs/failures.md).

    python bench/report_probe.py

Prints ``name:median/mean`` in microseconds per variant, for each gap.
"""
from __future__ import annotations

import os
import signal
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
    os.environ.update(HALO_PROGRESS_DIR=tempfile.mkdtemp(), RANK="0", HALO_STACK_SIGNAL=str(signal.SIGRTMIN + 5))
    from halo_sched.node import progress

    progress.report(0)
    ring, pair = progress._ring, struct.Struct("<qd")

    def stride8(k):
        if k & 7:
            return
        progress.report(k)

    variants = {"none": lambda k: None, "report": progress.report, "dec8": stride8, "time": lambda k: time.time(),
                "ffmt": lambda k: b"%13d %17.3f\n" % (k, 1.7e9), "pack": lambda k: pair.pack_into(ring, (k % 128) * 16, k, 1.5)}
    for gap in ("spin", "sleep"):
        got = {n: [] for n in variants}
        for k in range(4000):
            for name, fn in variants.items():  # interleaved: a drift falls on every variant alike
                if gap == "sleep":
                    time.sleep(0.0006)
                else:
                    end = time.perf_counter_ns() + 600_000
                    while time.perf_counter_ns() < end:
                        pass
                t = time.perf_counter_ns()
                fn(k)
                got[name].append(time.perf_counter_ns() - t)
        print(gap, " ".join(f"{n}:{sorted(v)[len(v) // 2] / 1e3:.2f}/{sum(v) / len(v) / 1e3:.2f}" for n, v in got.items()))


if __name__ == "__main__":
    main()
