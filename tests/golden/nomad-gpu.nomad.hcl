# halo-sched: job ddp-nomad for Nomad: 2 nodes. Group "trainer" runs them all,
# node rank = NOMAD_ALLOC_INDEX; rank 0's address comes from its service registration (halo-index-0).
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
    halo_sched_secrets = "nomad/jobs/ddp-nomad"
  }

  group "trainer" {
    count = 2
    # Nomad 2.0.3+: each allocation is stopped this long after its creation (halo-sched reports
    # TIMEOUT). A group that never placed has no allocation and no timer: it bounds a hung job,
    # not a half-placed one. Older `nomad job run` rejects this line.
    max_run_duration = "12h"

    # A fixed-size world never re-forms around a replaced rank: no restarts, no reschedules.
    restart { attempts = 0 }
    reschedule { attempts = 0 }
    # A rank whose node goes down is not replaced (Nomad would, whatever the reschedule policy):
    # its allocation turns "unknown" and whoever watches the job stops it. Nomad 1.8+.
    # lost_after (the job's bound plus an hour) keeps Nomad 1.11.2+ from replacing it until then;
    # replace = false keeps older servers from replacing it at all.
    disconnect {
      lost_after = "13h"
      replace    = false
    }

    network {
      mode = "host"
      # A port Nomad picks on the node (rendezvous.port unset): every job its own.
      port "rdzv" {}
    }

    # Each node's address, without Consul; the tag says which node it is. Every node reads index 0's.
    service {
      name     = "ddp-nomad-rdzv"
      provider = "nomad"
      port     = "rdzv"
      tags     = ["halo-index-$${NOMAD_ALLOC_INDEX}"]
    }

    task "torchrun" {
      driver       = "docker"
      kill_timeout = "30s"

      config {
        image = "ghcr.io/example/trainer:2.13.0-cuda13"
        entrypoint = ["/bin/bash"]
        args = ["$${NOMAD_TASK_DIR}/halo-entry.sh"]
        network_mode = "host"
        ulimit = [{ memlock = "-1", stack = "67108864" }]
        shm_size = 68719476736
        volumes = ["/scratch:/scratch"]
        devices = [{ host_path = "/dev/infiniband", container_path = "/dev/infiniband" }]
      }

      env {
        HALO_NODE_RANK = "$${NOMAD_ALLOC_INDEX}"
        HALO_MASTER_ADDR_FILE = "$${NOMAD_TASK_DIR}/halo-master-addr"
        HALO_LOG_DIR = "$${NOMAD_TASK_DIR}/halo-logs"
        HALO_RESULT_FILE = "$${NOMAD_TASK_DIR}/halo-result.json"
        HALO_NODE_RUNTIME_FILE = "$${NOMAD_TASK_DIR}/halo-node.b64"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-200724c5"
        right_delimiter = "halo-200724c5]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job ddp-nomad: 2 nodes x 8 processes, the same on every node.
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
export DIST_SHARED_FILESYSTEM=0
export DIST_STORE_TIMEOUT_HOURS=4
export NCCL_NET_PLUGIN=ofi
export NCCL_NET=Libfabric
export OMP_NUM_THREADS=8
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
halo_master 600

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
  --rdzv_conf=timeout=600 \
  --log-dir="$halo_log_dir" \
  --tee=3 \
  /workspace/examples/train_ddp.py --device cuda --steps 200
EOT
      }

      template {
        destination = "local/halo-master-addr"
        change_mode = "noop"
        data        = <<EOT
{{ with nomadService "halo-index-0.ddp-nomad-rdzv" }}{{ with index . 0 }}{{ .Address }}
{{ .Port }}{{ end }}{{ end }}
EOT
      }

      template {
        destination = "local/halo-node.b64"
        change_mode = "noop"
        data        = "{{ if nomadVarExists \"nomad/jobs/ddp-nomad\" }}{{ with nomadVar \"nomad/jobs/ddp-nomad\" }}{{ range $k, $v := . }}{{ if eq $k \"halo_node_runtime\" }}{{ $v.Value }}{{ end }}{{ end }}{{ end }}{{ end }}"
      }

      resources {
        cpu    = 32000
        memory = 491520
        device "nvidia/gpu" { count = 8 }
      }
    }
  }
}
