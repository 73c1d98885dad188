"""Shell that several scripts write is written once, in halo_sched/templates/fragments.sh.j2
(Jinja2 macros), and each template takes it from there: a copy pasted back into a template fails
here. The golden files pin what the macros render to."""
from __future__ import annotations

import pytest

from helpers import REPO

TEMPLATES = REPO / "halo_sched" / "templates"
FRAGMENTS = TEMPLATES / "fragments.sh.j2"
# A line that belongs to each fragment alone, and which templates write it.
SHARED = {
    "the warning traps": ("trap 'halo_warned_at=${halo_warned_at:-$SECONDS}' {{ warning.carrier", "warning_traps", ["entry.sh.j2"]),
    "the failure exit": ("halo_fail() {", "fail_function", ["entry.sh.j2", "slurm/sbatch.sh.j2"]),
    "torchrun's Python": ("1s/^#![[:space:]]*//p", "torchrun_python",
                          ["entry_runtime.sh.j2"]),
}


@pytest.mark.parametrize("what", sorted(SHARED))
def test_each_shared_fragment_is_written_once_and_used_by_its_templates(what):
    line, macro, users = SHARED[what]
    holders = sorted(p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*.j2") if line in p.read_text())
    assert holders == ["fragments.sh.j2"], f"{what} is written out in {holders}, not only in fragments.sh.j2"
    for name in users:
        assert macro in (TEMPLATES / name).read_text(), f"{name} does not use {macro}"


def test_the_batch_scripts_shell_is_the_node_runtimes():
    """The loopback check, the warning's forwarder and the srun wait loop are written once, in
    halo_sched/node/batch.sh, which the batch script loads; no template writes them out."""
    batch = (REPO / "halo_sched" / "node" / "batch.sh").read_text()
    for line in ("127.* | localhost | ::1", "scancel --signal=\"$halo_carrier\"", "halo_interrupted=$halo_rc"):
        assert batch.count(line) == 1, line
        assert not [p.name for p in TEMPLATES.rglob("*.j2") if line in p.read_text()], line
