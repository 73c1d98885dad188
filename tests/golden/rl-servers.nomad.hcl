# halo-sched: job rl-grpo for Nomad: 2 nodes. Group "trainer" runs them all,
# node rank = NOMAD_ALLOC_INDEX; rank 0's address comes from its service registration (halo-index-0).
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

  group "trainer" {
    count = 2

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart { attempts = 0 }
    reschedule { attempts = 0 }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    # lost_after (the job's bound plus an hour) keeps Nomad 1.11.2+ from replacing it until then;
    # replace = false keeps older servers from replacing it at all.
    disconnect {
      lost_after = "169h"
      replace    = false
    }

    network {
      mode = "host"
      # A port Nomad picks on the node (rendezvous.port unset): every job its own.
      port "rdzv" {}
      port "group-vllm" { static = 51216 }
    }

    # Each node's address, without Consul; the tag says which node it is. Every node reads index 0's.
    service {
      name     = "rl-grpo-rdzv"
      provider = "nomad"
      port     = "rdzv"
      tags     = ["halo-index-$${NOMAD_ALLOC_INDEX}"]
    }

    task "torchrun" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "ghcr.io/example/halo-trainer:2026.11"
        entrypoint = ["/bin/bash"]
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [{ memlock = "-1", stack = "67108864" }]
        shm_size = 17179869184
        devices = [{ host_path = "/dev/infiniband", container_path = "/dev/infiniband" }]
      }

      env {
        HALO_NODE_RANK = "$${NOMAD_ALLOC_INDEX}"
        HALO_MASTER_ADDR_FILE = "$${NOMAD_TASK_DIR}/halo-master-addr"
        HALO_LOG_DIR = "$${NOMAD_TASK_DIR}/halo-logs"
        HALO_RESULT_FILE = "$${NOMAD_TASK_DIR}/halo-result.json"
        HALO_NODE_RUNTIME_FILE = "$${NOMAD_TASK_DIR}/halo-node.b64"
        HALO_SERVER_VLLM_ADDRS_FILE = "$${NOMAD_TASK_DIR}/halo-server-vllm-addrs"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-9781ee01"
        right_delimiter = "halo-9781ee01]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job rl-grpo: 2 nodes x 8 processes, the same on every node.
# Its input: HALO_NODE_RANK, HALO_MASTER_ADDR/HALO_MASTER_PORT or HALO_MASTER_ADDR_FILE.
set -e
# The failure key signs this node's failure lines; no rank can read it (docs/failures.md).
halo_failure_key=$${HALO_FAILURE_KEY:-}
unset HALO_FAILURE_KEY
halo_fail() { echo "halo-sched: node $halo_rank: $*" >&2; exit 1; }
halo_rank=$HALO_NODE_RANK
# Digits only, and few of them: the arithmetic below can then neither fail nor overflow.
case "$halo_rank" in
  '' | *[!0-9]* | ??????????*) halo_fail "HALO_NODE_RANK must be a node rank in 0..1, got '$halo_rank'" ;;
esac
halo_rank=$((10#$halo_rank))  # 10#: a leading zero is not octal
[ "$halo_rank" -lt 2 ] || halo_fail "node rank $halo_rank (HALO_NODE_RANK) is outside 0..1"

# The warning (SIGUSR2) is ignored here and inherited so; it arrives as SIGURG, noted until the node
# runtime's halo_warning says it and hands SIGUSR2 to each rank once it handles it (docs/slurm.md).
export HALO_WARNING_SIGNAL=USR2
halo_warned_at=
trap '' USR2
trap 'halo_warned_at=$${halo_warned_at:-$SECONDS}' URG
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
command -v torchrun > /dev/null || halo_fail "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"

# The node runtime 0c4c106788766426 (docs/node-runtime.md): the node's own halo-sched at this version, else the
# job's copy (HALO_NODE_RUNTIME or the file HALO_NODE_RUNTIME_FILE), checked, written into the log directory.
halo_log_root=$${HALO_LOG_DIR:-}
[ -n "$halo_log_root" ] || halo_log_root=$(mktemp -d "$${TMPDIR:-/tmp}/halo-sched.XXXXXX")
halo_log_dir=$halo_log_root/node-$halo_rank
mkdir -p "$halo_log_dir"
halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
# $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
halo_node_zip=
if [ "$($halo_py -c 'import halo_sched.node as n; print(n.runtime_version())' 2> /dev/null)" != 0c4c106788766426 ]; then
  halo_node_zip=$halo_log_dir/halo-node-0c4c106788766426.zip
  $halo_py -c 'import base64, hashlib, sys, zlib; out, want, text, path = sys.argv[1:5]; data = zlib.decompressobj().decompress(base64.b64decode("".join((text or (open(path).read() if path else "")).split())), 1 << 24); hashlib.sha256(data).hexdigest() in want.split() or sys.exit("carried: %d bytes, not a zip of sha256 %s" % (len(data), " or ".join(want.split()))); open(out, "wb").write(data)' "$halo_node_zip" '8ddc3c31fcc6b1300326b22282a8b882a76d18e6587073f65e93f30daf1048c5 b95bcf29e89048da21c4fc3fc85bba84cabba24629526c44fc2c4450de2a09e3' "$${HALO_NODE_RUNTIME:-}" "$${HALO_NODE_RUNTIME_FILE:-}" ||
    halo_fail "the node's python ($halo_py) has no halo-sched of version 0c4c106788766426 and the job carries no intact copy of it (docs/node-runtime.md)"
fi
halo_node=($halo_py -c 'import runpy, sys; z, m = sys.argv.pop(1), sys.argv.pop(1); sys.path[:0] = [z] if z else []; runpy.run_module("halo_sched.node." + m, run_name="__main__", alter_sys=True)' "$halo_node_zip")
halo_functions=$("$${halo_node[@]}" shell) && [ -n "$halo_functions" ] ||
  halo_fail "could not read the node runtime's functions (python -m halo_sched.node.shell under $halo_py)"
eval "$halo_functions"
unset halo_functions
unset HALO_NODE_RUNTIME
halo_nproc=8
halo_warning_trap USR2 URG
# Rank 0's address and port: given, or published (a file); waited for within rendezvous.timeout_s.
halo_master 1200

# Rollout servers (servers:; halo_server_urls in halo_sched/node/entry.sh): each role's URLs, then every server
# answers its health path, within rendezvous.timeout_s of the end of setup, before torchrun starts.
halo_server_urls 1200 vllm 1 8000 /health \
  HALO_SERVER_VLLM_ADDRS HALO_SERVER_VLLM_ADDRS_FILE HALO_SERVER_VLLM_URLS
export HALO_SERVER_VLLM_GROUP_PORT=51216
halo_servers_healthy 1200

# Hang guard (docs/failures.md, "Hangs"): no rank progressed for hang.timeout_s, or hang.first_step_s before
# its first report: take every rank's stack and end the node.
halo_hang 300 600 nccl

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
  -m halo.rl.train --config configs/grpo.yaml
EOT
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = <<EOT
{{ with nomadService "halo-index-0.rl-grpo-rdzv" }}{{ with index . 0 }}{{ .Address }}
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
        device "nvidia/gpu" { count = 8 }
      }
    }
  }

  group "server-vllm" {
    count = 1

    restart { attempts = 0 }
    reschedule { attempts = 0 }
    disconnect {
      lost_after = "169h"
      replace    = false
    }

    meta { halo_server_role = "vllm" }

    network {
      mode = "host"
      port "http" { static = 8000 }
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
        ulimit = [{ memlock = "-1", stack = "67108864" }]
        shm_size = 17179869184
        devices = [{ host_path = "/dev/infiniband", container_path = "/dev/infiniband" }]
      }

      env {
        HALO_SERVER_INDEX = "$${NOMAD_ALLOC_INDEX}"
        HALO_SERVER_ADDR = "$${NOMAD_IP_http}"
        HALO_TRAINER_MASTER_ADDR_FILE = "$${NOMAD_TASK_DIR}/halo-master-addr"
        HALO_SERVER_SHELL_FILE = "$${NOMAD_TASK_DIR}/halo-server-shell.sh"
      }

      template {
        destination = "local/halo-server.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-cbf7671c"
        right_delimiter = "halo-cbf7671c]]"
        data        = <<EOT
#!/bin/bash
# halo-sched server entry for job rl-grpo, role vllm: 1 server node(s), port 8000; the same on every
# node of the role. halo_server_*: the node runtime's server shell (halo_sched/node/server.sh, docs/node-runtime.md).
set -e
unset HALO_FAILURE_KEY  # the trainer nodes' key to sign failure lines: no server holds it
eval "$${HALO_SERVER_SHELL:-$(cat "$${HALO_SERVER_SHELL_FILE:-/dev/null}" 2> /dev/null)}"
declare -F halo_server_run > /dev/null || { echo "halo-sched: server vllm: no server shell (HALO_SERVER_SHELL or HALO_SERVER_SHELL_FILE; docs/node-runtime.md)" >&2; exit 1; }
halo_server_start vllm 1 8000 51216
# The job's NCCL_*/DIST_* environment (as every trainer rank's), then the role's own (values are literal).
export DIST_SHARED_FILESYSTEM=1
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
export VLLM_LOGGING_LEVEL=INFO
halo_server_run 1200 vllm serve Qwen/Qwen3-8B --host 0.0.0.0 --port 8000 --tensor-parallel-size 8
EOT
      }

      template {
        destination = "local/halo-server-shell.sh"
        change_mode = "noop"
        data        = "{{ if nomadVarExists \"nomad/jobs/rl-grpo\" }}{{ with nomadVar \"nomad/jobs/rl-grpo\" }}{{ range $k, $v := . }}{{ if eq $k \"halo_server_shell\" }}{{ $v.Value }}{{ end }}{{ end }}{{ end }}{{ end }}"
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = <<EOT
{{ with nomadService "halo-index-0.rl-grpo-rdzv" }}{{ with index . 0 }}{{ .Address }}
{{ .Port }}{{ end }}{{ end }}
EOT
      }

      resources {
        cpu    = 16000
        memory = 65536
        device "nvidia/gpu" { count = 8 }
      }
    }
  }
}
