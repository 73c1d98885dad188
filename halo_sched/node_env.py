"""The names of the variables a backend sets for a node's entry script: its whole per-node
interface, defined once (the launch contract, launch.py, and the rollout servers, servers.py,
render them into the scripts; the backends set them)."""

#: The node's rank (0 .. nodes-1), before HALO_NODE_RANK_OFFSET is added.
NODE_RANK_VAR = "HALO_NODE_RANK"
#: Optional, added to the node rank: Nomad's worker group gives its allocation index (0-based)
#: and offset 1, since ``${}`` interpolation cannot add. The sum is still range-checked.
NODE_RANK_OFFSET_VAR = "HALO_NODE_RANK_OFFSET"
#: Rank 0's address and port; or a file whose first line becomes the address and second the
#: port once rank 0 is known, polled until ``rendezvous.timeout_s`` runs out.
MASTER_ADDR_VAR = "HALO_MASTER_ADDR"
MASTER_ADDR_FILE_VAR = "HALO_MASTER_ADDR_FILE"
MASTER_PORT_VAR = "HALO_MASTER_PORT"
#: Optional: where each node keeps torchrun's per-rank logs and error files (``DIR/node-K/``);
#: without it they go to a temporary directory, removed after the failure report is written.
LOG_DIR_VAR = "HALO_LOG_DIR"
#: Optional: a directory holding ``halo-secret-NAME`` files (Nomad) instead of the secrets in the
#: environment (SLURM, local). See ``secret_env`` in the entry script.
SECRETS_DIR_VAR = "HALO_SECRETS_DIR"
#: A rollout server node's index within its role, its own address, and the trainer's rank 0
#: (given, or in a file polled like HALO_MASTER_ADDR_FILE).
SERVER_INDEX_VAR = "HALO_SERVER_INDEX"
SERVER_ADDR_VAR = "HALO_SERVER_ADDR"
TRAINER_MASTER_VAR = "HALO_TRAINER_MASTER_ADDR"
TRAINER_MASTER_FILE_VAR = "HALO_TRAINER_MASTER_ADDR_FILE"
