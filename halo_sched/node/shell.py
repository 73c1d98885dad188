"""Prints the node entry's functions (``entry.sh``; ``world.sh`` too with ``world``), or with
``batch`` the SLURM batch script's (``batch.sh``), and with ``batch server`` also
``halo_server_shell='...'`` (``server.sh``, which the batch script hands to the server steps), from
an install or from the zip a job carries:
``python -m halo_sched.node.shell [world | batch [server]]``; the script evaluates what it prints."""
from __future__ import annotations

import pkgutil
import sys


def _text(name: str) -> str:
    return pkgutil.get_data(__package__ or "halo_sched.node", name).decode()


def assignment(var: str, text: str) -> str:
    """``VAR='TEXT'``, which bash reads back as exactly ``text`` (no NUL: no variable holds one)."""
    if "\0" in text:
        raise ValueError("a shell variable cannot hold NUL")
    return var + "='" + text.replace("'", "'\\''") + "'\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["batch"]:
        sys.stdout.write(_text("batch.sh"))
        if args[1:] == ["server"]:
            sys.stdout.write(assignment("halo_server_shell", _text("server.sh")))
    else:
        sys.stdout.write(_text("entry.sh"))
        if args[:1] == ["world"]:
            sys.stdout.write(_text("world.sh"))
