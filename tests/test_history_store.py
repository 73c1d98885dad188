"""The history store under hostile or unusual conditions (issue 43): a record nested too deeply
costs only itself and never a submitted job's id; option values and homes that cannot be used are
exit 2 naming them; a store the user cannot write still serves every read; the home is private to
its owner; `list --limit 0` and `export` stream. Every CLI run is bounded in time and memory."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from halo_sched import db, records
from helpers import REPO, example_job, legacy_record_path, write_tool

MEMORY = 1024 * 1024 * 1024


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(*args, env=None, timeout=60, preexec_fn=_limited) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn, env={**os.environ, **(env or {})})


def _clean(r: subprocess.CompletedProcess) -> None:
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def _rec(job_id: str, submitted: float, backend: str = "local", **extra) -> dict:
    rec = {"version": 1, "id": job_id, "backend": backend, "name": "t", "submitted": submitted,
           "submitted_iso": "2026-01-01T00:00:00+0000", "spec": {"slurm": {}}, "outputs": [], "scheduler": {},
           "last_state": {"status": "FAILED", "describe": f"FAILED {job_id}", "at": submitted}, **extra}
    records.write(rec)
    return rec


FAKE_SBATCH = "#!/bin/bash\ncat > /dev/null\necho 4242\n"
FAKE_SCONTROL = "#!/bin/bash\necho 'scontrol: stand-in' >&2\nexit 1\n"


def _sbatch_env(tmp_path: Path) -> dict:
    """A stand-in sbatch (job 4242) and scontrol first on PATH: submit --backend slurm, no cluster."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in (("sbatch", FAKE_SBATCH), ("scontrol", FAKE_SCONTROL)):
        write_tool(b, name, body)
    return {"PATH": f"{b}:{os.environ['PATH']}", "HALO_SUBMIT_RETRY_S": "0"}


# ---- item 5: one bad record costs only itself ---------------------------------------------------


def _deep(levels: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(levels):
        value = {"x": value}
    return value


def test_a_legacy_record_nested_600_deep_costs_only_itself(tmp_path):
    _rec("good-1", 10.0)
    records.jobs_dir().mkdir(parents=True, exist_ok=True)
    legacy_record_path("deep-1", "local").write_text(json.dumps(
        {"id": "deep-1", "backend": "local", "submitted": 20.0, "name": "d", "extra": _deep(600)}))
    r = run("list")
    _clean(r)
    assert r.returncode == 0
    rows = {line.split("\t")[0]: line for line in r.stdout.splitlines()}
    assert "FAILED good-1" in rows["good-1"]
    assert "UNREADABLE record (nested more than 100 levels deep)" in rows["deep-1"], r.stdout
    for args in (["status", "good-1"], ["status", "deep-1"], ["list", "--json"], ["export"]):
        r = run(*args)
        _clean(r)
        assert r.returncode in (0, 3), (args, r.stderr)
    # submit, with the deep file still there to import: the job's id is printed, its record kept.
    env = _sbatch_env(tmp_path)
    legacy_record_path("deep-2", "local").write_text(json.dumps({"id": "deep-2", "backend": "local", "x": _deep(600)}))
    r = run("submit", str(example_job(tmp_path, 29555)), "--backend", "slurm", env=env)
    _clean(r)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "4242", (r.stdout, r.stderr)
    assert records.find("4242", "slurm")[0]["name"] == "ddp-cpu"


def test_a_row_nested_too_deeply_in_the_store_is_unreadable_not_an_error():
    """A row written before the bound existed (here: by hand): skipped, the others listed."""
    from halo_sched import db

    _rec("good-1", 10.0)
    with db.write() as con:
        for i, levels in ((1, 600), (2, 3000)):  # 3000: deeper than json.loads itself can go
            text = f'{{"id": "deep-{i}", "backend": "local", "x": ' + '{"x": ' * levels + "1" + "}" * (levels + 1)
            con.execute("INSERT INTO jobs (id, backend, submitted, data) VALUES (?, 'local', 20.0, ?)", (f"deep-{i}", text))
    bad = []
    assert [r["id"] for r in records.page(0, on_bad=bad.append) if isinstance(r, dict)] == ["good-1"]
    assert sorted(b.id for b in bad) == ["deep-1", "deep-2"]
    for args in (["status", "deep-1"], ["status", "deep-2", "good-1"], ["list"]):
        _clean(run(*args))


def test_submit_prints_the_id_of_the_job_it_started_whatever_recording_does(tmp_path, monkeypatch, capsys):
    from halo_sched import cli

    for k, v in _sbatch_env(tmp_path).items():
        monkeypatch.setenv(k, v)

    def broken(*a, **k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(records, "save_new", broken)
    assert cli.main(["submit", str(example_job(tmp_path, 29555)), "--backend", "slurm"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "4242", (out, err)
    assert "the job record was not kept: RecursionError" in err and "internal error" not in err


# ---- item 8: edges ------------------------------------------------------------------------------


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` (a file or a directory) that the CLI run by this test cannot write: its write bits
    off for a user whom permissions stop; for root, whom they do not, the immutable attribute
    (chattr +i; skipped where the filesystem has none)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot make {path} read-only for root here (chattr +i: {r.stderr.strip()})")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True, timeout=30)


def test_a_limit_beyond_any_count_is_exit_2_naming_it_and_the_library_reads_all():
    _rec("a", 1.0)
    r = run("list", "--limit", "99999999999999999999999999")
    _clean(r)
    assert r.returncode == 2 and "--limit" in r.stderr and "at most" in r.stderr, r.stderr
    r = run("list", "--limit", "9" * 5000)  # more digits than int() takes
    _clean(r)
    assert r.returncode == 2 and "--limit" in r.stderr and len(r.stderr) < 1000, r.stderr
    assert [x["id"] for x in records.page(10 ** 30)] == ["a"]


def test_a_home_that_is_a_link_to_nothing_is_exit_2_naming_it(tmp_path):
    link = tmp_path / "gone-home"
    link.symlink_to(tmp_path / "nowhere")
    job = example_job(tmp_path, 29555)
    for args in (["list"], ["status", "x"], ["nodes", "--json"], ["export"], ["submit", str(job), "--backend", "local"]):
        r = run(*args, env={"HALO_SCHED_HOME": str(link)})
        _clean(r)
        assert r.returncode == 2 and f"HALO_SCHED_HOME: '{link}' is a symbolic link to" in r.stderr, (args, r.stderr)
    assert not (tmp_path / "nowhere").exists()


def test_a_home_the_user_cannot_write_refuses_submit_and_serves_reads(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    job = example_job(tmp_path, 29555)
    env = {"HALO_SCHED_HOME": str(home)}
    with read_only(home):
        for args in (["submit", str(job), "--backend", "local"], ["submit", str(job), "--backend", "slurm"]):
            r = run(*args, env={**env, **_sbatch_env(tmp_path)})
            _clean(r)
            assert r.returncode == 2 and f"HALO_SCHED_HOME: '{home}' cannot be written" in r.stderr, r.stderr
            assert "4242" not in r.stdout  # nothing was submitted
        for args in (["list"], ["list", "--json"], ["export"], ["export", "--json"], ["nodes"], ["status", "x"]):
            r = run(*args, env=env)
            _clean(r)
            assert r.returncode in (0, 2) and "cannot be written" not in r.stderr, (args, r.stderr)
        assert json.loads(run("nodes", "--json", env=env).stdout) == []
    assert os.listdir(home) == []


def _finished_local_job(job_id: str, submitted: float) -> None:
    """A local job that ended (no process behind it): its directory and its record."""
    from halo_sched.backends.local import state_root

    d = state_root() / job_id
    d.mkdir(parents=True)
    (d / "state.json").write_text('{"state": "COMPLETED", "exit_code": 0}')
    (d / "job.json").write_text('{"nodes": 1}')
    (d / "job.log").write_text("[node 0] hello\n")
    records.write({"id": job_id, "backend": "local", "submitted": submitted, "nodes": 1, "nproc_per_node": 1,
                   "name": "t", "spec": {"slurm": {}, "notify": {"webhook_env": "HOOK", "on": ["completed"]}},
                   "last_state": {"status": "RUNNING", "describe": "RUNNING", "at": submitted}})


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_store_the_user_cannot_write_serves_every_read(what):
    from halo_sched import db, ledger, store

    home = store.home()
    _finished_local_job("done-1", 10.0)  # its state is new to the store: a read would record it
    _rec("old-1", 5.0)
    ledger.add("h1", "NCCL network error", "old-1", "slurm")
    db.connection().close()  # as a command leaves it: no -wal or -shm beside it
    db._local.con = None
    assert not (home / "halo-sched.db-wal").exists()
    with read_only(home / "halo-sched.db" if what == "file" else home):
        for args in (["list"], ["list", "--json"], ["list", "--limit", "0"], ["status", "done-1", "old-1"],
                     ["status", "--json", "done-1"], ["export"], ["export", "--json"], ["nodes"], ["nodes", "--json"],
                     ["logs", "done-1"]):
            r = run(*args, env={"HOOK": "http://127.0.0.1:9/"})
            _clean(r)
            assert r.returncode == 0, (args, r.stderr)
            assert "is read-only here" in r.stderr and "readonly database" not in r.stderr, (args, r.stderr)
        listed = run("list").stdout
        assert "done-1\tlocal" in listed and "COMPLETED" in listed and "old-1\tlocal" in listed, listed
        assert [e["host"] for e in json.loads(run("nodes", "--json").stdout)] == ["h1"]
        # What must write is refused, naming where, exit 2.
        r = run("nodes", "clear", "h1")
        _clean(r)
        assert r.returncode == 2 and "cannot be written" in r.stderr and "HALO_SCHED_HOME" in r.stderr, r.stderr
    # Nothing was recorded meanwhile: the state the reads saw is kept by the first that can write.
    assert records.find("done-1", "local")[0]["last_state"]["status"] == "RUNNING"
    assert "COMPLETED" in run("list").stdout
    assert records.find("done-1", "local")[0]["last_state"]["status"] == "COMPLETED"


def test_nodes_json_prints_json_on_an_empty_ledger():
    r = run("nodes", "--json")  # no store at all
    _clean(r)
    assert r.returncode == 0 and json.loads(r.stdout) == []
    _rec("a", 1.0)  # a store, no ledger entry
    assert json.loads(run("nodes", "--json").stdout) == []
    from halo_sched import ledger

    ledger.add("h1", "NCCL network error", "a", "slurm")
    assert [e["host"] for e in json.loads(run("nodes", "--json").stdout)] == ["h1"]


# ---- item 1: the history is private to its owner ------------------------------------------------


def _mode(p: Path) -> int:
    return os.lstat(p).st_mode & 0o7777


def test_a_new_home_and_its_store_are_private_from_the_first_submit(tmp_path):
    from halo_sched import store

    home = store.home()
    assert not home.exists()
    r = run("submit", str(example_job(tmp_path, 29555)), "--backend", "slurm", env=_sbatch_env(tmp_path))
    _clean(r)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "4242", r.stderr
    assert "open to other users" not in r.stderr  # made private, not repaired
    assert _mode(home) == 0o700 and _mode(home / "halo-sched.db") == 0o600
    for p in home.rglob("*"):
        assert _mode(p) & 0o077 == 0, (p, oct(_mode(p)))
    assert "open to other users" not in run("list").stderr


def test_a_home_an_earlier_release_left_open_is_made_private_once_and_said(tmp_path):
    from halo_sched import store

    home = store.home()
    _rec("a", 1.0)
    (home / "rendered").mkdir()
    (home / "rendered" / "a@local.rendered").write_text("#!/bin/bash\n")
    (home / "local" / "j1").mkdir(parents=True)
    (home / "local" / "j1" / "entry.sh").write_text("#!/bin/bash\n")
    (home / "local" / "j1" / "entry.sh").chmod(0o755)
    (home / "outside").symlink_to(tmp_path)  # a link is not followed: what it names is not ours to change
    tmp_path.chmod(0o755)
    home.chmod(0o755)
    (home / "halo-sched.db").chmod(0o644)
    for p in home.rglob("*"):
        if not p.is_symlink() and p.is_dir():
            p.chmod(0o755)
    r = run("list")
    _clean(r)
    assert r.returncode == 0 and "a\tlocal" in r.stdout
    said = [line for line in r.stderr.splitlines() if "was open to other users" in line]
    assert len(said) == 1 and "HALO_SCHED_HOME" in said[0] and "the directory 0755" in said[0], r.stderr
    assert _mode(home) == 0o700 and _mode(home / "halo-sched.db") == 0o600
    assert _mode(home / "local" / "j1" / "entry.sh") == 0o700 and _mode(home / "rendered") == 0o700
    for p in home.rglob("*"):
        if not p.is_symlink():
            assert _mode(p) & 0o077 == 0, (p, oct(_mode(p)))
    assert _mode(tmp_path) == 0o755  # behind the link: untouched
    assert "open to other users" not in run("list").stderr  # once: now it is private


def test_a_store_file_left_open_in_a_private_home_is_made_private():
    from halo_sched import store

    home = store.home()
    _rec("a", 1.0)
    home.chmod(0o700)
    (home / "halo-sched.db").chmod(0o664)
    r = run("status", "a")
    _clean(r)
    assert "halo-sched.db 0664" in r.stderr and _mode(home / "halo-sched.db") == 0o600, r.stderr


def test_the_ranks_of_a_local_job_are_not_told_where_the_failure_key_is(tmp_path):
    """The key lives in the store and in the supervisor's environment; a rank's environment names
    neither the key nor the store, and no file under a path it is told holds the key."""
    from halo_sched import store

    dump = tmp_path / "rank-env"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # A stand-in torchrun (this test needs no torch): it writes the environment a rank would get.
    write_tool(bindir, "torchrun", f"#!/bin/sh\nenv -0 > {dump}\nexit 0\n")
    job = example_job(tmp_path, 29555, nodes=1, nproc_per_node=1, setup=[f'export PATH="{bindir}:$PATH"'])
    r = run("submit", str(job), "--backend", "local", "--wait", "--quiet", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.splitlines()[-1]
    key = records.failure_key(job_id, "local")
    assert len(key) == 64
    env = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
    assert env.get("HALO_LOCAL_JOB") == str(store.home() / "local" / job_id)  # the job's tag, as before
    assert "HALO_SCHED_HOME" not in env and "HALO_FAILURE_KEY" not in env
    assert not any(key in v for v in env.values())
    told = {Path(v) for v in env.values() if v.startswith("/") and Path(v).exists() and str(store.home()) in v}
    assert told, env
    for top in told:
        for p in ([top] if top.is_file() else list(top.rglob("*"))):
            if p.is_file() and not p.is_symlink():
                assert key.encode() not in p.read_bytes(), p
    kept = b"".join(p.read_bytes() for p in store.home().glob("halo-sched.db*"))
    assert key.encode() in kept  # where it is kept


def test_a_shared_or_foreign_home_is_never_changed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    r = run("list", env={"HALO_SCHED_HOME": str(shared)})
    _clean(r)
    assert r.returncode == 2 and "HALO_SCHED_HOME" in r.stderr and "shared directory" in r.stderr, r.stderr
    assert _mode(shared) == 0o1777
    if os.geteuid() != 0:
        return  # only root can give a directory to another user
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 65534, 65534)
    r = run("list", env={"HALO_SCHED_HOME": str(foreign)})
    _clean(r)
    assert r.returncode == 0 and "belongs to uid 65534" in r.stderr and _mode(foreign) == 0o755, r.stderr


# ---- item 9: a long history streams ------------------------------------------------------------


class _Probe:
    """stdout that notes how many records had been read when the first line came."""

    def __init__(self, reads: list[int]):
        self.reads, self.at_first, self.text = reads, None, []

    def write(self, s: str) -> int:
        if self.at_first is None and s.strip():
            self.at_first = self.reads[0]
        self.text.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _many(n: int) -> None:
    from halo_sched import db

    with db.write() as con:
        for i in range(n):
            records._put(con, {"id": f"m{i:05d}", "backend": "local", "submitted": float(i), "name": "m",
                               "last_state": {"status": "COMPLETED", "describe": "COMPLETED exit=0"}})


@pytest.mark.parametrize("args", [["list", "--limit", "0"], ["list", "--limit", "0", "--json"], ["export"],
                                  ["export", "--json"]])
def test_a_long_history_streams_its_first_line_before_the_rest_is_read(monkeypatch, args):
    """Structural, never a clock: the first line is written after at most one batch of records
    was read (not after all of them), and every record is still there, newest first."""
    from halo_sched import cli

    n = 1207  # a first page of 50, then batches of 500 (halo_sched/core.py) and a short last one
    _many(n)
    reads = [0]
    real = records._row

    def counted(row, on_bad):
        reads[0] += 1
        return real(row, on_bad)

    monkeypatch.setattr(records, "_row", counted)
    probe = _Probe(reads)
    monkeypatch.setattr(sys, "stdout", probe)
    assert cli.main(args) == 0
    assert reads[0] == n, reads
    assert probe.at_first is not None and probe.at_first <= 500, (probe.at_first, n)
    out = "".join(probe.text)
    if args == ["export", "--json"]:
        doc = json.loads(out)
        ids = [j["id"] for j in doc["jobs"]]
        assert doc["schema"] == db.SCHEMA_VERSION and doc["ledger"] == [] and doc["notifications"] == []
    elif args[0] == "export" or "--json" in args:
        ids = [json.loads(line)["id"] for line in out.splitlines()]
    else:
        ids = [line.split("\t")[0] for line in out.splitlines()]
    assert ids == [f"m{i:05d}" for i in reversed(range(n))]


def test_an_attempt_found_while_a_long_list_streams_is_listed_once(monkeypatch, capsys):
    """A run's attempt that a later batch's failed attempt submitted itself (recorded now, after
    the stream's snapshot) is shown with that batch, once; one found in the first batch is read
    again with it, as a plain `list` does."""
    from halo_sched import cli, runs

    _many(1207)
    calls = []

    def followed(rows, scheduler):
        calls.append(len(rows))
        if len(calls) in (1, 3):  # the first batch (50), then the third (after 50 + 500 rows)
            job = f"succ-{len(calls)}"
            _rec(job, 5000.0 + len(calls))
            return [("local", job)]
        return []

    monkeypatch.setattr(runs, "_followed", followed)  # the listing list and halo_sched.list() share
    assert cli.main(["list", "--limit", "0"]) == 0
    ids = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert ids.count("succ-1") == 1 and ids.count("succ-3") == 1 and len(ids) == 1209, ids[:5]
    assert ids[0] == "succ-1" and ids.index("succ-3") == 550  # read again at the top; at the head of its batch
