"""Recovery on Nomad with nobody at a terminal (issue 40): the fake Nomad API as the servers and the
client simulator as the clients (tests/nomad/fake_api.py, tests/nomad/client_sim.py), real
torchrun and gloo, a 2-node x 1-rank job whose node rank 1 fails as a bad node would once the
world formed (tests/trainers/slot_fault.py: an NCCL line, then a SIGKILL nothing in the job sent).
``submit`` without ``--wait`` returns before the fault: nobody waits. Side by side, alternating,
medians of ``--rounds``:

- ``keeper``: ``retry: {attempts: 2, on: [node]}``; the run's keeper (a task of the job,
  halo_sched/node/nomad_keeper.py) registers attempt 2 as a new version keeping off the culprit;
- ``spare``: ``nomad.spare_nodes: 1``; the keeper gives node rank 1 to the spare in the next world,
  in the same allocations.

(The anchor measured before issue 40, a waiting ``submit --wait`` registering attempt 2 of a job
with ``nomad.keeper: false``, is gone with that path: no waiter registers an attempt now.)

Each row: from the fault (the faulting rank's clock, just before its SIGKILL) to every rank of
the next world or attempt training again (its first all_reduce done), by the ranks' own clocks.
The four client nodes are this machine (the simulator's nodes on loopback); the keeper's node is a
fourth. Never asserted in tests: tests/test_nomad_runs.py bounds one run of each path.

    python bench/nomad_recovery.py [--rounds N] [--modes keeper,spare]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
TRAINER = REPO / "tests" / "trainers" / "slot_fault.py"
TOKEN = "tok-bench"
CAPS = ("read-job", "submit-job", "read-logs")


def _load(name: str):
    from helpers import load_nomad_helper

    return load_nomad_helper(name)


def _job(d: Path, mode: str) -> Path:
    import yaml

    shutil.copy(TRAINER, d / TRAINER.name)
    data = {"name": f"nr-{mode}", "nodes": 2, "nproc_per_node": 1, "env": {"OMP_NUM_THREADS": "1"},
            "rendezvous": {"timeout_s": 60}, "trainer": {"script": str(d / TRAINER.name), "args": ["--steps", "20"]},
            "nomad": {"driver": "raw_exec"}, "retry": {"attempts": 2, "on": ["node"]}}
    if mode == "spare":
        data["nomad"]["spare_nodes"] = 1
    (d / "job.yaml").write_text(yaml.safe_dump(data))
    return d / "job.yaml"


def _rows(d: Path) -> list[tuple[str, str, str, float]]:
    return [(r[0], r[1], r[2], float(r[3])) for p in (d / "nomad").rglob("starts.log")
            for r in (ln.split() for ln in p.read_text().splitlines()) if len(r) == 4]


def one(mode: str) -> float:
    """Seconds from the fault to every rank training again, one run of ``mode``."""
    fake_api, client_sim = _load("fake_api"), _load("client_sim")
    with tempfile.TemporaryDirectory(prefix="halo-nr-") as tmp, contextlib.ExitStack() as stack:
        d = Path(tmp)
        fake = stack.enter_context(fake_api.FakeNomad([fake_api.FakeNode(f"n{i}", gpus=0) for i in range(4)], token=TOKEN))
        fake.attach_policy("default", CAPS, variables={"nomad/jobs/*": ("read", "write")})
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env.update(NOMAD_ADDR=fake.address, NOMAD_TOKEN=TOKEN, HALO_SCHED_HOME=str(d / "home"),
                   PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        sims: list = []

        def make(job: dict):
            sim = client_sim.SimCluster(job, d / "nomad" / f"v{job.get('Version', 0)}", host_env=env)
            sims.append(sim)
            return sim

        fake.attach_sims(make)
        stack.callback(lambda: [s.stop() for s in sims])
        argv = [sys.executable, "-m", "halo_sched.cli", "submit", str(_job(d, mode)), "--backend", "nomad", "--quiet"]
        proc = subprocess.Popen(argv, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            fake.tick()
            rows = _rows(d)
            faults = [t for what, _, _, t in rows if what == "fault"]
            later = [t for what, _, _, t in rows if what == "start" and faults and t > faults[0]]
            trained = {(slot, node) for what, slot, node, t in rows if what == "trained" and later and t > min(later)}
            if len(trained) == 2:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"{mode}: no recovery within 300 s: {_rows(d)}")
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=120)
        if proc.poll() is None:
            proc.kill()
        restart = min(later)
        return max(t for what, _, _, t in rows if what == "trained" and t > restart) - faults[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="keeper,spare")
    args = ap.parse_args()
    modes = args.modes.split(",")
    got: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes:
            got[m].append(one(m))
            print(f"round {r + 1} {m}: {got[m][-1]:.1f} s", flush=True)
    print(json.dumps({m: {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1),
                          "all": [round(x, 1) for x in v]} for m, v in got.items()}, indent=1))


if __name__ == "__main__":
    main()
