"""Rollout servers beside the trainer (``servers:`` in the job file): the pure wiring.

Each role runs one server per node, on nodes of its own. Whatever the scheduler, the interface is:

* a trainer node learns each role's addresses from ``HALO_SERVER_<KEY>_ADDRS`` (comma-separated, in
  server order) or ``HALO_SERVER_<KEY>_ADDRS_FILE`` (lines ``halo-index-K ADDR``, filled as the
  servers register: Nomad's ``nomadService`` renders what is registered so far, empty at first),
  turns them into ``HALO_SERVER_<KEY>_URLS`` (``http://ADDR:PORT``, comma-separated, node order),
  and starts torchrun only once every server answered its health path with 200, all within
  ``rendezvous.timeout_s`` (halo_sched/templates/entry_servers.sh.j2,
  halo_sched/node/server_health.py);
* a server node runs ``halo_sched/templates/server.sh.j2`` with ``HALO_SERVER_INDEX`` and the
  trainer's rank-0 address (``HALO_TRAINER_MASTER_ADDR``, or ``HALO_TRAINER_MASTER_ADDR_FILE`` to
  poll), and its own address ``HALO_SERVER_ADDR`` where the backend knows it. The script is the
  same for every server of a role; it exports the job's derived fabric/storage env (the same NCCL_*/DIST_* as the
  ranks), the role's env, runs its setup, then ``exec``s the command verbatim.

Addresses always come from where the scheduler reaches the node (SLURM NodeAddr, Nomad service
registrations, local loopback), never from DNS on a node name. KEY is the role name upper-cased
with '-' as '_' (names allow only lower-case letters, digits and '-', so two roles never share one).
"""
from __future__ import annotations

from .node_env import (  # noqa: F401 - named once in node_env.py
    SECRETS_DIR_VAR, SERVER_ADDR_VAR, SERVER_INDEX_VAR, TRAINER_MASTER_FILE_VAR, TRAINER_MASTER_VAR,
)
from .node import source as node_source
from .models import JobSpec, Server
from .templating import heredoc_tag, render_template
#: The tag each Nomad server registration carries (``halo-index-${NOMAD_ALLOC_INDEX}``), and the
#: first word of each line of an addresses file.
INDEX_TAG = "halo-index-"


def key(name: str) -> str:
    return name.upper().replace("-", "_")


def urls_var(name: str) -> str:
    return f"HALO_SERVER_{key(name)}_URLS"


def group_port_var(name: str) -> str:
    return f"HALO_SERVER_{key(name)}_GROUP_PORT"


def addrs_var(name: str) -> str:
    return f"HALO_SERVER_{key(name)}_ADDRS"


def addrs_file_var(name: str) -> str:
    return f"HALO_SERVER_{key(name)}_ADDRS_FILE"


def url(addr: str, port: int) -> str:
    return f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}"


def server_environment(spec: JobSpec, role: Server) -> dict[str, str]:
    """What every server of ``role`` gets: the job's derived fabric/storage env (identical to the
    ranks'), then the role's own (literal)."""
    env = dict(spec.derived_env())
    env.update(role.env)
    return env


def server_script(spec: JobSpec, role: Server) -> str:
    """The per-server-node entry of one role, byte-identical for each of its nodes."""
    return render_template(
        "server.sh.j2", spec=spec, role=role, env=server_environment(spec, role),
        index_var=SERVER_INDEX_VAR, addr_var=SERVER_ADDR_VAR,
        master_var=TRAINER_MASTER_VAR, master_file_var=TRAINER_MASTER_FILE_VAR, secrets_dir_var=SECRETS_DIR_VAR,
    )


def entry_vars(spec: JobSpec) -> dict:
    """What ``halo_sched/templates/entry_servers.sh.j2`` (inside the trainer's entry) needs."""
    source = node_source("server_health")
    roles = [{
        "name": r.name, "nodes": r.nodes, "port": r.port, "group_port": r.group_port,
        "health_path": r.health_path, "urls_var": urls_var(r.name), "group_port_var": group_port_var(r.name),
        "addrs_var": addrs_var(r.name), "addrs_file_var": addrs_file_var(r.name),
    } for r in spec.servers]
    return {"server_roles": roles, "health_source": source, "health_tag": heredoc_tag(source, "HALO_HEALTH_EOF"),
            "index_tag": INDEX_TAG}


def local_addr(role_index: int, server_index: int) -> str:
    """The local backend's address of one server "node": a loopback address of its own (Linux
    routes all of 127.0.0.0/8 to lo), so servers of a role can share a port as on separate hosts."""
    return f"127.0.{role_index + 1}.{server_index + 1}"
