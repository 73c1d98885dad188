# The node entry's job-free functions, called by the entry script (templates/entry.sh.j2) with the
# job's values as arguments, or read from its variables (halo_rank, halo_warned_at, halo_nproc,
# halo_log_dir, halo_log_root, halo_node, halo_started, halo_failure_key). Printed by
# `python -m halo_sched.node.shell` (docs/node-runtime.md); HALO_* names are contract.py's.

# halo_master TIMEOUT_S: rank 0's address and port, given (HALO_MASTER_ADDR/PORT) or published in
# HALO_MASTER_ADDR_FILE (address, port; blank until then: nomadService renders empty, never blocks).
halo_master_published() {
  local halo_published halo_rest
  halo_published=$(head -n 2 "$HALO_MASTER_ADDR_FILE" 2> /dev/null | tr -d ' \t\r' | tr '\n' ' ')
  read -r HALO_MASTER_ADDR HALO_MASTER_PORT halo_rest <<< "$halo_published" || true
  [ -n "$HALO_MASTER_ADDR" ] && [ -n "$HALO_MASTER_PORT" ]
}
halo_master() {
  while [ -n "${HALO_MASTER_ADDR_FILE:-}" ] && ! halo_master_published; do
    [ $((SECONDS - halo_started)) -lt "$1" ] ||
      halo_fail "rank 0 was not published within rendezvous.timeout_s=$1s (waited on $HALO_MASTER_ADDR_FILE); is node 0 placed and running?"
    sleep 1
  done
  [ -n "${HALO_MASTER_ADDR:-}" ] || halo_fail "no master address: the backend set neither HALO_MASTER_ADDR nor HALO_MASTER_ADDR_FILE"
  case "${HALO_MASTER_PORT:-}" in
    '' | *[!0-9]* | ??????*) halo_fail "no master port: the backend gave HALO_MASTER_PORT='${HALO_MASTER_PORT:-}', not a port in 1..65535" ;;
  esac
  HALO_MASTER_PORT=$((10#$HALO_MASTER_PORT))
  [ "$HALO_MASTER_PORT" -ge 1 ] && [ "$HALO_MASTER_PORT" -le 65535 ] || halo_fail "HALO_MASTER_PORT=$HALO_MASTER_PORT is not a port in 1..65535"
}

# Rollout servers. halo_server_urls TIMEOUT_S ROLE NODES PORT HEALTH_PATH ADDRS_VAR FILE_VAR URLS_VAR:
# the role's addresses from ADDRS_VAR ("A0,A1") or FILE_VAR (lines "halo-index-K ADDR", INDEX_TAG),
# exported as URLS_VAR; halo_servers_healthy TIMEOUT_S: each answers its health path with 200.
halo_health=()
halo_server_look() {  # ROLE NODES FILE
  local halo_k halo_a
  halo_addrs= halo_missing=
  for ((halo_k = 0; halo_k < $2; halo_k++)); do
    halo_a=$(awk -v t="halo-index-$halo_k" '$1 == t && $2 != "" { print $2; exit }' "$3" 2> /dev/null)
    [ -n "$halo_a" ] || halo_missing="$halo_missing $1[$halo_k]"
    halo_addrs="$halo_addrs${halo_addrs:+,}$halo_a"
  done
  [ -z "$halo_missing" ]
}
halo_server_urls() {
  local halo_file="${!7:-}" halo_addrs halo_missing= halo_n halo_k=0 halo_a halo_urls=
  halo_addrs=${!6:-}
  while [ -n "$halo_file" ] && ! halo_server_look "$2" "$3" "$halo_file"; do
    [ $((SECONDS - halo_started)) -lt "$1" ] ||
      halo_fail "server(s)$halo_missing not registered within rendezvous.timeout_s=$1s (waited on $halo_file); are they placed and running?"
    sleep 1
  done
  halo_n=$(echo "$halo_addrs" | awk -F, '{ print NF }')
  [ "$halo_n" = "$3" ] || halo_fail "the backend gave $halo_n address(es) for server role $2 ('$halo_addrs'), expected $3"
  for halo_a in ${halo_addrs//,/ }; do
    case "$halo_a" in *:*) halo_a="[$halo_a]" ;; esac
    halo_urls="$halo_urls${halo_urls:+,}http://$halo_a:$4"
    halo_health+=("$2[$halo_k]" "http://$halo_a:$4$5")
    halo_k=$((halo_k + 1))
  done
  printf -v "$8" %s "$halo_urls"
  export "${8?}"
  echo "halo-sched: node $halo_rank: server $2: $halo_urls" >&2
}
halo_servers_healthy() {
  local halo_left=$(($1 - (SECONDS - halo_started)))
  [ "$halo_left" -gt 0 ] || halo_left=1
  "${halo_node[@]}" server_health "$halo_left" "${halo_health[@]}" < /dev/null ||
    halo_fail "not every rollout server answered its health path within rendezvous.timeout_s=$1s (see above); not starting the trainer"
  halo_health=()
}

# halo_hang TIMEOUT_S FIRST_STEP_S [nccl]: the hang monitor beside torchrun (hang_monitor.py;
# docs/failures.md, "Hangs"); nccl: also NCCL's flight recorder (TORCH_FR_* set wins).
halo_hang_timeout=
halo_monitor=
halo_hang() {
  halo_hang_timeout=$1 halo_hang_first=$2
  export HALO_PROGRESS_DIR=$halo_log_dir/progress
  mkdir -p "$HALO_PROGRESS_DIR"
  export HALO_STACK_SIGNAL=$(kill -l RTMIN+5)
  export PYTHONFAULTHANDLER=${PYTHONFAULTHANDLER:-1}
  [ "${3:-}" = nccl ] || return 0
  if [ -z "${TORCH_FR_BUFFER_SIZE:-}${TORCH_FR_DUMP_TEMP_FILE:-}" ]; then
    export TORCH_NCCL_TRACE_BUFFER_SIZE=${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}
    export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$halo_log_dir/nccl_trace_rank_}
  fi
  export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
}
halo_hang_start() {  # TORCHRUN_PID
  [ -n "$halo_hang_timeout" ] || return 0
  "${halo_node[@]}" hang_monitor "$halo_rank" "$1" "$HALO_PROGRESS_DIR" "$halo_log_dir" \
    "$halo_nproc" "$halo_hang_timeout" "$halo_hang_first" "$HALO_STACK_SIGNAL" \
    "${HALO_PROGRESS_MIRROR:-}" <<< "$halo_failure_key" &  # the key on stdin: not in its environment
  halo_monitor=$!
}
# After torchrun: a monitor that fired finishes its report; one that did not ends at once.
halo_hang_stop() {
  [ -n "$halo_monitor" ] || return 0
  kill -TERM "$halo_monitor" 2> /dev/null || true
  wait "$halo_monitor" 2> /dev/null || wait "$halo_monitor" 2> /dev/null || true
  halo_monitor=
}

# The warning: $halo_signal is ignored in the entry, setup, torchrun and (inherited) the ranks; it
# reaches the entry as its carrier (URG, ignored by default), and halo_deliver hands $halo_signal to
# each rank once that rank handles it (SigCgt). Why: docs/node-runtime.md, "The warning".
# Until the runtime is loaded the entry's own trap notes the carrier's time (halo_warned_at); then
# halo_warning_trap SIGNAL CARRIER hands the carrier to halo_warning, which says the warning once
# and, once torchrun runs, hands it on (halo_run does for one that came before).
halo_torchrun=
halo_deliverer=
halo_warning_trap() {
  halo_signal=$1
  trap halo_warning "$2"
  [ -z "$halo_warned_at" ] || halo_warning_said " (during setup, $((SECONDS - halo_warned_at)) s ago)"
}
halo_warning() {
  halo_trapped=1
  [ -z "$halo_warned_at" ] || return 0
  halo_warned_at=$SECONDS
  halo_warning_said ""
  [ -z "$halo_torchrun" ] || halo_deliver
}
halo_warning_said() {
  echo "halo-sched: node $halo_rank: warning at $(date +%H:%M:%S)$1; SIG$halo_signal goes to each rank once it handles it" >&2
}
# halo_deliver runs in the background from the warning until torchrun ends (torchrun may start ranks again).
halo_deliver() {
  (
    set +e
    halo_bit=$(($(kill -l "$halo_signal") - 1))
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
        # Its rank is read before the signal: a rank that saves and exits at once has no environ after.
        halo_who=$(tr '\0' '\n' 2> /dev/null < "/proc/$halo_p/environ" | sed -n 's/^RANK=\([0-9]*\)$/\1/p')
        kill -s "$halo_signal" "$halo_p" 2> /dev/null || continue
        halo_done+="$halo_p "
        halo_sent+="$halo_p:${halo_who:-?} "
      done
      for halo_p in $halo_sent; do
        echo "halo-sched: node $halo_rank: SIG$halo_signal to rank ${halo_p#*:} (pid ${halo_p%%:*}), $((SECONDS - halo_warned_at)) s after the warning" >&2
      done
      sleep 0.2
    done
    [ "$halo_done" != ' ' ] ||
      echo "halo-sched: node $halo_rank: no rank handled SIG$halo_signal before torchrun ended; the warning reached no trainer (install a handler for \$HALO_WARNING_SIGNAL)" >&2
  ) &
  halo_deliverer=$!
}
# The sweep: torchrun's workers run in sessions of their own and would outlive a killed torchrun;
# only torchrun gets $halo_node_tag in its environment, which marks all it started (docs/node-runtime.md).
# Live processes with the tag (a zombie's environ reads empty).
halo_tagged() {
  grep -lzxF "HALO_NODE_TAG=$halo_node_tag" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3
}
# After torchrun exits: TERM what it left once, KILL after 5 s until nothing is left; give up on
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
# The cgroup's OOM kills before torchrun (failure_collector.oom_kills: a SIGKILL after is the job's).
halo_oom_kills() {
  local halo_f halo_cg
  halo_cg=$(sed -n 's/^0:://p' /proc/self/cgroup 2> /dev/null)
  halo_f=/sys/fs/cgroup$halo_cg/memory.events
  [ -n "$halo_cg" ] && [ -r "$halo_f" ] ||
    halo_f=/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}://p' /proc/self/cgroup 2> /dev/null)/memory.oom_control
  sed -n 's/^oom_kill \([0-9]*\)$/\1/p' "$halo_f" 2> /dev/null | head -n 1 || true
}
# halo_run TORCHRUN ARGS: torchrun with the tag, the hang monitor and the deliverer; then the sweep
# and, when it failed, the failure collector's "halo-sched-failure {json}" lines (docs/failures.md).
halo_run() {
  local halo_pid halo_tee halo_rc halo_stop halo_oom_before
  export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank ${rank}] '
  halo_node_tag=node$halo_rank-$$-$(date +%s%N)-$RANDOM
  halo_trapped=0
  halo_stopped_at=
  halo_oom_before=$(halo_oom_kills)
  # torchrun's stderr also to a file: its failure summary has each failed rank's exit code.
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
  trap 'halo_trapped=1; halo_stopped_at=${EPOCHREALTIME:-$(date +%s)}; [ -n "${HALO_SLURM_STEP_ID:-}${HALO_LOCAL_JOB:-}" ] || kill -TERM "$halo_pid" 2> /dev/null || true' TERM INT
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
  # A stop request from here on waits for the sweep, then ends the shell (no failure report).
  halo_stop=
  trap 'halo_stop=TERM' TERM
  trap 'halo_stop=INT' INT
  halo_sweep
  trap - TERM INT
  [ -z "$halo_stop" ] || kill -s "$halo_stop" $$
  exec 3>&-
  wait "$halo_tee" 2> /dev/null || true
  if [ "$halo_rc" != 0 ]; then
    # The failure key in the collector's environment alone: only the lines it signs are trusted.
    HALO_FAILURE_KEY=$halo_failure_key "${halo_node[@]}" failure_collector "$halo_rank" "$halo_nproc" "$halo_log_dir" "$halo_rc" "$halo_stopped_at" "$halo_oom_before" < /dev/null ||
      echo "halo-sched-failure {\"node\":$halo_rank,\"rank\":null,\"host\":\"$(hostname)\",\"exit_code\":$halo_rc,\"time\":$(date +%s),\"error\":\"torchrun exited with $halo_rc\"}" >&2
  fi
  [ -n "${HALO_LOG_DIR:-}" ] || rm -rf "$halo_log_root"
  return "$halo_rc"
}
