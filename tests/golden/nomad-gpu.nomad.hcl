# halo-sched: job ddp-nomad for Nomad: 2 nodes. Group node-0 is node rank 0; group
# workers (count N-1) runs the others, node rank = 1 + NOMAD_ALLOC_INDEX (the entry script adds).
# Plan with `nomad job plan FILE`, run with `nomad job run FILE`.
job "ddp-nomad" {
  type        = "batch"
  datacenters = ["dc1"]
  namespace   = "training"

  # Nomad has no gang scheduling; node-sized allocations must at least land on different clients.
  constraint {
    operator = "distinct_hosts"
    value    = "true"
  }

  meta {
    halo_sched_nodes = "2"
    halo_sched_world_size = "16"
  }

  group "node-0" {
    count = 1
    # Nomad 2.0.3+: each allocation is stopped this long after its creation (halo-sched reports
    # TIMEOUT). A group that never placed has no allocation and no timer: it bounds a hung job,
    # not a half-placed one. Older `nomad job run` rejects this line.
    max_run_duration = "12h"

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart {
      attempts = 0
      mode     = "fail"
      interval = "24h"
      delay    = "15s"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    disconnect {
      replace = false
    }

    meta {
      halo_node_rank = "0"
    }

    network {
      mode = "host"
      port "rdzv" {
        static = 29500
      }
    }

    # Rank 0's address for the other nodes, without Consul.
    service {
      name     = "ddp-nomad-rdzv"
      provider = "nomad"
      port     = "rdzv"
    }

    task "torchrun" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "ghcr.io/example/trainer:2.13.0-cuda13"
        command = "/bin/bash"
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [
          {
            memlock = "-1"
            stack = "67108864"
          },
        ]
        shm_size = 68719476736
        volumes = ["/scratch:/scratch"]
        devices = [
          {
            host_path = "/dev/infiniband"
            container_path = "/dev/infiniband"
          },
        ]
      }

      env {
        HALO_NODE_RANK = "0"
        HALO_MASTER_ADDR = "$${NOMAD_IP_rdzv}"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-312b5ec4"
        right_delimiter = "halo-312b5ec4]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job ddp-nomad: 2 nodes x 8 processes.
# The same script runs on every node. The backend sets only HALO_NODE_RANK (and maybe
# HALO_NODE_RANK_OFFSET) and the master address (HALO_MASTER_ADDR, or
# HALO_MASTER_ADDR_FILE to poll until rank 0 is known).
set -e
halo_fail() {
  echo "halo-sched: node $halo_rank: $*" >&2
  exit 1
}
halo_rank=$HALO_NODE_RANK
# Nomad's worker group passes its allocation index and HALO_NODE_RANK_OFFSET=1 ($${} cannot add).
halo_offset=$${HALO_NODE_RANK_OFFSET:-0}
# Digits only, and few of them: the sum below can then neither fail nor overflow.
case "$halo_rank:$halo_offset" in
  :* | *: | *[!0-9:]* | *:*:* | ????????????*) halo_fail "HALO_NODE_RANK must be a node rank in 0..1, got '$halo_rank' (offset '$halo_offset')" ;;
esac
halo_rank=$((10#$halo_rank + 10#$halo_offset))  # 10#: a leading zero is not octal
[ "$halo_rank" -lt 2 ] || halo_fail "node rank $halo_rank (HALO_NODE_RANK + offset $halo_offset) is outside 0..1"

# The preemption/time-limit warning (SIGUSR2) is ignored here, in setup and in
# torchrun, and inherited as ignored by the ranks: torchrun would die from it (or, for a signal it
# handles, stop its workers after a short grace). The trainer installs its own handler (Python's
# signal.signal overrides an inherited SIG_IGN) and has until the deadline to checkpoint. A
# handler in this shell would not do: bash resets handled signals to the default in children.
trap '' USR2
export HALO_WARNING_SIGNAL=USR2
# Which run this is: 0 the first time, n after the job was requeued n times.
export HALO_RESTART_COUNT="$${HALO_RESTART_COUNT:-0}"

# Environment for every rank, identical on all nodes (values are literal).
export DIST_SHARED_FILESYSTEM=0
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
export OMP_NUM_THREADS=8
# rendezvous.timeout_s counts from here: a slow setup (pip install, image pull) is not a dead peer.
halo_started=$SECONDS

# Rank 0's address: given, or published later (a file that fills once rank 0 is known).
# The file exists but is blank until then (Nomad's nomadService renders empty; it never blocks).
if [ -n "$HALO_MASTER_ADDR_FILE" ]; then
  while :; do
    HALO_MASTER_ADDR=$(head -n 1 "$HALO_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')
    [ -z "$HALO_MASTER_ADDR" ] || break
    if [ $((SECONDS - halo_started)) -ge 600 ]; then
      halo_fail "rank 0 was not published within rendezvous.timeout_s=600s (waited on $HALO_MASTER_ADDR_FILE); is node 0 placed and running?"
    fi
    sleep 1
  done
fi
[ -n "$HALO_MASTER_ADDR" ] || halo_fail "no master address: the backend set neither HALO_MASTER_ADDR nor HALO_MASTER_ADDR_FILE"
command -v torchrun > /dev/null || halo_fail "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"

echo "halo-sched: node $halo_rank of 2 on $(hostname): master $HALO_MASTER_ADDR:29500" >&2
exec torchrun \
  --nnodes=2 \
  --nproc_per_node=8 \
  --node_rank="$halo_rank" \
  --master_addr="$HALO_MASTER_ADDR" \
  --master_port=29500 \
  --max_restarts=0 \
  --rdzv_conf=timeout=600 \
  /workspace/examples/train_ddp.py \
  --device \
  cuda \
  --steps \
  200
EOT
      }

      resources {
        cpu    = 32000
        memory = 491520
        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }

  group "workers" {
    count = 1
    # Nomad 2.0.3+: each allocation is stopped this long after its creation (halo-sched reports
    # TIMEOUT). A group that never placed has no allocation and no timer: it bounds a hung job,
    # not a half-placed one. Older `nomad job run` rejects this line.
    max_run_duration = "12h"

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart {
      attempts = 0
      mode     = "fail"
      interval = "24h"
      delay    = "15s"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    disconnect {
      replace = false
    }

    meta {
      halo_node_rank_offset = "1"
    }

    network {
      mode = "host"
    }

    task "torchrun" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "ghcr.io/example/trainer:2.13.0-cuda13"
        command = "/bin/bash"
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [
          {
            memlock = "-1"
            stack = "67108864"
          },
        ]
        shm_size = 68719476736
        volumes = ["/scratch:/scratch"]
        devices = [
          {
            host_path = "/dev/infiniband"
            container_path = "/dev/infiniband"
          },
        ]
      }

      env {
        HALO_NODE_RANK = "$${NOMAD_ALLOC_INDEX}"
        HALO_NODE_RANK_OFFSET = "1"
        HALO_MASTER_ADDR_FILE = "$${NOMAD_TASK_DIR}/halo-master-addr"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-312b5ec4"
        right_delimiter = "halo-312b5ec4]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job ddp-nomad: 2 nodes x 8 processes.
# The same script runs on every node. The backend sets only HALO_NODE_RANK (and maybe
# HALO_NODE_RANK_OFFSET) and the master address (HALO_MASTER_ADDR, or
# HALO_MASTER_ADDR_FILE to poll until rank 0 is known).
set -e
halo_fail() {
  echo "halo-sched: node $halo_rank: $*" >&2
  exit 1
}
halo_rank=$HALO_NODE_RANK
# Nomad's worker group passes its allocation index and HALO_NODE_RANK_OFFSET=1 ($${} cannot add).
halo_offset=$${HALO_NODE_RANK_OFFSET:-0}
# Digits only, and few of them: the sum below can then neither fail nor overflow.
case "$halo_rank:$halo_offset" in
  :* | *: | *[!0-9:]* | *:*:* | ????????????*) halo_fail "HALO_NODE_RANK must be a node rank in 0..1, got '$halo_rank' (offset '$halo_offset')" ;;
esac
halo_rank=$((10#$halo_rank + 10#$halo_offset))  # 10#: a leading zero is not octal
[ "$halo_rank" -lt 2 ] || halo_fail "node rank $halo_rank (HALO_NODE_RANK + offset $halo_offset) is outside 0..1"

# The preemption/time-limit warning (SIGUSR2) is ignored here, in setup and in
# torchrun, and inherited as ignored by the ranks: torchrun would die from it (or, for a signal it
# handles, stop its workers after a short grace). The trainer installs its own handler (Python's
# signal.signal overrides an inherited SIG_IGN) and has until the deadline to checkpoint. A
# handler in this shell would not do: bash resets handled signals to the default in children.
trap '' USR2
export HALO_WARNING_SIGNAL=USR2
# Which run this is: 0 the first time, n after the job was requeued n times.
export HALO_RESTART_COUNT="$${HALO_RESTART_COUNT:-0}"

# Environment for every rank, identical on all nodes (values are literal).
export DIST_SHARED_FILESYSTEM=0
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
export OMP_NUM_THREADS=8
# rendezvous.timeout_s counts from here: a slow setup (pip install, image pull) is not a dead peer.
halo_started=$SECONDS

# Rank 0's address: given, or published later (a file that fills once rank 0 is known).
# The file exists but is blank until then (Nomad's nomadService renders empty; it never blocks).
if [ -n "$HALO_MASTER_ADDR_FILE" ]; then
  while :; do
    HALO_MASTER_ADDR=$(head -n 1 "$HALO_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')
    [ -z "$HALO_MASTER_ADDR" ] || break
    if [ $((SECONDS - halo_started)) -ge 600 ]; then
      halo_fail "rank 0 was not published within rendezvous.timeout_s=600s (waited on $HALO_MASTER_ADDR_FILE); is node 0 placed and running?"
    fi
    sleep 1
  done
fi
[ -n "$HALO_MASTER_ADDR" ] || halo_fail "no master address: the backend set neither HALO_MASTER_ADDR nor HALO_MASTER_ADDR_FILE"
command -v torchrun > /dev/null || halo_fail "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"

echo "halo-sched: node $halo_rank of 2 on $(hostname): master $HALO_MASTER_ADDR:29500" >&2
exec torchrun \
  --nnodes=2 \
  --nproc_per_node=8 \
  --node_rank="$halo_rank" \
  --master_addr="$HALO_MASTER_ADDR" \
  --master_port=29500 \
  --max_restarts=0 \
  --rdzv_conf=timeout=600 \
  /workspace/examples/train_ddp.py \
  --device \
  cuda \
  --steps \
  200
EOT
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = "{{ with nomadService \"ddp-nomad-rdzv\" }}{{ with index . 0 }}{{ .Address }}{{ end }}{{ end }}"
      }

      resources {
        cpu    = 32000
        memory = 491520
        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }
}
