"""tests/cluster/debian-packages.sh: the test clusters' package installs, one at a time.

On a fresh machine make test's first workers start the 22.05 cluster and the multi-host rig at
once, and both install packages: the second apt-get stopped on dpkg's lock and every rig test was an
ERROR. Here apt-get and dpkg-query are stand-ins on PATH that behave as Debian's do where it
matters: apt-get takes dpkg's frontend lock without waiting (two at once here, 2026-12-07: "E: Could
not get lock /var/lib/dpkg/lock-frontend. It is held by process N (apt-get)") and marks what it
installs; dpkg-query reports it.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import REPO, write_tool

SCRIPT = REPO / "tests" / "cluster" / "debian-packages.sh"

FAKE_APT_GET = r'''#!/usr/bin/env bash
# apt-get: dpkg's frontend lock taken at once or exit 100; install marks each package installed.
state=$FAKE_DPKG_STATE
exec 7>>"$state/lock-frontend"
if ! flock -n 7; then echo "E: Could not get lock $state/lock-frontend" >&2; exit 100; fi
echo "$*" >>"$state/calls"
[[ " $* " == *" install "* ]] || exit 0
sleep 1
for a in "$@"; do
    case $a in -*|install|update|DPkg::*) ;; *) touch "$state/installed-$a" ;; esac
done
'''

FAKE_DPKG_QUERY = r'''#!/usr/bin/env bash
# dpkg-query -W -f=STATUS-FORMAT PKG: the package is the last argument
for pkg; do :; done
[[ -e $FAKE_DPKG_STATE/installed-$pkg ]] && printf 'install ok installed' && exit 0
exit 1
'''


def _installer(tmp_path: Path, who: str) -> subprocess.Popen:
    body = (f'log() {{ echo "{who}: $*" >&2; }}; die() {{ log "ERROR: $*"; exit 1; }}; '
            f'source {SCRIPT}; install_debian_packages "" munge iptables')
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "FAKE_DPKG_STATE": str(tmp_path / "dpkg"), "HALO_APT_LOCK": str(tmp_path / "apt.lock")}
    return subprocess.Popen(["bash", "-euo", "pipefail", "-c", body], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_installers_at_once_both_succeed_and_install_once(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "dpkg").mkdir()
    write_tool(tmp_path / "bin", "apt-get", FAKE_APT_GET)
    write_tool(tmp_path / "bin", "dpkg-query", FAKE_DPKG_QUERY)
    procs = [_installer(tmp_path, who) for who in ("cluster", "rig")]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    calls = (tmp_path / "dpkg" / "calls").read_text().splitlines()
    # One update and one install: the second installer found the packages there once it had the lock.
    assert len(calls) == 2 and "install" in calls[1], calls
    assert "munge iptables" in calls[1] and "DPkg::Lock::Timeout=" in calls[1], calls


def test_nothing_missing_runs_no_apt_get(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "dpkg").mkdir()
    write_tool(tmp_path / "bin", "apt-get", FAKE_APT_GET)
    write_tool(tmp_path / "bin", "dpkg-query", FAKE_DPKG_QUERY)
    for pkg in ("munge", "iptables"):
        (tmp_path / "dpkg" / f"installed-{pkg}").touch()
    p = _installer(tmp_path, "cluster")
    assert p.communicate(timeout=30)[0] == "" and p.returncode == 0
    assert not (tmp_path / "dpkg" / "calls").exists()
