"""The names in a rendered Nomad job that other modules read back: the task and group names, the
job meta keys, which node rank an allocation runs (its name index), the rendezvous
service's name and the secrets Variable's path. render.py explains the job's shape."""
from __future__ import annotations

import re

from ...node.nomad_names import (
    NOMAD_KEEPER_GROUP, NOMAD_KEEPER_TASK, NOMAD_NODES_META, NOMAD_TRAINER_GROUP, NOMAD_TRAINER_TASK, nomad_rdzv_service,
)
from . import servers as nomad_servers

TASK = NOMAD_TRAINER_TASK
PORT_LABEL = "rdzv"
ENTRY_PATH = "local/halo-entry.sh"
MASTER_FILE = nomad_servers.MASTER_FILE
NODES_META = NOMAD_NODES_META
#: Job meta naming the job's secrets Variable (its path; never a value): whoever sees the job
#: ended deletes that Variable (``NomadScheduler``), and only for jobs that carry this key.
SECRETS_META = "halo_sched_secrets"
#: The trainer's one group: count N, node rank = the allocation's name index.
TRAINER_GROUP = NOMAD_TRAINER_GROUP
#: The run's keeper (node/nomad_keeper.py): one group, one task (groups.py keeper_group).
KEEPER_GROUP = NOMAD_KEEPER_GROUP
KEEPER_TASK = NOMAD_KEEPER_TASK
#: Rank 0's result file (``HALO_RESULT_FILE``, halo_sched/node/result.py), in the task directory
#: of node 0's allocation, as the task sees it and as the client's fs/cat takes it (relative to
#: the allocation directory): Nomad shares no filesystem with the submitter, but its client serves
#: an allocation's files until it garbage-collects the allocation.
RESULT_IN_TASK = "${NOMAD_TASK_DIR}/halo-result.json"
RESULT_PATH = f"{TASK}/local/halo-result.json"

_ALLOC_INDEX_RE = re.compile(r"\[(\d+)\]$")


def alloc_index(alloc_name: str) -> int | None:
    """The name index of an allocation (``JOBID.GROUP[K]`` -> K), None for another name."""
    m = _ALLOC_INDEX_RE.search(alloc_name)
    return None if m is None else int(m.group(1))


def node_rank_of(task_group: str, alloc_name: str) -> int | None:
    """The node rank an allocation runs, from its TaskGroup and Name (``JOBID.trainer[K]`` -> K);
    None for another group."""
    return alloc_index(alloc_name) if task_group == TRAINER_GROUP else None


def service_name(job_id: str) -> str:
    """The rendezvous service of one job: DNS-like (lower case, digits, '-'), at most 63
    characters, and distinct for distinct job ids (a hash keeps it so when the id is folded);
    node/nomad_names.py defines it, as the run's keeper renames it for its next attempt."""
    return nomad_rdzv_service(job_id)


def carries_runtime(job_id: str) -> bool:
    """Whether the job's Variable can carry the node runtime: its path allows only
    [a-zA-Z0-9-_~/] (nomad/structs/variables.go validVariablePath@v2.0.5), and a job id may hold '.'.
    A job that cannot runs where the nodes have halo-sched at the job's version."""
    return "." not in job_id


def variable_path(job_id: str) -> str:
    """The Nomad Variable holding a job's secrets and the node runtime. A task's workload identity may read
    ``nomad/jobs/<job>`` (and below) of its own namespace without any policy (acl/acl.go
    ``matchingVariablesCapabilitySet``: the implicit read/list for the claim's job)."""
    return f"nomad/jobs/{job_id}"



def keeper_variable_path(job_id: str) -> str:
    """The Variable holding the keeper's copy of the node runtime: the path of the job's ``keeper``
    group, which the keeper's workload identity may read without any policy (acl/acl.go
    ``matchingVariablesCapabilitySet``: ``nomad/jobs/<job>/<group>``, v2.0.5); the job's own
    Variable (secrets and the trainer's copy) has no room left for it."""
    return f"nomad/jobs/{job_id}/{KEEPER_GROUP}"
