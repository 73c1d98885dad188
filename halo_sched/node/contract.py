"""The names the submitter's side and the nodes share, each defined once: every environment
variable halo-sched sets for a node or a server (the node's whole interface to its backend), the
warning's carrier signal, the ports a job derives its master port from.

The renderers pass :data:`NAMES` and :data:`WARNING_CARRIER` into every template (through
``halo_sched/launch.py``); no template spells one itself (``tests/test_contract_names.py``).
"""
from __future__ import annotations

#: The signal that takes the warning (``slurm.signal``'s, ``halo-sched cancel --signal``) to every
#: process of a SLURM job's steps: ignored by default, so only each entry script acts on it (handing
#: the warning signal to its ranks); to the batch script too via slurmrestd, which cannot signal it
#: alone. ``slurm.signal`` may not be this one (halo_sched/spec.py).
WARNING_CARRIER = "URG"

#: A job's own master port without ``rendezvous.port`` (SLURM: from the job id, local: the first
#: free one from a random start): below torchrun's customary 29500, SGLang's default 30000 and
#: Linux's ephemeral range (32768-60999, outgoing connections' ports).
DERIVED_PORTS = range(28500, 29500)
#: The local backend's: a range of its own, so that a local job never takes the port a SLURM job on
#: the same machine (a workstation with its own slurmd, a test host) derives from its id: in one
#: range, a local job that picked a free port at submit could hold the one a SLURM job started later
#: needed (EADDRINUSE, measured in the suite: a sweep job of the 24.11 cluster, 2026-12-06).
LOCAL_PORTS = range(27500, 28500)

#: The tag each Nomad server registration carries (``halo-index-${NOMAD_ALLOC_INDEX}``), and the
#: first word of each line of a server addresses file.
INDEX_TAG = "halo-index-"


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
    #: The node runtime the job carries (halo_sched/node_runtime.py), base64 of a zip, in the
    #: variable (SLURM) or a file (Nomad, local); used where the node's halo-sched is another version.
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
    #: The job's failure key, made at submit, which signs the failure lines; the entry and server
    #: scripts take it out of the environment first thing, so no rank or server inherits it.
    failure_key: str = "HALO_FAILURE_KEY"
    #: The secret_env names of this node (space-separated): the reporters scrub their values.
    secret_names: str = "HALO_SECRET_NAMES"
    #: Where rank 0 writes the job's result, a small JSON value (node/result.py), for the submitter
    #: to read: local, the job's directory; SLURM, beside the output file; Nomad, node 0's task dir.
    result_file: str = "HALO_RESULT_FILE"

    #: A Nomad run's keeper's input (node/nomad_keeper.py); node/world.sh's files (hot spares).
    keeper_attempts: str = "HALO_KEEPER_ATTEMPTS"
    keeper_retry_on: str = "HALO_KEEPER_RETRY_ON"
    keeper_nodes: str = "HALO_KEEPER_NODES"
    keeper_spares: str = "HALO_KEEPER_SPARES"
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
