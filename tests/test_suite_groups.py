"""The suite's own check that each xdist group ran on one worker (tests/conftest.py): a run whose
SLURM tests ran on two workers queued one test's jobs behind another's, and fails. The check must
see the group a test ran in, not a keyword: a parametrized test's id (``test_x[slurm]``) is one of
its keywords too, and such a test runs on any worker (a whole-suite run failed with every test
passed: ``{'slurm': {'gw0', 'gw3'}}``)."""
from types import SimpleNamespace

import conftest


def _report(worker: str, keywords: dict, props: list) -> SimpleNamespace:
    return SimpleNamespace(node=SimpleNamespace(gateway=SimpleNamespace(id=worker)), keywords=keywords,
                           user_properties=props, when="call", nodeid="tests/x.py::t", duration=0.0)


def _reporter(*reports) -> SimpleNamespace:
    return SimpleNamespace(stats={"passed": list(reports)})


def test_a_parametrized_id_named_slurm_is_not_the_slurm_group():
    grouped = _report("gw0", {"slurm": True, "xdist_group": True}, [("xdist_group", "slurm-22.05")])
    by_id = _report("gw3", {"slurm": True, "test_x[slurm]": True}, [])
    assert conftest._groups_spread(_reporter(grouped, by_id)) == {}


def test_a_group_on_two_workers_is_found():
    a = _report("gw0", {}, [("xdist_group", "slurm-22.05")])
    b = _report("gw2", {}, [("xdist_group", "slurm-22.05")])
    rig = _report("gw1", {}, [("xdist_group", "multihost")])
    assert conftest._groups_spread(_reporter(a, b, rig)) == {"slurm-22.05": {"gw0", "gw2"}}


#: The history home while this file was collected: the suite's own, never the user's (conftest.py).
HOME_AT_COLLECTION = __import__("os").environ.get("HALO_SCHED_HOME")


def test_collection_never_reads_the_users_history_store():
    """A test file that renders a job at import reads the node ledger from the history store; at
    the default path a store another release wrote failed that file's collection. conftest.py points
    the whole run at a home of its own before anything is collected."""
    assert HOME_AT_COLLECTION and "halo-suite-home." in HOME_AT_COLLECTION, HOME_AT_COLLECTION


def test_the_clusters_of_a_run_keep_apart():
    """`make test` runs two SLURM passes (22.05 and the current release) of two workers each, each
    worker on a 3-node cluster of its own on this one host (tests/cluster/cluster.py). Their daemons'
    ports, state dirs and the job ids they hand out never meet: a job's rendezvous port is derived from
    its id modulo 1000 (DERIVED_PORTS), and tests find a job's processes by SLURM_JOB_ID. The first
    run with clusters per worker, all numbering jobs from 1, failed 6 tests on equal ids."""
    from cluster import cluster

    from halo_sched.node.contract import DERIVED_PORTS

    clusters = [(v, w) for v in ("22.05", "24.11") for w in ("gw0", "gw1")]
    dirs = {cluster.per_worker_cluster(w, v)[0] for v, w in clusters}
    assert len(dirs) == 4
    ports = [p for v, w in clusters for base in [cluster.per_worker_cluster(w, v)[1]]
             for p in (base, base + 1, base + 2, base + 3, base + 100)]  # slurmctld, 3 slurmd, slurmrestd
    assert len(set(ports)) == len(ports)
    defaults = {p for base in (6817, 6827, 6837) for p in (base, base + 1, base + 2, base + 3, base + 100)}
    assert not set(ports) & defaults and all(p < 12000 for p in ports)  # the tests' own: 12000-19999
    bands = []
    for v, w in clusters:
        first = cluster.first_job_id(w, v)
        bands.append({(first + k) % len(DERIVED_PORTS) for k in range(cluster.JOB_ID_BAND)})
    assert all(not (a & b) for i, a in enumerate(bands) for b in bands[i + 1:])
