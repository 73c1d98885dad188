"""A Nomad job's names that its run's keeper (node/nomad_keeper.py) reads and writes too: the
submitter's Nomad backend (halo_sched/backends/nomad/) renders them, the keeper reads them back from
the job and registers its next version with them. Only the keeper's copy of the node runtime carries
this module (``node.KEEPER``; a trainer's copy and a SLURM batch script's leave it out)."""
from __future__ import annotations

import hashlib

#: Job.Meta keys: node ranks N; the attempt a version is (absent in the run's first version); the
#: submission token (exactly once, halo_sched/exactly_once.py); the server roles (``name:nodes,...``);
#: whether the job carries a keeper group; the hosts every attempt so far kept off (``a,b``).
NOMAD_NODES_META = "halo_sched_nodes"
NOMAD_ATTEMPT_META = "halo_sched_attempt"
NOMAD_TOKEN_META = "halo_sched_token"
NOMAD_SERVERS_META = "halo_sched_servers"
NOMAD_KEEPER_META = "halo_sched_keeper"
NOMAD_EXCLUDED_META = "halo_sched_excluded"
NOMAD_SPARES_META = "halo_sched_spares"
#: The task groups: the trainer's (count N, plus ``nomad.spare_nodes``), the keeper's (count 1).
NOMAD_TRAINER_GROUP = "trainer"
NOMAD_KEEPER_GROUP = "keeper"
NOMAD_TRAINER_TASK = "torchrun"
NOMAD_KEEPER_TASK = "keeper"
NOMAD_SERVER_GROUP_PREFIX = "server-"


def nomad_attempt_key(job_id: str, attempt: int) -> str:
    """What a Nomad job's service registrations are named after: the job ID; for a retry attempt,
    a new version of the same job, the ID and the attempt (halo_sched/backends/nomad/servers.py
    says why: an earlier attempt's registration can outlive its stop)."""
    return f"{job_id}-attempt{attempt}" if attempt else job_id


def nomad_rdzv_service(key: str) -> str:
    """The trainer's rendezvous service of one attempt (``key``: :func:`nomad_attempt_key`): DNS-like
    (lower case, digits, '-'), at most 63 characters, distinct for distinct keys (a hash keeps it
    so when the key is folded)."""
    base = "".join(c if c.isalnum() else "-" for c in key.lower()).strip("-") or "job"
    if base != key or len(base) > 58:
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        base = f"{base[:49].rstrip('-')}-{digest}"
    return f"{base}-rdzv"


def nomad_server_service(key: str, role: str) -> str:
    """A server role's service of one attempt: DNS-like, at most 63, distinct for distinct pairs."""
    base = "".join(c if c.isalnum() else "-" for c in key.lower()).strip("-") or "job"
    name = f"{base}-srv-{role}"
    if name != f"{key}-srv-{role}" or len(name) > 63:
        digest = hashlib.sha256(f"{key}\0{role}".encode()).hexdigest()[:8]
        name = f"{base[:63 - len(role) - 14].rstrip('-')}-{digest}-srv-{role}"
    return name
