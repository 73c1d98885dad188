"""``submit --wait``'s live log stays readable (issue 41, item 2): a traceback another rank or
node printed already (the same but for its numbers) is folded into one line, and the
``halo-sched-failure {...}`` lines are left out; ``halo-sched logs`` keeps every line.

The fixture is the live log of a real local job (2 nodes x 2 ranks, every rank raising the same
ValueError): 107 lines, of which four rank tracebacks and two torchrun tracebacks with their
failure summaries."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from halo_sched.commands.wait import LiveLog
from helpers import REPO, free_port

FIXTURE = REPO / "tests" / "fixtures" / "live" / "raise-on-every-rank.log"


def shown(lines) -> list[str]:
    out: list[str] = []
    live = LiveLog(out.append, "JOB")
    for line in lines:
        live.line(line)
    live.close()
    return out


def test_a_real_failure_reads_in_half_the_lines_and_nothing_else_is_lost():
    lines = FIXTURE.read_text().splitlines(keepends=True)
    out = shown(lines)
    text = "".join(out)
    assert "halo-sched-failure" not in text and sum("halo-sched-failure {" in x for x in lines) == 2
    # The first of each traceback whole; the three other ranks' and node 1's torchrun's folded.
    assert text.count("ValueError: bad learning rate 7 on rank") == 1
    assert text.count("errors.ChildFailedError:") == 1
    folds = [x for x in out if "folded" in x]
    assert folds == [
        "[node 0] [rank 1] (a traceback of 6 lines, the same as [node 0] [rank 0]'s but for its numbers: folded; "
        "`halo-sched logs JOB` has it)\n",
        "[node 1] [rank 2] (a traceback of 6 lines, the same as [node 0] [rank 0]'s but for its numbers: folded; "
        "`halo-sched logs JOB` has it)\n",
        "[node 1] [rank 3] (a traceback of 6 lines, the same as [node 0] [rank 0]'s but for its numbers: folded; "
        "`halo-sched logs JOB` has it)\n",
        "[node 1] (a traceback of 38 lines, the same as [node 0]'s but for its numbers: folded; "
        "`halo-sched logs JOB` has it)\n",
    ]
    # Every line that is no traceback and no failure line is there, in its order.
    plain = [x for x in lines if "halo-sched-failure" not in x and x in out]
    assert [x for x in out if "folded" not in x] == plain
    assert len(out) == 53 and len(lines) == 107


def test_a_traceback_that_differs_is_shown_whole():
    first = ["[node 0] Traceback (most recent call last):\n", '[node 0]   File "t.py", line 3, in <module>\n',
             "[node 0] ValueError: lr 7\n"]
    other = ["[node 1] Traceback (most recent call last):\n", '[node 1]   File "t.py", line 3, in <module>\n',
             "[node 1] KeyError: 'lr'\n"]  # the same frames, another error
    assert shown(first + other + ["[node 1] after\n"]) == first + other + ["[node 1] after\n"]
    # A repeat that goes on past the first (a chained exception): its held lines come back, then the rest.
    longer = [x.replace("KeyError: 'lr'", "ValueError: lr 9") for x in other] + [
        "[node 1] \n", "[node 1] During handling of the above exception, another exception occurred:\n"]
    out = shown(first + ["[node 0] next\n"] + longer + ["[node 1] next\n"])
    assert out[:4] == first + ["[node 0] next\n"]
    assert any("folded" in x for x in out) and out[-3:] == longer[-2:] + ["[node 1] next\n"]


def test_interleaved_sources_each_fold_against_what_was_shown():
    a = ["[node 0] [rank 0] Traceback (most recent call last):\n", '[node 0] [rank 0]   File "t.py", line 9\n',
         "[node 0] [rank 0] RuntimeError: boom on 0\n"]
    b = [x.replace("[rank 0]", "[rank 1]").replace("on 0", "on 1") for x in a]
    mixed = [a[0], b[0], a[1], b[1], a[2], b[2]]
    out = shown(mixed)
    assert out[:3] == a and len(out) == 4 and "[node 0] [rank 1] (a traceback of 3 lines" in out[3]


def test_what_is_held_back_comes_out_at_the_end():
    a = ["[node 0] Traceback (most recent call last):\n", '[node 0]   File "t.py", line 9\n', "[node 0] E: x\n",
         "[node 0] done\n"]
    partial = ["[node 1] Traceback (most recent call last):\n", '[node 1]   File "t.py", line 9\n']
    assert shown(a + partial) == a + partial  # matched so far, never completed: written at close


@pytest.mark.torch
def test_submit_wait_folds_and_logs_keeps_every_line(tmp_path):
    (tmp_path / "boom.py").write_text('import os\nraise ValueError("bad lr on rank " + os.environ["RANK"])\n')
    (tmp_path / "job.yaml").write_text(
        f"name: boom\nnodes: 2\nnproc_per_node: 2\ntrainer: {{script: boom.py}}\nrendezvous: {{port: {free_port()}}}\n"
        "env: {OMP_NUM_THREADS: '1'}\n")
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", "job.yaml", "--wait"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180, env=os.environ)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.split()[-1]
    assert "halo-sched-failure" not in r.stderr and "folded" in r.stderr, r.stderr
    assert "ValueError: bad lr on rank" in r.stderr.splitlines()[-1]
    logs = subprocess.run([sys.executable, "-m", "halo_sched.cli", "logs", job_id], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=os.environ).stdout
    failures = [json.loads(x.split("halo-sched-failure ", 1)[1]) for x in logs.splitlines() if "halo-sched-failure {" in x]
    # The node that failed first stops the other: under load a rank there may be stopped (torchrun's
    # SIGTERM) before it raised, and is then reported by the signal; every other says why it failed.
    raised = [f for f in failures if f["error"].startswith("ValueError: bad lr on rank")]
    assert raised and all(f in raised or f["error"] in ("killed by SIGTERM", "killed by SIGKILL") for f in failures), failures
    assert logs.count("Traceback (most recent call last)") > r.stderr.count("Traceback (most recent call last)")
