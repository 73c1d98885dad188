"""Server roles (``servers:``) in the Nomad job: one group per role, ``server-NAME``, Count = its
nodes (constant size, like the trainer's two groups), server index = ``NOMAD_ALLOC_INDEX``
(sound for the same reasons as the workers' node rank, see render.py).

Each server allocation reserves its static ``port`` (host network) and registers a Nomad-native
service (``provider = "nomad"``) tagged ``halo-index-${NOMAD_ALLOC_INDEX}``; Nomad interpolates
tags with the allocation's environment (``command/agent/consul/structs.go`` ->
``taskenv.InterpolateServices``). The trainer's tasks read the registrations through one template
per role (``nomadService``; consul-template ``dependency/nomad_service.go``: an empty list until
registered, so the file is blank and the entry script polls it within the rendezvous timeout)
rendering ``halo-index-K ADDR`` lines; the entry script picks each index (overlapping
registrations of one index: the first line wins).

The task's driver config and resources are the trainer's (render._config_and_resources): with
docker, ``entrypoint = ["/bin/bash"]`` and the server script as ``args``, so an image's own
ENTRYPOINT (vLLM's starts its server) never swallows it; the group's restart, reschedule and
``disconnect { lost_after, replace = false }`` are the trainer's too (render.lost_after_ns).

Ending: Nomad ends nothing across groups. The job's watcher stops the job once the trainer's
groups are complete or a server allocation died (state.py, watchdog.py); and each server also
ends itself (exit 0) once rank 0's registration is gone from its own template for three looks
(halo_sched/templates/server.sh.j2): a batch allocation deregisters its services when it stops
(``client/allocrunner/groupservice_hook.go`` PreKill/Postrun).
"""
from __future__ import annotations

import hashlib

from ...servers import (
    INDEX_TAG, SERVER_ADDR_VAR, SERVER_INDEX_VAR, TRAINER_MASTER_FILE_VAR, addrs_file_var, server_script,
)
from ...models import JobSpec, Server
from ...templating import check, checked_int

GROUP_PREFIX = "server-"
TASK = "server"
PORT_LABEL = "http"
ENTRY_PATH = "local/halo-server.sh"
# Rank 0's address, rendered into each task that needs it (trainer and server tasks alike; the
# trainer's renderer takes these from here).
MASTER_FILE = "local/halo-master-addr"
MASTER_FILE_IN_TASK = "${NOMAD_TASK_DIR}/halo-master-addr"
SERVERS_META = "halo_sched_servers"


def group_name(role: str) -> str:
    return GROUP_PREFIX + check(role, "server name", "servers[].name")


def role_of_group(task_group: str) -> str | None:
    return task_group[len(GROUP_PREFIX):] if task_group.startswith(GROUP_PREFIX) else None


def service_name(job_id: str, role: str) -> str:
    """A DNS-like service name (at most 63) per job and role, distinct for distinct pairs."""
    check(role, "server name", "servers[].name")
    base = "".join(c if c.isalnum() else "-" for c in job_id.lower()).strip("-") or "job"
    name = f"{base}-srv-{role}"
    if name != f"{job_id}-srv-{role}" or len(name) > 63:
        digest = hashlib.sha256(f"{job_id}\0{role}".encode()).hexdigest()[:8]
        name = f"{base[:63 - len(role) - 14].rstrip('-')}-{digest}-srv-{role}"
    return name


def addrs_template(job_id: str, role: str) -> str:
    return (f'{{{{ range nomadService "{service_name(job_id, role)}" }}}}'
            "{{ range .Tags }}{{ . }} {{ end }}"
            # The final newline: a heredoc in the HCL would add one (the two forms stay one job).
            "{{ .Address }}\n{{ end }}\n")


def trainer_wiring(spec: JobSpec, job_id: str) -> tuple[dict, list[dict]]:
    """(env, templates) every trainer task gets: one addresses file per role."""
    env, templates = {}, []
    for r in spec.servers:
        dest = f"local/halo-server-{check(r.name, 'server name', 'servers[].name')}-addrs"
        env[addrs_file_var(r.name)] = "${NOMAD_TASK_DIR}/" + dest.split("/", 1)[1]
        # noop: rewritten as servers register; the entry script polls it.
        templates.append({"EmbeddedTmpl": addrs_template(job_id, r.name), "DestPath": dest, "ChangeMode": "noop"})
    return env, templates


def server_group(spec: JobSpec, job_id: str, role: Server, master_template: str, delimiters, task_config,
                 policies: dict, secrets: tuple[dict, list[dict]]) -> dict:
    """The task group of one role. ``task_config(image, gpus)`` gives the driver config and
    resources as the trainer's tasks get them (same fabric devices, same host network);
    ``secrets`` the env and templates of the role's secret_env (render.secret_wiring)."""
    entry = server_script(spec, role)
    left, right = delimiters(entry)
    config, resources = task_config(role.image or spec.image, role.gpus_per_node, ["${NOMAD_TASK_DIR}/halo-server.sh"])
    task = {
        "Name": TASK,
        "Driver": spec.nomad.driver,
        "Config": config,
        "Env": {
            SERVER_INDEX_VAR: "${NOMAD_ALLOC_INDEX}",
            SERVER_ADDR_VAR: "${NOMAD_IP_%s}" % PORT_LABEL,
            TRAINER_MASTER_FILE_VAR: MASTER_FILE_IN_TASK,
            **secrets[0],
        },
        "Templates": [
            {"EmbeddedTmpl": entry, "DestPath": ENTRY_PATH, "Perms": "0755", "ChangeMode": "noop",
             "LeftDelim": left, "RightDelim": right},
            # noop: the server script polls it, and stops the server once it is blank again.
            {"EmbeddedTmpl": master_template, "DestPath": MASTER_FILE, "ChangeMode": "noop"},
            *secrets[1],
        ],
        "Resources": resources,
        "KillTimeout": 30_000_000_000,
    }
    group = {
        "Name": group_name(role.name),
        "Count": checked_int(role.nodes, "servers[].nodes"),
        **policies,
        "Meta": {"halo_server_role": role.name},
        "Networks": [{"Mode": "host", "ReservedPorts": [{"Label": PORT_LABEL,
                                                          "Value": checked_int(role.port, "servers[].port")}]}],
        "Services": [{"Name": service_name(job_id, role.name), "Provider": "nomad", "PortLabel": PORT_LABEL,
                      "Tags": [INDEX_TAG + "${NOMAD_ALLOC_INDEX}"]}],
        "Tasks": [task],
    }
    if spec.nomad.max_run_duration_ns is not None:
        group["MaxRunDuration"] = checked_int(spec.nomad.max_run_duration_ns, "nomad.max_run_duration")
    return group


def servers_meta(spec: JobSpec) -> str:
    """``name:nodes,...``: the roles and their counts, for the state fold."""
    return ",".join(f"{check(r.name, 'server name', 'servers[].name')}:{checked_int(r.nodes, 'servers[].nodes')}"
                    for r in spec.servers)
