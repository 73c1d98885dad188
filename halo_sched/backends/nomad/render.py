"""JobSpec -> Nomad job (pure): the API payload ``{"Job": {...}}`` is the one model; the HCL
(``templates/nomad/job.nomad.hcl.j2``) is rendered from that same dict.

Shape, for N nodes: one group per node, ``node-0`` .. ``node-{N-1}``, each count 1 with a fixed
node rank (``NOMAD_ALLOC_INDEX`` is unique only within one job version, so it never decides a
rank). ``node-0`` reserves the rendezvous port and registers a Nomad-native service; the other
groups read it through a ``nomadService`` template that renders EMPTY until the service exists,
and the shared entry script polls that file with the rendezvous deadline.

User text reaches the task only inside the entry-script template, whose Go-template delimiters
are chosen absent from it, and which Nomad does not ``${}``-interpolate. Env and args carry only
names Nomad itself defines.
"""
from __future__ import annotations

import hashlib
import secrets
import time

from ...launch import MASTER_ADDR_FILE_VAR, MASTER_ADDR_VAR, NODE_RANK_VAR, entry_script
from ...errors import SpecError
from ...spec import JobSpec
from ...templating import render_template

TASK = "torchrun"
PORT_LABEL = "rdzv"
ENTRY_PATH = "local/halo-entry.sh"
MASTER_FILE = "local/halo-master-addr"
NODES_META = "halo_sched_nodes"


def group_name(rank: int) -> str:
    return f"node-{rank}"


def service_name(job_id: str) -> str:
    """The rendezvous service of one job: DNS-like (lower case, digits, '-'), at most 63
    characters, and distinct for distinct job ids (a hash keeps it so when the id is folded)."""
    base = "".join(c if c.isalnum() else "-" for c in job_id.lower()).strip("-") or "job"
    if base != job_id or len(base) > 58:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
        base = f"{base[:49].rstrip('-')}-{digest}"
    return f"{base}-rdzv"


def submission_id(spec: JobSpec) -> str:
    """A fresh job ID for each submission, like a SLURM job id: Nomad would otherwise treat a
    resubmitted file as the same job (not re-run when unchanged, replaced in place when changed)."""
    return f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _delimiters(text: str) -> tuple[str, str]:
    """Go-template delimiters that never occur in ``text``, so the entry renders byte-exact."""
    salt = 0
    while True:
        h = hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:8]
        left, right = f"[[halo-{h}", f"halo-{h}]]"
        if left not in text and right not in text:
            return left, right
        salt += 1


def master_template(job_id: str) -> str:
    # Instance 0 explicitly: during a redeploy two registrations of the service can overlap.
    return (
        f'{{{{ with nomadService "{service_name(job_id)}" }}}}'
        "{{ with index . 0 }}{{ .Address }}{{ end }}{{ end }}"
    )


def _task(spec: JobSpec, job_id: str, rank: int, entry: str) -> dict:
    nm = spec.nomad
    left, right = _delimiters(entry)
    templates = [{
        "EmbeddedTmpl": entry,
        "DestPath": ENTRY_PATH,
        "Perms": "0755",
        "ChangeMode": "noop",
        "LeftDelim": left,
        "RightDelim": right,
    }]
    env = {NODE_RANK_VAR: str(rank)}
    if rank == 0:
        env[MASTER_ADDR_VAR] = "${NOMAD_IP_%s}" % PORT_LABEL
    else:
        env[MASTER_ADDR_FILE_VAR] = "${NOMAD_TASK_DIR}/halo-master-addr"
        # noop: the file is rewritten when rank 0 registers; the entry script polls it.
        templates.append({"EmbeddedTmpl": master_template(job_id), "DestPath": MASTER_FILE, "ChangeMode": "noop"})

    args = ["${NOMAD_TASK_DIR}/halo-entry.sh"]
    if nm.driver == "docker":
        config: dict = {
            "image": spec.image,
            "command": "/bin/bash",
            "args": args,
            # torchrun and NCCL need the host's interfaces; the rendezvous port is a host port.
            "network_mode": "host",
            "ipc_mode": "host",
            # The docker driver's ulimit is a list(map(string)); an HCL block is a list of one.
            "ulimit": [{"memlock": "-1", "stack": "67108864"}],
        }
        if nm.shm_bytes is not None:
            config["shm_size"] = nm.shm_bytes
        if nm.volumes:
            config["volumes"] = list(nm.volumes)
        if spec.network.fabric == "efa":
            devices = ["/dev/infiniband"] + (["/dev/gdrdrv"] if spec.network.cross_node_expert_parallel else [])
            config["devices"] = [{"host_path": d, "container_path": d} for d in devices]
    else:
        config = {"command": "/bin/bash", "args": args}

    resources: dict = {"CPU": nm.cpu, "MemoryMB": nm.memory}
    if spec.gpus_per_node:
        resources["Devices"] = [{"Name": "nvidia/gpu", "Count": spec.gpus_per_node}]
    return {
        "Name": TASK,
        "Driver": nm.driver,
        "Config": config,
        "Env": env,
        "Templates": templates,
        "Resources": resources,
        "KillTimeout": 30_000_000_000,
    }


def _group(spec: JobSpec, job_id: str, rank: int, entry: str) -> dict:
    group: dict = {
        "Name": group_name(rank),
        "Count": 1,
        # A fixed-size torchrun world never re-forms around a replaced rank: no restarts, no reschedules.
        "RestartPolicy": {"Attempts": 0, "Mode": "fail", "Interval": 86_400_000_000_000, "Delay": 15_000_000_000},
        "ReschedulePolicy": {"Attempts": 0, "Interval": 0, "Unlimited": False},
        "Meta": {"halo_node_rank": str(rank)},
        "Tasks": [_task(spec, job_id, rank, entry)],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = spec.nomad.max_run_duration_ns
    if rank == 0:
        group["Networks"] = [{
            "Mode": "host",
            "ReservedPorts": [{"Label": PORT_LABEL, "Value": spec.rendezvous.port}],
        }]
        group["Services"] = [{"Name": service_name(job_id), "Provider": "nomad", "PortLabel": PORT_LABEL}]
    else:
        group["Networks"] = [{"Mode": "host"}]
    return group


def job_payload(spec: JobSpec, job_id: str | None = None) -> dict:
    """The API payload for ``PUT /v1/jobs`` (and ``/v1/job/<id>/plan``). ``job_id`` defaults to
    the job's name (what ``render`` shows); ``submit`` passes a fresh :func:`submission_id`."""
    nm = spec.nomad
    if nm.driver == "docker" and not spec.image:
        raise SpecError([("image", "the Nomad docker driver needs an image; set image, or nomad.driver: exec or raw_exec")])
    if nm.driver != "docker" and spec.image:
        raise SpecError([("image", f"nomad.driver {nm.driver} runs on the host and would ignore the image; "
                                   "use nomad.driver: docker, or remove image")])
    entry = entry_script(spec)
    job_id = job_id or spec.name
    job: dict = {
        "ID": job_id,
        "Name": spec.name,
        "Type": "batch",
        "Datacenters": list(nm.datacenters),
        # One node per host: node-sized groups must never share a client.
        "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
        "Meta": {NODES_META: str(spec.nodes), "halo_sched_world_size": str(spec.world_size)},
        "TaskGroups": [_group(spec, job_id, r, entry) for r in range(spec.nodes)],
    }
    if nm.namespace:
        job["Namespace"] = nm.namespace
    if nm.region:
        job["Region"] = nm.region
    if nm.priority is not None:
        job["Priority"] = nm.priority
    return {"Job": job}


def go_duration(ns: int) -> str:
    """Nanoseconds -> the shortest Go duration text ('2h', '1h30m', '45s')."""
    parts, rest = [], ns
    for unit, size in (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3), ("ns", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def render_hcl(spec: JobSpec) -> str:
    return render_template("nomad/job.nomad.hcl.j2", job=job_payload(spec)["Job"], go_duration=go_duration)
