"""A hand-written halo-sched Nomad job payload, in the shape the renderer produces.

Tests of the client, the status mapping and the fake API use this instead of the renderer so that
they do not depend on it: group ``node-0`` (Count 1, node rank 0, reserving the rendezvous port and
registering a Nomad-native service) and, for N > 1, group ``workers`` (Count N-1; allocation
``JOB.workers[K]`` is node rank K+1); no restarts, no rescheduling, ``disconnect { lost_after = "169h", replace = false }``,
``distinct_hosts``, GPUs requested as ``nvidia/gpu`` devices.
"""
from __future__ import annotations

from typing import Any, Sequence

RDZV_PORT = 29500
NS_PER_S = 1_000_000_000


def make_job(
    n_nodes: int,
    gpus: int = 8,
    *,
    job_id: str = "halo-test",
    namespace: str | None = "default",
    datacenters: Sequence[str] = ("dc1",),
    region: str | None = None,
    cpu_mhz: int = 8000,
    memory_mb: int = 65536,
    driver: str = "raw_exec",
    max_run_duration_s: float | None = None,
    rdzv_port: int = RDZV_PORT,
    command: Sequence[str] = ("torchrun", "--nnodes", "{n}", "--nproc_per_node", "{g}", "train.py"),
) -> dict[str, Any]:
    """``{"Job": {...}}`` for an ``n_nodes`` x ``gpus`` torchrun job."""
    if n_nodes < 1:
        raise ValueError("n_nodes must be >= 1")
    args = [part.format(n=n_nodes, g=gpus) for part in command]
    groups = []
    for rank in range(min(n_nodes, 2)):  # rank 1 stands for the whole workers group
        resources: dict[str, Any] = {"CPU": cpu_mhz, "MemoryMB": memory_mb}
        if gpus:
            resources["Devices"] = [{"Name": "nvidia/gpu", "Count": gpus}]
        config: dict[str, Any] = {"command": args[0], "args": args[1:]}
        if driver == "docker":
            config = {"image": "halo/train:latest", "command": args[0], "args": args[1:], "network_mode": "host"}
        env = ({"HALO_NODE_RANK": "0"} if rank == 0 else
               {"HALO_NODE_RANK": "${NOMAD_ALLOC_INDEX}", "HALO_NODE_RANK_OFFSET": "1"})
        group: dict[str, Any] = {
            "Name": "node-0" if rank == 0 else "workers",
            "Count": 1 if rank == 0 else n_nodes - 1,
            "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Interval": 24 * 3600 * NS_PER_S, "Delay": 15 * NS_PER_S},
            "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
            # As rendered without max_run_duration: a week plus an hour (render.lost_after_ns).
            "Disconnect": {"LostAfter": 169 * 3600 * NS_PER_S, "Replace": False},
            "Tasks": [{
                "Name": "torchrun",
                "Driver": driver,
                "Config": config,
                "Env": {**env, "HALO_NNODES": str(n_nodes)},
                "Resources": resources,
            }],
        }
        if max_run_duration_s is not None:
            group["MaxRunDuration"] = int(max_run_duration_s * NS_PER_S)
        if rank == 0:
            group["Networks"] = [{"Mode": "host", "ReservedPorts": [{"Label": "rdzv", "Value": rdzv_port}]}]
            group["Services"] = [{"Name": f"{job_id}-rdzv", "Provider": "nomad", "PortLabel": "rdzv"}]
        groups.append(group)
    job: dict[str, Any] = {
        "ID": job_id,
        "Name": job_id,
        "Type": "batch",
        "Datacenters": list(datacenters),
        "Constraints": [{"LTarget": "", "Operand": "distinct_hosts", "RTarget": "true"}],
        "Meta": {"halo_sched_nodes": str(n_nodes)},
        "TaskGroups": groups,
    }
    if namespace:
        job["Namespace"] = namespace
    if region:
        job["Region"] = region
    return {"Job": job}
