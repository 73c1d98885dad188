"""The multi-host rig's tests on a machine that cannot make network namespaces (issue 31, item 4):
skipped with one line that says why, and never skipped with CI=true (tests/cluster/
multihost_fixtures.py ``require_namespaces``, which the rig's session fixture calls first). No
namespace is made here: the machine's answers are stood in for."""
from __future__ import annotations

import subprocess

import pytest

from cluster import multihost_fixtures as mf


def _unshare_refused(monkeypatch):
    monkeypatch.setattr(mf.os, "geteuid", lambda: 0)
    monkeypatch.setattr(mf.shutil, "which", lambda tool: f"/usr/bin/{tool}")

    def run(argv, **kw):
        assert argv[:2] == ["unshare", "--net"], argv
        return subprocess.CompletedProcess(argv, 1, "", "unshare: unshare failed:\n  Operation not permitted\n")

    monkeypatch.setattr(mf.subprocess, "run", run)


@pytest.mark.parametrize("machine", ["not root", "unshare refused"])
def test_without_namespaces_the_rig_is_skipped_in_one_line(monkeypatch, machine):
    monkeypatch.delenv("CI", raising=False)
    if machine == "not root":
        monkeypatch.setattr(mf.os, "geteuid", lambda: 1000)
    else:
        _unshare_refused(monkeypatch)
    with pytest.raises(pytest.skip.Exception) as e:
        mf.require_namespaces()
    msg = str(e.value)
    assert msg.startswith("multi-host rig skipped: ") and "\n" not in msg, msg
    assert {"not root": "not root", "unshare refused": "Operation not permitted"}[machine] in msg, msg


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_with_ci_the_rig_is_never_skipped(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    _unshare_refused(monkeypatch)
    with pytest.raises(pytest.fail.Exception) as e:
        mf.require_namespaces()
    assert "CI=true: the multi-host rig's tests may not be skipped" in str(e.value), e.value
    assert "cannot create a network namespace: unshare: unshare failed: Operation not permitted" in str(e.value)


def test_a_machine_that_can_runs_them(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(mf, "why_no_namespaces", lambda: None)
    mf.require_namespaces()  # neither skip nor fail
