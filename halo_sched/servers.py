"""Rollout servers beside the trainer (``servers:`` in the job file): each role's server script,
rendered from the launch plan (halo_sched/launch.py: the roles, their node offsets and ports; the
variable names below are defined once in halo_sched/node/contract.py).

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
  same for every server of a role and holds the role's values only: it evaluates the servers'
  job-free shell (``halo_sched/node/server.sh``, pure bash: a server's image need not have
  python), given as text (``HALO_SERVER_SHELL``: SLURM's batch script reads it from the node
  runtime) or a file (``HALO_SERVER_SHELL_FILE``: Nomad's template of the job's Variable, the
  local job's directory), then calls ``halo_server_start`` with the role's name, nodes and ports,
  exports the job's derived fabric/storage env (the same NCCL_*/DIST_* as the ranks) and the
  role's env, runs its setup, and ``halo_server_run`` waits for rank 0 and runs the command verbatim.

Addresses always come from where the scheduler reaches the node (SLURM NodeAddr, Nomad service
registrations, local loopback), never from DNS on a node name. KEY is the role name upper-cased
with '-' as '_' (names allow only lower-case letters, digits and '-', so two roles never share one).
"""
from __future__ import annotations

from .launch import Launch, ServerRole
from .templating import render_template


def render_server(launch: Launch, role: ServerRole) -> str:
    """The per-server-node entry of one role, byte-identical for each of its nodes."""
    return render_template("server.sh.j2", launch=launch, role=role, names=launch.names)


def local_addr(role_index: int, server_index: int) -> str:
    """The local backend's address of one server "node": a loopback address of its own (Linux
    routes all of 127.0.0.0/8 to lo), so servers of a role can share a port as on separate hosts."""
    return f"127.0.{role_index + 1}.{server_index + 1}"
