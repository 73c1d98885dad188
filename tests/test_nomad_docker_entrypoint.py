"""Docker tasks run halo-sched's script whatever the image's own ENTRYPOINT: the rendered job
sets ``entrypoint = ["/bin/bash"]`` and passes the script as ``args`` (no ``command``), trainer
and server groups alike. Run in the client simulator (tests/nomad/client_sim.py), which composes
the container's argv as the docker driver does (drivers/docker/driver.go v2.0.5:1053,
1477-1491) from a stand-in image whose entrypoint ignores its arguments and exits 0."""
from __future__ import annotations

import os
import stat
import sys

import halo_sched.spec  # the module itself: `import halo_sched` loads it lazily, on first use
from halo_sched.backends.nomad.render import job_payload
from helpers import REPO, free_port, job_variable, load_nomad_helper

client_sim = load_nomad_helper("client_sim")
SERVER = str(REPO / "tests" / "servers" / "rollout_server.py")


def test_docker_argv_composition():
    image = client_sim.StandInImage(entrypoint=["/init"], cmd=["serve"])
    argv = client_sim.docker_argv
    # command/args go into the Cmd only: the image's entrypoint still runs first.
    assert argv({"command": "/bin/bash", "args": ["s.sh"]}, image) == ["/init", "/bin/bash", "s.sh"]
    assert argv({"args": ["s.sh"]}, image) == ["/init", "s.sh"]
    assert argv({}, image) == ["/init", "serve"]
    # A task entrypoint replaces the image's, and its CMD with it.
    assert argv({"entrypoint": ["/bin/bash"], "args": ["s.sh"]}, image) == ["/bin/bash", "s.sh"]
    assert argv({"entrypoint": ["/bin/bash"]}, image) == ["/bin/bash"]


def _spec(tmp_path):
    port = free_port()
    return halo_sched.spec.JobSpec.model_validate({
        "name": "dk-sim", "nodes": 1, "nproc_per_node": 1, "gpus_per_node": 1,
        "image": "example/trainer:1",
        "trainer": {"script": "/workspace/train.py"},
        "rendezvous": {"port": free_port(), "timeout_s": 30},
        "nomad": {"driver": "docker"},
        "servers": [{"name": "gen", "nodes": 1, "port": port, "image": "example/vllm:1",
                     "command": [sys.executable, SERVER, "--port", str(port), "--delay", "0",
                                 "--record-dir", str(tmp_path / "rec")]}],
    })


def _images(tmp_path):
    """Both stand-in images swallow whatever Cmd they get; their PATH has a stand-in torchrun
    that says it ran (the trainer's world is not what this test is about)."""
    bin_dir = tmp_path / "image-bin"
    bin_dir.mkdir()
    torchrun = bin_dir / "torchrun"
    torchrun.write_text("#!/bin/sh\necho \"stand-in torchrun ran: $*\"\n")
    torchrun.chmod(torchrun.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    return {name: client_sim.StandInImage(entrypoint=list(client_sim.SWALLOWING_ENTRYPOINT), env=env)
            for name in ("example/trainer:1", "example/vllm:1")}


def test_docker_trainer_and_server_run_the_script_under_a_swallowing_image_entrypoint(tmp_path):
    job = job_payload(_spec(tmp_path))["Job"]
    assert [g["Name"] for g in job["TaskGroups"]] == ["trainer", "server-gen"]
    with client_sim.SimCluster(job, tmp_path / "nomad", docker_images=_images(tmp_path), variables=job_variable(job)) as cluster:
        assert any("devices" in u for u in cluster.unsimulated)  # nvidia/gpu: noted, not provided
        cluster.place()
        cluster.start()
        codes = cluster.wait(timeout=90)
        logs = {n: cluster.stdout(n) + cluster.stderr(n) for n in codes}
        argv = {a.group_name: a.tasks[next(iter(a.tasks))].argv for a in cluster.allocations}
    for name, text in logs.items():
        assert "image entrypoint" not in text, (name, text)
    assert argv["trainer"][0] == "/bin/bash" and argv["trainer"][1].endswith("/local/halo-entry.sh")
    assert argv["server-gen"][0] == "/bin/bash" and argv["server-gen"][1].endswith("/local/halo-server.sh")
    trainer = logs["dk-sim.trainer[0]"]
    assert "stand-in torchrun ran:" in trainer and "/workspace/train.py" in trainer, trainer
    # The server's own command ran (it records each start) and it ended after rank 0 did.
    assert os.listdir(tmp_path / "rec"), logs
    assert set(codes.values()) == {0}, logs


def test_the_nomad_gpu_example_runs_in_the_simulator_with_docker_and_devices(tmp_path):
    """examples/nomad-gpu.yaml as rendered (docker, 8 GPUs, EFA devices, shm, a host volume):
    both nodes run the entry script under swallowing stand-in images; what a container would add
    is listed, not silently dropped."""
    spec = halo_sched.load(REPO / "examples" / "nomad-gpu.yaml")
    job = job_payload(spec.model_copy(update={"rendezvous": spec.rendezvous.model_copy(update={"timeout_s": 60})}))["Job"]
    images = _images(tmp_path)
    # The stand-in torchrun stays up a little: node rank 1 reads rank 0's registration first.
    torchrun = tmp_path / "image-bin" / "torchrun"
    torchrun.write_text("#!/bin/sh\necho \"stand-in torchrun ran: $*\"\nsleep 3\n")
    images = {spec.image: images["example/trainer:1"]}
    with client_sim.SimCluster(job, tmp_path / "nomad", docker_images=images) as cluster:
        assert {u.rsplit(": ", 1)[-1].split(" (")[0] for u in cluster.unsimulated} >= {
            "docker ulimit", "docker shm_size", "docker devices", "docker volumes", "devices"}
        cluster.place()
        cluster.start()
        codes = cluster.wait(timeout=120)
        logs = {n: cluster.stdout(n) + cluster.stderr(n) for n in codes}
    assert set(codes.values()) == {0}, logs
    for name, text in logs.items():
        assert "image entrypoint" not in text and "stand-in torchrun ran:" in text, (name, text)
