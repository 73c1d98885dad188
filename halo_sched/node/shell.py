"""Prints the node entry's functions (``entry.sh`` beside this file), or with ``batch`` the SLURM
batch script's (``batch.sh``), from an install or from the zip a job carries:
``python -m halo_sched.node.shell [batch]``; the script evaluates what it prints."""
from __future__ import annotations

import pkgutil
import sys

if __name__ == "__main__":
    name = "batch.sh" if sys.argv[1:] == ["batch"] else "entry.sh"
    sys.stdout.write(pkgutil.get_data(__package__ or "halo_sched.node", name).decode())
