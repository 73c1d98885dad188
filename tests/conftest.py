import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import helpers  # noqa: E402
from cluster import cluster as _cluster  # noqa: E402

# First, before the cluster's lock path is computed: in a SLURM pass with a cluster per worker
# (tests/suite.sh), this worker's own.
_cluster.use_per_worker_cluster()

from cluster.fixtures import (  # noqa: E402,F401  (the real local cluster, and its lock)
    cancel_slurm_jobs_under, cluster_lock, skip_slurm_requested, slurm_cluster, slurm_cluster_exclusive,
    stop_cluster_started_by,
)

SKIP_REASON_MARK = "HALO_SKIP_SLURM=1"


def pytest_configure(config):
    # Nothing the suite does may read or write the user's own history store. Each test gets a home
    # of its own (the fixture below); what runs outside a test (collection renders jobs, which read
    # the node ledger) gets the run's own: a store another release left at the default path failed
    # a whole file's collection ("written by a newer halo-sched").
    import shutil
    import tempfile

    home = tempfile.mkdtemp(prefix="halo-suite-home.")
    os.environ["HALO_SCHED_HOME"] = home
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    # Under pytest-xdist the controller names the run (workers get it as workerinput["testrunuid"]),
    # so that it can stop, at the end, a SLURM cluster that one of its workers started.
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None) \
            and getattr(config.option, "testrunuid", "unset") is None:
        config.option.testrunuid = uuid.uuid4().hex
    # Skipping the SLURM tests is for a developer's machine without root; CI must run them.
    if skip_slurm_requested() and helpers.in_ci():
        raise pytest.UsageError(
            "HALO_SKIP_SLURM=1 is refused when CI=true: CI runs the SLURM tests (tests/cluster/slurm-cluster.sh "
            "starts the local cluster). Unset HALO_SKIP_SLURM, or run `make test-fast` for the tier without them.")


def _slurm_skip_message(config) -> str | None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    skipped = [r for r in (tr.stats.get("skipped", []) if tr else [])
               if SKIP_REASON_MARK in str(getattr(r, "longrepr", ""))]
    if not skipped:
        return None
    return (f"{len(skipped)} SLURM tests were SKIPPED (HALO_SKIP_SLURM=1): nothing that needs the SLURM cluster "
            "was tested in this run")


def _weight(item) -> int:
    """Where a test goes in the run: the SLURM cluster's and the rig's chains first (each runs on one
    worker, one test after another, and is the longest), then real torchrun, then the long property
    runs, then the rest, which fill the workers' last minutes."""
    if item.get_closest_marker("slurm"):
        return 0
    if item.get_closest_marker("torch"):
        return 1
    return 2 if item.get_closest_marker("long") else 3


def pytest_itemcollected(item):
    # pytest-xdist (`make test`: tests/suite.sh, `--dist loadgroup`). A group runs on one worker, one
    # test after another: the multi-host rig's tests (they cut and slow its links under its lock),
    # and one release's SLURM tests (a 3-node cluster: a second test's job would queue behind the
    # first's and outwait its bounds, and a test that fills the cluster or reads a queued job's
    # reason sees only its own jobs there). Marked as each item is collected: xdist reads the marks
    # in its own pytest_collection_modifyitems.
    # In a pass with a cluster per worker (HALO_CLUSTER_PER_WORKER=1), a release's SLURM tests
    # spread over the workers a file at a time (a file's tests share module-scoped jobs); each
    # worker's tests still run one after another on its own cluster.
    from cluster.cluster import slurm_version

    if "slurm_cluster" in item.fixturenames and not item.get_closest_marker("slurm"):
        raise pytest.UsageError(f"{item.nodeid} uses the SLURM cluster but is not marked slurm: tests/suite.sh "
                                "runs the SLURM tests on their clusters by that mark")
    if item.get_closest_marker("multihost"):
        item.add_marker(pytest.mark.xdist_group("multihost"))
    elif item.get_closest_marker("slurm"):
        per_file = os.environ.get("HALO_CLUSTER_PER_WORKER") == "1"
        group = f"slurm-{slurm_version()}" + (f":{item.path.name}" if per_file else "")
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_weight)


def _groups_spread(terminalreporter) -> dict[str, set[str]]:
    """The groups of pytest_itemcollected that ran on several workers, from the group each report
    carries (pytest_runtest_makereport). Not from a report's keywords: those hold a parametrized
    test's id too, and ``test_x[slurm]`` runs on any worker."""
    workers: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            node = getattr(r, "node", None)
            for k, group in getattr(r, "user_properties", ()) or ():
                if k == "xdist_group" and node is not None:
                    workers.setdefault(group, set()).add(node.gateway.id)
    return {g: w for g, w in workers.items() if len(w) > 1}


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return
    # The xdist controller stops a cluster one of its workers started.
    testrun = getattr(session.config.option, "testrunuid", None)
    if testrun:
        stop_cluster_started_by(testrun)
    # A group spread over workers is a run whose SLURM tests queued behind each other's jobs: fail it.
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    spread = _groups_spread(tr) if tr else {}
    if spread:
        tr.write_line(f"halo-sched: xdist groups ran on several workers, one each expected: {spread} "
                      "(pytest 9.2 ignores xdist_group: pyproject.toml)", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


LONG_TEST_S = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":  # the group it ran in, for the controller's check (_groups_spread)
        group = item.get_closest_marker("xdist_group")
        if group is not None and group.args:
            outcome.get_result().user_properties.append(("xdist_group", str(group.args[0])))
    # A test over a minute must say why in its docstring; one that does not is named in the summary.
    if call.when == "call" and call.duration > LONG_TEST_S:
        doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
        if not doc.strip():
            outcome.get_result().user_properties.append(("long_without_reason", round(call.duration, 1)))


def _time_by_file(terminalreporter) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Each test file's summed setup + call + teardown time, and the tests over LONG_TEST_S whose
    docstring does not say why; from the reports, so the xdist controller sees every worker's."""
    totals: dict[str, float] = {}
    unexplained = []
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) not in ("setup", "call", "teardown"):
                continue
            path = r.nodeid.split("::", 1)[0]
            totals[path] = totals.get(path, 0.0) + getattr(r, "duration", 0.0)
            unexplained += [(r.nodeid, v) for k, v in getattr(r, "user_properties", ()) if k == "long_without_reason"]
    return sorted(totals.items(), key=lambda kv: -kv[1]), unexplained


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not hasattr(config, "workerinput"):
        by_file, unexplained = _time_by_file(terminalreporter)
        if by_file:
            terminalreporter.write_sep("=", f"test time by file ({len(by_file)} files, "
                                            f"{sum(t for _, t in by_file):.0f} s summed over workers)")
            for path, t in by_file:
                terminalreporter.write_line(f"{t:8.1f}s {path}")
        for nodeid, t in unexplained:
            terminalreporter.write_line(f"halo-sched: {nodeid} took {t} s, over {LONG_TEST_S} s, and its docstring "
                                        "does not say why it must be that long", yellow=True, bold=True)
    msg = _slurm_skip_message(config)
    if msg:
        terminalreporter.write_sep("!", msg, red=True, bold=True)


def pytest_unconfigure(config):
    # Said again as the run's very last line, below pytest's own counts.
    msg = _slurm_skip_message(config)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if msg and tr:
        tr.write_line(f"halo-sched: {msg}", red=True, bold=True)


def _our_processes(root: Path) -> list[int]:
    """Live processes of local jobs started under ``root``: every node process carries
    HALO_LOCAL_JOB=<job dir>; the supervisor runs `python -m ...local_supervisor <job dir>`."""
    prefix = str(root).encode()
    tag = b"HALO_LOCAL_JOB=" + prefix
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue
        supervisor = any(a.endswith(b"local_supervisor") for a in cmd) and any(a.startswith(prefix) for a in cmd)
        if supervisor or any(e.startswith(tag) for e in env):
            out.append(int(d.name))
    return out


def _stop_local_jobs(root: Path) -> None:
    """Whatever a test's local jobs left running (a failed test's `sleep 300` trainer) is killed."""
    deadline = time.monotonic() + 10
    while (pids := _our_processes(root)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def _isolated_state(request, tmp_path, monkeypatch):
    # Local jobs write their state under HALO_SCHED_HOME; keep each test's apart.
    monkeypatch.setenv("HALO_SCHED_HOME", str(tmp_path / "halo-home"))
    for k in list(os.environ):
        if k.startswith(("NOMAD_", "SLURM_JOB")):
            monkeypatch.delenv(k, raising=False)
    # A watcher is shared by every scheduler object that reaches the same scheduler for the
    # process's life; a test's stand-in transport must not answer for the next test.
    from halo_sched.backends import watcher

    with watcher._REGISTRY_LOCK:
        watcher._REGISTRY.clear()
    # The CLI sets, for its process, where outage notes go and the outage budget: a test that
    # runs cli.main() in-process must not decide them for the next test.
    from halo_sched import outage

    monkeypatch.setattr(outage, "_sink", None)
    monkeypatch.setattr(outage, "_budget", None)
    helpers.begin_test_ports()
    uses_slurm = "slurm_cluster" in request.fixturenames
    with cluster_lock(exclusive="slurm_cluster_exclusive" in request.fixturenames) if uses_slurm else _nothing():
        try:
            yield
        finally:
            # Jobs a test started never outlive it, passed or failed.
            if uses_slurm:
                cancel_slurm_jobs_under(tmp_path)
            _stop_local_jobs(tmp_path)
            helpers.release_test_ports()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
