"""The one place where bench scripts keep the figures they measured on the test cluster, for the
models that take them as inputs (bench/goodput.py): ``bench/measured.json``, one entry per figure
with its value, what it is, the script that wrote it, when and where.

    from measured import write, value       # (bench/ is on sys.path in a bench script)
    write("swap_s", 5.2, what="...", by="bench/spares.py", where="...")   # a bench script's --write
    value("swap_s")                         # a model's default

An entry whose ``measured`` is null is not measured yet: its value is the goal's bound, and the
model that reads it says so. The file is rewritten whole under a lock (read-modify-write inside
it), so two bench scripts writing at once keep both figures.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

FILE = Path(__file__).resolve().parent / "measured.json"


def entries() -> dict:
    """Every entry (name -> {value, what, by, measured, where[, note]})."""
    data = json.loads(FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def value(name: str) -> float:
    return float(entries()[name]["value"])


def measured(name: str) -> bool:
    """Whether the figure was measured (else: the goal's bound, not measured yet)."""
    return entries()[name].get("measured") is not None


def write(name: str, value: float, what: str, by: str, where: str, note: str = "") -> None:
    """Keep a measured figure (today's date), the others as they are."""
    with open(os.path.join(tempfile.gettempdir(), "halo-bench-measured.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(FILE.read_text())
        data[name] = {"value": round(float(value), 3), "what": what, "by": by,
                      "measured": time.strftime("%Y-%m-%d"), "where": where, **({"note": note} if note else {})}
        tmp = FILE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, FILE)
