"""On the real SLURM cluster (3 nodes, Slurm 22.05): planned maintenance without the queue (issue 39
item 3). A 2-node job with ``slurm.spare_nodes: 1`` (real torchrun, examples/train_ddp.py with a
checkpoint directory) trains; node2, which runs node rank 1, is drained as an admin drains a node
(``scontrol update nodename=node2 state=drain reason=maint``). The batch script's watcher sees it
within its poll (``HALO_MAINT_POLL_S=2`` here; 30 s by default), warns the trainers, which save
and exit 0, gives rank 1 to the spare node3, releases node2 from the job (it goes IDLE+DRAIN while
the job runs on: free for its maintenance) and starts the step again: the trainer resumes from its
checkpoint and the job COMPLETES under the same id. node2 is not in the node ledger; ``status``
says 0 of 1 spare left and what the swap cost (from the warning to training again).

It holds the cluster alone (``slurm_cluster_exclusive``): a node is drained, and resumed after."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, until

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.fixture
def env(slurm_cluster_exclusive):
    e = slurm_env(slurm_cluster_exclusive, pythonpath=True)
    e["HALO_MAINT_POLL_S"] = "2"
    return e


def _until(pred, timeout: float, what):
    got = until(pred, timeout)
    assert got, what()
    return got


def test_a_drained_node_leaves_at_the_next_checkpoint_for_the_spare_and_the_job_completes(tmp_path, env):
    """node2 drained while the job trains: a planned swap to the spare, the job COMPLETED, same id.
    Long (about 40 s): two real torchrun starts on SLURM with the checkpoint between them."""
    trainer = {"script": str(REPO / "examples" / "train_ddp.py"),
               "args": ["--steps", "40", "--step-time", "0.25", "--report-dir", str(tmp_path / "reports"),
                        "--checkpoint-dir", str(tmp_path / "ckpt")]}
    job = example_job(tmp_path, free_port(), nproc_per_node=1, trainer=trainer,
                      slurm={"spare_nodes": 1, "exclusive": True})
    r = cli("submit", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    out = tmp_path / f"halo-ddp-cpu-{job_id}.out"
    text = lambda: out.read_text() if out.exists() else ""  # noqa: E731
    scontrol = lambda *a: subprocess.run(["scontrol", *a], env=env, capture_output=True, text=True,  # noqa: E731
                                         timeout=30).stdout
    try:
        _until(lambda: re.search(r"^0: (\[rank 0\] )?step +5 ", text(), re.M), 120, lambda: text()[-3000:])
        drained = time.time()
        scontrol("update", "nodename=node2", "state=drain", "reason=maint")
        # node2 released from the job while it runs on: its maintenance can begin (IDLE+DRAIN).
        _until(lambda: "node2 released from the job" in text(), 60, lambda: text()[-3000:])
        now = scontrol("-o", "show", "job", job_id)
        assert "JobState=RUNNING" in now and " NodeList=node[1,3] " in now, now
        assert "State=IDLE+DRAIN " in scontrol("-o", "show", "node", "node2")
        _until(lambda: json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)["status"]
               not in ("PENDING", "RUNNING"), 120, lambda: text()[-3000:])
    finally:
        scontrol("update", "nodename=node2", "state=resume")
    log = text()
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "COMPLETED" and st["exit_code"] == 0, (st, log[-3000:])
    assert "to leave for maintenance: node2 node3 drained: maint; warning the trainers" in log, log[-3000:]
    assert "node rank 1: node2 leaves for maintenance (drained: maint); node3 takes its rank, restart 1, 0 spares left" in log

    # The trainers saved at the warning and resumed from that checkpoint, HALO_RESTART_COUNT 1, in this job.
    first = [json.loads((tmp_path / "reports" / f"rank{r}.json").read_text()) for r in (0, 1)]
    second = [json.loads((tmp_path / "reports" / f"rank{r}-restart1.json").read_text()) for r in (0, 1)]
    saved = first[0]["saved_step"]
    assert all(x["stopped"] and x["saved_step"] == saved for x in first), first
    assert all(x["restart_count"] == 1 and x["resumed_from"] == saved and x["last_step"] == 39 for x in second), second

    # Status: the spare used, the swap planned and what it cost; no failure, nothing ledgered.
    assert st["spares"]["total"] == 1 and st["spares"]["left"] == 0, st["spares"]
    (swap,) = st["spares"]["swaps"]
    assert (swap["rank"], swap["bad"], swap["spare"], swap["reason"], swap["planned"]) == (
        1, "node2", "node3", "drained: maint", True), swap
    assert drained - 1 <= swap["warned"] <= swap["time"], (drained, swap)
    assert swap["cost_s"] is not None and 0 < swap["cost_s"] < 90, swap
    shown = cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert ("0 of 1 spare left (node2 -> node3: maintenance (drained: maint), training again "
            f"{swap['cost_s']:g} s after the warning)") in shown, shown
    assert json.loads(cli("nodes", "--json", env=env).stdout) == []
    print(f"drain -> warning {swap['warned'] - drained:.1f} s (poll 2 s); warning -> every rank training again: "
          f"{swap['cost_s']:.1f} s")
