"""The client settings a Nomad job needs to start its tasks (drivers, docker volumes, privileged
and namespace modes, the nvidia device plugin and runtime), each with how a node shows it: read
from the job's API payload; ``plan`` checks them on the nodes (plan.py) and ``render`` lists
those a default client lacks (render.client_requirements)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ClientNeed:
    """One client setting a job needs, and how a node shows it (``GET /v1/nodes?resources=true``:
    each NodeListStub carries ``Drivers`` — per driver Detected, Healthy and the attributes its
    fingerprint set (structs.DriverInfo, nomad/structs/node.go:355; client/node_updater.go:248@v2.0.5)
    — and ``NodeResources.Devices``).

    ``check(node)`` is True/False for a node, or None where the API shows nothing about it
    ("unverifiable"); ``applies(node)`` picks the nodes that must have it (those that could run the
    task otherwise). ``default`` is True for what a default 2.0.x client already has."""

    option: str  # the job option that needs it
    setting: str  # the client's setting, as its configuration says it
    shown_by: str  # where a node shows it, or why nothing shows it
    check: Callable[[dict], bool] | None
    applies: Callable[[dict], bool]
    default: bool = False

    @property
    def line(self) -> str:
        return f"{self.option}: {self.setting}"


def _driver(node: dict, name: str) -> dict:
    return (node.get("Drivers") or {}).get(name) or {}


def _driver_ok(name: str) -> Callable[[dict], bool]:
    return lambda node: bool(_driver(node, name).get("Detected") and _driver(node, name).get("Healthy"))


def _docker_attr(name: str) -> Callable[[dict], str]:
    return lambda node: (_driver(node, "docker").get("Attributes") or {}).get(name, "")


def _has_nvidia_gpus(node: dict) -> bool:
    # The nvidia device plugin fingerprints each GPU model as a device group (Vendor "nvidia",
    # Type "gpu"); the job asks for "nvidia/gpu" (nomad/structs/devices.go, v2.0.5).
    devices = ((node.get("NodeResources") or {}).get("Devices")) or []
    return any(d.get("Vendor") == "nvidia" and d.get("Type") == "gpu" and d.get("Instances") for d in devices)


def _anywhere(node: dict) -> bool:
    return True


#: The namespace modes the docker driver refuses since 2.0.4 unless the client lists them in
#: ``allowed_modes`` (drivers/docker/driver.go:1365-1384 validateNamespace, config.go:325-326@v2.0.5).
_DOCKER_MODES = (("ipc_mode", "ipc"), ("pid_mode", "pid"), ("uts_mode", "uts"), ("userns_mode", "userns"))


def client_needs(job: dict) -> list[ClientNeed]:
    """Every client setting the job (the API payload's ``Job``) needs to start its tasks, read
    from what the job asks: drivers, docker host volumes, privileged mode and namespace modes,
    and for GPU docker tasks the nvidia device plugin and Docker's ``nvidia`` runtime. ``nomad job
    plan`` checks none of the docker plugin's settings; a task fails at start on a client without."""
    tasks = [t for g in job.get("TaskGroups") or [] for t in g.get("Tasks") or []]
    needs: list[ClientNeed] = []
    for driver in sorted({t.get("Driver") for t in tasks if t.get("Driver")}):
        if driver == "raw_exec":
            # raw_exec is off unless enabled (drivers/rawexec/driver.go:84-87@v2.0.5: enabled defaults to false).
            setting = 'plugin "raw_exec" { config { enabled = true } }'
        else:
            setting = f"the {driver} driver detected and healthy (on by default)"
        needs.append(ClientNeed(f"nomad.driver {driver}", setting, f"Drivers.{driver}.Detected/Healthy",
                                _driver_ok(driver), _anywhere, default=driver != "raw_exec"))
    docker = [t for t in tasks if t.get("Driver") == "docker"]
    on_docker = _driver_ok("docker")
    if any(any(str(v).split(":", 1)[0].startswith("/") for v in (t.get("Config") or {}).get("volumes") or [])
           for t in docker):
        # drivers/docker/driver.go: "volumes are not enabled; cannot mount host path" for any bind
        # source outside the allocation dir unless the plugin's volumes.enabled is true; the
        # fingerprint says so (drivers/docker/fingerprint.go:140-142@v2.0.5).
        needs.append(ClientNeed(
            "nomad.volumes", 'the docker plugin must allow host bind mounts: plugin "docker" { config { volumes { '
            'enabled = true } } }', "attribute driver.docker.volumes.enabled",
            lambda node: _docker_attr("driver.docker.volumes.enabled")(node) == "true", on_docker))
    if any((t.get("Config") or {}).get("privileged") for t in docker):
        needs.append(ClientNeed(
            "docker privileged", 'plugin "docker" { config { allow_privileged = true } }',
            "attribute driver.docker.privileged.enabled (fingerprint.go:132-134@v2.0.5)",
            lambda node: _docker_attr("driver.docker.privileged.enabled")(node) == "true", on_docker))
    for field, key in _DOCKER_MODES:
        modes = sorted({(t.get("Config") or {}).get(field) for t in docker} - {None, ""})
        if modes:
            needs.append(ClientNeed(
                f"docker {field}", f'plugin "docker" {{ config {{ allowed_modes {{ {key} = {json.dumps(modes)} }} }} }}',
                "no node attribute shows allowed_modes (drivers/docker/fingerprint.go@v2.0.5)",
                None, on_docker))
    if any(str(d.get("Name", "")).startswith("nvidia") for t in docker for d in (t.get("Resources") or {}).get("Devices") or []):
        # A GPU docker task: the device plugin sets NVIDIA_VISIBLE_DEVICES in the task's DeviceEnv,
        # and the driver then requires Docker's GPU runtime, named by the plugin's nvidia_runtime
        # ("nvidia" by default, drivers/docker/config.go:267-270), found in `docker info` at
        # fingerprint (fingerprint.go:172-183: d.gpuRuntime, attribute driver.docker.runtimes),
        # else the task fails at start: "requested docker runtime ... was not found"
        # (driver.go:1065-1068@v2.0.5); the runtime must also be in allow_runtimes (default
        # ["runc", "nvidia"], config.go:272-275; driver.go:1074-1076). The NVIDIA_VISIBLE_DEVICES
        # test: driver.go:80, 1065.
        needs.append(ClientNeed(
            "gpus_per_node (docker)", "the nvidia device plugin (nomad-device-nvidia) listing the GPUs",
            "NodeResources.Devices (Vendor nvidia, Type gpu)", _has_nvidia_gpus, on_docker))
        needs.append(ClientNeed(
            "gpus_per_node (docker)", "Docker's nvidia runtime (NVIDIA Container Toolkit), named as the plugin's "
            "nvidia_runtime (default nvidia)",
            "attribute driver.docker.runtimes",
            lambda node: "nvidia" in _docker_attr("driver.docker.runtimes")(node).split(","),
            lambda node: on_docker(node) and _has_nvidia_gpus(node)))
        needs.append(ClientNeed(
            "gpus_per_node (docker)", 'the runtime allowed: plugin "docker" { config { allow_runtimes } } '
            'includes "nvidia" (the default ["runc", "nvidia"] does)',
            "no node attribute shows allow_runtimes (drivers/docker/fingerprint.go@v2.0.5)",
            None, lambda node: on_docker(node) and _has_nvidia_gpus(node), default=True))
    return needs

