# halo-sched: job rl-grpo for Nomad: 2 nodes. Group node-0 is node rank 0; group
# workers (count N-1) runs the others, node rank = 1 + NOMAD_ALLOC_INDEX (the entry script adds).
# Plan with `nomad job plan FILE`, run with `nomad job run FILE`.
job "rl-grpo" {
  type        = "batch"
  datacenters = ["*"]

  # Nomad has no gang scheduling; node-sized allocations must at least land on different clients.
  constraint {
    operator = "distinct_hosts"
    value    = "true"
  }

  meta {
    halo_sched_nodes = "2"
    halo_sched_world_size = "16"
    halo_sched_secrets = "nomad/jobs/rl-grpo"
    halo_sched_servers = "vllm:1"
  }

  group "node-0" {
    count = 1

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart {
      attempts = 0
      mode     = "fail"
      interval = "24h"
      delay    = "15s"
    }
    reschedule {
      attempts  = 0
      interval  = "0s"
      unlimited = false
    }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    # lost_after (the job's bound plus an hour) keeps Nomad 1.11.2+ from replacing it until then;
    # replace = false keeps older servers from replacing it at all.
    disconnect {
      lost_after = "169h"
      replace    = false
    }

    meta {
      halo_node_rank = "0"
    }

    network {
      mode = "host"
      # A port Nomad picks on the node (rendezvous.port unset): every job its own.
      port "rdzv" {}
      port "group-vllm" {
        static = 51216
      }
    }

    # Rank 0's address for the other nodes, without Consul.
    service {
      name     = "rl-grpo-rdzv"
      provider = "nomad"
      port     = "rdzv"
    }

    task "torchrun" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "ghcr.io/example/halo-trainer:2026.11"
        entrypoint = ["/bin/bash"]
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [
          {
            memlock = "-1"
            stack = "67108864"
          },
        ]
        shm_size = 17179869184
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
        HALO_MASTER_PORT = "$${NOMAD_PORT_rdzv}"
        HALO_LOG_DIR = "$${NOMAD_TASK_DIR}/halo-logs"
        HALO_NODE_RUNTIME_FILE = "$${NOMAD_TASK_DIR}/halo-node.b64"
        HALO_SERVER_VLLM_ADDRS_FILE = "$${NOMAD_TASK_DIR}/halo-server-vllm-addrs"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-f5b14a61"
        right_delimiter = "halo-f5b14a61]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job rl-grpo: 2 nodes x 8 processes, the same on every node.
# Its input: HALO_NODE_RANK (+ HALO_NODE_RANK_OFFSET), HALO_MASTER_ADDR/HALO_MASTER_PORT or HALO_MASTER_ADDR_FILE.
set -e
# The job's failure key: this node's reporters sign their failure lines with it, and a line a rank
# prints is no verdict because no rank can read it from its environment (docs/failures.md).
halo_failure_key=$${HALO_FAILURE_KEY:-}
unset HALO_FAILURE_KEY
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

# The warning (SIGUSR2) is ignored here, in setup, torchrun and the ranks; the trainer installs its own
# handler. It arrives as SIGURG (ignored by default): this shell then hands SIGUSR2 to each rank
# once that rank handles it (halo_deliver; the why: halo_sched/node/entry.sh, docs/slurm.md).
export HALO_WARNING_SIGNAL=USR2
halo_warned_at=
halo_torchrun=
halo_deliverer=
halo_warning() {
  halo_trapped=1
  [ -z "$halo_warned_at" ] || return 0
  halo_warned_at=$SECONDS
  echo "halo-sched: node $halo_rank: warning at $(date +%H:%M:%S); SIGUSR2 goes to each rank once it handles it" >&2
  [ -z "$halo_torchrun" ] || halo_deliver
}
trap '' USR2
trap halo_warning URG
# Which run this is: 0 the first time, n after the job was requeued n times.
export HALO_RESTART_COUNT="$${HALO_RESTART_COUNT:-0}"

# Environment for every rank, identical on all nodes (values are literal).
export DIST_SHARED_FILESYSTEM=1
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
# rendezvous.timeout_s counts from here: a slow setup (pip install, image pull) is not a dead peer.
halo_started=$SECONDS

# Rank 0's address and port: given, or published later (a file whose first line is the address
# and second the port once rank 0 is known). The file exists but is blank until then (Nomad's
# nomadService renders empty; it never blocks).
if [ -n "$HALO_MASTER_ADDR_FILE" ]; then
  while :; do
    halo_published=$(head -n 2 "$HALO_MASTER_ADDR_FILE" 2> /dev/null | tr -d ' \t\r' | tr '\n' ' ')
    read -r HALO_MASTER_ADDR HALO_MASTER_PORT halo_rest <<< "$halo_published" || true
    [ -z "$HALO_MASTER_ADDR" ] || [ -z "$HALO_MASTER_PORT" ] || break
    if [ $((SECONDS - halo_started)) -ge 1200 ]; then
      halo_fail "rank 0 was not published within rendezvous.timeout_s=1200s (waited on $HALO_MASTER_ADDR_FILE); is node 0 placed and running?"
    fi
    sleep 1
  done
fi
[ -n "$HALO_MASTER_ADDR" ] || halo_fail "no master address: the backend set neither HALO_MASTER_ADDR nor HALO_MASTER_ADDR_FILE"
case "$${HALO_MASTER_PORT:-}" in
  '' | *[!0-9]* | ??????*) halo_fail "no master port: the backend gave HALO_MASTER_PORT='$${HALO_MASTER_PORT:-}', not a port in 1..65535" ;;
esac
HALO_MASTER_PORT=$((10#$HALO_MASTER_PORT))
[ "$HALO_MASTER_PORT" -ge 1 ] && [ "$HALO_MASTER_PORT" -le 65535 ] || halo_fail "HALO_MASTER_PORT=$HALO_MASTER_PORT is not a port in 1..65535"
command -v torchrun > /dev/null || halo_fail "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"

# ---- The node runtime eb6ced3703f288d1 (halo_sched/node/; docs/node-runtime.md): the node's own halo-sched
# when it is this version, else the job's zip (HALO_NODE_RUNTIME, or the file HALO_NODE_RUNTIME_FILE),
# checked by its SHA-256 and written once into this node's log directory.
halo_log_root=$${HALO_LOG_DIR:-}
[ -n "$halo_log_root" ] || halo_log_root=$(mktemp -d "$${TMPDIR:-/tmp}/halo-sched.XXXXXX")
halo_log_dir=$halo_log_root/node-$halo_rank
mkdir -p "$halo_log_dir"
halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
# $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
halo_node_zip=
if [ "$($halo_py -c 'import halo_sched.node as n; print(n.runtime_version())' 2> /dev/null)" != eb6ced3703f288d1 ]; then
  halo_node_zip=$halo_log_dir/halo-node-eb6ced3703f288d1.zip
  $halo_py -c 'import base64, hashlib, sys; out, want, text, path = sys.argv[1:5]; data = base64.b64decode("".join((text or (open(path).read() if path else "")).split())); hashlib.sha256(data).hexdigest() == want or sys.exit("carried: %d bytes, not the zip of sha256 %s" % (len(data), want)); open(out, "wb").write(data)' "$halo_node_zip" 9a0208f0b8269076adb5c79f6d349b81e834bc072f90097e23a01be239df106f "$${HALO_NODE_RUNTIME:-}" "$${HALO_NODE_RUNTIME_FILE:-}" ||
    halo_fail "the node's python ($halo_py) has no halo-sched of version eb6ced3703f288d1 and the job carries no intact copy of it (docs/node-runtime.md)"
fi
unset HALO_NODE_RUNTIME
halo_node=($halo_py -c 'import runpy, sys; z, m = sys.argv.pop(1), sys.argv.pop(1); sys.path[:0] = [z] if z else []; runpy.run_module("halo_sched.node." + m, run_name="__main__", alter_sys=True)' "$halo_node_zip")
# "$${halo_node[@]}" MODULE ARGS: python -m halo_sched.node.MODULE from there; then the entry's job-free functions.
halo_functions=$("$${halo_node[@]}" shell) && [ -n "$halo_functions" ] ||
  halo_fail "could not read the node runtime's functions (python -m halo_sched.node.shell under $halo_py)"
eval "$halo_functions"
unset halo_functions
halo_signal=USR2
halo_nproc=8

# ---- Rollout servers (servers:, halo_sched/servers.py) ----
# Each role's addresses come from the backend: HALO_SERVER_<NAME>_ADDRS (comma-separated, server
# order) or HALO_SERVER_<NAME>_ADDRS_FILE (lines "halo-index-K ADDR", filled as servers register;
# blank until then). Then every server must answer GET health_path with 200 before torchrun starts;
# all of it within rendezvous.timeout_s, counted from the end of setup.
halo_server_addrs() {  # ROLE NODES VAR FILE_VAR -> halo_addrs="A0,A1,..."
  local halo_k halo_a halo_missing halo_file="$${!4:-}"
  while :; do
    halo_addrs=$${!3:-}
    [ -n "$halo_file" ] || break
    halo_addrs= halo_missing=
    for ((halo_k = 0; halo_k < $2; halo_k++)); do
      halo_a=$(awk -v t="halo-index-$halo_k" '$1 == t && $2 != "" { print $2; exit }' "$halo_file" 2> /dev/null)
      [ -n "$halo_a" ] || halo_missing="$halo_missing $1[$halo_k]"
      halo_addrs="$halo_addrs$${halo_addrs:+,}$halo_a"
    done
    [ -n "$halo_missing" ] || break
    if [ $((SECONDS - halo_started)) -ge 1200 ]; then
      halo_fail "server(s)$halo_missing not registered within rendezvous.timeout_s=1200s (waited on $halo_file); are they placed and running?"
    fi
    sleep 1
  done
  local halo_n
  halo_n=$(echo "$halo_addrs" | awk -F, '{ print NF }')
  [ "$halo_n" = "$2" ] || halo_fail "the backend gave $halo_n address(es) for server role $1 ('$halo_addrs'), expected $2"
}
halo_health=()
halo_server_addrs vllm 1 HALO_SERVER_VLLM_ADDRS HALO_SERVER_VLLM_ADDRS_FILE
HALO_SERVER_VLLM_URLS=
halo_k=0
for halo_a in $${halo_addrs//,/ }; do
  case "$halo_a" in *:*) halo_a="[$halo_a]" ;; esac
  HALO_SERVER_VLLM_URLS="$HALO_SERVER_VLLM_URLS$${HALO_SERVER_VLLM_URLS:+,}http://$halo_a:8000"
  halo_health+=("vllm[$halo_k]" "http://$halo_a:8000"/health)
  halo_k=$((halo_k + 1))
done
export HALO_SERVER_VLLM_URLS
export HALO_SERVER_VLLM_GROUP_PORT=51216
echo "halo-sched: node $halo_rank: server vllm: $HALO_SERVER_VLLM_URLS" >&2
halo_left=$((1200 - (SECONDS - halo_started)))
[ "$halo_left" -gt 0 ] || halo_left=1
"$${halo_node[@]}" server_health "$halo_left" "$${halo_health[@]}" < /dev/null ||
  halo_fail "not every rollout server answered its health path within rendezvous.timeout_s=1200s (see above); not starting the trainer"
unset halo_health halo_addrs halo_left halo_k halo_a


# ---- Failure report (halo_sched/node/failure_collector.py) ----
# torchrun --log-dir/--tee: each rank's output also lands in a file; when torchrun fails, the
# collector prints one "halo-sched-failure {json}" line per failed rank, where every backend finds it.
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank $${rank}] '
# Only torchrun gets this tag in its environment: it finds what torchrun started, however deep or
# reparented (its workers run in sessions of their own and would outlive the job; entry.sh).
halo_node_tag=node$halo_rank-$$-$(date +%s%N)-$RANDOM
# halo_run (halo_sched/node/entry.sh) runs torchrun with the tag, the hang monitor beside it and
# the warning's deliverer; then it sweeps what torchrun left (TERM, KILL after 5 s, up to 15 s)
# and, when torchrun failed, runs the failure collector.

# ---- Hang detection (hang.timeout_s; halo_sched/node/hang_monitor.py, progress.py) ----
# A monitor beside torchrun ends the node when no rank progressed (lines in $HALO_PROGRESS_DIR/rank-$RANK)
# for hang.timeout_s=300s (600s before a rank's first report), after taking every rank's
# stack (docs/failures.md, "Hangs"); it copies the progress files to $HALO_PROGRESS_MIRROR where set.
export HALO_PROGRESS_DIR=$halo_log_dir/progress
mkdir -p "$HALO_PROGRESS_DIR"
export HALO_STACK_SIGNAL=$(kill -l RTMIN+5)
export PYTHONFAULTHANDLER=$${PYTHONFAULTHANDLER:-1}
# NCCL's flight recorder: each rank's last collectives, dumped beside the logs on NCCL's timeout.
# (torch 2.13 reads these older names too, with a deprecation warning; TORCH_FR_* set wins.)
if [ -z "$${TORCH_FR_BUFFER_SIZE:-}$${TORCH_FR_DUMP_TEMP_FILE:-}" ]; then
  export TORCH_NCCL_TRACE_BUFFER_SIZE=$${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}
  export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$halo_log_dir/nccl_trace_rank_}
fi
export TORCH_NCCL_DUMP_ON_TIMEOUT=$${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
halo_monitor=
halo_hang_start() {
  "$${halo_node[@]}" hang_monitor "$halo_rank" "$1" "$HALO_PROGRESS_DIR" "$halo_log_dir" \
    8 300 600 "$HALO_STACK_SIGNAL" \
    "$${HALO_PROGRESS_MIRROR:-}" <<< "$halo_failure_key" &  # the key on stdin: not in its environment
  halo_monitor=$!
}
# After torchrun: a monitor that fired finishes its report (bounded by its own waits); one that
# did not ends at once.
halo_hang_stop() {
  [ -n "$halo_monitor" ] || return 0
  kill -TERM "$halo_monitor" 2> /dev/null || true
  wait "$halo_monitor" 2> /dev/null || wait "$halo_monitor" 2> /dev/null || true
  halo_monitor=
}

echo "halo-sched: node $halo_rank of 2 on $(hostname): master $HALO_MASTER_ADDR:$HALO_MASTER_PORT" >&2
halo_run torchrun \
  --nnodes=2 \
  --nproc_per_node=8 \
  --node_rank="$halo_rank" \
  --master_addr="$HALO_MASTER_ADDR" \
  --master_port="$HALO_MASTER_PORT" \
  --max_restarts=0 \
  --rdzv_conf=timeout=1200 \
  --log-dir="$halo_log_dir" \
  --tee=3 \
  -m \
  halo.rl.train \
  --config \
  configs/grpo.yaml
EOT
      }

      template {
        destination = "local/halo-node.b64"
        change_mode = "noop"
        data        = "{{ if nomadVarExists \"nomad/jobs/rl-grpo\" }}{{ with nomadVar \"nomad/jobs/rl-grpo\" }}{{ range $k, $v := . }}{{ if eq $k \"halo_node_runtime\" }}{{ $v.Value }}{{ end }}{{ end }}{{ end }}{{ end }}"
      }

      template {
        destination = "local/halo-server-vllm-addrs"
        change_mode = "noop"
        data        = <<EOT
{{ range nomadService "rl-grpo-srv-vllm" }}{{ range .Tags }}{{ . }} {{ end }}{{ .Address }}
{{ end }}
EOT
      }

      resources {
        cpu    = 16000
        memory = 65536
        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }

  group "workers" {
    count = 1

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart {
      attempts = 0
      mode     = "fail"
      interval = "24h"
      delay    = "15s"
    }
    reschedule {
      attempts  = 0
      interval  = "0s"
      unlimited = false
    }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    # lost_after (the job's bound plus an hour) keeps Nomad 1.11.2+ from replacing it until then;
    # replace = false keeps older servers from replacing it at all.
    disconnect {
      lost_after = "169h"
      replace    = false
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
        image = "ghcr.io/example/halo-trainer:2026.11"
        entrypoint = ["/bin/bash"]
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [
          {
            memlock = "-1"
            stack = "67108864"
          },
        ]
        shm_size = 17179869184
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
        HALO_LOG_DIR = "$${NOMAD_TASK_DIR}/halo-logs"
        HALO_NODE_RUNTIME_FILE = "$${NOMAD_TASK_DIR}/halo-node.b64"
        HALO_SERVER_VLLM_ADDRS_FILE = "$${NOMAD_TASK_DIR}/halo-server-vllm-addrs"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-f5b14a61"
        right_delimiter = "halo-f5b14a61]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job rl-grpo: 2 nodes x 8 processes, the same on every node.
# Its input: HALO_NODE_RANK (+ HALO_NODE_RANK_OFFSET), HALO_MASTER_ADDR/HALO_MASTER_PORT or HALO_MASTER_ADDR_FILE.
set -e
# The job's failure key: this node's reporters sign their failure lines with it, and a line a rank
# prints is no verdict because no rank can read it from its environment (docs/failures.md).
halo_failure_key=$${HALO_FAILURE_KEY:-}
unset HALO_FAILURE_KEY
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

# The warning (SIGUSR2) is ignored here, in setup, torchrun and the ranks; the trainer installs its own
# handler. It arrives as SIGURG (ignored by default): this shell then hands SIGUSR2 to each rank
# once that rank handles it (halo_deliver; the why: halo_sched/node/entry.sh, docs/slurm.md).
export HALO_WARNING_SIGNAL=USR2
halo_warned_at=
halo_torchrun=
halo_deliverer=
halo_warning() {
  halo_trapped=1
  [ -z "$halo_warned_at" ] || return 0
  halo_warned_at=$SECONDS
  echo "halo-sched: node $halo_rank: warning at $(date +%H:%M:%S); SIGUSR2 goes to each rank once it handles it" >&2
  [ -z "$halo_torchrun" ] || halo_deliver
}
trap '' USR2
trap halo_warning URG
# Which run this is: 0 the first time, n after the job was requeued n times.
export HALO_RESTART_COUNT="$${HALO_RESTART_COUNT:-0}"

# Environment for every rank, identical on all nodes (values are literal).
export DIST_SHARED_FILESYSTEM=1
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
# rendezvous.timeout_s counts from here: a slow setup (pip install, image pull) is not a dead peer.
halo_started=$SECONDS

# Rank 0's address and port: given, or published later (a file whose first line is the address
# and second the port once rank 0 is known). The file exists but is blank until then (Nomad's
# nomadService renders empty; it never blocks).
if [ -n "$HALO_MASTER_ADDR_FILE" ]; then
  while :; do
    halo_published=$(head -n 2 "$HALO_MASTER_ADDR_FILE" 2> /dev/null | tr -d ' \t\r' | tr '\n' ' ')
    read -r HALO_MASTER_ADDR HALO_MASTER_PORT halo_rest <<< "$halo_published" || true
    [ -z "$HALO_MASTER_ADDR" ] || [ -z "$HALO_MASTER_PORT" ] || break
    if [ $((SECONDS - halo_started)) -ge 1200 ]; then
      halo_fail "rank 0 was not published within rendezvous.timeout_s=1200s (waited on $HALO_MASTER_ADDR_FILE); is node 0 placed and running?"
    fi
    sleep 1
  done
fi
[ -n "$HALO_MASTER_ADDR" ] || halo_fail "no master address: the backend set neither HALO_MASTER_ADDR nor HALO_MASTER_ADDR_FILE"
case "$${HALO_MASTER_PORT:-}" in
  '' | *[!0-9]* | ??????*) halo_fail "no master port: the backend gave HALO_MASTER_PORT='$${HALO_MASTER_PORT:-}', not a port in 1..65535" ;;
esac
HALO_MASTER_PORT=$((10#$HALO_MASTER_PORT))
[ "$HALO_MASTER_PORT" -ge 1 ] && [ "$HALO_MASTER_PORT" -le 65535 ] || halo_fail "HALO_MASTER_PORT=$HALO_MASTER_PORT is not a port in 1..65535"
command -v torchrun > /dev/null || halo_fail "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"

# ---- The node runtime eb6ced3703f288d1 (halo_sched/node/; docs/node-runtime.md): the node's own halo-sched
# when it is this version, else the job's zip (HALO_NODE_RUNTIME, or the file HALO_NODE_RUNTIME_FILE),
# checked by its SHA-256 and written once into this node's log directory.
halo_log_root=$${HALO_LOG_DIR:-}
[ -n "$halo_log_root" ] || halo_log_root=$(mktemp -d "$${TMPDIR:-/tmp}/halo-sched.XXXXXX")
halo_log_dir=$halo_log_root/node-$halo_rank
mkdir -p "$halo_log_dir"
halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
# $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
halo_node_zip=
if [ "$($halo_py -c 'import halo_sched.node as n; print(n.runtime_version())' 2> /dev/null)" != eb6ced3703f288d1 ]; then
  halo_node_zip=$halo_log_dir/halo-node-eb6ced3703f288d1.zip
  $halo_py -c 'import base64, hashlib, sys; out, want, text, path = sys.argv[1:5]; data = base64.b64decode("".join((text or (open(path).read() if path else "")).split())); hashlib.sha256(data).hexdigest() == want or sys.exit("carried: %d bytes, not the zip of sha256 %s" % (len(data), want)); open(out, "wb").write(data)' "$halo_node_zip" 9a0208f0b8269076adb5c79f6d349b81e834bc072f90097e23a01be239df106f "$${HALO_NODE_RUNTIME:-}" "$${HALO_NODE_RUNTIME_FILE:-}" ||
    halo_fail "the node's python ($halo_py) has no halo-sched of version eb6ced3703f288d1 and the job carries no intact copy of it (docs/node-runtime.md)"
fi
unset HALO_NODE_RUNTIME
halo_node=($halo_py -c 'import runpy, sys; z, m = sys.argv.pop(1), sys.argv.pop(1); sys.path[:0] = [z] if z else []; runpy.run_module("halo_sched.node." + m, run_name="__main__", alter_sys=True)' "$halo_node_zip")
# "$${halo_node[@]}" MODULE ARGS: python -m halo_sched.node.MODULE from there; then the entry's job-free functions.
halo_functions=$("$${halo_node[@]}" shell) && [ -n "$halo_functions" ] ||
  halo_fail "could not read the node runtime's functions (python -m halo_sched.node.shell under $halo_py)"
eval "$halo_functions"
unset halo_functions
halo_signal=USR2
halo_nproc=8

# ---- Rollout servers (servers:, halo_sched/servers.py) ----
# Each role's addresses come from the backend: HALO_SERVER_<NAME>_ADDRS (comma-separated, server
# order) or HALO_SERVER_<NAME>_ADDRS_FILE (lines "halo-index-K ADDR", filled as servers register;
# blank until then). Then every server must answer GET health_path with 200 before torchrun starts;
# all of it within rendezvous.timeout_s, counted from the end of setup.
halo_server_addrs() {  # ROLE NODES VAR FILE_VAR -> halo_addrs="A0,A1,..."
  local halo_k halo_a halo_missing halo_file="$${!4:-}"
  while :; do
    halo_addrs=$${!3:-}
    [ -n "$halo_file" ] || break
    halo_addrs= halo_missing=
    for ((halo_k = 0; halo_k < $2; halo_k++)); do
      halo_a=$(awk -v t="halo-index-$halo_k" '$1 == t && $2 != "" { print $2; exit }' "$halo_file" 2> /dev/null)
      [ -n "$halo_a" ] || halo_missing="$halo_missing $1[$halo_k]"
      halo_addrs="$halo_addrs$${halo_addrs:+,}$halo_a"
    done
    [ -n "$halo_missing" ] || break
    if [ $((SECONDS - halo_started)) -ge 1200 ]; then
      halo_fail "server(s)$halo_missing not registered within rendezvous.timeout_s=1200s (waited on $halo_file); are they placed and running?"
    fi
    sleep 1
  done
  local halo_n
  halo_n=$(echo "$halo_addrs" | awk -F, '{ print NF }')
  [ "$halo_n" = "$2" ] || halo_fail "the backend gave $halo_n address(es) for server role $1 ('$halo_addrs'), expected $2"
}
halo_health=()
halo_server_addrs vllm 1 HALO_SERVER_VLLM_ADDRS HALO_SERVER_VLLM_ADDRS_FILE
HALO_SERVER_VLLM_URLS=
halo_k=0
for halo_a in $${halo_addrs//,/ }; do
  case "$halo_a" in *:*) halo_a="[$halo_a]" ;; esac
  HALO_SERVER_VLLM_URLS="$HALO_SERVER_VLLM_URLS$${HALO_SERVER_VLLM_URLS:+,}http://$halo_a:8000"
  halo_health+=("vllm[$halo_k]" "http://$halo_a:8000"/health)
  halo_k=$((halo_k + 1))
done
export HALO_SERVER_VLLM_URLS
export HALO_SERVER_VLLM_GROUP_PORT=51216
echo "halo-sched: node $halo_rank: server vllm: $HALO_SERVER_VLLM_URLS" >&2
halo_left=$((1200 - (SECONDS - halo_started)))
[ "$halo_left" -gt 0 ] || halo_left=1
"$${halo_node[@]}" server_health "$halo_left" "$${halo_health[@]}" < /dev/null ||
  halo_fail "not every rollout server answered its health path within rendezvous.timeout_s=1200s (see above); not starting the trainer"
unset halo_health halo_addrs halo_left halo_k halo_a


# ---- Failure report (halo_sched/node/failure_collector.py) ----
# torchrun --log-dir/--tee: each rank's output also lands in a file; when torchrun fails, the
# collector prints one "halo-sched-failure {json}" line per failed rank, where every backend finds it.
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank $${rank}] '
# Only torchrun gets this tag in its environment: it finds what torchrun started, however deep or
# reparented (its workers run in sessions of their own and would outlive the job; entry.sh).
halo_node_tag=node$halo_rank-$$-$(date +%s%N)-$RANDOM
# halo_run (halo_sched/node/entry.sh) runs torchrun with the tag, the hang monitor beside it and
# the warning's deliverer; then it sweeps what torchrun left (TERM, KILL after 5 s, up to 15 s)
# and, when torchrun failed, runs the failure collector.

# ---- Hang detection (hang.timeout_s; halo_sched/node/hang_monitor.py, progress.py) ----
# A monitor beside torchrun ends the node when no rank progressed (lines in $HALO_PROGRESS_DIR/rank-$RANK)
# for hang.timeout_s=300s (600s before a rank's first report), after taking every rank's
# stack (docs/failures.md, "Hangs"); it copies the progress files to $HALO_PROGRESS_MIRROR where set.
export HALO_PROGRESS_DIR=$halo_log_dir/progress
mkdir -p "$HALO_PROGRESS_DIR"
export HALO_STACK_SIGNAL=$(kill -l RTMIN+5)
export PYTHONFAULTHANDLER=$${PYTHONFAULTHANDLER:-1}
# NCCL's flight recorder: each rank's last collectives, dumped beside the logs on NCCL's timeout.
# (torch 2.13 reads these older names too, with a deprecation warning; TORCH_FR_* set wins.)
if [ -z "$${TORCH_FR_BUFFER_SIZE:-}$${TORCH_FR_DUMP_TEMP_FILE:-}" ]; then
  export TORCH_NCCL_TRACE_BUFFER_SIZE=$${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}
  export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=$${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$halo_log_dir/nccl_trace_rank_}
fi
export TORCH_NCCL_DUMP_ON_TIMEOUT=$${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
halo_monitor=
halo_hang_start() {
  "$${halo_node[@]}" hang_monitor "$halo_rank" "$1" "$HALO_PROGRESS_DIR" "$halo_log_dir" \
    8 300 600 "$HALO_STACK_SIGNAL" \
    "$${HALO_PROGRESS_MIRROR:-}" <<< "$halo_failure_key" &  # the key on stdin: not in its environment
  halo_monitor=$!
}
# After torchrun: a monitor that fired finishes its report (bounded by its own waits); one that
# did not ends at once.
halo_hang_stop() {
  [ -n "$halo_monitor" ] || return 0
  kill -TERM "$halo_monitor" 2> /dev/null || true
  wait "$halo_monitor" 2> /dev/null || wait "$halo_monitor" 2> /dev/null || true
  halo_monitor=
}

echo "halo-sched: node $halo_rank of 2 on $(hostname): master $HALO_MASTER_ADDR:$HALO_MASTER_PORT" >&2
halo_run torchrun \
  --nnodes=2 \
  --nproc_per_node=8 \
  --node_rank="$halo_rank" \
  --master_addr="$HALO_MASTER_ADDR" \
  --master_port="$HALO_MASTER_PORT" \
  --max_restarts=0 \
  --rdzv_conf=timeout=1200 \
  --log-dir="$halo_log_dir" \
  --tee=3 \
  -m \
  halo.rl.train \
  --config \
  configs/grpo.yaml
EOT
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = <<EOT
{{ with nomadService "rl-grpo-rdzv" }}{{ with index . 0 }}{{ .Address }}
{{ .Port }}{{ end }}{{ end }}
EOT
      }

      template {
        destination = "local/halo-node.b64"
        change_mode = "noop"
        data        = "{{ if nomadVarExists \"nomad/jobs/rl-grpo\" }}{{ with nomadVar \"nomad/jobs/rl-grpo\" }}{{ range $k, $v := . }}{{ if eq $k \"halo_node_runtime\" }}{{ $v.Value }}{{ end }}{{ end }}{{ end }}{{ end }}"
      }

      template {
        destination = "local/halo-server-vllm-addrs"
        change_mode = "noop"
        data        = <<EOT
{{ range nomadService "rl-grpo-srv-vllm" }}{{ range .Tags }}{{ . }} {{ end }}{{ .Address }}
{{ end }}
EOT
      }

      resources {
        cpu    = 16000
        memory = 65536
        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }

  group "server-vllm" {
    count = 1

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart {
      attempts = 0
      mode     = "fail"
      interval = "24h"
      delay    = "15s"
    }
    reschedule {
      attempts  = 0
      interval  = "0s"
      unlimited = false
    }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    # lost_after (the job's bound plus an hour) keeps Nomad 1.11.2+ from replacing it until then;
    # replace = false keeps older servers from replacing it at all.
    disconnect {
      lost_after = "169h"
      replace    = false
    }

    meta {
      halo_server_role = "vllm"
    }

    network {
      mode = "host"
      port "http" {
        static = 8000
      }
    }

    # This server's address for the trainer, without Consul; the tag says which server it is.
    service {
      name     = "rl-grpo-srv-vllm"
      provider = "nomad"
      port     = "http"
      tags     = ["halo-index-$${NOMAD_ALLOC_INDEX}"]
    }

    task "server" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "vllm/vllm-openai:v0.11.0"
        entrypoint = ["/bin/bash"]
        args = ["$${NOMAD_TASK_DIR}/halo-server.sh"]
        network_mode = "host"
        ulimit = [
          {
            memlock = "-1"
            stack = "67108864"
          },
        ]
        shm_size = 17179869184
        devices = [
          {
            host_path = "/dev/infiniband"
            container_path = "/dev/infiniband"
          },
        ]
      }

      env {
        HALO_SERVER_INDEX = "$${NOMAD_ALLOC_INDEX}"
        HALO_SERVER_ADDR = "$${NOMAD_IP_http}"
        HALO_TRAINER_MASTER_ADDR_FILE = "$${NOMAD_TASK_DIR}/halo-master-addr"
      }

      template {
        destination = "local/halo-server.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-b4cf2632"
        right_delimiter = "halo-b4cf2632]]"
        data        = <<EOT
#!/bin/bash
# halo-sched server entry for job rl-grpo, role vllm: 1 server node(s), port 8000.
# The same script runs on every node of the role. The backend sets HALO_SERVER_INDEX (0-based, node
# order), the trainer's rank-0 address (HALO_TRAINER_MASTER_ADDR, or HALO_TRAINER_MASTER_ADDR_FILE to poll) and,
# where it knows it, this node's address (HALO_SERVER_ADDR).
set -e
unset HALO_FAILURE_KEY  # the trainer nodes' key to sign failure lines: no server holds it
halo_fail() {
  echo "halo-sched: server vllm[$${HALO_SERVER_INDEX:-?}]: $*" >&2
  exit 1
}
case "$${HALO_SERVER_INDEX:-}" in
  '' | *[!0-9]* | ?????????*) halo_fail "HALO_SERVER_INDEX must be a server index in 0..0, got '$${HALO_SERVER_INDEX:-}'" ;;
esac
[ "$((10#$HALO_SERVER_INDEX))" -lt 1 ] || halo_fail "HALO_SERVER_INDEX=$HALO_SERVER_INDEX is outside 0..0"
export HALO_SERVER_INDEX=$((10#$HALO_SERVER_INDEX))
export HALO_SERVER_NAME=vllm HALO_SERVER_PORT=8000
export HALO_SERVER_GROUP_PORT=51216

# The job's fabric and storage environment (the same NCCL_*/DIST_* as every trainer rank), then
# the role's own (values are literal).
export DIST_SHARED_FILESYSTEM=1
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
export VLLM_LOGGING_LEVEL=INFO
halo_started=$SECONDS

# The trainer's rank-0 address (where the weight-sync group is bound): given, or published later.
if [ -n "$${HALO_TRAINER_MASTER_ADDR_FILE:-}" ]; then
  while :; do
    HALO_TRAINER_MASTER_ADDR=$(head -n 1 "$HALO_TRAINER_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')
    [ -z "$HALO_TRAINER_MASTER_ADDR" ] || break
    if [ $((SECONDS - halo_started)) -ge 1200 ]; then
      halo_fail "the trainer's rank 0 was not published within rendezvous.timeout_s=1200s (waited on $HALO_TRAINER_MASTER_ADDR_FILE); is node-0 placed and running?"
    fi
    sleep 1
  done
fi
[ -n "$${HALO_TRAINER_MASTER_ADDR:-}" ] || halo_fail "no trainer address: the backend set neither HALO_TRAINER_MASTER_ADDR nor HALO_TRAINER_MASTER_ADDR_FILE"
export HALO_TRAINER_MASTER_ADDR
echo "halo-sched: server vllm[$HALO_SERVER_INDEX] on $(hostname) ($${HALO_SERVER_ADDR:-?}:8000); trainer rank 0 at $HALO_TRAINER_MASTER_ADDR" >&2

halo_cmd=(
  vllm
  serve
  Qwen/Qwen3-8B
  --host
  0.0.0.0
  --port
  8000
  --tensor-parallel-size
  8
)
if [ -z "$${HALO_TRAINER_MASTER_ADDR_FILE:-}" ]; then
  # SLURM and local: the batch script or supervisor stops the server when the trainer ends.
  exec "$${halo_cmd[@]}"
fi
# Nomad: no scheduler ends this group when the trainer's groups end (the job's watcher stops the
# job). Also end on our own: once rank 0's registration is gone (its allocation ended, Nomad
# deregistered the service and the template re-rendered empty) for 3 looks in a row, stop the
# server and exit 0. TERM is passed on: Nomad signals this shell alone.
"$${halo_cmd[@]}" &
halo_pid=$!
trap 'kill -TERM "$halo_pid" 2> /dev/null || true' TERM INT
halo_gone=0
while kill -0 "$halo_pid" 2> /dev/null; do
  if [ -z "$(head -n 1 "$HALO_TRAINER_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')" ]; then
    halo_gone=$((halo_gone + 1))
  else
    halo_gone=0
  fi
  if [ "$halo_gone" -ge 3 ]; then
    echo "halo-sched: server vllm[$HALO_SERVER_INDEX]: the trainer's rank 0 is gone; stopping the server" >&2
    kill -TERM "$halo_pid" 2> /dev/null || true
    wait "$halo_pid" 2> /dev/null || true
    exit 0
  fi
  sleep 2 &
  wait $! || true
done
halo_rc=0
wait "$halo_pid" || halo_rc=$?
exit "$halo_rc"
EOT
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = <<EOT
{{ with nomadService "rl-grpo-rdzv" }}{{ with index . 0 }}{{ .Address }}
{{ .Port }}{{ end }}{{ end }}
EOT
      }

      resources {
        cpu    = 16000
        memory = 65536
        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }
}
