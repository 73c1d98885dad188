"""The ranks' progress on SLURM, where the submitter can read it: each node's hang monitor copies
its ranks' progress files (``hang_monitor.Mirror``) every few seconds into
``OUTPUT_DIR/.halo-progress/JOB_ID/node-K/progress/`` (``OUTPUT_DIR``: the directory of the job's
output file, which halo-sched already reads for failure reports; production sites keep it on a
shared filesystem). The layout is a local job's log root, so ``stragglers.read`` and
``timeline.progress_files`` read it unchanged. Standard library only, no torch.
"""
from __future__ import annotations

import os
from pathlib import Path

#: Under the output file's directory: one directory per job id.
MIRROR_DIR = ".halo-progress"


def mirror_shell(output: str, under: str = MIRROR_DIR) -> str | None:
    """The batch script's shell text for the mirror's base directory (the job id is added there):
    the directory of ``output`` (sbatch's ``--output`` pattern), relative ones under ``$PWD``, the
    job's working directory, against which sbatch resolves a relative ``--output``. None where the
    directory holds a ``%`` code (its value is the scheduler's to expand): then no mirror.
    ``under``: the directory beside the output file (the rank 0's result's: outputs.RESULT_DIR)."""
    from ...templating import sh_quote

    d = os.path.dirname(output)
    if "%" in d:
        return None
    base = sh_quote(d, "output") + "/" + under if os.path.isabs(d) else (
        '"$PWD"/' + (sh_quote(d, "output") + "/" if d else "") + under)
    return base


def mirror_root(outputs: list[str], job_id: str) -> Path | None:
    """Where the job's nodes mirror their progress files (None: no output file known)."""
    if not outputs:
        return None
    local = job_id.rpartition(":")[2]  # sbatch -M: CLUSTER:ID; the nodes see SLURM_JOB_ID=ID
    if not local or not local.replace("_", "").isdigit():
        return None
    return Path(outputs[0]).parent / MIRROR_DIR / local


def stragglers_line(outputs: list[str], job_id: str) -> str:
    """Each node's step and step time and the slowest rank, from the mirrored files (as a local
    job's ``status`` shows them); empty before the first copy or where none is readable."""
    from ...node import stragglers

    root = mirror_root(outputs, job_id)
    if root is None:
        return ""
    return stragglers.line(root)

