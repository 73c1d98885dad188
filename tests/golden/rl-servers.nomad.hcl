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
        HALO_SERVER_VLLM_ADDRS_FILE = "$${NOMAD_TASK_DIR}/halo-server-vllm-addrs"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-c043dc06"
        right_delimiter = "halo-c043dc06]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job rl-grpo: 2 nodes x 8 processes.
# The same script runs on every node. The backend sets only HALO_NODE_RANK (and maybe
# HALO_NODE_RANK_OFFSET) and the master address and port (HALO_MASTER_ADDR and
# HALO_MASTER_PORT, or HALO_MASTER_ADDR_FILE to poll until rank 0 is known).
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

# The preemption/time-limit warning (SIGUSR2) is ignored here, in setup and in
# torchrun, and inherited as ignored by the ranks: torchrun would die from it (or, for a signal it
# handles, stop its workers after a short grace). The trainer installs its own handler (Python's
# signal.signal overrides an inherited SIG_IGN) and has until the deadline to checkpoint. A
# handler in this shell would not do: bash resets handled signals to the default in children.
export HALO_WARNING_SIGNAL=USR2

# The warning reaches this shell as SIGURG (SLURM: the batch script passes slurm.signal's warning
# and `halo-sched cancel --signal` on as URG, to every process of the job's steps). URG's default
# action is to ignore it, so torchrun, the ranks and any server go on as if nothing came; this
# shell alone acts on it: it hands SIGUSR2 to each rank (a process torchrun started)
# once that rank handles it (SigCgt in /proc/PID/status), at once or as soon as it installs its
# handler. A warning that comes while setup, torchrun or a trainer's imports still run is held,
# not lost: slurmctld looks at time limits every 30 s and sends slurm.signal's warning up to 30 s
# early, which for a short job can be its first seconds (job_mgr.c send_job_warn_signal).
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
# Runs in the background from the warning until torchrun ends (torchrun may start ranks again).
halo_deliver() {
  (
    set +e
    halo_bit=$(($(kill -l USR2) - 1))
    halo_done=' '
    while kill -0 "$halo_torchrun" 2> /dev/null; do
      # torchrun's children: "pid (comm) state ppid ..." in /proc/PID/stat (comm may hold spaces).
      # (cat, not awk, opens the files: a process that ends meanwhile must not end the scan).
      # Signal every rank that handles it first, then say so: the ranks of all nodes stop
      # together at their next step, and a rank still unsignalled by then would stop unwarned.
      halo_sent=
      for halo_p in $(cat /proc/[0-9]*/stat 2> /dev/null | awk -v t="$halo_torchrun" '{ p = $1; sub(/^.*\) /, ""); if ($2 == t) print p }'); do
        [[ $halo_done != *" $halo_p "* ]] || continue
        halo_mask=
        while read -r halo_k halo_v; do
          [ "$halo_k" != SigCgt: ] || { halo_mask=$halo_v; break; }
        done 2> /dev/null < "/proc/$halo_p/status"
        [[ $halo_mask =~ ^[0-9a-fA-F]+$ ]] && (((16#$halo_mask >> halo_bit) & 1)) || continue
        kill -USR2 "$halo_p" 2> /dev/null || continue
        halo_done+="$halo_p "
        halo_sent+="$halo_p "
      done
      for halo_p in $halo_sent; do
        halo_who=$(tr '\0' '\n' 2> /dev/null < "/proc/$halo_p/environ" | sed -n 's/^RANK=//p')
        echo "halo-sched: node $halo_rank: SIGUSR2 to rank $${halo_who:-?} (pid $halo_p), $((SECONDS - halo_warned_at)) s after the warning" >&2
      done
      sleep 0.2
    done
    [ "$halo_done" != ' ' ] ||
      echo "halo-sched: node $halo_rank: no rank handled SIGUSR2 before torchrun ended; the warning reached no trainer (install a handler for \$HALO_WARNING_SIGNAL)" >&2
  ) &
  halo_deliverer=$!
}
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
halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
# $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
$halo_py - "$halo_left" "$${halo_health[@]}" << 'HALO_HEALTH_EOF' ||
"""Wait until every rollout server answers its health path (run on a trainer node by the entry
script, with the node's python3; standard library only).

argv: SECONDS then NAME URL pairs (NAME like ``vllm[0]``, URL the health URL). Exit 0 once each
URL answered HTTP 200; exit 1 at the deadline, naming every server that did not, with its last
error. Prints one line per server when it becomes healthy.
"""
import sys
import time
import urllib.error
import urllib.request


def main(argv):
    deadline = time.monotonic() + float(argv[0])
    pending = dict(zip(argv[1::2], argv[2::2]))
    last = {name: "no answer yet" for name in pending}
    t0 = time.monotonic()
    while pending:
        for name, url in list(pending.items()):
            left = deadline - time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=max(0.5, min(5.0, left))) as resp:
                    code = resp.status
            except urllib.error.HTTPError as err:
                code, last[name] = err.code, f"HTTP {err.code}"
            except (urllib.error.URLError, OSError, ValueError) as err:
                code, last[name] = None, str(getattr(err, "reason", err))
            if code == 200:
                del pending[name]
                print(f"halo-sched: server {name} healthy at {url} after {time.monotonic() - t0:.1f}s "
                      f"(t={time.time():.3f})", file=sys.stderr, flush=True)
            elif code is not None:
                last[name] = f"HTTP {code}"
        if not pending:
            break
        if time.monotonic() >= deadline:
            for name, url in pending.items():
                print(f"halo-sched: server {name} did not answer 200 at {url} within rendezvous.timeout_s "
                      f"(last: {last[name]})", file=sys.stderr, flush=True)
            return 1
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
HALO_HEALTH_EOF
  halo_fail "not every rollout server answered its health path within rendezvous.timeout_s=1200s (see above); not starting the trainer"
unset halo_health halo_addrs halo_left halo_k halo_a


# ---- Failure report (halo_sched/node/failure_collector.py) ----
# torchrun --log-dir/--tee: each rank's stdout/stderr also land in a file (on the console every
# such line reads "[rank R] ..."), beside the rank's TORCHELASTIC_ERROR_FILE. When torchrun exits
# non-zero, the collector prints one "halo-sched-failure {json}" line per failed rank to this
# node's output, where every backend finds it. HALO_LOG_DIR (optional) keeps the files.
halo_log_root=$${HALO_LOG_DIR:-}
[ -n "$halo_log_root" ] || halo_log_root=$(mktemp -d "$${TMPDIR:-/tmp}/halo-sched.XXXXXX")
halo_log_dir=$halo_log_root/node-$halo_rank
mkdir -p "$halo_log_dir"
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank $${rank}] '
# torchrun's workers run in sessions of their own: when torchrun dies (SIGKILL), they are
# reparented to init, out of reach of its process tree and of SLURM's proctrack/linuxproc, and
# would outlive the job. Only torchrun gets this tag in its environment, so it marks exactly what
# torchrun started, however deep or reparented; it is made here, at run time (the script is the
# same on every node and backend). A subreaper would not do: bash cannot become one, and a helper
# process that did could itself be killed.
halo_node_tag=node$halo_rank-$$-$(date +%s%N)-$RANDOM
# Pids of live processes carrying the tag (a zombie's environ reads empty).
halo_tagged() {
  grep -lzxF "HALO_NODE_TAG=$halo_node_tag" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3
}
# After torchrun exits, however it exits: TERM what it left once, KILL it after a short grace,
# until nothing is left (a process forked meanwhile is caught on the next round); give up on
# one that cannot die (uninterruptible sleep) after 10 s more.
halo_sweep() {
  local halo_p halo_seen=' ' halo_kill_at=$((SECONDS + 5)) halo_give_up=$((SECONDS + 15))
  while [ "$SECONDS" -lt "$halo_give_up" ]; do
    set -- $(halo_tagged)
    [ $# -gt 0 ] || return 0
    for halo_p; do
      if [ "$SECONDS" -ge "$halo_kill_at" ]; then
        kill -KILL "$halo_p" 2> /dev/null || true
      elif [[ $halo_seen != *" $halo_p "* ]]; then
        kill -TERM "$halo_p" 2> /dev/null || true
        halo_seen+="$halo_p "
      fi
    done
    sleep 0.1
  done
  echo "halo-sched: node $halo_rank: processes left by torchrun would not die: $*" >&2
}
halo_run() {
  local halo_pid halo_tee halo_rc halo_py halo_stop
  halo_trapped=0
  halo_stopped_at=
  # torchrun's own stderr also goes to a file: its failure summary has each failed rank's exit code.
  exec 3> >(trap '' TERM INT HUP; exec tee -a "$halo_log_dir/torchrun.err" >&2)
  halo_tee=$!
  HALO_NODE_TAG=$halo_node_tag "$@" 2>&3 &
  halo_pid=$!
  halo_torchrun=$halo_pid
  halo_hang_start "$halo_pid"
  [ -z "$halo_warned_at" ] || halo_deliver  # warned during setup: hand it on once a rank handles it
  # SLURM signals every process of the step and the local backend the node's process group, so
  # torchrun has the signal already; Nomad signals this shell alone (executor_unix.go
  # shutdownProcess), so pass it on. (SLURM's task sets HALO_SLURM_STEP_ID: it removes SLURM_STEP_*.)
  trap 'halo_trapped=1; halo_stopped_at=$${EPOCHREALTIME:-$(date +%s)}; [ -n "$${HALO_SLURM_STEP_ID:-}$${HALO_LOCAL_JOB:-}" ] || kill -TERM "$halo_pid" 2> /dev/null || true' TERM INT
  while :; do
    halo_trapped=0
    halo_rc=0
    wait "$halo_pid" || halo_rc=$?
    # wait returns early (>128) when the trap ran; torchrun is still stopping: wait again.
    [ "$halo_trapped" = 1 ] && [ "$halo_rc" -gt 128 ] || break
  done
  halo_hang_stop
  # The warning's deliverer ends within 0.2 s of torchrun (its last words come before the sweep's).
  [ -z "$halo_deliverer" ] || wait "$halo_deliverer" 2> /dev/null || true
  # A stop request from here on waits for the sweep, then takes effect (as it did before: the
  # shell ends by that signal, without the failure report).
  halo_stop=
  trap 'halo_stop=TERM' TERM
  trap 'halo_stop=INT' INT
  halo_sweep
  trap - TERM INT
  [ -z "$halo_stop" ] || kill -s "$halo_stop" $$
  exec 3>&-
  wait "$halo_tee" 2> /dev/null || true
  if [ "$halo_rc" != 0 ]; then
    halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
    case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
    # $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
    HALO_FAILURE_KEY=$halo_failure_key $halo_py - "$halo_rank" 8 "$halo_log_dir" "$halo_rc" "$halo_stopped_at" << 'HALO_COLLECT_EOF' ||
"""Run on each node by the entry script after torchrun exits non-zero: one failure line per rank.

Standard library only: it runs under the node's Python (the one torchrun runs under), where
halo-sched itself need not be installed. The entry script passes it, as text, to that Python.

Inputs, from torchrun's own files (``torch/distributed/elastic/multiprocessing/api.py``,
``DefaultLogsSpecs.reify``): with ``--log-dir=DIR --tee=3``, each worker's stdout/stderr land in
``DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and its
``TORCHELASTIC_ERROR_FILE`` is ``error.json`` beside them (written only by a trainer decorated
with ``@record``). Exit codes and signals come from torchrun's failure summary on its stderr
(``ChildFailedError.format_msg``: ``rank : 3 (local_rank: 1)``, ``exitcode : -9 (pid: 12)
(SIGKILL)``), which the entry script tees into ``DIR/torchrun.err``.

Output: ``halo-sched-failure {json}`` on stderr, one per failed rank, or one for the node when
torchrun itself failed (rendezvous timeout, killed) and no rank is named. The keys are those of
:class:`halo_sched.node.failures.RankFailure`.

Two things make a line fit to leave the node (issue 28). Secrets: every ``secret_env`` value (the
names in ``HALO_SECRET_NAMES``, the values in this node's environment) is replaced by ``***`` in
all the text a line carries, on the whole text before anything is cut (a cut secret is a fragment
no later scrub can find). Trust: the line ends with ``"mac"``, an HMAC-SHA256 of the rest under the
job's failure key (``HALO_FAILURE_KEY``, made at submit; the entry script takes it out of the
environment before torchrun starts, so a rank cannot read it from its own): the submitter takes a
line as a verdict (the first failure, the culprit, a ledger entry) only when it verifies.
"""
from __future__ import annotations

import datetime
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12
#: The characters a tail line keeps (after the secrets are scrubbed from the whole line).
LINE_CHARS = 400
#: The names of the secret_env variables on this node (space-separated); their values are in the environment.
SECRET_NAMES_VAR = "HALO_SECRET_NAMES"
#: The job's failure key (halo_sched/node/contract.py ``failure_key``).
KEY_VAR = "HALO_FAILURE_KEY"
SCRUBBED = "***"
#: A secret value shorter than this is not scrubbed: as a substring it would mangle ordinary text
#: (a value "x" turned "exit" into "e***it"); submit warns about it.
MIN_SECRET_CHARS = 6

_BLOCK = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S*)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*"
    r"\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<exit>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?[ \t]*\n"
)
# The line that names an error in a traceback or a torchrun log: "ValueError: ...", "torch.x.Y: ...".
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b.*")
# torch prefixes a worker's uncaught exception lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# How torchrun stops a node's other workers once one has failed (api.py ``_close``).
_STOP_SIGNALS = ("SIGTERM",)


def secret_values(environ=None) -> list[str]:
    """The values to scrub: each secret_env variable's value in this environment, longest first
    (one value inside another is replaced whole), those too short to scrub left out."""
    environ = os.environ if environ is None else environ
    values = {environ.get(n, "") for n in environ.get(SECRET_NAMES_VAR, "").split()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, SCRUBBED)
    return text


def _tail(path: str, n: int = TAIL_LINES, secrets: list[str] | None = None) -> list[str]:
    """The last ``n`` non-empty lines of the file's last 16 KiB, each scrubbed whole and then cut
    to LINE_CHARS. The first line is dropped when the read began inside it: it may begin inside a
    secret, whose fragment no scrub would find."""
    secrets = secret_values() if secrets is None else secrets
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 16384)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start and lines:
        lines = lines[1:]
    return [scrub(line, secrets)[:LINE_CHARS] for line in lines if line.strip()][-n:]


# faulthandler's dump (a rank aborted by the hang monitor, a segfault): its first line, the
# current thread's header, a frame, and what follows it (Python 3.12: "Extension modules: ...").
_FATAL = re.compile(r"^Fatal Python error: .+")
_CURRENT = re.compile(r"^Current thread 0x[0-9a-fA-F]+")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _dump_line(texts: list[str]) -> str:
    """``Fatal Python error: Aborted, in train.py:57 (main)`` from the last faulthandler dump in
    ``texts`` (the current thread's innermost frame), or '' when there is none."""
    fatal = max((i for i, t in enumerate(texts) if _FATAL.match(t)), default=-1)
    current = max((i for i, t in enumerate(texts) if _CURRENT.match(t)), default=-1)
    if fatal < 0 and current < 0:
        return ""
    frame = None
    if current >= 0:
        frame = next((m for t in texts[current + 1:] if (m := _DUMP_FRAME.match(t))), None)
    where = f"in {os.path.basename(frame['file'])}:{frame['line']} ({frame['func']})" if frame else ""
    head = texts[fatal] if fatal >= 0 else "Fatal Python error"
    return f"{head}, {where}" if where else head


def error_line(lines: list[str], recent: int = TAIL_LINES) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the last
    ``recent``; but when a faulthandler dump came after it (or there is none), the dump's fatal
    error and the frame it was in, never its last line (Python 3.12's "Extension modules: ...");
    else the last line."""
    texts = [_RANK_PREFIX.sub("", line.strip()) for line in lines]
    last_error = max((i for i, t in enumerate(texts) if i >= len(texts) - recent and _ERROR.match(t)), default=-1)
    last_dump = max((i for i, t in enumerate(texts) if _FATAL.match(t) or _CURRENT.match(t)), default=-1)
    if last_dump > last_error:
        return _dump_line(texts)
    if last_error >= 0:
        return texts[last_error]
    return texts[-1] if texts else ""


def summary_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary, per global rank: time (epoch), host, local rank, exit, signal."""
    out = {}
    for m in _BLOCK.finditer(text):
        try:
            # ProcessFailure.timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS", whole seconds.
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = None
        code = int(m["exit"])
        out[int(m["rank"])] = {
            "time": when, "host": m["host"], "local_rank": int(m["local_rank"]),
            # A negative exit code is torch's way to say "killed by signal -code".
            "exit_code": 128 - code if code < 0 else code,
            "signal": m["sig"] or (_SIGNALS.get(-code, f"SIG{-code}") if code < 0 else None),
        }
    return out


def _rank_dirs(log_dir: str) -> dict[int, str]:
    """local rank -> its directory in the latest attempt torchrun made under ``log_dir``."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return {}
    out = {}
    for d in glob.glob(os.path.join(attempts[-1], "*")):
        if os.path.basename(d).isdigit():
            out[int(os.path.basename(d))] = d
    return out


def _error_file(path: str, secrets: list[str]) -> tuple[str, float] | None:
    """(message, time) from a worker's error.json (``@record``); the file's mtime is the precise time."""
    try:
        with open(path) as f:
            data = json.load(f)
        when = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    lines = scrub(str(msg or ""), secrets).strip().splitlines()
    return (lines[-1] if lines else ""), when


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None) -> list[dict]:
    """Failure records for one node whose torchrun exited with ``rc`` (non-zero)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with open(os.path.join(log_dir, "torchrun.err"), errors="replace") as f:
            agent_text = f.read()
    except OSError:
        agent_text = ""
    summary = summary_failures(agent_text)
    dirs = _rank_dirs(log_dir)
    secrets = secret_values()
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        # The error may be a faulthandler dump's, longer than the tail: read further for it.
        lines = _tail(os.path.join(d, "stderr.log"), 400, secrets) if d else []
        tail = lines[-TAIL_LINES:]
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json"), secrets) if d else None
        if from_file:
            error, when = from_file
        elif tail and info["signal"] is None:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later).
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            if mtime is not None and detected - 5 <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(lines) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
        })
    # When one worker fails, torchrun stops the node's other workers with SIGTERM: those are
    # victims (not SIGKILL: the kernel's OOM killer ends a rank that way). A victim's summary time
    # is the whole second of detection and can read earlier than the real failure's precise one.
    own = [r for r in out if r["signal"] not in _STOP_SIGNALS]
    if own:
        for r in out:
            if r["signal"] in _STOP_SIGNALS:
                r["stopped"] = True
    if not out:
        # torchrun failed before or without a worker failure (rendezvous, store timeout, a
        # signal that stopped it): the node is what failed.
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40, secrets) if not line.startswith("[rank ")]
        code = rc
        sig = _SIGNALS.get(code - 128) if code > 128 else None
        out.append({
            "node": node, "rank": None, "local_rank": None, "host": host, "exit_code": code, "signal": sig,
            "time": stopped_at if stopped_at is not None else now,
            "error": error_line(tail[-TAIL_LINES:]), "tail": tail[-TAIL_LINES:], "stopped": stopped_at is not None,
        })
    # The scheduler's name for this node (SLURM sets SLURMD_NODENAME in every task): what sbatch's
    # node options take. torchrun's host is the machine's FQDN and may differ from it.
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_name:
        for r in out:
            r["node_name"] = node_name
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def sign(body: str, key: str) -> str:
    """The line's ``mac``: HMAC-SHA256 of its JSON text without it, under the job's failure key."""
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def record_line(rec: dict, key: str | None = None, secrets: list[str] | None = None) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's
    end. Every secret_env value is scrubbed from its text first (``secrets``: this environment's),
    and the line is signed with ``key`` (this environment's ``HALO_FAILURE_KEY``; none: unsigned,
    a line no submitter takes as a verdict)."""
    secrets = secret_values() if secrets is None else secrets
    key = os.environ.get(KEY_VAR, "") if key is None else key
    rec = {k: _scrubbed(v, secrets) for k, v in rec.items() if k != "mac"}
    rec["tail"] = list(rec.get("tail") or [])
    while True:
        body = json.dumps(rec, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
        text = f"{TAG} {body}\n"
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_COLLECT_EOF
      echo "halo-sched-failure {\"node\":$halo_rank,\"rank\":null,\"host\":\"$(hostname)\",\"exit_code\":$halo_rc,\"time\":$(date +%s),\"error\":\"torchrun exited with $halo_rc\"}" >&2
  fi
  [ -n "$${HALO_LOG_DIR:-}" ] || rm -rf "$halo_log_root"
  return "$halo_rc"
}

# ---- Hang detection (hang.timeout_s; halo_sched/node/hang_monitor.py, progress.py) ----
# Each rank may append "STEP UNIX_TIME" lines to $HALO_PROGRESS_DIR/rank-$RANK after its steps
# (docs/failures.md: "Hangs"). A monitor beside torchrun ends the node when no rank progressed for
# hang.timeout_s=300s (600s before a rank's first report, judged by its output),
# after taking every rank's stack: SIGRTMIN+5 where the rank registered faulthandler on it
# (HALO_STACK_SIGNAL; progress.report() does), else SIGABRT with PYTHONFAULTHANDLER.
# Where the backend sets HALO_PROGRESS_MIRROR (SLURM: beside the job's output file), the monitor
# also copies the progress files there every few seconds, for `halo-sched status` and `timeline`.
# Each stays as the user set it.
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
  local halo_py halo_pkg=$halo_log_dir/.monitor/halo_node
  mkdir -p "$halo_pkg" && : > "$halo_pkg/__init__.py"
  cat > "$halo_pkg/failure_collector.py" << 'HALO_COLLECT_EOF'
"""Run on each node by the entry script after torchrun exits non-zero: one failure line per rank.

Standard library only: it runs under the node's Python (the one torchrun runs under), where
halo-sched itself need not be installed. The entry script passes it, as text, to that Python.

Inputs, from torchrun's own files (``torch/distributed/elastic/multiprocessing/api.py``,
``DefaultLogsSpecs.reify``): with ``--log-dir=DIR --tee=3``, each worker's stdout/stderr land in
``DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and its
``TORCHELASTIC_ERROR_FILE`` is ``error.json`` beside them (written only by a trainer decorated
with ``@record``). Exit codes and signals come from torchrun's failure summary on its stderr
(``ChildFailedError.format_msg``: ``rank : 3 (local_rank: 1)``, ``exitcode : -9 (pid: 12)
(SIGKILL)``), which the entry script tees into ``DIR/torchrun.err``.

Output: ``halo-sched-failure {json}`` on stderr, one per failed rank, or one for the node when
torchrun itself failed (rendezvous timeout, killed) and no rank is named. The keys are those of
:class:`halo_sched.node.failures.RankFailure`.

Two things make a line fit to leave the node (issue 28). Secrets: every ``secret_env`` value (the
names in ``HALO_SECRET_NAMES``, the values in this node's environment) is replaced by ``***`` in
all the text a line carries, on the whole text before anything is cut (a cut secret is a fragment
no later scrub can find). Trust: the line ends with ``"mac"``, an HMAC-SHA256 of the rest under the
job's failure key (``HALO_FAILURE_KEY``, made at submit; the entry script takes it out of the
environment before torchrun starts, so a rank cannot read it from its own): the submitter takes a
line as a verdict (the first failure, the culprit, a ledger entry) only when it verifies.
"""
from __future__ import annotations

import datetime
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12
#: The characters a tail line keeps (after the secrets are scrubbed from the whole line).
LINE_CHARS = 400
#: The names of the secret_env variables on this node (space-separated); their values are in the environment.
SECRET_NAMES_VAR = "HALO_SECRET_NAMES"
#: The job's failure key (halo_sched/node/contract.py ``failure_key``).
KEY_VAR = "HALO_FAILURE_KEY"
SCRUBBED = "***"
#: A secret value shorter than this is not scrubbed: as a substring it would mangle ordinary text
#: (a value "x" turned "exit" into "e***it"); submit warns about it.
MIN_SECRET_CHARS = 6

_BLOCK = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S*)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*"
    r"\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<exit>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?[ \t]*\n"
)
# The line that names an error in a traceback or a torchrun log: "ValueError: ...", "torch.x.Y: ...".
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b.*")
# torch prefixes a worker's uncaught exception lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# How torchrun stops a node's other workers once one has failed (api.py ``_close``).
_STOP_SIGNALS = ("SIGTERM",)


def secret_values(environ=None) -> list[str]:
    """The values to scrub: each secret_env variable's value in this environment, longest first
    (one value inside another is replaced whole), those too short to scrub left out."""
    environ = os.environ if environ is None else environ
    values = {environ.get(n, "") for n in environ.get(SECRET_NAMES_VAR, "").split()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, SCRUBBED)
    return text


def _tail(path: str, n: int = TAIL_LINES, secrets: list[str] | None = None) -> list[str]:
    """The last ``n`` non-empty lines of the file's last 16 KiB, each scrubbed whole and then cut
    to LINE_CHARS. The first line is dropped when the read began inside it: it may begin inside a
    secret, whose fragment no scrub would find."""
    secrets = secret_values() if secrets is None else secrets
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 16384)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start and lines:
        lines = lines[1:]
    return [scrub(line, secrets)[:LINE_CHARS] for line in lines if line.strip()][-n:]


# faulthandler's dump (a rank aborted by the hang monitor, a segfault): its first line, the
# current thread's header, a frame, and what follows it (Python 3.12: "Extension modules: ...").
_FATAL = re.compile(r"^Fatal Python error: .+")
_CURRENT = re.compile(r"^Current thread 0x[0-9a-fA-F]+")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _dump_line(texts: list[str]) -> str:
    """``Fatal Python error: Aborted, in train.py:57 (main)`` from the last faulthandler dump in
    ``texts`` (the current thread's innermost frame), or '' when there is none."""
    fatal = max((i for i, t in enumerate(texts) if _FATAL.match(t)), default=-1)
    current = max((i for i, t in enumerate(texts) if _CURRENT.match(t)), default=-1)
    if fatal < 0 and current < 0:
        return ""
    frame = None
    if current >= 0:
        frame = next((m for t in texts[current + 1:] if (m := _DUMP_FRAME.match(t))), None)
    where = f"in {os.path.basename(frame['file'])}:{frame['line']} ({frame['func']})" if frame else ""
    head = texts[fatal] if fatal >= 0 else "Fatal Python error"
    return f"{head}, {where}" if where else head


def error_line(lines: list[str], recent: int = TAIL_LINES) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the last
    ``recent``; but when a faulthandler dump came after it (or there is none), the dump's fatal
    error and the frame it was in, never its last line (Python 3.12's "Extension modules: ...");
    else the last line."""
    texts = [_RANK_PREFIX.sub("", line.strip()) for line in lines]
    last_error = max((i for i, t in enumerate(texts) if i >= len(texts) - recent and _ERROR.match(t)), default=-1)
    last_dump = max((i for i, t in enumerate(texts) if _FATAL.match(t) or _CURRENT.match(t)), default=-1)
    if last_dump > last_error:
        return _dump_line(texts)
    if last_error >= 0:
        return texts[last_error]
    return texts[-1] if texts else ""


def summary_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary, per global rank: time (epoch), host, local rank, exit, signal."""
    out = {}
    for m in _BLOCK.finditer(text):
        try:
            # ProcessFailure.timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS", whole seconds.
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = None
        code = int(m["exit"])
        out[int(m["rank"])] = {
            "time": when, "host": m["host"], "local_rank": int(m["local_rank"]),
            # A negative exit code is torch's way to say "killed by signal -code".
            "exit_code": 128 - code if code < 0 else code,
            "signal": m["sig"] or (_SIGNALS.get(-code, f"SIG{-code}") if code < 0 else None),
        }
    return out


def _rank_dirs(log_dir: str) -> dict[int, str]:
    """local rank -> its directory in the latest attempt torchrun made under ``log_dir``."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return {}
    out = {}
    for d in glob.glob(os.path.join(attempts[-1], "*")):
        if os.path.basename(d).isdigit():
            out[int(os.path.basename(d))] = d
    return out


def _error_file(path: str, secrets: list[str]) -> tuple[str, float] | None:
    """(message, time) from a worker's error.json (``@record``); the file's mtime is the precise time."""
    try:
        with open(path) as f:
            data = json.load(f)
        when = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    lines = scrub(str(msg or ""), secrets).strip().splitlines()
    return (lines[-1] if lines else ""), when


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None) -> list[dict]:
    """Failure records for one node whose torchrun exited with ``rc`` (non-zero)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with open(os.path.join(log_dir, "torchrun.err"), errors="replace") as f:
            agent_text = f.read()
    except OSError:
        agent_text = ""
    summary = summary_failures(agent_text)
    dirs = _rank_dirs(log_dir)
    secrets = secret_values()
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        # The error may be a faulthandler dump's, longer than the tail: read further for it.
        lines = _tail(os.path.join(d, "stderr.log"), 400, secrets) if d else []
        tail = lines[-TAIL_LINES:]
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json"), secrets) if d else None
        if from_file:
            error, when = from_file
        elif tail and info["signal"] is None:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later).
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            if mtime is not None and detected - 5 <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(lines) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
        })
    # When one worker fails, torchrun stops the node's other workers with SIGTERM: those are
    # victims (not SIGKILL: the kernel's OOM killer ends a rank that way). A victim's summary time
    # is the whole second of detection and can read earlier than the real failure's precise one.
    own = [r for r in out if r["signal"] not in _STOP_SIGNALS]
    if own:
        for r in out:
            if r["signal"] in _STOP_SIGNALS:
                r["stopped"] = True
    if not out:
        # torchrun failed before or without a worker failure (rendezvous, store timeout, a
        # signal that stopped it): the node is what failed.
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40, secrets) if not line.startswith("[rank ")]
        code = rc
        sig = _SIGNALS.get(code - 128) if code > 128 else None
        out.append({
            "node": node, "rank": None, "local_rank": None, "host": host, "exit_code": code, "signal": sig,
            "time": stopped_at if stopped_at is not None else now,
            "error": error_line(tail[-TAIL_LINES:]), "tail": tail[-TAIL_LINES:], "stopped": stopped_at is not None,
        })
    # The scheduler's name for this node (SLURM sets SLURMD_NODENAME in every task): what sbatch's
    # node options take. torchrun's host is the machine's FQDN and may differ from it.
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_name:
        for r in out:
            r["node_name"] = node_name
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def sign(body: str, key: str) -> str:
    """The line's ``mac``: HMAC-SHA256 of its JSON text without it, under the job's failure key."""
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def record_line(rec: dict, key: str | None = None, secrets: list[str] | None = None) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's
    end. Every secret_env value is scrubbed from its text first (``secrets``: this environment's),
    and the line is signed with ``key`` (this environment's ``HALO_FAILURE_KEY``; none: unsigned,
    a line no submitter takes as a verdict)."""
    secrets = secret_values() if secrets is None else secrets
    key = os.environ.get(KEY_VAR, "") if key is None else key
    rec = {k: _scrubbed(v, secrets) for k, v in rec.items() if k != "mac"}
    rec["tail"] = list(rec.get("tail") or [])
    while True:
        body = json.dumps(rec, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
        text = f"{TAG} {body}\n"
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_COLLECT_EOF
  cat > "$halo_pkg/hang_monitor.py" << 'HALO_MONITOR_EOF'
"""The hang monitor: runs on each node beside torchrun, ends the job when its ranks stop progressing.

Started by the entry script (``entry_hang.sh.j2``) right after torchrun, under the Python torchrun
runs under; standard library only (halo-sched need not be installed on the node). It polls once a
second and reads nothing but ``stat`` of a few files while the ranks are healthy.

When is a node hung? Every live rank of the node (torchrun's children that carry ``RANK``) is
stalled at once:

* a rank that reports progress (``$HALO_PROGRESS_DIR/rank-R`` exists, see ``progress.py``) is
  stalled after ``timeout_s`` without a report;
* a rank that has not reported yet (still importing, loading, before its first step, or a trainer
  without the protocol) is stalled after ``first_step_s`` with no new output on its stdout/stderr
  (torchrun's ``--tee`` files), counted from when the monitor first saw it.

In a synchronous job one stuck rank stops every rank within a step, so every node's monitor
fires within about a poll and a step of the others. Then, on each node:

1. every rank that registered ``faulthandler`` on ``HALO_STACK_SIGNAL`` (the helper in
   ``progress.py`` does) dumps its stack without ending (SigCgt in ``/proc/PID/status`` says who);
2. the monitor waits ``SETTLE_S`` so that the other nodes' monitors take theirs before anything
   here ends (ending a rank makes its peers fail in their collective, losing their stacks);
3. the ranks whose stack is still unknown are stopped (``SIGSTOP``), and ``STOP_SYNC_S`` later, when
   every node of the stall has stopped its own, get ``SIGABRT`` and ``SIGCONT``: with
   ``PYTHONFAULTHANDLER`` (set by the entry script) Python prints every thread's stack to the rank's
   stderr as it dies. A stopped rank cannot see its peers on other nodes die, so no node's aborts
   break another node's ranks before their dumps;
4. one ``halo-sched-failure`` line of kind ``HUNG`` per local rank goes to the node's output (step,
   last progress, top of stack, the collective it waits in, or why its stack could not be read),
   every stack to ``DIR/hang-stacks.txt`` and the node's output;
5. the monitor stays until ``LINGER_S`` after the aborts, so that this node's end (which ends the
   whole job: srun's ``--kill-on-bad-exit``) cannot kill another node's monitor mid-report; then
   torchrun gets SIGTERM (SIGKILL 10 s later): the node exits non-zero and the scheduler ends the job.

Which rank is the culprit is decided where all nodes' lines meet (``failures.FailureReport``).
"""
from __future__ import annotations

import glob
import linecache
import os
import re
import signal
import socket
import sys
import time

from .failure_collector import record_line, scrub, secret_values  # on the node: a package of the two files (entry_hang.sh.j2)

POLL_S = 1.0
SETTLE_S = 10.0
#: From stopping the ranks to aborting them: longer than any node's lag behind the others (its
#: poll of the settle wait, a loaded node's scheduling).
STOP_SYNC_S = 2.0
ABORT_WAIT_S = 5.0
#: After the aborted ranks are gone: how long their dumps may take to reach their log files.
FLUSH_WAIT_S = 5.0
#: After the aborts, how long every node stays: another node's monitor may still be reading its
#: dumps (FLUSH_WAIT_S at most) when this node's end makes srun end the step.
LINGER_S = FLUSH_WAIT_S + 1.0
STACK_WAIT_S = 3.0

#: Functions of torch.distributed in which a rank waits for its peers.
COLLECTIVES = frozenset("""
all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier
monitored_barrier broadcast broadcast_object_list gather gather_object reduce reduce_scatter
reduce_scatter_tensor scatter scatter_object_list send recv isend irecv batch_isend_irecv wait
_all_gather_base _reduce_scatter_base all_reduce_coalesced
""".split())
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+|^Stack \(most recent call first\)")
#: A frame of a Python traceback (most recent call last), as a rank that ended with an exception prints it.
_TB_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep and k in (b"RANK", b"LOCAL_RANK"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _handles(pid: int, signum: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


#: A report file this large or smaller is read whole (progress.py's ring is one 4 KiB page);
#: a larger one holds appended lines, and only its tail is read.
_WHOLE_BYTES = 8192


def read_reports(path: str, n: int = 1) -> list[tuple[int, float]]:
    """A rank's last ``n`` progress reports, ``(step, unix_time)``, oldest first: every line of
    its file that reads as a step and a time (progress.py's ring of lines rewritten in place, or
    lines a trainer appended), ordered by time. A line being rewritten as it is read, or a slot
    not written yet, reads as nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(0 if size <= _WHOLE_BYTES else size - 64 * (n + 2))
            lines = f.read().split(b"\n")
    except OSError:
        return []
    if size > _WHOLE_BYTES:
        lines = lines[1:]  # the first may be cut
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            out.append((int(parts[0]), float(parts[1])))
        except ValueError:
            continue
    out.sort(key=lambda r: (r[1], r[0]))
    return out[-n:]


def last_report(path: str) -> tuple[int, float] | None:
    """A rank's last progress report, ``(step, unix_time)``; None before its first."""
    got = read_reports(path)
    return got[-1] if got else None


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """The threads of the last faulthandler dump in ``text``: each a list of (file, line,
    function), most recent call first. Lines may carry torchrun's ``[rank N] `` prefix."""
    threads: list[list[tuple[str, int, str]]] = []
    cur = None
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if "Fatal Python error" in line:
            threads, cur = [], None  # a later dump replaces an earlier one
            continue
        if _THREAD.match(line.strip()):
            cur = []
            threads.append(cur)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur.append((m["file"], int(m["line"]), m["func"]))
        elif cur is not None and cur and not line.strip():
            cur = None
    return [t for t in threads if t]


def parse_traceback(text: str) -> list[tuple[str, int, str]]:
    """The frames of the last Python traceback in ``text``, most recent call first (as a dump's):
    where a rank was when it ended with an exception, e.g. a peer's end breaking the collective
    it waited in. Empty when there is none."""
    frames: list[tuple[str, int, str]] = []
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if line.startswith("Traceback (most recent call last):"):
            frames = []
            continue
        m = _TB_FRAME.match(line)
        if m:
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames[::-1]


def main_thread(threads: list[list[tuple[str, int, str]]]) -> list[tuple[str, int, str]]:
    """The main thread: the one whose outermost frame is a module's top level."""
    for t in threads:
        if t and t[-1][2] == "<module>":
            return t
    return threads[-1] if threads else []


def _library(path: str) -> bool:
    return ("site-packages" in path or "dist-packages" in path or "/lib/python" in path
            or path.startswith("<"))


def classify(frames: list[tuple[str, int, str]], cwd: str | None = None) -> dict:
    """Where a rank is: ``waiting_in`` (a collective, or None), the top user frame and its code."""
    waiting = None
    for path, _, func in frames:
        if "torch/distributed/" in path.replace("\\", "/") and func in COLLECTIVES:
            waiting = func
            break
        if "torch/autograd/" in path and func in ("backward", "_engine_run_backward"):
            waiting = "backward"
            break
    user = next((f for f in frames if not _library(f[0])), frames[0] if frames else None)
    where = code = ""
    if user:
        path, line, func = user
        where = f"{os.path.basename(path)}:{line}"
        full = path if os.path.isabs(path) or not cwd else os.path.join(cwd, path)
        code = linecache.getline(full, line).split("  #", 1)[0].strip()[:80]
        if not code:
            code = func
    return {"waiting_in": waiting, "where": where, "code": code}


#: How often the progress files are copied into the mirror directory (``Mirror``).
MIRROR_S = 5.0
#: The most bytes of a long file read per copy (a history grows about 640 bytes in ``MIRROR_S``).
MIRROR_CHUNK = 65536
_MIRRORED = re.compile(r"rank-\d+(?:\.history)?")


class Mirror:
    """Copies a node's progress files (each rank's ring ``rank-R`` and its ``rank-R.history``)
    into a directory the submitter can read, as ``DST/node-K/progress/``: the layout of a local
    job's log root, so that ``stragglers.read`` and ``timeline.progress_files`` read it as they
    read that. SLURM keeps the node's own progress directory in a temporary directory on the
    node; the mirror goes beside the job's output file (docs/failures.md, "Stragglers").

    Bounded, every ``MIRROR_S`` seconds at most: a file of ``_WHOLE_BYTES`` or less (the ring, one
    page; a history's first minutes) is copied whole when its bytes changed, by a write to a
    temporary name and a rename (a reader sees the old copy or the new, never half of one); of a
    longer ``rank-R`` (lines a trainer appends, one a step) its last ``_WHOLE_BYTES`` of whole lines
    the same way (the stragglers' window); of a longer history only the newest whole line is
    appended at each copy, reading ``MIRROR_CHUNK`` bytes at most, so the copy grows a line every
    ``MIRROR_S`` (about 23 KB an hour), not the node's two a second; a trainer's own long
    ``rank-R`` without a history gets such a history too. A copy that cannot be written is said
    once on stderr and tried again later: the mirror never ends or slows the job."""

    def __init__(self, src: str, dst: str, node: int):
        self.src, self.node = src, node
        self.dst = os.path.join(dst, f"node-{node}", "progress")
        # copy's name -> (its source's inode, source bytes taken, the bytes of a whole copy or None)
        self.sent: dict[str, tuple[int, int, bytes | None]] = {}
        self.next = 0.0
        self.said = False

    def maybe(self, now: float) -> None:
        if now >= self.next:
            self.next = now + MIRROR_S
            self.copy()

    def copy(self) -> None:
        """Copy what changed since the last copy."""
        try:
            names = sorted(n for n in os.listdir(self.src) if _MIRRORED.fullmatch(n))
        except OSError:
            return  # no rank has reported yet
        try:
            if names:
                os.makedirs(self.dst, exist_ok=True)
            for name in names:
                self._one(name, names)
        except OSError as e:
            if not self.said:
                self.said = True
                sys.stderr.write(f"halo-sched: node {self.node}: cannot copy the ranks' progress into {self.dst} "
                                 f"({e.strerror or e}); `halo-sched status` and `timeline` will not show it; "
                                 "the job goes on\n")
                sys.stderr.flush()

    def _one(self, name: str, names: list[str]) -> None:
        try:
            f = open(os.path.join(self.src, name), "rb")
        except OSError:
            return  # gone meanwhile (a restarting rank)
        with f:
            st = os.fstat(f.fileno())
            if st.st_size <= _WHOLE_BYTES or not name.endswith(".history"):
                f.seek(max(0, st.st_size - _WHOLE_BYTES))
                data = f.read(_WHOLE_BYTES)
                if st.st_size > _WHOLE_BYTES:
                    data = data[data.find(b"\n") + 1:]  # the first line may be cut
                data = data[:data.rfind(b"\n") + 1]  # whole lines only (a slot not written yet is nothing)
                if self.sent.get(name, (None, 0, None))[::2] != (st.st_ino, data):
                    self._replace(name, data)
                self.sent[name] = (st.st_ino, st.st_size if st.st_size > _WHOLE_BYTES else len(data), data)
                if st.st_size <= _WHOLE_BYTES or name + ".history" in names:
                    return
                name += ".history"  # a trainer's own lines, one a step: a history of them as well
            self._thin(f, st, name)

    def _thin(self, f, st: os.stat_result, name: str) -> None:
        """Append the newest whole line of ``f`` past what was taken (its first one too when the
        copy starts afresh: a new file, or one that was started again)."""
        ino, done, _ = self.sent.get(name, (-1, 0, None))
        fresh = ino != st.st_ino or st.st_size < done
        if fresh:
            done = 0
        if st.st_size - done > MIRROR_CHUNK:  # far behind: the newest lines are what matters
            head = b""
            if fresh:
                f.seek(0)
                head = f.read(256).split(b"\n", 1)[0] + b"\n"
            done = st.st_size - MIRROR_CHUNK
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            data = data[data.find(b"\n") + 1:]
            done += MIRROR_CHUNK - len(data)
        else:
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            head = b""
        cut = data.rfind(b"\n") + 1
        lines = data[:cut].splitlines(keepends=True)
        keep = (lines[:1] if fresh and not head else [head] if head else []) + lines[-1:]
        keep = list(dict.fromkeys(keep))
        if fresh:
            self._replace(name, b"".join(keep))
        elif keep:
            with open(os.path.join(self.dst, name), "ab") as out:
                out.write(b"".join(keep))
        self.sent[name] = (st.st_ino, done + cut, None)

    def _replace(self, name: str, data: bytes) -> None:
        tmp = os.path.join(self.dst, f".{name}.{os.getpid()}.tmp")  # never read as a rank's file
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, os.path.join(self.dst, name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


class Monitor:
    def __init__(self, node: int, torchrun: int, progress_dir: str, log_dir: str, nproc: int,
                 timeout_s: float, first_step_s: float, stack_signal: int, host: str | None = None,
                 mirror: str | None = None, key: str = ""):
        self.node, self.torchrun, self.progress_dir, self.log_dir = node, torchrun, progress_dir, log_dir
        self.mirror = Mirror(progress_dir, mirror, node) if mirror else None
        self.nproc, self.timeout_s, self.first_step_s = nproc, timeout_s, first_step_s
        self.stack_signal, self.host = stack_signal, host or socket.gethostname()
        self.ranks: dict[int, dict] = {}  # pid -> {rank, local_rank, seen, out, cwd}
        self.key = key  # the job's failure key, which signs this node's HUNG lines

    # ---- watching -------------------------------------------------------------------------
    def _discover(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.ranks:
                continue
            s = _stat(int(entry))
            if not s or int(s[1]) != self.torchrun:
                continue
            env = _environ(int(entry))
            if "RANK" not in env:
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = None
            self.ranks[int(entry)] = {"rank": int(env["RANK"]), "local_rank": int(env.get("LOCAL_RANK", -1)),
                                      "seen": time.time(), "out": [], "cwd": cwd}

    def _outputs(self, info: dict) -> list[str]:
        if not info["out"]:
            info["out"] = sorted(glob.glob(os.path.join(self.log_dir, "*", "attempt_*", str(info["local_rank"]),
                                                        "std*.log")))
        return info["out"]

    def activity(self, info: dict) -> tuple[float, float, bool]:
        """(last activity, its limit, reports progress)."""
        last = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}"))
        if last is not None:  # the time the rank wrote: a ring rewritten in memory leaves no mtime
            return last[1], self.timeout_s, True
        times = [info["seen"]] + [m for m in map(_mtime, self._outputs(info)) if m is not None]
        return max(times), self.first_step_s, False

    def live(self) -> dict[int, dict]:
        return {pid: i for pid, i in self.ranks.items() if _alive(pid)}

    def hung(self, now: float) -> bool:
        live = self.live()
        if not live:
            return False
        return all(now - last >= limit for last, limit, _ in (self.activity(i) for i in live.values()))

    def watch(self) -> bool:
        """Poll until the node hangs (True) or torchrun ends (False)."""
        while _alive(self.torchrun):
            if len(self.live()) < self.nproc:
                self._discover()
            if self.hung(time.time()):
                return True
            if self.mirror is not None:
                self.mirror.maybe(time.monotonic())
            time.sleep(POLL_S)
        return False

    # ---- on a hang --------------------------------------------------------------------------
    def _sleep_while_running(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and _alive(self.torchrun):
            time.sleep(min(0.2, left))  # wakes at the end, not up to 0.2 s after: the nodes act together

    def _wait_until(self, when: float, most: float) -> None:
        """Until the wall-clock time ``when`` (one instant for every node of a stall, as each
        node reckons it from its ranks' last activity), ``most`` seconds at most, while torchrun runs."""
        self._sleep_while_running(min(most, max(0.0, when - time.time())))

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self.progress_dir, f"rank-{rank}.stack")

    def _stderr_text(self, info: dict) -> str:
        for p in self._outputs(info):
            if p.endswith("stderr.log"):
                try:
                    with open(p, "rb") as f:
                        f.seek(0, os.SEEK_END)
                        f.seek(max(0, f.tell() - 65536))
                        return f.read().decode(errors="replace")
                except OSError:
                    return ""
        return ""

    def fire(self) -> bool:
        """Take the stacks, write the report and end torchrun; False when the hang went away."""
        detected = time.time()
        state = {}
        stalled = 0.0  # when the last of this node's ranks went past its limit: the hang's start
        for pid, info in self.live().items():
            last, limit, reports = self.activity(info)
            stalled = max(stalled, last + limit)
            got = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}")) if reports else None
            step = got[0] if got else None
            state[pid] = {"last": last, "reports": reports, "step": step, "threads": None, "how": None, "why": None}
        sys.stderr.write(f"halo-sched: node {self.node}: no rank made progress for {self.timeout_s:g} s; "
                         "taking their stacks\n")
        sys.stderr.flush()
        # 1. Stacks without ending the ranks, where the rank registered faulthandler.
        sizes = {}
        for pid, info in self.live().items():
            if self.stack_signal and _handles(pid, self.stack_signal):
                sizes[pid] = os.path.getsize(self._stack_file(info["rank"])) if os.path.exists(
                    self._stack_file(info["rank"])) else 0
                try:
                    os.kill(pid, self.stack_signal)
                except OSError:
                    sizes.pop(pid)
        end = time.monotonic() + STACK_WAIT_S
        while sizes and time.monotonic() < end:
            time.sleep(0.2)
            for pid in list(sizes):
                path = self._stack_file(self.ranks[pid]["rank"])
                try:
                    with open(path, errors="replace") as f:
                        f.seek(sizes[pid])
                        text = f.read()
                except OSError:
                    continue
                threads = parse_stacks(text)
                # Complete once the main thread's outermost frame (<module>) is in.
                if threads and any(t[-1][2] == "<module>" for t in threads):
                    state[pid]["threads"], state[pid]["how"] = threads, f"signal {self.stack_signal} (SIGRTMIN+{self.stack_signal - signal.SIGRTMIN}), rank kept running"
                    del sizes[pid]
        # 2. Let the other nodes' monitors take theirs before anything here ends. A hang must
        # last through this: a rank that progressed meanwhile, or torchrun's end, calls it off.
        # torchrun ending meanwhile does not call it off: every rank here had stalled, so another
        # node's monitor ended its ranks and this node's collectives broke; what this node saw is
        # still its part of the report (its ranks' last tracebacks say where they waited).
        # Until SETTLE_S after the stall began (the same on every node of it), not after this
        # node's poll saw it: the nodes then abort together (docs/failures.md, "Hangs").
        self._wait_until(stalled + SETTLE_S, SETTLE_S)
        if any(self.activity(self.ranks[pid])[0] > st["last"] for pid, st in state.items() if _alive(pid)):
            sys.stderr.write(f"halo-sched: node {self.node}: progress again within "
                             f"{SETTLE_S:g} s: not a hang\n")
            sys.stderr.flush()
            return False
        # 3. The rest: SIGABRT, which PYTHONFAULTHANDLER turns into a dump on the rank's stderr.
        # Each node's wake can lag the others' by its poll and its load, and a rank whose peer died
        # first leaves its collective at once (a CI run: node 0's aborts came 0.1 s before node
        # 1's, and rank 3 was dumped inside torch's excepthook, its traceback held in a StringIO).
        # So: stop them, wait until every node has stopped its own, then abort. A stopped rank
        # cannot see its peers' sockets close; the SIGABRT sent while it is stopped is pending and
        # is taken as it resumes, before a broken collective can unwind to Python.
        abort_at = stalled + SETTLE_S + STOP_SYNC_S
        aborted, stopped = [], []
        try:
            for pid in state:
                if state[pid]["threads"] is None and _alive(pid):
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
                    except OSError:
                        pass
            if stopped:
                self._wait_until(abort_at, STOP_SYNC_S)
            for pid in state:
                if state[pid]["threads"] is None:
                    if not _alive(pid):
                        # Ended before this node's turn (a peer's end broke its collective): where it
                        # was is in the traceback it printed as it ended, if it printed one.
                        frames = parse_traceback(self._stderr_text(self.ranks[pid]))
                        if frames:
                            state[pid]["threads"], state[pid]["how"] = [frames], "its traceback as it ended"
                        else:
                            state[pid]["why"] = "the rank had already ended"
                        continue
                    try:
                        os.kill(pid, signal.SIGABRT)
                        aborted.append(pid)
                    except OSError as e:
                        state[pid]["why"] = f"SIGABRT failed: {e.strerror}"
        finally:
            for pid in stopped:  # never leave a rank stopped
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        end = time.monotonic() + ABORT_WAIT_S
        while any(_alive(p) for p in aborted) and time.monotonic() < end:
            time.sleep(0.2)
        # torchrun's tee thread copies the dump into the rank's log file after the rank is gone:
        # look again until every dump is in or FLUSH_WAIT_S passes (on a loaded node this takes
        # seconds, not the 0.3 s it takes on an idle one).
        got: dict[int, list] = {}
        end = time.monotonic() + FLUSH_WAIT_S
        while True:
            for pid in aborted:
                if pid not in got:
                    threads = parse_stacks(self._stderr_text(self.ranks[pid]))
                    if threads and any(t[-1][2] == "<module>" for t in threads):
                        got[pid] = threads
            if len(got) == len(aborted) or time.monotonic() >= end:
                break
            time.sleep(0.2)
        for pid in aborted:
            threads = got.get(pid) or parse_stacks(self._stderr_text(self.ranks[pid]))
            if threads:
                state[pid]["threads"], state[pid]["how"] = threads, "SIGABRT with PYTHONFAULTHANDLER"
            elif parse_traceback(self._stderr_text(self.ranks[pid])):
                # It ended with an exception before the signal's dump (a peer ended first).
                state[pid]["threads"] = [parse_traceback(self._stderr_text(self.ranks[pid]))]
                state[pid]["how"] = "its traceback as it ended"
            elif _alive(pid):
                state[pid]["why"] = "the rank did not react to SIGABRT (uninterruptible sleep? faulthandler disabled?)"
            else:
                state[pid]["why"] = "no stack on its stderr after SIGABRT (PYTHONFAULTHANDLER unset or disabled?)"
        # 4. The report: one line per rank, every stack kept.
        dump = []
        for pid, st in sorted(state.items(), key=lambda kv: self.ranks[kv[0]]["rank"]):
            info = self.ranks[pid]
            frames = main_thread(st["threads"]) if st["threads"] else []
            where = classify(frames, info["cwd"]) if frames else {"waiting_in": None, "where": "", "code": ""}
            if where["waiting_in"] is None:
                # Another node's monitor ended its ranks first: this rank's collective failed
                # ("Connection closed by peer") and its dump caught it handling that. The traceback
                # it printed says which collective it had been waiting in.
                tb = parse_traceback(self._stderr_text(info))
                was = classify(tb, info["cwd"]) if tb else None
                if was is not None and was["waiting_in"] is not None:
                    where = was
            rec = {
                "kind": "HUNG", "node": self.node, "rank": info["rank"], "local_rank": info["local_rank"],
                "host": self.host, "exit_code": None, "signal": None, "time": detected,
                "step": st["step"], "last_progress": st["last"], "reports": st["reports"],
                "stalled_s": round(detected - st["last"], 1), "stack_read": bool(frames),
                "error": st["why"] or "", **where, "tail": [f"{os.path.basename(f)}:{n} in {fn}" for f, n, fn in frames[:8]],
            }
            sys.stderr.write(record_line(rec, self.key))
            dump.append(f"==== rank {info['rank']} (node {self.node}, host {self.host}, local rank "
                        f"{info['local_rank']}, pid {pid}): "
                        + (f"stack by {st['how']}" if st["threads"] else f"no stack: {st['why']}"))
            for t in st["threads"] or []:
                dump.append("  thread" + (" (main)" if t is frames else "") + ":")
                dump.extend(f"    File \"{f}\", line {n} in {fn}" for f, n, fn in t)
        sys.stderr.flush()
        secrets = secret_values()
        dump = [scrub(line, secrets) for line in dump]
        text = "\n".join(dump) + "\n"
        try:
            with open(os.path.join(os.path.dirname(self.progress_dir), "hang-stacks.txt"), "a") as f:
                f.write(text)
        except OSError:
            pass
        sys.stderr.write("".join(f"halo-sched: node {self.node}: {line}\n" for line in dump))
        sys.stderr.flush()
        # 5. Stay until every node's report is written (this node's end ends the step), then end
        # the node: torchrun stops its ranks and exits non-zero.
        time.sleep(max(0.0, min(abort_at + LINGER_S - time.time(), STOP_SYNC_S + LINGER_S)))
        try:
            os.kill(self.torchrun, signal.SIGTERM)
        except OSError:
            return True
        end = time.monotonic() + 10
        while _alive(self.torchrun) and time.monotonic() < end:
            time.sleep(0.2)
        for pid in [self.torchrun] + list(self.live()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return True


def _read_key() -> str:
    try:
        return (sys.stdin.readline() if sys.stdin is not None else "").strip()
    except (OSError, ValueError):
        return ""


def main(argv: list[str]) -> int:
    """``NODE TORCHRUN_PID PROGRESS_DIR LOG_DIR NPROC TIMEOUT_S FIRST_STEP_S SIGNAL [MIRROR_DIR]``
    (an empty MIRROR_DIR: no mirror); the job's failure key on stdin (its first line), never in
    the environment, where a rank of the same user could read it (/proc/PID/environ)."""
    node, torchrun, progress_dir, log_dir, nproc, timeout_s, first_step_s, sig = argv[:8]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # torchrun ended: nothing to watch
    m = Monitor(int(node), int(torchrun), progress_dir, log_dir, int(nproc), float(timeout_s),
                float(first_step_s), int(sig) if sig.isdigit() else 0, mirror=argv[8] if len(argv) > 8 else None,
                key=_read_key())
    try:
        while m.watch():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the report, bounded by its own waits
            if m.fire():
                break
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    finally:
        if m.mirror is not None:  # the ranks' last reports, as the job ends
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            m.mirror.copy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_MONITOR_EOF
  halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
  case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
  # $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
  PYTHONPATH=$halo_log_dir/.monitor $halo_py -m halo_node.hang_monitor "$halo_rank" "$1" "$HALO_PROGRESS_DIR" "$halo_log_dir" \
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
        HALO_SERVER_VLLM_ADDRS_FILE = "$${NOMAD_TASK_DIR}/halo-server-vllm-addrs"
      }

      template {
        destination = "local/halo-entry.sh"
        change_mode = "noop"
        perms       = "0755"
        # Delimiters absent from the script: Go templating leaves it byte-exact.
        left_delimiter  = "[[halo-c043dc06"
        right_delimiter = "halo-c043dc06]]"
        data        = <<EOT
#!/bin/bash
# halo-sched node entry for job rl-grpo: 2 nodes x 8 processes.
# The same script runs on every node. The backend sets only HALO_NODE_RANK (and maybe
# HALO_NODE_RANK_OFFSET) and the master address and port (HALO_MASTER_ADDR and
# HALO_MASTER_PORT, or HALO_MASTER_ADDR_FILE to poll until rank 0 is known).
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

# The preemption/time-limit warning (SIGUSR2) is ignored here, in setup and in
# torchrun, and inherited as ignored by the ranks: torchrun would die from it (or, for a signal it
# handles, stop its workers after a short grace). The trainer installs its own handler (Python's
# signal.signal overrides an inherited SIG_IGN) and has until the deadline to checkpoint. A
# handler in this shell would not do: bash resets handled signals to the default in children.
export HALO_WARNING_SIGNAL=USR2

# The warning reaches this shell as SIGURG (SLURM: the batch script passes slurm.signal's warning
# and `halo-sched cancel --signal` on as URG, to every process of the job's steps). URG's default
# action is to ignore it, so torchrun, the ranks and any server go on as if nothing came; this
# shell alone acts on it: it hands SIGUSR2 to each rank (a process torchrun started)
# once that rank handles it (SigCgt in /proc/PID/status), at once or as soon as it installs its
# handler. A warning that comes while setup, torchrun or a trainer's imports still run is held,
# not lost: slurmctld looks at time limits every 30 s and sends slurm.signal's warning up to 30 s
# early, which for a short job can be its first seconds (job_mgr.c send_job_warn_signal).
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
# Runs in the background from the warning until torchrun ends (torchrun may start ranks again).
halo_deliver() {
  (
    set +e
    halo_bit=$(($(kill -l USR2) - 1))
    halo_done=' '
    while kill -0 "$halo_torchrun" 2> /dev/null; do
      # torchrun's children: "pid (comm) state ppid ..." in /proc/PID/stat (comm may hold spaces).
      # (cat, not awk, opens the files: a process that ends meanwhile must not end the scan).
      # Signal every rank that handles it first, then say so: the ranks of all nodes stop
      # together at their next step, and a rank still unsignalled by then would stop unwarned.
      halo_sent=
      for halo_p in $(cat /proc/[0-9]*/stat 2> /dev/null | awk -v t="$halo_torchrun" '{ p = $1; sub(/^.*\) /, ""); if ($2 == t) print p }'); do
        [[ $halo_done != *" $halo_p "* ]] || continue
        halo_mask=
        while read -r halo_k halo_v; do
          [ "$halo_k" != SigCgt: ] || { halo_mask=$halo_v; break; }
        done 2> /dev/null < "/proc/$halo_p/status"
        [[ $halo_mask =~ ^[0-9a-fA-F]+$ ]] && (((16#$halo_mask >> halo_bit) & 1)) || continue
        kill -USR2 "$halo_p" 2> /dev/null || continue
        halo_done+="$halo_p "
        halo_sent+="$halo_p "
      done
      for halo_p in $halo_sent; do
        halo_who=$(tr '\0' '\n' 2> /dev/null < "/proc/$halo_p/environ" | sed -n 's/^RANK=//p')
        echo "halo-sched: node $halo_rank: SIGUSR2 to rank $${halo_who:-?} (pid $halo_p), $((SECONDS - halo_warned_at)) s after the warning" >&2
      done
      sleep 0.2
    done
    [ "$halo_done" != ' ' ] ||
      echo "halo-sched: node $halo_rank: no rank handled SIGUSR2 before torchrun ended; the warning reached no trainer (install a handler for \$HALO_WARNING_SIGNAL)" >&2
  ) &
  halo_deliverer=$!
}
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
halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
# $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
$halo_py - "$halo_left" "$${halo_health[@]}" << 'HALO_HEALTH_EOF' ||
"""Wait until every rollout server answers its health path (run on a trainer node by the entry
script, with the node's python3; standard library only).

argv: SECONDS then NAME URL pairs (NAME like ``vllm[0]``, URL the health URL). Exit 0 once each
URL answered HTTP 200; exit 1 at the deadline, naming every server that did not, with its last
error. Prints one line per server when it becomes healthy.
"""
import sys
import time
import urllib.error
import urllib.request


def main(argv):
    deadline = time.monotonic() + float(argv[0])
    pending = dict(zip(argv[1::2], argv[2::2]))
    last = {name: "no answer yet" for name in pending}
    t0 = time.monotonic()
    while pending:
        for name, url in list(pending.items()):
            left = deadline - time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=max(0.5, min(5.0, left))) as resp:
                    code = resp.status
            except urllib.error.HTTPError as err:
                code, last[name] = err.code, f"HTTP {err.code}"
            except (urllib.error.URLError, OSError, ValueError) as err:
                code, last[name] = None, str(getattr(err, "reason", err))
            if code == 200:
                del pending[name]
                print(f"halo-sched: server {name} healthy at {url} after {time.monotonic() - t0:.1f}s "
                      f"(t={time.time():.3f})", file=sys.stderr, flush=True)
            elif code is not None:
                last[name] = f"HTTP {code}"
        if not pending:
            break
        if time.monotonic() >= deadline:
            for name, url in pending.items():
                print(f"halo-sched: server {name} did not answer 200 at {url} within rendezvous.timeout_s "
                      f"(last: {last[name]})", file=sys.stderr, flush=True)
            return 1
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
HALO_HEALTH_EOF
  halo_fail "not every rollout server answered its health path within rendezvous.timeout_s=1200s (see above); not starting the trainer"
unset halo_health halo_addrs halo_left halo_k halo_a


# ---- Failure report (halo_sched/node/failure_collector.py) ----
# torchrun --log-dir/--tee: each rank's stdout/stderr also land in a file (on the console every
# such line reads "[rank R] ..."), beside the rank's TORCHELASTIC_ERROR_FILE. When torchrun exits
# non-zero, the collector prints one "halo-sched-failure {json}" line per failed rank to this
# node's output, where every backend finds it. HALO_LOG_DIR (optional) keeps the files.
halo_log_root=$${HALO_LOG_DIR:-}
[ -n "$halo_log_root" ] || halo_log_root=$(mktemp -d "$${TMPDIR:-/tmp}/halo-sched.XXXXXX")
halo_log_dir=$halo_log_root/node-$halo_rank
mkdir -p "$halo_log_dir"
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank $${rank}] '
# torchrun's workers run in sessions of their own: when torchrun dies (SIGKILL), they are
# reparented to init, out of reach of its process tree and of SLURM's proctrack/linuxproc, and
# would outlive the job. Only torchrun gets this tag in its environment, so it marks exactly what
# torchrun started, however deep or reparented; it is made here, at run time (the script is the
# same on every node and backend). A subreaper would not do: bash cannot become one, and a helper
# process that did could itself be killed.
halo_node_tag=node$halo_rank-$$-$(date +%s%N)-$RANDOM
# Pids of live processes carrying the tag (a zombie's environ reads empty).
halo_tagged() {
  grep -lzxF "HALO_NODE_TAG=$halo_node_tag" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3
}
# After torchrun exits, however it exits: TERM what it left once, KILL it after a short grace,
# until nothing is left (a process forked meanwhile is caught on the next round); give up on
# one that cannot die (uninterruptible sleep) after 10 s more.
halo_sweep() {
  local halo_p halo_seen=' ' halo_kill_at=$((SECONDS + 5)) halo_give_up=$((SECONDS + 15))
  while [ "$SECONDS" -lt "$halo_give_up" ]; do
    set -- $(halo_tagged)
    [ $# -gt 0 ] || return 0
    for halo_p; do
      if [ "$SECONDS" -ge "$halo_kill_at" ]; then
        kill -KILL "$halo_p" 2> /dev/null || true
      elif [[ $halo_seen != *" $halo_p "* ]]; then
        kill -TERM "$halo_p" 2> /dev/null || true
        halo_seen+="$halo_p "
      fi
    done
    sleep 0.1
  done
  echo "halo-sched: node $halo_rank: processes left by torchrun would not die: $*" >&2
}
halo_run() {
  local halo_pid halo_tee halo_rc halo_py halo_stop
  halo_trapped=0
  halo_stopped_at=
  # torchrun's own stderr also goes to a file: its failure summary has each failed rank's exit code.
  exec 3> >(trap '' TERM INT HUP; exec tee -a "$halo_log_dir/torchrun.err" >&2)
  halo_tee=$!
  HALO_NODE_TAG=$halo_node_tag "$@" 2>&3 &
  halo_pid=$!
  halo_torchrun=$halo_pid
  halo_hang_start "$halo_pid"
  [ -z "$halo_warned_at" ] || halo_deliver  # warned during setup: hand it on once a rank handles it
  # SLURM signals every process of the step and the local backend the node's process group, so
  # torchrun has the signal already; Nomad signals this shell alone (executor_unix.go
  # shutdownProcess), so pass it on. (SLURM's task sets HALO_SLURM_STEP_ID: it removes SLURM_STEP_*.)
  trap 'halo_trapped=1; halo_stopped_at=$${EPOCHREALTIME:-$(date +%s)}; [ -n "$${HALO_SLURM_STEP_ID:-}$${HALO_LOCAL_JOB:-}" ] || kill -TERM "$halo_pid" 2> /dev/null || true' TERM INT
  while :; do
    halo_trapped=0
    halo_rc=0
    wait "$halo_pid" || halo_rc=$?
    # wait returns early (>128) when the trap ran; torchrun is still stopping: wait again.
    [ "$halo_trapped" = 1 ] && [ "$halo_rc" -gt 128 ] || break
  done
  halo_hang_stop
  # The warning's deliverer ends within 0.2 s of torchrun (its last words come before the sweep's).
  [ -z "$halo_deliverer" ] || wait "$halo_deliverer" 2> /dev/null || true
  # A stop request from here on waits for the sweep, then takes effect (as it did before: the
  # shell ends by that signal, without the failure report).
  halo_stop=
  trap 'halo_stop=TERM' TERM
  trap 'halo_stop=INT' INT
  halo_sweep
  trap - TERM INT
  [ -z "$halo_stop" ] || kill -s "$halo_stop" $$
  exec 3>&-
  wait "$halo_tee" 2> /dev/null || true
  if [ "$halo_rc" != 0 ]; then
    halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
    case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
    # $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
    HALO_FAILURE_KEY=$halo_failure_key $halo_py - "$halo_rank" 8 "$halo_log_dir" "$halo_rc" "$halo_stopped_at" << 'HALO_COLLECT_EOF' ||
"""Run on each node by the entry script after torchrun exits non-zero: one failure line per rank.

Standard library only: it runs under the node's Python (the one torchrun runs under), where
halo-sched itself need not be installed. The entry script passes it, as text, to that Python.

Inputs, from torchrun's own files (``torch/distributed/elastic/multiprocessing/api.py``,
``DefaultLogsSpecs.reify``): with ``--log-dir=DIR --tee=3``, each worker's stdout/stderr land in
``DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and its
``TORCHELASTIC_ERROR_FILE`` is ``error.json`` beside them (written only by a trainer decorated
with ``@record``). Exit codes and signals come from torchrun's failure summary on its stderr
(``ChildFailedError.format_msg``: ``rank : 3 (local_rank: 1)``, ``exitcode : -9 (pid: 12)
(SIGKILL)``), which the entry script tees into ``DIR/torchrun.err``.

Output: ``halo-sched-failure {json}`` on stderr, one per failed rank, or one for the node when
torchrun itself failed (rendezvous timeout, killed) and no rank is named. The keys are those of
:class:`halo_sched.node.failures.RankFailure`.

Two things make a line fit to leave the node (issue 28). Secrets: every ``secret_env`` value (the
names in ``HALO_SECRET_NAMES``, the values in this node's environment) is replaced by ``***`` in
all the text a line carries, on the whole text before anything is cut (a cut secret is a fragment
no later scrub can find). Trust: the line ends with ``"mac"``, an HMAC-SHA256 of the rest under the
job's failure key (``HALO_FAILURE_KEY``, made at submit; the entry script takes it out of the
environment before torchrun starts, so a rank cannot read it from its own): the submitter takes a
line as a verdict (the first failure, the culprit, a ledger entry) only when it verifies.
"""
from __future__ import annotations

import datetime
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12
#: The characters a tail line keeps (after the secrets are scrubbed from the whole line).
LINE_CHARS = 400
#: The names of the secret_env variables on this node (space-separated); their values are in the environment.
SECRET_NAMES_VAR = "HALO_SECRET_NAMES"
#: The job's failure key (halo_sched/node/contract.py ``failure_key``).
KEY_VAR = "HALO_FAILURE_KEY"
SCRUBBED = "***"
#: A secret value shorter than this is not scrubbed: as a substring it would mangle ordinary text
#: (a value "x" turned "exit" into "e***it"); submit warns about it.
MIN_SECRET_CHARS = 6

_BLOCK = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S*)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*"
    r"\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<exit>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?[ \t]*\n"
)
# The line that names an error in a traceback or a torchrun log: "ValueError: ...", "torch.x.Y: ...".
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b.*")
# torch prefixes a worker's uncaught exception lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# How torchrun stops a node's other workers once one has failed (api.py ``_close``).
_STOP_SIGNALS = ("SIGTERM",)


def secret_values(environ=None) -> list[str]:
    """The values to scrub: each secret_env variable's value in this environment, longest first
    (one value inside another is replaced whole), those too short to scrub left out."""
    environ = os.environ if environ is None else environ
    values = {environ.get(n, "") for n in environ.get(SECRET_NAMES_VAR, "").split()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, SCRUBBED)
    return text


def _tail(path: str, n: int = TAIL_LINES, secrets: list[str] | None = None) -> list[str]:
    """The last ``n`` non-empty lines of the file's last 16 KiB, each scrubbed whole and then cut
    to LINE_CHARS. The first line is dropped when the read began inside it: it may begin inside a
    secret, whose fragment no scrub would find."""
    secrets = secret_values() if secrets is None else secrets
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 16384)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start and lines:
        lines = lines[1:]
    return [scrub(line, secrets)[:LINE_CHARS] for line in lines if line.strip()][-n:]


# faulthandler's dump (a rank aborted by the hang monitor, a segfault): its first line, the
# current thread's header, a frame, and what follows it (Python 3.12: "Extension modules: ...").
_FATAL = re.compile(r"^Fatal Python error: .+")
_CURRENT = re.compile(r"^Current thread 0x[0-9a-fA-F]+")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _dump_line(texts: list[str]) -> str:
    """``Fatal Python error: Aborted, in train.py:57 (main)`` from the last faulthandler dump in
    ``texts`` (the current thread's innermost frame), or '' when there is none."""
    fatal = max((i for i, t in enumerate(texts) if _FATAL.match(t)), default=-1)
    current = max((i for i, t in enumerate(texts) if _CURRENT.match(t)), default=-1)
    if fatal < 0 and current < 0:
        return ""
    frame = None
    if current >= 0:
        frame = next((m for t in texts[current + 1:] if (m := _DUMP_FRAME.match(t))), None)
    where = f"in {os.path.basename(frame['file'])}:{frame['line']} ({frame['func']})" if frame else ""
    head = texts[fatal] if fatal >= 0 else "Fatal Python error"
    return f"{head}, {where}" if where else head


def error_line(lines: list[str], recent: int = TAIL_LINES) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the last
    ``recent``; but when a faulthandler dump came after it (or there is none), the dump's fatal
    error and the frame it was in, never its last line (Python 3.12's "Extension modules: ...");
    else the last line."""
    texts = [_RANK_PREFIX.sub("", line.strip()) for line in lines]
    last_error = max((i for i, t in enumerate(texts) if i >= len(texts) - recent and _ERROR.match(t)), default=-1)
    last_dump = max((i for i, t in enumerate(texts) if _FATAL.match(t) or _CURRENT.match(t)), default=-1)
    if last_dump > last_error:
        return _dump_line(texts)
    if last_error >= 0:
        return texts[last_error]
    return texts[-1] if texts else ""


def summary_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary, per global rank: time (epoch), host, local rank, exit, signal."""
    out = {}
    for m in _BLOCK.finditer(text):
        try:
            # ProcessFailure.timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS", whole seconds.
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = None
        code = int(m["exit"])
        out[int(m["rank"])] = {
            "time": when, "host": m["host"], "local_rank": int(m["local_rank"]),
            # A negative exit code is torch's way to say "killed by signal -code".
            "exit_code": 128 - code if code < 0 else code,
            "signal": m["sig"] or (_SIGNALS.get(-code, f"SIG{-code}") if code < 0 else None),
        }
    return out


def _rank_dirs(log_dir: str) -> dict[int, str]:
    """local rank -> its directory in the latest attempt torchrun made under ``log_dir``."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return {}
    out = {}
    for d in glob.glob(os.path.join(attempts[-1], "*")):
        if os.path.basename(d).isdigit():
            out[int(os.path.basename(d))] = d
    return out


def _error_file(path: str, secrets: list[str]) -> tuple[str, float] | None:
    """(message, time) from a worker's error.json (``@record``); the file's mtime is the precise time."""
    try:
        with open(path) as f:
            data = json.load(f)
        when = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    lines = scrub(str(msg or ""), secrets).strip().splitlines()
    return (lines[-1] if lines else ""), when


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None) -> list[dict]:
    """Failure records for one node whose torchrun exited with ``rc`` (non-zero)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with open(os.path.join(log_dir, "torchrun.err"), errors="replace") as f:
            agent_text = f.read()
    except OSError:
        agent_text = ""
    summary = summary_failures(agent_text)
    dirs = _rank_dirs(log_dir)
    secrets = secret_values()
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        # The error may be a faulthandler dump's, longer than the tail: read further for it.
        lines = _tail(os.path.join(d, "stderr.log"), 400, secrets) if d else []
        tail = lines[-TAIL_LINES:]
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json"), secrets) if d else None
        if from_file:
            error, when = from_file
        elif tail and info["signal"] is None:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later).
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            if mtime is not None and detected - 5 <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(lines) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
        })
    # When one worker fails, torchrun stops the node's other workers with SIGTERM: those are
    # victims (not SIGKILL: the kernel's OOM killer ends a rank that way). A victim's summary time
    # is the whole second of detection and can read earlier than the real failure's precise one.
    own = [r for r in out if r["signal"] not in _STOP_SIGNALS]
    if own:
        for r in out:
            if r["signal"] in _STOP_SIGNALS:
                r["stopped"] = True
    if not out:
        # torchrun failed before or without a worker failure (rendezvous, store timeout, a
        # signal that stopped it): the node is what failed.
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40, secrets) if not line.startswith("[rank ")]
        code = rc
        sig = _SIGNALS.get(code - 128) if code > 128 else None
        out.append({
            "node": node, "rank": None, "local_rank": None, "host": host, "exit_code": code, "signal": sig,
            "time": stopped_at if stopped_at is not None else now,
            "error": error_line(tail[-TAIL_LINES:]), "tail": tail[-TAIL_LINES:], "stopped": stopped_at is not None,
        })
    # The scheduler's name for this node (SLURM sets SLURMD_NODENAME in every task): what sbatch's
    # node options take. torchrun's host is the machine's FQDN and may differ from it.
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_name:
        for r in out:
            r["node_name"] = node_name
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def sign(body: str, key: str) -> str:
    """The line's ``mac``: HMAC-SHA256 of its JSON text without it, under the job's failure key."""
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def record_line(rec: dict, key: str | None = None, secrets: list[str] | None = None) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's
    end. Every secret_env value is scrubbed from its text first (``secrets``: this environment's),
    and the line is signed with ``key`` (this environment's ``HALO_FAILURE_KEY``; none: unsigned,
    a line no submitter takes as a verdict)."""
    secrets = secret_values() if secrets is None else secrets
    key = os.environ.get(KEY_VAR, "") if key is None else key
    rec = {k: _scrubbed(v, secrets) for k, v in rec.items() if k != "mac"}
    rec["tail"] = list(rec.get("tail") or [])
    while True:
        body = json.dumps(rec, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
        text = f"{TAG} {body}\n"
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_COLLECT_EOF
      echo "halo-sched-failure {\"node\":$halo_rank,\"rank\":null,\"host\":\"$(hostname)\",\"exit_code\":$halo_rc,\"time\":$(date +%s),\"error\":\"torchrun exited with $halo_rc\"}" >&2
  fi
  [ -n "$${HALO_LOG_DIR:-}" ] || rm -rf "$halo_log_root"
  return "$halo_rc"
}

# ---- Hang detection (hang.timeout_s; halo_sched/node/hang_monitor.py, progress.py) ----
# Each rank may append "STEP UNIX_TIME" lines to $HALO_PROGRESS_DIR/rank-$RANK after its steps
# (docs/failures.md: "Hangs"). A monitor beside torchrun ends the node when no rank progressed for
# hang.timeout_s=300s (600s before a rank's first report, judged by its output),
# after taking every rank's stack: SIGRTMIN+5 where the rank registered faulthandler on it
# (HALO_STACK_SIGNAL; progress.report() does), else SIGABRT with PYTHONFAULTHANDLER.
# Where the backend sets HALO_PROGRESS_MIRROR (SLURM: beside the job's output file), the monitor
# also copies the progress files there every few seconds, for `halo-sched status` and `timeline`.
# Each stays as the user set it.
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
  local halo_py halo_pkg=$halo_log_dir/.monitor/halo_node
  mkdir -p "$halo_pkg" && : > "$halo_pkg/__init__.py"
  cat > "$halo_pkg/failure_collector.py" << 'HALO_COLLECT_EOF'
"""Run on each node by the entry script after torchrun exits non-zero: one failure line per rank.

Standard library only: it runs under the node's Python (the one torchrun runs under), where
halo-sched itself need not be installed. The entry script passes it, as text, to that Python.

Inputs, from torchrun's own files (``torch/distributed/elastic/multiprocessing/api.py``,
``DefaultLogsSpecs.reify``): with ``--log-dir=DIR --tee=3``, each worker's stdout/stderr land in
``DIR/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` and its
``TORCHELASTIC_ERROR_FILE`` is ``error.json`` beside them (written only by a trainer decorated
with ``@record``). Exit codes and signals come from torchrun's failure summary on its stderr
(``ChildFailedError.format_msg``: ``rank : 3 (local_rank: 1)``, ``exitcode : -9 (pid: 12)
(SIGKILL)``), which the entry script tees into ``DIR/torchrun.err``.

Output: ``halo-sched-failure {json}`` on stderr, one per failed rank, or one for the node when
torchrun itself failed (rendezvous timeout, killed) and no rank is named. The keys are those of
:class:`halo_sched.node.failures.RankFailure`.

Two things make a line fit to leave the node (issue 28). Secrets: every ``secret_env`` value (the
names in ``HALO_SECRET_NAMES``, the values in this node's environment) is replaced by ``***`` in
all the text a line carries, on the whole text before anything is cut (a cut secret is a fragment
no later scrub can find). Trust: the line ends with ``"mac"``, an HMAC-SHA256 of the rest under the
job's failure key (``HALO_FAILURE_KEY``, made at submit; the entry script takes it out of the
environment before torchrun starts, so a rank cannot read it from its own): the submitter takes a
line as a verdict (the first failure, the culprit, a ledger entry) only when it verifies.
"""
from __future__ import annotations

import datetime
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import time

TAG = "halo-sched-failure"
TAIL_LINES = 12
#: The characters a tail line keeps (after the secrets are scrubbed from the whole line).
LINE_CHARS = 400
#: The names of the secret_env variables on this node (space-separated); their values are in the environment.
SECRET_NAMES_VAR = "HALO_SECRET_NAMES"
#: The job's failure key (halo_sched/node/contract.py ``failure_key``).
KEY_VAR = "HALO_FAILURE_KEY"
SCRUBBED = "***"
#: A secret value shorter than this is not scrubbed: as a substring it would mangle ordinary text
#: (a value "x" turned "exit" into "e***it"); submit warns about it.
MIN_SECRET_CHARS = 6

_BLOCK = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S*)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*"
    r"\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<exit>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?[ \t]*\n"
)
# The line that names an error in a traceback or a torchrun log: "ValueError: ...", "torch.x.Y: ...".
_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b.*")
# torch prefixes a worker's uncaught exception lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# How torchrun stops a node's other workers once one has failed (api.py ``_close``).
_STOP_SIGNALS = ("SIGTERM",)


def secret_values(environ=None) -> list[str]:
    """The values to scrub: each secret_env variable's value in this environment, longest first
    (one value inside another is replaced whole), those too short to scrub left out."""
    environ = os.environ if environ is None else environ
    values = {environ.get(n, "") for n in environ.get(SECRET_NAMES_VAR, "").split()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, SCRUBBED)
    return text


def _tail(path: str, n: int = TAIL_LINES, secrets: list[str] | None = None) -> list[str]:
    """The last ``n`` non-empty lines of the file's last 16 KiB, each scrubbed whole and then cut
    to LINE_CHARS. The first line is dropped when the read began inside it: it may begin inside a
    secret, whose fragment no scrub would find."""
    secrets = secret_values() if secrets is None else secrets
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - 16384)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start and lines:
        lines = lines[1:]
    return [scrub(line, secrets)[:LINE_CHARS] for line in lines if line.strip()][-n:]


# faulthandler's dump (a rank aborted by the hang monitor, a segfault): its first line, the
# current thread's header, a frame, and what follows it (Python 3.12: "Extension modules: ...").
_FATAL = re.compile(r"^Fatal Python error: .+")
_CURRENT = re.compile(r"^Current thread 0x[0-9a-fA-F]+")
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def _dump_line(texts: list[str]) -> str:
    """``Fatal Python error: Aborted, in train.py:57 (main)`` from the last faulthandler dump in
    ``texts`` (the current thread's innermost frame), or '' when there is none."""
    fatal = max((i for i, t in enumerate(texts) if _FATAL.match(t)), default=-1)
    current = max((i for i, t in enumerate(texts) if _CURRENT.match(t)), default=-1)
    if fatal < 0 and current < 0:
        return ""
    frame = None
    if current >= 0:
        frame = next((m for t in texts[current + 1:] if (m := _DUMP_FRAME.match(t))), None)
    where = f"in {os.path.basename(frame['file'])}:{frame['line']} ({frame['func']})" if frame else ""
    head = texts[fatal] if fatal >= 0 else "Fatal Python error"
    return f"{head}, {where}" if where else head


def error_line(lines: list[str], recent: int = TAIL_LINES) -> str:
    """The line that says what went wrong: the last ``SomethingError: ...`` line of the last
    ``recent``; but when a faulthandler dump came after it (or there is none), the dump's fatal
    error and the frame it was in, never its last line (Python 3.12's "Extension modules: ...");
    else the last line."""
    texts = [_RANK_PREFIX.sub("", line.strip()) for line in lines]
    last_error = max((i for i, t in enumerate(texts) if i >= len(texts) - recent and _ERROR.match(t)), default=-1)
    last_dump = max((i for i, t in enumerate(texts) if _FATAL.match(t) or _CURRENT.match(t)), default=-1)
    if last_dump > last_error:
        return _dump_line(texts)
    if last_error >= 0:
        return texts[last_error]
    return texts[-1] if texts else ""


def summary_failures(text: str) -> dict[int, dict]:
    """torchrun's failure summary, per global rank: time (epoch), host, local rank, exit, signal."""
    out = {}
    for m in _BLOCK.finditer(text):
        try:
            # ProcessFailure.timestamp_isoformat: local time, "YYYY-MM-DD_HH:MM:SS", whole seconds.
            when = datetime.datetime.strptime(m["time"], "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            when = None
        code = int(m["exit"])
        out[int(m["rank"])] = {
            "time": when, "host": m["host"], "local_rank": int(m["local_rank"]),
            # A negative exit code is torch's way to say "killed by signal -code".
            "exit_code": 128 - code if code < 0 else code,
            "signal": m["sig"] or (_SIGNALS.get(-code, f"SIG{-code}") if code < 0 else None),
        }
    return out


def _rank_dirs(log_dir: str) -> dict[int, str]:
    """local rank -> its directory in the latest attempt torchrun made under ``log_dir``."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return {}
    out = {}
    for d in glob.glob(os.path.join(attempts[-1], "*")):
        if os.path.basename(d).isdigit():
            out[int(os.path.basename(d))] = d
    return out


def _error_file(path: str, secrets: list[str]) -> tuple[str, float] | None:
    """(message, time) from a worker's error.json (``@record``); the file's mtime is the precise time."""
    try:
        with open(path) as f:
            data = json.load(f)
        when = os.stat(path).st_mtime
    except (OSError, ValueError):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    lines = scrub(str(msg or ""), secrets).strip().splitlines()
    return (lines[-1] if lines else ""), when


def collect(node: int, nproc: int, log_dir: str, rc: int, stopped_at: float | None = None,
            host: str | None = None, now: float | None = None) -> list[dict]:
    """Failure records for one node whose torchrun exited with ``rc`` (non-zero)."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with open(os.path.join(log_dir, "torchrun.err"), errors="replace") as f:
            agent_text = f.read()
    except OSError:
        agent_text = ""
    summary = summary_failures(agent_text)
    dirs = _rank_dirs(log_dir)
    secrets = secret_values()
    out = []
    for rank, info in sorted(summary.items()):
        lr = info["local_rank"]
        d = dirs.get(lr, "")
        # The error may be a faulthandler dump's, longer than the tail: read further for it.
        lines = _tail(os.path.join(d, "stderr.log"), 400, secrets) if d else []
        tail = lines[-TAIL_LINES:]
        detected = info["time"] if info["time"] is not None else now
        when, error = detected, ""
        from_file = _error_file(os.path.join(d, "error.json"), secrets) if d else None
        if from_file:
            error, when = from_file
        elif tail and info["signal"] is None:
            # The traceback was the last thing the rank wrote: its mtime is the time of death, to
            # the nanosecond, where torchrun's summary has whole seconds (and is later).
            try:
                mtime = os.stat(os.path.join(d, "stderr.log")).st_mtime
            except OSError:
                mtime = None
            if mtime is not None and detected - 5 <= mtime <= detected + 1:
                when = mtime
        if not error:
            error = error_line(lines) or (f"killed by {info['signal']}" if info["signal"] else "")
        out.append({
            "node": node, "rank": rank, "local_rank": lr, "host": info["host"] or host,
            "exit_code": info["exit_code"], "signal": info["signal"], "time": when,
            "error": error, "tail": tail, "stopped": False,
        })
    # When one worker fails, torchrun stops the node's other workers with SIGTERM: those are
    # victims (not SIGKILL: the kernel's OOM killer ends a rank that way). A victim's summary time
    # is the whole second of detection and can read earlier than the real failure's precise one.
    own = [r for r in out if r["signal"] not in _STOP_SIGNALS]
    if own:
        for r in out:
            if r["signal"] in _STOP_SIGNALS:
                r["stopped"] = True
    if not out:
        # torchrun failed before or without a worker failure (rendezvous, store timeout, a
        # signal that stopped it): the node is what failed.
        tail = [line for line in _tail(os.path.join(log_dir, "torchrun.err"), 40, secrets) if not line.startswith("[rank ")]
        code = rc
        sig = _SIGNALS.get(code - 128) if code > 128 else None
        out.append({
            "node": node, "rank": None, "local_rank": None, "host": host, "exit_code": code, "signal": sig,
            "time": stopped_at if stopped_at is not None else now,
            "error": error_line(tail[-TAIL_LINES:]), "tail": tail[-TAIL_LINES:], "stopped": stopped_at is not None,
        })
    # The scheduler's name for this node (SLURM sets SLURMD_NODENAME in every task): what sbatch's
    # node options take. torchrun's host is the machine's FQDN and may differ from it.
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_name:
        for r in out:
            r["node_name"] = node_name
    return out


# srun relays a task's output in pieces of at most 1024 bytes (SLURM_IO_MAX_MSG_LEN; slurmstepd
# io.c _task_build_message cuts a longer line) and labels each piece: a longer line reaches the
# output file cut in two, and neither half parses. Each record's line stays below that.
LINE_MAX = 1000


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def sign(body: str, key: str) -> str:
    """The line's ``mac``: HMAC-SHA256 of its JSON text without it, under the job's failure key."""
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def record_line(rec: dict, key: str | None = None, secrets: list[str] | None = None) -> str:
    """``TAG {json}`` in at most LINE_MAX bytes: the oldest tail lines go first, then the error's
    end. Every secret_env value is scrubbed from its text first (``secrets``: this environment's),
    and the line is signed with ``key`` (this environment's ``HALO_FAILURE_KEY``; none: unsigned,
    a line no submitter takes as a verdict)."""
    secrets = secret_values() if secrets is None else secrets
    key = os.environ.get(KEY_VAR, "") if key is None else key
    rec = {k: _scrubbed(v, secrets) for k, v in rec.items() if k != "mac"}
    rec["tail"] = list(rec.get("tail") or [])
    while True:
        body = json.dumps(rec, separators=(',', ':'))  # ASCII: bytes == characters
        if key:
            body = f'{body[:-1]},"mac":"{sign(body, key)}"}}'
        text = f"{TAG} {body}\n"
        if len(text) <= LINE_MAX:
            return text
        if rec["tail"]:
            rec["tail"].pop(0)
        elif rec.get("error"):
            rec["error"] = rec["error"][:len(rec["error"]) // 2]
        else:
            return text  # not reached: the other fields are short


def main(argv: list[str]) -> int:
    node, nproc, log_dir, rc = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # EPOCHREALTIME uses the locale's decimal point.
    stopped_at = float(argv[4].replace(",", ".")) if len(argv) > 4 and argv[4] else None
    for rec in collect(node, nproc, log_dir, rc, stopped_at):
        sys.stderr.write(record_line(rec))
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_COLLECT_EOF
  cat > "$halo_pkg/hang_monitor.py" << 'HALO_MONITOR_EOF'
"""The hang monitor: runs on each node beside torchrun, ends the job when its ranks stop progressing.

Started by the entry script (``entry_hang.sh.j2``) right after torchrun, under the Python torchrun
runs under; standard library only (halo-sched need not be installed on the node). It polls once a
second and reads nothing but ``stat`` of a few files while the ranks are healthy.

When is a node hung? Every live rank of the node (torchrun's children that carry ``RANK``) is
stalled at once:

* a rank that reports progress (``$HALO_PROGRESS_DIR/rank-R`` exists, see ``progress.py``) is
  stalled after ``timeout_s`` without a report;
* a rank that has not reported yet (still importing, loading, before its first step, or a trainer
  without the protocol) is stalled after ``first_step_s`` with no new output on its stdout/stderr
  (torchrun's ``--tee`` files), counted from when the monitor first saw it.

In a synchronous job one stuck rank stops every rank within a step, so every node's monitor
fires within about a poll and a step of the others. Then, on each node:

1. every rank that registered ``faulthandler`` on ``HALO_STACK_SIGNAL`` (the helper in
   ``progress.py`` does) dumps its stack without ending (SigCgt in ``/proc/PID/status`` says who);
2. the monitor waits ``SETTLE_S`` so that the other nodes' monitors take theirs before anything
   here ends (ending a rank makes its peers fail in their collective, losing their stacks);
3. the ranks whose stack is still unknown are stopped (``SIGSTOP``), and ``STOP_SYNC_S`` later, when
   every node of the stall has stopped its own, get ``SIGABRT`` and ``SIGCONT``: with
   ``PYTHONFAULTHANDLER`` (set by the entry script) Python prints every thread's stack to the rank's
   stderr as it dies. A stopped rank cannot see its peers on other nodes die, so no node's aborts
   break another node's ranks before their dumps;
4. one ``halo-sched-failure`` line of kind ``HUNG`` per local rank goes to the node's output (step,
   last progress, top of stack, the collective it waits in, or why its stack could not be read),
   every stack to ``DIR/hang-stacks.txt`` and the node's output;
5. the monitor stays until ``LINGER_S`` after the aborts, so that this node's end (which ends the
   whole job: srun's ``--kill-on-bad-exit``) cannot kill another node's monitor mid-report; then
   torchrun gets SIGTERM (SIGKILL 10 s later): the node exits non-zero and the scheduler ends the job.

Which rank is the culprit is decided where all nodes' lines meet (``failures.FailureReport``).
"""
from __future__ import annotations

import glob
import linecache
import os
import re
import signal
import socket
import sys
import time

from .failure_collector import record_line, scrub, secret_values  # on the node: a package of the two files (entry_hang.sh.j2)

POLL_S = 1.0
SETTLE_S = 10.0
#: From stopping the ranks to aborting them: longer than any node's lag behind the others (its
#: poll of the settle wait, a loaded node's scheduling).
STOP_SYNC_S = 2.0
ABORT_WAIT_S = 5.0
#: After the aborted ranks are gone: how long their dumps may take to reach their log files.
FLUSH_WAIT_S = 5.0
#: After the aborts, how long every node stays: another node's monitor may still be reading its
#: dumps (FLUSH_WAIT_S at most) when this node's end makes srun end the step.
LINGER_S = FLUSH_WAIT_S + 1.0
STACK_WAIT_S = 3.0

#: Functions of torch.distributed in which a rank waits for its peers.
COLLECTIVES = frozenset("""
all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier
monitored_barrier broadcast broadcast_object_list gather gather_object reduce reduce_scatter
reduce_scatter_tensor scatter scatter_object_list send recv isend irecv batch_isend_irecv wait
_all_gather_base _reduce_scatter_base all_reduce_coalesced
""".split())
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+|^Stack \(most recent call first\)")
#: A frame of a Python traceback (most recent call last), as a rank that ended with an exception prints it.
_TB_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep and k in (b"RANK", b"LOCAL_RANK"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _handles(pid: int, signum: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


#: A report file this large or smaller is read whole (progress.py's ring is one 4 KiB page);
#: a larger one holds appended lines, and only its tail is read.
_WHOLE_BYTES = 8192


def read_reports(path: str, n: int = 1) -> list[tuple[int, float]]:
    """A rank's last ``n`` progress reports, ``(step, unix_time)``, oldest first: every line of
    its file that reads as a step and a time (progress.py's ring of lines rewritten in place, or
    lines a trainer appended), ordered by time. A line being rewritten as it is read, or a slot
    not written yet, reads as nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(0 if size <= _WHOLE_BYTES else size - 64 * (n + 2))
            lines = f.read().split(b"\n")
    except OSError:
        return []
    if size > _WHOLE_BYTES:
        lines = lines[1:]  # the first may be cut
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            out.append((int(parts[0]), float(parts[1])))
        except ValueError:
            continue
    out.sort(key=lambda r: (r[1], r[0]))
    return out[-n:]


def last_report(path: str) -> tuple[int, float] | None:
    """A rank's last progress report, ``(step, unix_time)``; None before its first."""
    got = read_reports(path)
    return got[-1] if got else None


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """The threads of the last faulthandler dump in ``text``: each a list of (file, line,
    function), most recent call first. Lines may carry torchrun's ``[rank N] `` prefix."""
    threads: list[list[tuple[str, int, str]]] = []
    cur = None
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if "Fatal Python error" in line:
            threads, cur = [], None  # a later dump replaces an earlier one
            continue
        if _THREAD.match(line.strip()):
            cur = []
            threads.append(cur)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur.append((m["file"], int(m["line"]), m["func"]))
        elif cur is not None and cur and not line.strip():
            cur = None
    return [t for t in threads if t]


def parse_traceback(text: str) -> list[tuple[str, int, str]]:
    """The frames of the last Python traceback in ``text``, most recent call first (as a dump's):
    where a rank was when it ended with an exception, e.g. a peer's end breaking the collective
    it waited in. Empty when there is none."""
    frames: list[tuple[str, int, str]] = []
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if line.startswith("Traceback (most recent call last):"):
            frames = []
            continue
        m = _TB_FRAME.match(line)
        if m:
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames[::-1]


def main_thread(threads: list[list[tuple[str, int, str]]]) -> list[tuple[str, int, str]]:
    """The main thread: the one whose outermost frame is a module's top level."""
    for t in threads:
        if t and t[-1][2] == "<module>":
            return t
    return threads[-1] if threads else []


def _library(path: str) -> bool:
    return ("site-packages" in path or "dist-packages" in path or "/lib/python" in path
            or path.startswith("<"))


def classify(frames: list[tuple[str, int, str]], cwd: str | None = None) -> dict:
    """Where a rank is: ``waiting_in`` (a collective, or None), the top user frame and its code."""
    waiting = None
    for path, _, func in frames:
        if "torch/distributed/" in path.replace("\\", "/") and func in COLLECTIVES:
            waiting = func
            break
        if "torch/autograd/" in path and func in ("backward", "_engine_run_backward"):
            waiting = "backward"
            break
    user = next((f for f in frames if not _library(f[0])), frames[0] if frames else None)
    where = code = ""
    if user:
        path, line, func = user
        where = f"{os.path.basename(path)}:{line}"
        full = path if os.path.isabs(path) or not cwd else os.path.join(cwd, path)
        code = linecache.getline(full, line).split("  #", 1)[0].strip()[:80]
        if not code:
            code = func
    return {"waiting_in": waiting, "where": where, "code": code}


#: How often the progress files are copied into the mirror directory (``Mirror``).
MIRROR_S = 5.0
#: The most bytes of a long file read per copy (a history grows about 640 bytes in ``MIRROR_S``).
MIRROR_CHUNK = 65536
_MIRRORED = re.compile(r"rank-\d+(?:\.history)?")


class Mirror:
    """Copies a node's progress files (each rank's ring ``rank-R`` and its ``rank-R.history``)
    into a directory the submitter can read, as ``DST/node-K/progress/``: the layout of a local
    job's log root, so that ``stragglers.read`` and ``timeline.progress_files`` read it as they
    read that. SLURM keeps the node's own progress directory in a temporary directory on the
    node; the mirror goes beside the job's output file (docs/failures.md, "Stragglers").

    Bounded, every ``MIRROR_S`` seconds at most: a file of ``_WHOLE_BYTES`` or less (the ring, one
    page; a history's first minutes) is copied whole when its bytes changed, by a write to a
    temporary name and a rename (a reader sees the old copy or the new, never half of one); of a
    longer ``rank-R`` (lines a trainer appends, one a step) its last ``_WHOLE_BYTES`` of whole lines
    the same way (the stragglers' window); of a longer history only the newest whole line is
    appended at each copy, reading ``MIRROR_CHUNK`` bytes at most, so the copy grows a line every
    ``MIRROR_S`` (about 23 KB an hour), not the node's two a second; a trainer's own long
    ``rank-R`` without a history gets such a history too. A copy that cannot be written is said
    once on stderr and tried again later: the mirror never ends or slows the job."""

    def __init__(self, src: str, dst: str, node: int):
        self.src, self.node = src, node
        self.dst = os.path.join(dst, f"node-{node}", "progress")
        # copy's name -> (its source's inode, source bytes taken, the bytes of a whole copy or None)
        self.sent: dict[str, tuple[int, int, bytes | None]] = {}
        self.next = 0.0
        self.said = False

    def maybe(self, now: float) -> None:
        if now >= self.next:
            self.next = now + MIRROR_S
            self.copy()

    def copy(self) -> None:
        """Copy what changed since the last copy."""
        try:
            names = sorted(n for n in os.listdir(self.src) if _MIRRORED.fullmatch(n))
        except OSError:
            return  # no rank has reported yet
        try:
            if names:
                os.makedirs(self.dst, exist_ok=True)
            for name in names:
                self._one(name, names)
        except OSError as e:
            if not self.said:
                self.said = True
                sys.stderr.write(f"halo-sched: node {self.node}: cannot copy the ranks' progress into {self.dst} "
                                 f"({e.strerror or e}); `halo-sched status` and `timeline` will not show it; "
                                 "the job goes on\n")
                sys.stderr.flush()

    def _one(self, name: str, names: list[str]) -> None:
        try:
            f = open(os.path.join(self.src, name), "rb")
        except OSError:
            return  # gone meanwhile (a restarting rank)
        with f:
            st = os.fstat(f.fileno())
            if st.st_size <= _WHOLE_BYTES or not name.endswith(".history"):
                f.seek(max(0, st.st_size - _WHOLE_BYTES))
                data = f.read(_WHOLE_BYTES)
                if st.st_size > _WHOLE_BYTES:
                    data = data[data.find(b"\n") + 1:]  # the first line may be cut
                data = data[:data.rfind(b"\n") + 1]  # whole lines only (a slot not written yet is nothing)
                if self.sent.get(name, (None, 0, None))[::2] != (st.st_ino, data):
                    self._replace(name, data)
                self.sent[name] = (st.st_ino, st.st_size if st.st_size > _WHOLE_BYTES else len(data), data)
                if st.st_size <= _WHOLE_BYTES or name + ".history" in names:
                    return
                name += ".history"  # a trainer's own lines, one a step: a history of them as well
            self._thin(f, st, name)

    def _thin(self, f, st: os.stat_result, name: str) -> None:
        """Append the newest whole line of ``f`` past what was taken (its first one too when the
        copy starts afresh: a new file, or one that was started again)."""
        ino, done, _ = self.sent.get(name, (-1, 0, None))
        fresh = ino != st.st_ino or st.st_size < done
        if fresh:
            done = 0
        if st.st_size - done > MIRROR_CHUNK:  # far behind: the newest lines are what matters
            head = b""
            if fresh:
                f.seek(0)
                head = f.read(256).split(b"\n", 1)[0] + b"\n"
            done = st.st_size - MIRROR_CHUNK
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            data = data[data.find(b"\n") + 1:]
            done += MIRROR_CHUNK - len(data)
        else:
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            head = b""
        cut = data.rfind(b"\n") + 1
        lines = data[:cut].splitlines(keepends=True)
        keep = (lines[:1] if fresh and not head else [head] if head else []) + lines[-1:]
        keep = list(dict.fromkeys(keep))
        if fresh:
            self._replace(name, b"".join(keep))
        elif keep:
            with open(os.path.join(self.dst, name), "ab") as out:
                out.write(b"".join(keep))
        self.sent[name] = (st.st_ino, done + cut, None)

    def _replace(self, name: str, data: bytes) -> None:
        tmp = os.path.join(self.dst, f".{name}.{os.getpid()}.tmp")  # never read as a rank's file
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, os.path.join(self.dst, name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


class Monitor:
    def __init__(self, node: int, torchrun: int, progress_dir: str, log_dir: str, nproc: int,
                 timeout_s: float, first_step_s: float, stack_signal: int, host: str | None = None,
                 mirror: str | None = None, key: str = ""):
        self.node, self.torchrun, self.progress_dir, self.log_dir = node, torchrun, progress_dir, log_dir
        self.mirror = Mirror(progress_dir, mirror, node) if mirror else None
        self.nproc, self.timeout_s, self.first_step_s = nproc, timeout_s, first_step_s
        self.stack_signal, self.host = stack_signal, host or socket.gethostname()
        self.ranks: dict[int, dict] = {}  # pid -> {rank, local_rank, seen, out, cwd}
        self.key = key  # the job's failure key, which signs this node's HUNG lines

    # ---- watching -------------------------------------------------------------------------
    def _discover(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.ranks:
                continue
            s = _stat(int(entry))
            if not s or int(s[1]) != self.torchrun:
                continue
            env = _environ(int(entry))
            if "RANK" not in env:
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = None
            self.ranks[int(entry)] = {"rank": int(env["RANK"]), "local_rank": int(env.get("LOCAL_RANK", -1)),
                                      "seen": time.time(), "out": [], "cwd": cwd}

    def _outputs(self, info: dict) -> list[str]:
        if not info["out"]:
            info["out"] = sorted(glob.glob(os.path.join(self.log_dir, "*", "attempt_*", str(info["local_rank"]),
                                                        "std*.log")))
        return info["out"]

    def activity(self, info: dict) -> tuple[float, float, bool]:
        """(last activity, its limit, reports progress)."""
        last = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}"))
        if last is not None:  # the time the rank wrote: a ring rewritten in memory leaves no mtime
            return last[1], self.timeout_s, True
        times = [info["seen"]] + [m for m in map(_mtime, self._outputs(info)) if m is not None]
        return max(times), self.first_step_s, False

    def live(self) -> dict[int, dict]:
        return {pid: i for pid, i in self.ranks.items() if _alive(pid)}

    def hung(self, now: float) -> bool:
        live = self.live()
        if not live:
            return False
        return all(now - last >= limit for last, limit, _ in (self.activity(i) for i in live.values()))

    def watch(self) -> bool:
        """Poll until the node hangs (True) or torchrun ends (False)."""
        while _alive(self.torchrun):
            if len(self.live()) < self.nproc:
                self._discover()
            if self.hung(time.time()):
                return True
            if self.mirror is not None:
                self.mirror.maybe(time.monotonic())
            time.sleep(POLL_S)
        return False

    # ---- on a hang --------------------------------------------------------------------------
    def _sleep_while_running(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and _alive(self.torchrun):
            time.sleep(min(0.2, left))  # wakes at the end, not up to 0.2 s after: the nodes act together

    def _wait_until(self, when: float, most: float) -> None:
        """Until the wall-clock time ``when`` (one instant for every node of a stall, as each
        node reckons it from its ranks' last activity), ``most`` seconds at most, while torchrun runs."""
        self._sleep_while_running(min(most, max(0.0, when - time.time())))

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self.progress_dir, f"rank-{rank}.stack")

    def _stderr_text(self, info: dict) -> str:
        for p in self._outputs(info):
            if p.endswith("stderr.log"):
                try:
                    with open(p, "rb") as f:
                        f.seek(0, os.SEEK_END)
                        f.seek(max(0, f.tell() - 65536))
                        return f.read().decode(errors="replace")
                except OSError:
                    return ""
        return ""

    def fire(self) -> bool:
        """Take the stacks, write the report and end torchrun; False when the hang went away."""
        detected = time.time()
        state = {}
        stalled = 0.0  # when the last of this node's ranks went past its limit: the hang's start
        for pid, info in self.live().items():
            last, limit, reports = self.activity(info)
            stalled = max(stalled, last + limit)
            got = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}")) if reports else None
            step = got[0] if got else None
            state[pid] = {"last": last, "reports": reports, "step": step, "threads": None, "how": None, "why": None}
        sys.stderr.write(f"halo-sched: node {self.node}: no rank made progress for {self.timeout_s:g} s; "
                         "taking their stacks\n")
        sys.stderr.flush()
        # 1. Stacks without ending the ranks, where the rank registered faulthandler.
        sizes = {}
        for pid, info in self.live().items():
            if self.stack_signal and _handles(pid, self.stack_signal):
                sizes[pid] = os.path.getsize(self._stack_file(info["rank"])) if os.path.exists(
                    self._stack_file(info["rank"])) else 0
                try:
                    os.kill(pid, self.stack_signal)
                except OSError:
                    sizes.pop(pid)
        end = time.monotonic() + STACK_WAIT_S
        while sizes and time.monotonic() < end:
            time.sleep(0.2)
            for pid in list(sizes):
                path = self._stack_file(self.ranks[pid]["rank"])
                try:
                    with open(path, errors="replace") as f:
                        f.seek(sizes[pid])
                        text = f.read()
                except OSError:
                    continue
                threads = parse_stacks(text)
                # Complete once the main thread's outermost frame (<module>) is in.
                if threads and any(t[-1][2] == "<module>" for t in threads):
                    state[pid]["threads"], state[pid]["how"] = threads, f"signal {self.stack_signal} (SIGRTMIN+{self.stack_signal - signal.SIGRTMIN}), rank kept running"
                    del sizes[pid]
        # 2. Let the other nodes' monitors take theirs before anything here ends. A hang must
        # last through this: a rank that progressed meanwhile, or torchrun's end, calls it off.
        # torchrun ending meanwhile does not call it off: every rank here had stalled, so another
        # node's monitor ended its ranks and this node's collectives broke; what this node saw is
        # still its part of the report (its ranks' last tracebacks say where they waited).
        # Until SETTLE_S after the stall began (the same on every node of it), not after this
        # node's poll saw it: the nodes then abort together (docs/failures.md, "Hangs").
        self._wait_until(stalled + SETTLE_S, SETTLE_S)
        if any(self.activity(self.ranks[pid])[0] > st["last"] for pid, st in state.items() if _alive(pid)):
            sys.stderr.write(f"halo-sched: node {self.node}: progress again within "
                             f"{SETTLE_S:g} s: not a hang\n")
            sys.stderr.flush()
            return False
        # 3. The rest: SIGABRT, which PYTHONFAULTHANDLER turns into a dump on the rank's stderr.
        # Each node's wake can lag the others' by its poll and its load, and a rank whose peer died
        # first leaves its collective at once (a CI run: node 0's aborts came 0.1 s before node
        # 1's, and rank 3 was dumped inside torch's excepthook, its traceback held in a StringIO).
        # So: stop them, wait until every node has stopped its own, then abort. A stopped rank
        # cannot see its peers' sockets close; the SIGABRT sent while it is stopped is pending and
        # is taken as it resumes, before a broken collective can unwind to Python.
        abort_at = stalled + SETTLE_S + STOP_SYNC_S
        aborted, stopped = [], []
        try:
            for pid in state:
                if state[pid]["threads"] is None and _alive(pid):
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
                    except OSError:
                        pass
            if stopped:
                self._wait_until(abort_at, STOP_SYNC_S)
            for pid in state:
                if state[pid]["threads"] is None:
                    if not _alive(pid):
                        # Ended before this node's turn (a peer's end broke its collective): where it
                        # was is in the traceback it printed as it ended, if it printed one.
                        frames = parse_traceback(self._stderr_text(self.ranks[pid]))
                        if frames:
                            state[pid]["threads"], state[pid]["how"] = [frames], "its traceback as it ended"
                        else:
                            state[pid]["why"] = "the rank had already ended"
                        continue
                    try:
                        os.kill(pid, signal.SIGABRT)
                        aborted.append(pid)
                    except OSError as e:
                        state[pid]["why"] = f"SIGABRT failed: {e.strerror}"
        finally:
            for pid in stopped:  # never leave a rank stopped
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        end = time.monotonic() + ABORT_WAIT_S
        while any(_alive(p) for p in aborted) and time.monotonic() < end:
            time.sleep(0.2)
        # torchrun's tee thread copies the dump into the rank's log file after the rank is gone:
        # look again until every dump is in or FLUSH_WAIT_S passes (on a loaded node this takes
        # seconds, not the 0.3 s it takes on an idle one).
        got: dict[int, list] = {}
        end = time.monotonic() + FLUSH_WAIT_S
        while True:
            for pid in aborted:
                if pid not in got:
                    threads = parse_stacks(self._stderr_text(self.ranks[pid]))
                    if threads and any(t[-1][2] == "<module>" for t in threads):
                        got[pid] = threads
            if len(got) == len(aborted) or time.monotonic() >= end:
                break
            time.sleep(0.2)
        for pid in aborted:
            threads = got.get(pid) or parse_stacks(self._stderr_text(self.ranks[pid]))
            if threads:
                state[pid]["threads"], state[pid]["how"] = threads, "SIGABRT with PYTHONFAULTHANDLER"
            elif parse_traceback(self._stderr_text(self.ranks[pid])):
                # It ended with an exception before the signal's dump (a peer ended first).
                state[pid]["threads"] = [parse_traceback(self._stderr_text(self.ranks[pid]))]
                state[pid]["how"] = "its traceback as it ended"
            elif _alive(pid):
                state[pid]["why"] = "the rank did not react to SIGABRT (uninterruptible sleep? faulthandler disabled?)"
            else:
                state[pid]["why"] = "no stack on its stderr after SIGABRT (PYTHONFAULTHANDLER unset or disabled?)"
        # 4. The report: one line per rank, every stack kept.
        dump = []
        for pid, st in sorted(state.items(), key=lambda kv: self.ranks[kv[0]]["rank"]):
            info = self.ranks[pid]
            frames = main_thread(st["threads"]) if st["threads"] else []
            where = classify(frames, info["cwd"]) if frames else {"waiting_in": None, "where": "", "code": ""}
            if where["waiting_in"] is None:
                # Another node's monitor ended its ranks first: this rank's collective failed
                # ("Connection closed by peer") and its dump caught it handling that. The traceback
                # it printed says which collective it had been waiting in.
                tb = parse_traceback(self._stderr_text(info))
                was = classify(tb, info["cwd"]) if tb else None
                if was is not None and was["waiting_in"] is not None:
                    where = was
            rec = {
                "kind": "HUNG", "node": self.node, "rank": info["rank"], "local_rank": info["local_rank"],
                "host": self.host, "exit_code": None, "signal": None, "time": detected,
                "step": st["step"], "last_progress": st["last"], "reports": st["reports"],
                "stalled_s": round(detected - st["last"], 1), "stack_read": bool(frames),
                "error": st["why"] or "", **where, "tail": [f"{os.path.basename(f)}:{n} in {fn}" for f, n, fn in frames[:8]],
            }
            sys.stderr.write(record_line(rec, self.key))
            dump.append(f"==== rank {info['rank']} (node {self.node}, host {self.host}, local rank "
                        f"{info['local_rank']}, pid {pid}): "
                        + (f"stack by {st['how']}" if st["threads"] else f"no stack: {st['why']}"))
            for t in st["threads"] or []:
                dump.append("  thread" + (" (main)" if t is frames else "") + ":")
                dump.extend(f"    File \"{f}\", line {n} in {fn}" for f, n, fn in t)
        sys.stderr.flush()
        secrets = secret_values()
        dump = [scrub(line, secrets) for line in dump]
        text = "\n".join(dump) + "\n"
        try:
            with open(os.path.join(os.path.dirname(self.progress_dir), "hang-stacks.txt"), "a") as f:
                f.write(text)
        except OSError:
            pass
        sys.stderr.write("".join(f"halo-sched: node {self.node}: {line}\n" for line in dump))
        sys.stderr.flush()
        # 5. Stay until every node's report is written (this node's end ends the step), then end
        # the node: torchrun stops its ranks and exits non-zero.
        time.sleep(max(0.0, min(abort_at + LINGER_S - time.time(), STOP_SYNC_S + LINGER_S)))
        try:
            os.kill(self.torchrun, signal.SIGTERM)
        except OSError:
            return True
        end = time.monotonic() + 10
        while _alive(self.torchrun) and time.monotonic() < end:
            time.sleep(0.2)
        for pid in [self.torchrun] + list(self.live()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return True


def _read_key() -> str:
    try:
        return (sys.stdin.readline() if sys.stdin is not None else "").strip()
    except (OSError, ValueError):
        return ""


def main(argv: list[str]) -> int:
    """``NODE TORCHRUN_PID PROGRESS_DIR LOG_DIR NPROC TIMEOUT_S FIRST_STEP_S SIGNAL [MIRROR_DIR]``
    (an empty MIRROR_DIR: no mirror); the job's failure key on stdin (its first line), never in
    the environment, where a rank of the same user could read it (/proc/PID/environ)."""
    node, torchrun, progress_dir, log_dir, nproc, timeout_s, first_step_s, sig = argv[:8]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # torchrun ended: nothing to watch
    m = Monitor(int(node), int(torchrun), progress_dir, log_dir, int(nproc), float(timeout_s),
                float(first_step_s), int(sig) if sig.isdigit() else 0, mirror=argv[8] if len(argv) > 8 else None,
                key=_read_key())
    try:
        while m.watch():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the report, bounded by its own waits
            if m.fire():
                break
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    finally:
        if m.mirror is not None:  # the ranks' last reports, as the job ends
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            m.mirror.copy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
HALO_MONITOR_EOF
  halo_py=$(sed -n '1s/^#![[:space:]]*//p' "$(command -v torchrun)")
  case "$halo_py" in *python*) ;; *) halo_py=python3 ;; esac
  # $halo_py unquoted: a shebang such as "/usr/bin/env python3" is two words.
  PYTHONPATH=$halo_log_dir/.monitor $halo_py -m halo_node.hang_monitor "$halo_rank" "$1" "$HALO_PROGRESS_DIR" "$halo_log_dir" \
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
