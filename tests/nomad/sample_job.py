"""A hand-written halo-sched Nomad job payload, in the shape the renderer produces.

Tests of the client, the status mapping and the fake API use this instead of the renderer so that
they do not depend on it: one group ``trainer`` (Count N; allocation ``JOB.trainer[K]`` is node
rank K; each reserves the rendezvous port and registers a Nomad-native service tagged with its
index); no restarts, no rescheduling, ``disconnect { lost_after = "169h", replace = false }``,
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
    resources: dict[str, Any] = {"CPU": cpu_mhz, "MemoryMB": memory_mb}
    if gpus:
        resources["Devices"] = [{"Name": "nvidia/gpu", "Count": gpus}]
    config: dict[str, Any] = {"command": args[0], "args": args[1:]}
    if driver == "docker":
        config = {"image": "halo/train:latest", "command": args[0], "args": args[1:], "network_mode": "host"}
    env = {"HALO_NODE_RANK": "${NOMAD_ALLOC_INDEX}"}
    group: dict[str, Any] = {
        "Name": "trainer",
        "Count": n_nodes,
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
    group["Networks"] = [{"Mode": "host", "ReservedPorts": [{"Label": "rdzv", "Value": rdzv_port}]}]
    group["Services"] = [{"Name": f"{job_id}-rdzv", "Provider": "nomad", "PortLabel": "rdzv",
                          "Tags": ["halo-index-${NOMAD_ALLOC_INDEX}"]}]
    job: dict[str, Any] = {
        "ID": job_id,
        "Name": job_id,
        "Type": "batch",
        "Datacenters": list(datacenters),
        "Constraints": [{"LTarget": "", "Operand": "distinct_hosts", "RTarget": "true"}],
        "Meta": {"halo_sched_nodes": str(n_nodes)},
        "TaskGroups": [group],
    }
    if namespace:
        job["Namespace"] = namespace
    if region:
        job["Region"] = region
    return {"Job": job}


# halo-sched itself only creates jobs, exactly once (NomadClient.submit_job, which wants a
# submission token). The tests also register, update, read and list jobs freely, as ``nomad job
# run``/``status`` would; these go through the client's own transport, so they carry its token,
# namespace, region and TLS settings and are retried as its reads are.


def register(client, payload: dict) -> dict:
    """``POST /v1/jobs``: register or update a job. Nomad's answer: EvalID, JobModifyIndex, ..."""
    body = client._with_scope(payload)
    return client._call(f"register job {body['Job']['ID']!r}", client._request, "POST", "/v1/jobs", json=body)


def read_job(client, job_id: str) -> dict | None:
    """``GET /v1/job/:id``: the job, or None when Nomad does not know it."""
    from halo_sched.backends.nomad.client import NomadAPIError

    try:
        return client._call(f"read job {job_id!r}", client._read_job, job_id)
    except NomadAPIError as exc:
        if exc.status == 404:
            return None
        raise


def list_jobs(client, prefix: str | None = None) -> list[dict]:
    """``GET /v1/jobs``: job stubs whose ID starts with ``prefix``."""
    return client._call("list jobs", client._request, "GET", "/v1/jobs",
                        params={"prefix": prefix} if prefix else None) or []
