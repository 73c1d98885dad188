"""Server roles (``servers:``) in the Nomad job: their group and service names and the trainer's
view of them; groups.py builds each role's group from the launch plan with these. One group per
role, ``server-NAME``, Count = its nodes (constant size, like the trainer's group), server
index = ``NOMAD_ALLOC_INDEX`` (sound for the same reasons as the trainer's node rank, see render.py).

Each server allocation reserves its static ``port`` (host network) and registers a Nomad-native
service (``provider = "nomad"``) tagged ``halo-index-${NOMAD_ALLOC_INDEX}``; Nomad interpolates
tags with the allocation's environment (``command/agent/consul/structs.go`` ->
``taskenv.InterpolateServices``). The trainer's tasks read the registrations through one template
per role (``nomadService``; consul-template ``dependency/nomad_service.go``: an empty list until
registered, so the file is blank and the entry script polls it within the rendezvous timeout)
rendering ``halo-index-K ADDR`` lines; the entry script picks each index (overlapping
registrations of one index: the first line wins).

A retry attempt is a new version of the same job: its services are named after the job ID and
the attempt (attempt_key), so its trainer never reads a registration an earlier attempt's
server left on a node that went down (an ``unknown`` allocation keeps its registration until it is
lost or garbage-collected, nomad/state/state_store_service_registration.go, v2.0.5).

The task's driver config and resources are the trainer's (groups._config_and_resources): with
docker, ``entrypoint = ["/bin/bash"]`` and the server script as ``args``, so an image's own
ENTRYPOINT (vLLM's starts its server) never swallows it; the group's restart, reschedule and
``disconnect { lost_after, replace = false }`` are the trainer's too (groups.lost_after_ns).

Ending: Nomad ends nothing across groups. The job's watcher stops the job once the trainer's
group is complete or a server allocation died (state.py, watchdog.py); and each server also
ends itself (exit 0) once rank 0's registration is gone from its own template for three looks
(halo_server_run in halo_sched/node/server.sh): a batch allocation deregisters its services when it stops
(``client/allocrunner/group_service_hook.go`` PreKill/Postrun, v2.0.5); on a node that went down
nothing runs those hooks, and the registration stays until the servers mark the allocation lost
or collect it (nomad/state/state_store_service_registration.go ``deregisterServicesForTerminalAllocs``).
"""
from __future__ import annotations

from ...launch import Launch
from ...node.nomad_names import NOMAD_SERVER_GROUP_PREFIX, NOMAD_SERVERS_META, nomad_attempt_key, nomad_server_service
from ...templating import check

GROUP_PREFIX = NOMAD_SERVER_GROUP_PREFIX
TASK = "server"
PORT_LABEL = "http"
ENTRY_PATH = "local/halo-server.sh"
# Rank 0's address, rendered into each task that needs it (trainer and server tasks alike; the
# trainer's renderer takes these from here).
MASTER_FILE = "local/halo-master-addr"
MASTER_FILE_IN_TASK = "${NOMAD_TASK_DIR}/halo-master-addr"
SERVERS_META = NOMAD_SERVERS_META


def group_name(role: str) -> str:
    return GROUP_PREFIX + check(role, "server name", "servers[].name")


def role_of_group(task_group: str) -> str | None:
    return task_group[len(GROUP_PREFIX):] if task_group.startswith(GROUP_PREFIX) else None


def attempt_key(job_id: str, attempt: int) -> str:
    """What a job's service registrations are named after: the job ID; for a retry attempt, which
    is a new version of the same job (NomadScheduler.submit_attempt, or the run's keeper), the ID
    and the attempt (node/nomad_names.py ``nomad_attempt_key``, which the keeper reads too).
    Nomad deletes a Nomad-native registration only when its allocation is client-terminal
    (complete, failed, lost) or garbage-collected (nomad/state/state_store_service_registration.go
    ``deregisterServicesForTerminalAllocs``, nomad/state/state_store.go ``DeleteEval`` -> allocs,
    v2.0.5); the client deregisters in its PreKill/Postrun hooks
    (client/allocrunner/group_service_hook.go), which a lost node never runs. An allocation of a
    node that went down stays ``unknown`` (its group has ``lost_after``) after the job's stop, so
    its registration stays under the old name through the retry, and ``nomadService`` lists
    registrations ordered by ID (alloc UUIDs): the next attempt would read the dead node's. Under
    a name of its own, it never reads an earlier attempt's."""
    return nomad_attempt_key(job_id, attempt)


def service_name(job_id: str, role: str) -> str:
    """A DNS-like service name (at most 63) per job (an attempt's: attempt_key) and role,
    distinct for distinct pairs (node/nomad_names.py ``nomad_server_service``)."""
    return nomad_server_service(job_id, check(role, "server name", "servers[].name"))


def addrs_template(job_id: str, role: str) -> str:
    return (f'{{{{ range nomadService "{service_name(job_id, role)}" }}}}'
            "{{ range .Tags }}{{ . }} {{ end }}"
            # The final newline: a heredoc in the HCL would add one (the two forms stay one job).
            "{{ .Address }}\n{{ end }}\n")


def trainer_wiring(launch: Launch) -> tuple[dict, list[dict]]:
    """(env, templates) every trainer task gets: one addresses file per role."""
    env, templates = {}, []
    for r in launch.servers:
        dest = f"local/halo-server-{r.name}-addrs"
        env[r.addrs_file_var] = "${NOMAD_TASK_DIR}/" + dest.split("/", 1)[1]
        # noop: rewritten as servers register; the entry script polls it.
        key = attempt_key(launch.job_id, launch.restart_count)  # the attempt's own registrations only
        templates.append({"EmbeddedTmpl": addrs_template(key, r.name), "DestPath": dest, "ChangeMode": "noop"})
    return env, templates


def servers_meta(launch: Launch) -> str:
    """``name:nodes,...``: the roles and their counts, for the state fold."""
    return ",".join(f"{r.name}:{r.nodes}" for r in launch.servers)
