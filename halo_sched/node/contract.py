"""The names the submitter's side and the nodes share, each defined once: every environment
variable halo-sched sets for a node or a server (the node's whole interface to its backend), the
signal that carries the warning, and the ports a job derives its master port from.

The renderers pass :data:`NAMES` and :data:`WARNING_CARRIER` into every template (through the
launch plan, ``halo_sched/launch.py``); no template spells one of them itself
(``tests/test_contract_names.py`` reads every template and fails on one). Standard library only:
the node-side programs (local supervisor, process helpers) read these too.
"""
from __future__ import annotations

import hashlib

#: The signal that takes the warning (``slurm.signal``'s, or ``halo-sched cancel --signal``) to
#: every process of a SLURM job's steps. Its default action is to ignore it, so only each node's
#: entry script acts on it (handing the job's warning signal to its ranks once they handle it);
#: slurmrestd cannot signal the batch script alone, so there it carries the warning to the batch
#: script too. ``slurm.signal`` may not be this one (halo_sched/spec.py).
WARNING_CARRIER = "URG"

#: Where a job's own master port comes from when ``rendezvous.port`` is unset (SLURM: from the job
#: id, local: the first free one from a random start): 28500-29499. Below torchrun's customary
#: 29500 (which hand-written jobs on the same host still take), below SGLang's default 30000, and
#: below Linux's ephemeral range (32768-60999), from which outgoing connections take their ports.
DERIVED_PORTS = range(28500, 29500)

#: The tag each Nomad server registration carries (``halo-index-${NOMAD_ALLOC_INDEX}``), and the
#: first word of each line of a server addresses file.
INDEX_TAG = "halo-index-"

# ---- a Nomad job's names that its keeper (node/nomad_keeper.py) reads and writes too ----------

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


class EnvNames:
    """Every environment variable the backends and scripts pass between them (a namespace of
    constants: a plain class, which imports faster than a dataclass; no instance attributes)."""

    __slots__ = ()

    # ---- a trainer node (the entry script's whole per-node input) ----
    #: The node rank, 0-based.
    node_rank: str = "HALO_NODE_RANK"
    #: Rank 0's address and port ...
    master_addr: str = "HALO_MASTER_ADDR"
    master_port: str = "HALO_MASTER_PORT"
    #: ... or a file whose first line becomes the address and second the port once rank 0 is known.
    master_addr_file: str = "HALO_MASTER_ADDR_FILE"
    #: Optional: where each node keeps torchrun's per-rank logs and error files (``DIR/node-K/``);
    #: without it they go to a temporary directory, removed after the failure report is written.
    log_dir: str = "HALO_LOG_DIR"
    #: Optional: a directory holding ``halo-secret-NAME`` files (Nomad) instead of the secrets in
    #: the environment (SLURM, local).
    secrets_dir: str = "HALO_SECRETS_DIR"
    #: The node runtime the job carries (halo_sched/node_runtime.py), base64 of a zip: in the
    #: variable (SLURM: passed to each task) or in a file (Nomad: rendered from the job's Variable;
    #: local: the job's directory). Used only when the node's own halo-sched is another version.
    node_runtime: str = "HALO_NODE_RUNTIME"
    node_runtime_file: str = "HALO_NODE_RUNTIME_FILE"
    #: Which run of a requeued job this is (0 the first time).
    restart_count: str = "HALO_RESTART_COUNT"
    #: The signal each rank gets as the warning (the trainer installs a handler for it).
    warning_signal: str = "HALO_WARNING_SIGNAL"
    #: SLURM's step id, kept under a name of ours: each task removes SLURM_STEP_*.
    slurm_step_id: str = "HALO_SLURM_STEP_ID"
    #: In every process of a local job: finds them, however deep.
    local_job: str = "HALO_LOCAL_JOB"
    #: In torchrun's environment only: finds what it started, however reparented.
    node_tag: str = "HALO_NODE_TAG"
    #: The job's failure key, made at submit: the node-side reporters sign their failure lines
    #: with it (node/failure_collector.py); the entry and server scripts take it out of the
    #: environment first thing, so no rank or server inherits it.
    failure_key: str = "HALO_FAILURE_KEY"
    #: The secret_env names of this node (space-separated): the reporters scrub their values.
    secret_names: str = "HALO_SECRET_NAMES"
    #: Where rank 0 writes the job's result, a small JSON value (node/result.py), at a path the
    #: submitter can read back: local, the job's directory; SLURM, beside the output file; Nomad,
    #: node 0's task directory (read through the client's fs API).
    result_file: str = "HALO_RESULT_FILE"

    # ---- a Nomad run's keeper (node/nomad_keeper.py), from the job file's retry: and nomad: ----
    #: retry.attempts (0: no retry:) and retry.on (comma-separated words).
    keeper_attempts: str = "HALO_KEEPER_ATTEMPTS"
    keeper_retry_on: str = "HALO_KEEPER_RETRY_ON"
    #: The trainer's node ranks N and its hot spares K (nomad.spare_nodes).
    keeper_nodes: str = "HALO_KEEPER_NODES"
    keeper_spares: str = "HALO_KEEPER_SPARES"
    #: A trainer node of a Nomad job with hot spares (node/entry.sh halo_world): a file holding the
    #: run's current world as the keeper wrote it (``KEY VALUE`` lines: attempt, generation, state,
    #: master, ranks), and one of every slot's registration (``halo-index-K ADDR PORT`` lines).
    world_file: str = "HALO_WORLD_FILE"
    slots_file: str = "HALO_SLOTS_FILE"

    # ---- hang detection (``hang:``; node/hang_monitor.py, node/progress.py) ----
    #: The directory each rank appends ``STEP UNIX_TIME`` lines to (``rank-$RANK``).
    progress_dir: str = "HALO_PROGRESS_DIR"
    #: The signal on which a rank registers faulthandler, so the monitor can read its stack live.
    stack_signal: str = "HALO_STACK_SIGNAL"
    #: Optional: a directory the submitter can read (SLURM: beside the job's output file), into
    #: which each node's hang monitor copies its ranks' progress files every few seconds, as
    #: ``DIR/node-K/progress/rank-R`` and ``rank-R.history`` (``hang_monitor.Mirror``).
    progress_mirror: str = "HALO_PROGRESS_MIRROR"

    # ---- a rollout server node (``servers:``) ----
    server_index: str = "HALO_SERVER_INDEX"
    server_addr: str = "HALO_SERVER_ADDR"
    server_name: str = "HALO_SERVER_NAME"
    server_port: str = "HALO_SERVER_PORT"
    server_group_port: str = "HALO_SERVER_GROUP_PORT"
    trainer_master: str = "HALO_TRAINER_MASTER_ADDR"
    trainer_master_file: str = "HALO_TRAINER_MASTER_ADDR_FILE"
    #: The servers' job-free shell (node/server.sh) as text (SLURM: the batch script hands it to
    #: the step), or a file holding it (Nomad: rendered from the job's Variable; local).
    server_shell: str = "HALO_SERVER_SHELL"
    server_shell_file: str = "HALO_SERVER_SHELL_FILE"

    # ---- a trainer node's view of each server role: PREFIX + KEY + suffix ----
    role_prefix: str = "HALO_SERVER_"

    @staticmethod
    def role_key(role: str) -> str:
        """A role's name in variable names: upper case, '-' as '_' (role names allow only
        lower-case letters, digits and '-', so two roles never share one)."""
        return role.upper().replace("-", "_")

    def role_urls(self, role: str) -> str:
        """``http://ADDR:PORT`` of each of the role's servers, comma-separated, node order."""
        return f"{self.role_prefix}{self.role_key(role)}_URLS"

    def role_group_port(self, role: str) -> str:
        return f"{self.role_prefix}{self.role_key(role)}_GROUP_PORT"

    def role_addrs(self, role: str) -> str:
        """The role's addresses, comma-separated, server order (SLURM, local)."""
        return f"{self.role_prefix}{self.role_key(role)}_ADDRS"

    def role_addrs_file(self, role: str) -> str:
        """A file of ``halo-index-K ADDR`` lines, filled as the servers register (Nomad)."""
        return f"{self.role_prefix}{self.role_key(role)}_ADDRS_FILE"


NAMES = EnvNames()
