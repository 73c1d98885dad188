"""Prints the node entry's functions (``entry.sh`` beside this file), from an install or from the
zip a job carries: ``python -m halo_sched.node.shell``; the entry script evaluates what it prints."""
from __future__ import annotations

import pkgutil
import sys

if __name__ == "__main__":
    sys.stdout.write(pkgutil.get_data(__package__ or "halo_sched.node", "entry.sh").decode())
