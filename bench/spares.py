"""Restarts inside the allocation against a resubmission through the queue, on the local SLURM
test cluster (issue 32 item 3, issue 39 item 1): a 2-node job (real torchrun, gloo) whose node
rank 1 fails 2 s into its first step (bench/spare_trainer.py). Measured: from that fault to every
rank training again (its first all_reduce of the next step), by the ranks' own clocks.

- inplace: the job's own fault (a Python exception), no spare, ``retry: {attempts: 2, on: [job]}``:
  the batch script starts the ranks again on the same nodes, same job (halo_sched/node/restart.py).
- spare: a node's fault (an NCCL error, then a SIGKILL nothing in the job sent), ``slurm.spare_nodes: 1``
  on the 3-node cluster: the batch script swaps the node for the spare in the same job.
- inplace+spare: the job's own fault in a job that holds a spare too (``retry`` and
  ``slurm.spare_nodes: 1``): restarted in place, the spare kept.
- planned (``--planned``): planned maintenance (issue 39 item 3), no fault: ``slurm.spare_nodes: 1``,
  every rank training, the node of node rank 1 drained as an admin drains it (``scontrol update
  nodename=X state=drain reason=...``, resumed after). The batch script's watcher sees it within its
  poll (HALO_MAINT_POLL_S=2 here, as tests/test_maintenance_slurm.py has it; 30 s by default, which
  adds up to 30 s between the drain and the warning), warns the trainers, which stop at the same
  step and exit 0 (they save nothing: the time is the tool's), and the spare takes the rank in the
  same job. Measured from the warning (the signed swap line's ``warned``) to every rank training
  again.
- queue (``--queue``): a node's fault, no spare, ``retry: {attempts: 2, on: [node]}``: the failed
  attempt submits the next, which goes through the queue. The queue here is empty, so this is
  the best case of a resubmission: on a busy cluster the wait for nodes comes on top (hours, for
  a large job).

    python bench/spares.py [--reps N] [--queue] [--planned] [--kinds inplace,spare]   # medians of N runs each (default 3)
    python bench/spares.py --write[=NAME,..] # the same, and the medians kept in bench/measured.json
                                             # (inplace_s, swap_s, resubmit_s, planned_s: bench/goodput.py's
                                             # inputs; =inplace_s: that one only)
    python bench/spares.py --kinds planned --write=planned_s   # the planned swap alone

About a minute per rep and kind. HALO_CLUSTER_DIR/HALO_CLUSTER_PORT pick the cluster, as for
tests/cluster/slurm-cluster.sh.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from testcluster import cluster_env, cluster_lock, slurm_answers  # noqa: E402

#: The batch script's signed decision lines (node/restart.py, node/spares.py).
TAGS = ("halo-sched-restart {", "halo-sched-swap {")
#: The maintenance watcher's poll in the planned kind (HALO_MAINT_POLL_S; 30 s by default).
POLL_S = "2"


def one(kind: str, tmp: Path, env: dict) -> tuple[float, float | None, str, str]:
    """(seconds from the fault (a planned swap's: its warning) to every rank training again, from
    then to the batch script's decision (its signed restart or swap line; None for the queue), the
    job ids, a note)."""
    shutil.copy(REPO / "bench" / "spare_trainer.py", tmp / "spare_trainer.py")
    job = {"name": f"spare-bench-{kind.replace('+', '-')}", "nodes": 2, "nproc_per_node": 2,
           "trainer": {"script": "spare_trainer.py"}, "env": {"OMP_NUM_THREADS": "1"},
           "rendezvous": {"timeout_s": 120}}
    if "spare" in kind or kind == "planned":
        job["slurm"] = {"spare_nodes": 1, "exclusive": True}
    if kind.startswith("inplace"):
        job["retry"] = {"attempts": 2, "on": ["job"]}
        job["env"]["SPARE_BENCH_FAULT"] = "job"
    elif kind == "queue":
        job["retry"] = {"attempts": 2, "on": ["node"]}
    elif kind == "planned":
        job["env"]["SPARE_BENCH_FAULT"] = "planned"
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    # A home of its own: each run starts with an empty node ledger (3 nodes, one of them ledgered
    # per run: a second run's retry would find too few).
    env = {**env, "HALO_SCHED_HOME": str(tmp / "home")}
    argv = [sys.executable, "-m", "halo_sched.cli", "submit", "job.yaml", "--backend", "slurm", "--wait",
            "--quiet", "--timeout", "300"]
    note = ""
    if kind == "planned":
        env["HALO_MAINT_POLL_S"] = POLL_S
        stdout, drained, host = _drained_while_training(argv, tmp, env, job["name"])
    else:
        r = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=400)
        if r.returncode != 0:
            raise SystemExit(f"{kind}: submit --wait exited {r.returncode}:\n{r.stderr[-2000:]}")
        stdout = r.stdout
    rows = [ln.split() for ln in (tmp / "spare_bench.log").read_text().splitlines()]
    again = [float(t) for c, n, w, t in rows if c == "1" and w == "train"]
    if len(again) != 4:
        raise SystemExit(f"{kind}: expected 4 ranks training in the next step, got {rows}")
    lines = [json.loads(line[line.index(tag) + len(tag) - 1:]) for out in tmp.glob("*.out")
             for line in out.read_text(errors="replace").splitlines() for tag in TAGS if tag in line]
    if kind == "planned":
        swaps = [x for x in lines if x.get("planned") is True and x.get("warned")]
        if not swaps:
            raise SystemExit(f"{kind}: no planned swap line in the job's output ({lines})")
        start = float(swaps[0]["warned"])
        note = f"; {host} drained, the warning {start - drained:.1f} s after"
    else:
        start = float(next(t for c, n, w, t in rows if w == "fault"))
    decided = lines[0]["time"] - start if lines else None
    return max(again) - start, decided, stdout.strip().replace("\n", " "), note


def _drained_while_training(argv: list[str], tmp: Path, env: dict, name: str) -> tuple[str, float, str]:
    """``submit --wait`` of the planned kind: once every rank trains, the node of node rank 1 is
    drained; the submit's stdout, when it was drained, and which node (resumed at the end)."""
    log = tmp / "spare_bench.log"

    def rows() -> list[list[str]]:
        got = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
        return [r for r in got if len(r) == 4]  # a line being written: not yet

    scontrol = lambda *a: subprocess.run(["scontrol", *a], env=env, capture_output=True, text=True,  # noqa: E731
                                         timeout=30)
    host = ""
    with subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            deadline = time.monotonic() + 240
            while p.poll() is None and time.monotonic() < deadline:
                got = rows()
                on = [w[3:] for c, n, w, t in got if c == "0" and w.startswith("on:")]
                if on and sum(c == "0" and w == "train" for c, n, w, t in got) == 4:
                    host = on[0]
                    break
                time.sleep(0.2)
            if not host:
                ended = p.poll() is not None
                raise SystemExit(f"planned: the ranks never all trained (submit "
                                 f"{'exited' if ended else 'still waiting'}): {rows()}\n"
                                 f"{p.stderr.read()[-2000:] if ended else ''}")
            drained = time.time()
            r = scontrol("update", f"nodename={host}", "state=drain", "reason=halo-bench-planned")
            if r.returncode != 0:
                raise SystemExit(f"planned: scontrol update nodename={host} state=drain: {r.stderr.strip()[:300]}")
            stdout, stderr = p.communicate(timeout=400)
            if p.returncode != 0:
                raise SystemExit(f"planned: submit --wait exited {p.returncode}:\n{stderr[-2000:]}")
            return stdout, drained, host
        except BaseException:
            p.kill()
            subprocess.run(["scancel", f"--name={name}"], env=env, capture_output=True, timeout=30)
            raise
        finally:
            if host:
                scontrol("update", f"nodename={host}", "state=resume")


@contextlib.contextmanager
def _lock():
    """The cluster's lock, held exclusive while measuring (tests hold it shared): a cluster of its
    own (HALO_CLUSTER_DIR) has its own lock beside its state (tests/cluster/cluster.py lock_path)."""
    if not os.environ.get("HALO_CLUSTER_DIR"):
        with cluster_lock():
            yield
        return
    with open(os.environ["HALO_CLUSTER_DIR"].rstrip("/") + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def main(argv: list[str]) -> int:
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 3
    kinds = argv[argv.index("--kinds") + 1].split(",") if "--kinds" in argv else ["inplace", "spare", "inplace+spare"]
    keep = next((a.partition("=")[2] or "all" for a in argv if a.split("=")[0] == "--write"), "")
    for kind, flag in (("queue", "--queue"), ("planned", "--planned")):
        named = any(k == kind and name in keep.split(",") for k, name, _ in KEPT)
        kinds += [kind] if (flag in argv or named) and kind not in kinds else []
    if not set(kinds) <= set(WORDS):
        raise SystemExit(f"--kinds: each of {', '.join(WORDS)}")
    os.environ.update(cluster_env())
    if not slurm_answers():
        raise SystemExit("no SLURM cluster answers: tests/cluster/slurm-cluster.sh up (with HALO_CLUSTER_PORT)")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    decided: dict[str, list[float]] = {k: [] for k in kinds}
    with _lock(), tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               "PYTHONPATH": str(REPO)}
        for i in range(reps):
            for kind in kinds:  # alternating
                tmp = Path(d) / f"{kind}{i}"
                tmp.mkdir()
                s, at, ids, note = one(kind, tmp, env)
                times[kind].append(s)
                decided[kind] += [at] if at is not None else []
                print(f"{kind} rep {i + 1}: {s:.1f} s"
                      + (f", decided {at:.1f} s after the {FROM[kind]}" if at is not None else "")
                      + f" (job {ids}{note}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
    print(f"\nfault (planned: the warning) -> every rank training again, medians of {reps} (2 nodes x 2 ranks, gloo, "
          "Slurm test cluster):")
    for kind in kinds:
        got = times[kind]
        at = f"; decided after {statistics.median(decided[kind]):.1f} s" if decided[kind] else ""
        print(f"  {WORDS[kind]}: {statistics.median(got):.1f} s ({min(got):.1f}-{max(got):.1f}{at})  ({GOALS[kind]})")
    if keep:
        from measured import write

        where = (f"the Slurm test cluster, 2 nodes x 2 ranks, real torchrun, gloo (bench/spares.py, {reps} reps; "
                 f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end)")
        for kind, name, what in KEPT:
            if times.get(kind) and (keep == "all" or name in keep.split(",")):
                write(name, statistics.median(times[kind]), f"{FROM[kind]} -> every rank training again, {what}, "
                      f"median of {reps} ({', '.join(f'{t:.1f}' for t in times[kind])} s)", "bench/spares.py", where)
        print("kept in bench/measured.json (bench/goodput.py's inputs)")
    return 0


WORDS = {"inplace": "job fault, restart in place in the same job (retry.on: [job], no spare)",
         "spare": "node fault, spare swap in the same job (slurm.spare_nodes: 1)",
         "inplace+spare": "job fault, restart in place in a job holding a spare (retry.on: [job], spare_nodes: 1)",
         "queue": "node fault, resubmission through an empty queue (retry.on: [node], no spare)",
         "planned": "planned swap: a node drained, onto the spare at the trainers' stop (slurm.spare_nodes: 1)"}
#: Where each kind's time starts.
FROM = {"inplace": "fault", "spare": "fault", "inplace+spare": "fault", "queue": "fault", "planned": "warning"}
#: What --write keeps in bench/measured.json: (kind, name, what).
KEPT = [("inplace", "inplace_s", "restarted in place in the same allocation (a new step on the same nodes; the job's "
                                 "own fault, retry.on: [job])"),
        ("spare", "swap_s", "a hot spare swapped in the same job (slurm.spare_nodes: 1)"),
        ("queue", "resubmit_s", "the job resubmitted through an empty queue (retry, the failed attempt submits it)"),
        ("planned", "planned_s", "a planned swap in the same job: a node of the step drained (scontrol update "
                                 "state=drain), the warning, the trainers stopped at the same step and exited 0 "
                                 "(saving nothing), the spare in its rank (slurm.spare_nodes: 1); the warning: "
                                 f"the signed swap line's warned, the maintenance watcher polling every {POLL_S} s "
                                 "(HALO_MAINT_POLL_S): its default poll, 30 s, adds up to 30 s between the drain and "
                                 "the warning")]
GOALS = {"inplace": "goal at most 10 s, the job id unchanged", "spare": "goal at most 10 s, the job id unchanged",
         "inplace+spare": "goal at most 10 s, the job id unchanged", "queue": "+ the queue wait on a busy cluster",
         "planned": f"the job id unchanged; + up to the poll ({POLL_S} s here, 30 s by default) from the drain to the "
                    "warning, + the trainer's checkpoint"}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
