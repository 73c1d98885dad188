"""A non-root task reads its secret, end to end: halo-sched renders and submits the job (the
fake Nomad API holds its Variable), the client simulator runs the allocations the fake places
(tests/nomad/client_sim.py, attached) as Nomad 2.0.5 would: templates rendered with their
``perms`` and, only when ``uid``/``gid`` are set, chowned (client/allocrunner/taskrunner/
template/template.go:820-826); the task directory's modes (client/allocdir); the process run as
the task's user (docker ``user`` or the image's USER, drivers/docker/driver.go:1055; exec:
``nobody`` unless ``user`` is set, drivers/exec/driver.go:472-474).

The stand-in torchrun records who ran it and a digest of the secret it was handed, in a file:
no value reaches a log.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

import halo_sched.spec
from halo_sched.backends.base import JobStatus
from halo_sched.backends.nomad import NomadScheduler
from halo_sched.backends.nomad.client import NomadClient, NomadConfig
from helpers import free_port, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
client_sim = load_nomad_helper("client_sim")
FakeNomad, FakeNode = fake_api.FakeNomad, fake_api.FakeNode
TOKEN = "t0ken-su"
VALUE = "hf-" + "7c2e91d0" + " it's $(x) {{ .y }}"
IMAGE = "example/trainer:1"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a task as another user and "
                                                          "chowning its files needs root, as on a Nomad client")


@pytest.fixture
def open_dir():
    """The simulator's data dir where any user may pass (pytest's tmp_path lies under 0700)."""
    d = Path(tempfile.mkdtemp(prefix="halo-secret-user-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _stand_ins(d: Path) -> tuple[Path, Path]:
    """A PATH dir with a stand-in torchrun, and the report dir it writes to (any user may)."""
    bin_dir, report = d / "bin", d / "report"
    bin_dir.mkdir()
    report.mkdir()
    os.chmod(report, 0o777)
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(
        "#!/bin/sh\n"
        f'{{ echo "$(id -u):$(id -g)"; printf "%s" "$HF_TOKEN" | sha256sum | cut -d" " -f1; }} > {report}/ran\n'
    )
    torchrun.chmod(0o755)
    return bin_dir, report


def _spec(nomad: dict):
    return halo_sched.spec.JobSpec.model_validate({
        "name": "secret-user", "nodes": 1, "nproc_per_node": 1,
        **({"image": IMAGE} if nomad["driver"] == "docker" else {}),
        "trainer": {"script": "/workspace/train.py"},
        "secret_env": ["HF_TOKEN"],
        "rendezvous": {"port": free_port(), "timeout_s": 30},
        "nomad": nomad,
    })


def _run(monkeypatch, d: Path, nomad: dict, image_user: str = ""):
    """Submit through the fake API with the simulator attached; wait for the job to end.
    Returns (status, the task run, its stderr, the report dir)."""
    monkeypatch.setenv("HF_TOKEN", VALUE)
    bin_dir, report = _stand_ins(d)
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    images = {IMAGE: client_sim.StandInImage(env={"PATH": path}, user=image_user)}
    host_env = {"PATH": path, "LANG": "C.UTF-8"}  # the agent's own (non-image drivers get it)
    with FakeNomad([FakeNode("n0", gpus=0)], token=TOKEN) as fake:
        sched = NomadScheduler(client=NomadClient(NomadConfig(address=fake.address, token=TOKEN, retry_attempts=1)))
        dry = sched.dryrun(_spec(nomad))
        with client_sim.SimCluster(dry.payload["Job"], d / "nomad", docker_images=images, host_env=host_env,
                                   exec_as_raw_exec=True) as cluster:
            fake.attach_sim(cluster)
            job_id = sched.schedule(dry)
            deadline = time.monotonic() + 60
            while fake.job_record(job_id)["Status"] != "dead" and time.monotonic() < deadline:
                sched.query([job_id])
                time.sleep(0.3)
            status = sched.query([job_id])[job_id].status
            alloc = cluster.alloc(f"{job_id}.trainer[0]")
            tr = alloc.tasks["torchrun"]
            secret = Path(tr.dir) / "secrets" / "halo-secret-HF_TOKEN"
            st = secret.stat()
            return status, tr, cluster.stderr(alloc.name), report, (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))


def _ran(report: Path) -> tuple[str, str]:
    ids, digest = (report / "ran").read_text().split()
    return ids, digest


def test_docker_task_with_nomad_user_runs_as_it_and_reads_its_secret(monkeypatch, open_dir):
    # The image's USER is someone else: the task's user replaces it (driver.go:1055).
    status, tr, err, report, owner = _run(monkeypatch, open_dir, {"driver": "docker", "user": "1000:1000"},
                                          image_user="4242:4242")
    assert status is JobStatus.COMPLETED, err
    assert _ran(report) == ("1000:1000", hashlib.sha256(VALUE.encode()).hexdigest()), err
    assert tr.spec["User"] == "1000:1000"
    assert owner == (1000, 1000, 0o400), owner  # chmod 0400, then chown to the template's uid/gid
    assert (tr.user.uid, tr.user.gid) == (1000, 1000), tr.events
    assert "7c2e91d0" not in err


def test_docker_image_user_without_nomad_user_cannot_read_and_is_told_so(monkeypatch, open_dir):
    # No nomad.user: no task User, no template uid/gid: the file stays the agent's (root's), 0400;
    # the container runs as the image's USER.
    status, tr, err, report, owner = _run(monkeypatch, open_dir, {"driver": "docker"}, image_user="1000:1000")
    assert "User" not in tr.spec
    assert owner == (0, 0, 0o400), owner
    assert (tr.user.uid, tr.user.gid) == (1000, 1000), tr.events
    assert status is JobStatus.FAILED
    assert ("secret HF_TOKEN (secret_env) is there but this task's user (uid 1000, gid 1000) cannot read it" in err
            and "owner uid:gid 0:0 and mode 400" in err and "nomad.user" in err), err
    assert "missing" not in err, err
    assert not (report / "ran").exists()


def test_exec_task_runs_as_nobody_and_reads_its_secret_rendered_for_nobody(monkeypatch, open_dir):
    nobody = pwd.getpwnam("nobody")
    ids = f"{nobody.pw_uid}:{nobody.pw_gid}"
    status, tr, err, report, owner = _run(monkeypatch, open_dir, {"driver": "exec", "user": ids})
    assert status is JobStatus.COMPLETED, err
    ran_ids, digest = _ran(report)
    assert ran_ids.split(":")[0] == str(nobody.pw_uid) and digest == hashlib.sha256(VALUE.encode()).hexdigest(), err
    assert "User" not in tr.spec  # exec takes a host user name; none given: nobody (exec/driver.go:472)
    assert owner == (nobody.pw_uid, nobody.pw_gid, 0o400), owner
    assert tr.user.uid == nobody.pw_uid and tr.env["USER"] == "nobody", tr.events


def _raw_exec_job(user: str | None) -> dict:
    task = {"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sh", "args": ["-c", "id -u; id -g; id -G"]}}
    if user is not None:
        task["User"] = user
    return {"ID": "who", "Name": "who", "Type": "batch", "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}]}


@pytest.mark.parametrize("user", [None, "nobody"])
def test_raw_exec_runs_as_the_agent_unless_user_is_set(open_dir, user):
    """raw_exec: the agent's user (root) by default; ``user`` goes through the universal
    executor's setCmdUser (executor_unix.go:61-106 v2.0.5): uid, primary gid, and the user's groups
    behind one 0 per group (``make`` with a length, then ``append``)."""
    with client_sim.SimCluster(_raw_exec_job(user), open_dir / "nomad", host_env={"PATH": "/usr/bin:/bin"}) as cluster:
        cluster.place()
        cluster.start()
        assert cluster.wait(timeout=30) == {"who.g[0]": 0}
        uid, gid, groups = cluster.stdout("who.g[0]").splitlines()
        env = cluster.alloc("who.g[0]").tasks["t"].env
    if user is None:
        assert (uid, gid) == ("0", "0") and "USER" not in env
    else:
        nobody = pwd.getpwnam("nobody")
        assert (uid, gid) == (str(nobody.pw_uid), str(nobody.pw_gid))
        assert set(groups.split()) == {"0", str(nobody.pw_gid)}, groups
        assert (env["USER"], env["HOME"]) == ("nobody", nobody.pw_dir)
