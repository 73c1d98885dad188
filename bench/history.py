"""``status ID`` and ``list`` at 50 and at 50,000 job records, side by side (issue 34): the history
store answers by index, so neither should grow with the history.

    python bench/run.py --history [--records 50000]

And the whole history streamed (issue 43): ``list --limit 0`` and ``export`` at 50,000 records,
the time to their first line and their peak RSS (goals: 0.5 s and 100 MB whatever the count).

Two state directories are filled once (under the system's temporary directory, reused while
their record count matches) with copies of a real record: ``examples/ddp-cpu.yaml`` as
``submit`` records it for the local backend (about 15 kB with its resolved spec), each with
its own id and submit time. The commands then run alternately, one warm-up each, and the
medians of wall time and peak RSS are compared. The jobs' local directories do not exist: both
homes answer from the records alone (what ``status`` and ``list`` do for a forgotten job).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _record() -> dict:
    sys.path.insert(0, str(REPO))
    from halo_sched import records, spec

    s = spec.load(REPO / "examples" / "ddp-cpu.yaml")
    rec = records.build("local", s, "template", {"outputs": [], "scheduler": {}}, None, lambda: None)
    rec.pop("_diff", None)
    rec["last_state"] = {"status": "COMPLETED", "describe": "COMPLETED exit=0", "at": time.time(), "exit_code": 0}
    return rec


def fill(home: Path, n: int) -> str:
    """A state directory holding ``n`` records (made once); the id of one in the middle."""
    marker = home / f"filled-{n}"
    middle = f"ddp-cpu-bench-{n // 2:06d}"
    if marker.exists():
        return middle
    import shutil

    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, mode=0o700)  # private, as halo-sched makes a home
    os.environ["HALO_SCHED_HOME"] = str(home)
    from halo_sched import db, records

    base = _record()
    now = time.time()
    with db.write() as con:
        for i in range(n):
            rec = dict(base, id=f"ddp-cpu-bench-{i:06d}", submitted=now - (n - i))
            records._put(con, rec)
    marker.touch()
    return middle


def first_line(cmd, env) -> tuple[float, float, int]:
    """(seconds to the first line of stdout, seconds to the end, peak RSS KiB) of one command."""
    import subprocess

    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdout.readline()
    first = time.perf_counter() - t
    while p.stdout.read(1 << 20):
        pass
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), cmd)
    return first, time.perf_counter() - t, usage.ru_maxrss


def measure(run, side_by_side, row, n: int, big: int = 50_000) -> None:
    """The rows: ``status ID`` and ``list`` at 50 vs ``big`` records (medians of ``n``)."""
    tmp = Path(tempfile.gettempdir())
    small_home, big_home = tmp / "halo-bench-history-50", tmp / f"halo-bench-history-{big}"
    t = time.perf_counter()
    small_id, big_id = fill(small_home, 50), fill(big_home, big)
    print(f"  (history homes ready in {time.perf_counter() - t:.1f} s: {big_home})", flush=True)
    py = sys.executable
    base = {k: v for k, v in os.environ.items() if k != "HALO_SCHED_HOME"}
    base["HALO_SCHED_BACKEND"] = "local"

    def cmd(home: Path, *args):
        env = {**base, "HALO_SCHED_HOME": str(home)}
        return lambda: run([py, "-m", "halo_sched.cli", *args], env=env)

    for what, small, large in (("status ID", cmd(small_home, "status", small_id), cmd(big_home, "status", big_id)),
                               ("list", cmd(small_home, "list"), cmd(big_home, "list"))):
        ts, tb, ms, mb = side_by_side(large, small, n)
        row(f"`{what}` at {big:,} records vs 50", f"{ts:.3f} s, {ms / 1024:.1f} MB", f"{tb:.3f} s, {mb / 1024:.1f} MB",
            f"+{ts - tb:.3f} s, +{(ms - mb) / 1024:.1f} MB", "within +0.15 s and +10 MB")
    import statistics

    env = {**base, "HALO_SCHED_HOME": str(big_home)}
    for args in (("list", "--limit", "0"), ("export",)):
        got = [first_line([py, "-m", "halo_sched.cli", *args], env) for _ in range(max(3, n // 3))]
        first, whole = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
        rss = statistics.median(g[2] for g in got)
        row(f"`{' '.join(args)}` at {big:,} records: first line, peak RSS", f"{first:.3f} s, {rss / 1024:.1f} MB",
            f"all {big:,} lines: {whole:.2f} s", "", "first line <= 0.5 s, <= 100 MB")
