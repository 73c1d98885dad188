# The SLURM batch script's job-free functions: the batch script (templates/slurm/sbatch.sh.j2)
# calls them with the job's values as arguments. Printed by `python -m halo_sched.node.shell batch`
# on node 0 (docs/node-runtime.md); halo_fail is the batch script's.

# The submitter's history home (sbatch exports it), where its failure key lies: no step is told (docs/failures.md).
unset HALO_SCHED_HOME

# halo_batch_warning SIGNAL CARRIER: the warning (slurm.signal, `halo-sched cancel --signal`)
# reaches this shell only; it goes on to every node as CARRIER (ignored by default, so only each
# node's entry acts on it), again 1, 2, 4, 8, 16 s later, then every 32 s, for nodes not started
# yet. slurmrestd's `cancel --signal` sends CARRIER to every process, this shell included: a
# warning here too. One that came before this call ($halo_held) is passed on now.
halo_warned=0
halo_trapped=0
halo_forwarder=
halo_batch_warning() {
  halo_warn_signal=$1 halo_carrier=$2
  trap halo_warn "$1" "$2"
  [ -z "${halo_held:-}" ] || halo_warn
}
halo_warn() {
  halo_trapped=1
  [ "$halo_warned" = 0 ] || return 0
  halo_warned=1
  echo "halo-sched: job $SLURM_JOB_ID: SIG$halo_warn_signal at $(date +%H:%M:%S); passing it on to every node" >&2
  halo_forward &
  halo_forwarder=$!
}
halo_forward() {
  local halo_gap=1 halo_nap=
  # Stopped once srun ends: its sleep goes with it (an orphan would hold the job's output open).
  trap '[ -z "$halo_nap" ] || kill "$halo_nap" 2> /dev/null; exit 0' TERM
  while :; do
    scancel --signal="$halo_carrier" "$SLURM_JOB_ID" 2> /dev/null ||
      echo "halo-sched: job $SLURM_JOB_ID: could not pass the warning on to the nodes (scancel --signal=$halo_carrier); trying again in $halo_gap s" >&2
    sleep "$halo_gap" &
    halo_nap=$!
    wait "$halo_nap" || true
    [ "$halo_gap" -ge 32 ] || halo_gap=$((halo_gap * 2))
  done
}

# halo_wait PID: wait for srun (in the background, so that the warning's trap runs at once);
# sets halo_rc to its exit status. wait returns early (>128) when the trap runs, srun still
# running: wait again. Then the forwarder stops.
halo_wait() {
  local halo_interrupted=
  while :; do
    halo_trapped=0
    halo_rc=0
    wait "$1" || halo_rc=$?
    if [ "$halo_trapped" = 1 ] && [ "$halo_rc" -gt 128 ]; then
      halo_interrupted=$halo_rc
      continue
    fi
    # srun ended with the signal's code in the same instant: bash already reported it (127 now).
    if [ "$halo_rc" = 127 ] && [ -n "$halo_interrupted" ]; then halo_rc=$halo_interrupted; fi
    break
  done
  [ -z "$halo_forwarder" ] || kill "$halo_forwarder" 2> /dev/null || true
}

# halo_master_addr INTERFACE: rank 0 is the allocation's first host ($halo_first_node), at the
# address SLURM itself reaches it by (NodeAddr; node names need not resolve), or, with
# network.interface (INTERFACE not empty), its address there: the batch script runs on the first
# node. Without it, gloo binds the address each host's own name resolves to, NCCL the first
# interface up that is not loopback or docker (docs/slurm.md, "Which network the ranks use").
# Sets HALO_MASTER_ADDR, halo_addr_from and halo_node_addrs ("NAME ADDR" lines of every node).
halo_master_addr() {
  halo_first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  [ -n "$halo_first_node" ] || halo_fail "could not expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"
  halo_node_addrs=$(scontrol -o show node "$SLURM_JOB_NODELIST" | sed -n 's/^NodeName=\([^ ]*\) .* NodeAddr=\([^ ]*\) .*/\1 \2/p')
  if [ -n "$1" ]; then
    HALO_MASTER_ADDR=$(halo_iface_addr "$1")
    [ -n "$HALO_MASTER_ADDR" ] || halo_fail "network.interface $1 has no IPv4 address on $halo_first_node"
    halo_addr_from="network.interface $1"
  else
    HALO_MASTER_ADDR=$(halo_node_addr "$halo_first_node")
    [ -n "$HALO_MASTER_ADDR" ] || halo_fail "no NodeAddr for $halo_first_node in 'scontrol show node'"
    halo_addr_from="NodeAddr of $halo_first_node; network.interface unset: gloo binds the address each host's name resolves to"
  fi
  halo_refuse_loopback "$HALO_MASTER_ADDR" "rank 0's address is $HALO_MASTER_ADDR but the nodes are different hosts; set network.interface or fix NodeAddr"
}
halo_iface_addr() {  # INTERFACE: this host's IPv4 address on it
  ip -4 -o addr show dev "$1" 2> /dev/null | awk '{ split($4, a, "/"); print a[1]; exit }'
}
halo_node_addr() {  # NODE: its NodeAddr
  echo "$halo_node_addrs" | awk -v n="$1" '$1 == n { print $2; exit }'
}
# A loopback ADDR (127.*, localhost, ::1) is refused unless every node of the allocation has it.
halo_refuse_loopback() {  # ADDR MESSAGE
  case "$1" in
    127.* | localhost | ::1)
      if echo "$halo_node_addrs" | awk -v a="$1" '$2 != a { bad = 1 } END { exit !bad }'; then
        halo_fail "$2"
      fi
      ;;
  esac
}

# halo_master_port START COUNT [AVOID...]: rendezvous.port unset: the job's own master port,
# START + SLURM_JOB_ID % COUNT, the same on every node and in every run of a requeued job (same
# id), stepping over the ports of the job's servers (AVOID). Two jobs whose node 0 share a host
# get the same port only when their ids differ by a multiple of COUNT.
halo_master_port() {
  local halo_start=$1 halo_count=$2 halo_k
  shift 2
  case "${SLURM_JOB_ID:-}" in
    '' | *[!0-9]* | ???????????*) halo_fail "cannot derive the master port from SLURM_JOB_ID='${SLURM_JOB_ID:-}'; set rendezvous.port" ;;
  esac
  halo_k=$((10#$SLURM_JOB_ID % halo_count))
  while [[ " $* " == *" $((halo_start + halo_k)) "* ]]; do halo_k=$(((halo_k + 1) % halo_count)); done
  HALO_MASTER_PORT=$((halo_start + halo_k))
}

# halo_container_pwd [MOUNTS [DST...]]: pyxis's working directory is the submit directory ($PWD),
# mounted at the same path unless a destination DST of slurm.container_mounts (MOUNTS) covers it;
# sets halo_container_workdir and halo_container_mounts.
halo_container_pwd() {
  local halo_d
  case "$PWD" in
    *,* | *:*) halo_fail "the submit directory $PWD contains ',' or ':', which --container-mounts cannot carry; set slurm.container_workdir" ;;
  esac
  halo_container_workdir=$PWD halo_container_mounts=${1:-}
  shift $(($# > 0))
  for halo_d; do
    case "$PWD/" in "$halo_d"/*) return 0 ;; esac
  done
  halo_container_mounts=$halo_container_mounts${halo_container_mounts:+,}$PWD:$PWD
}

# halo_server_hosts NODES: the allocation's hosts in the order of `scontrol show hostnames`
# ($halo_hosts), NODES of them: the trainer's, then each server role's.
halo_server_hosts() {
  halo_hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
  [ "${#halo_hosts[@]}" -eq "$1" ] || halo_fail "the allocation has ${#halo_hosts[@]} nodes, expected $1 (trainer and servers)"
}
# Rollout servers (servers:). halo_server_addrs ROLE OFFSET NODES INTERFACE VAR: the role's nodes
# (OFFSET.. in the order of `scontrol show hostnames`, $halo_hosts) each at its NodeAddr, or, with
# network.interface, at its own address there (NodeAddr may be another network than the
# fabric's): one short step over them, a labelled line each. Exports VAR="A0,A1,...".
halo_server_addrs() {
  local halo_k halo_a halo_probe= halo_addrs=
  if [ -n "$4" ]; then
    halo_probe=$(srun --nodes="$3" --ntasks="$3" --ntasks-per-node=1 --relative="$2" --label \
      bash -c 'ip -4 -o addr show dev "$1" 2> /dev/null | awk "{ split(\$4, a, \"/\"); print a[1]; exit }"' halo-probe "$4") ||
      halo_fail "could not ask server $1's nodes for their network.interface $4 address (srun)"
  fi
  for ((halo_k = $2; halo_k < $2 + $3; halo_k++)); do
    if [ -n "$4" ]; then
      halo_a=$(echo "$halo_probe" | awk -v k="$((halo_k - $2)):" '$1 == k { print $2; exit }')
      [ -n "$halo_a" ] || halo_fail "network.interface $4 has no IPv4 address on ${halo_hosts[$halo_k]} (server $1)"
    else
      halo_a=$(halo_node_addr "${halo_hosts[$halo_k]}")
      [ -n "$halo_a" ] || halo_fail "no NodeAddr for ${halo_hosts[$halo_k]} (server $1) in 'scontrol show node'"
    fi
    halo_refuse_loopback "$halo_a" "server $1's node ${halo_hosts[$halo_k]} has address $halo_a but the nodes are different hosts; fix NodeAddr"
    halo_addrs="$halo_addrs${halo_addrs:+,}$halo_a"
  done
  printf -v "$5" %s "$halo_addrs"
  export "${5?}"
  echo "halo-sched: server $1 on ${halo_hosts[*]:$2:$3} at $halo_addrs" >&2
}
# halo_server_step ROLE SRUN...: the role's step in the background. A server step that ends while
# the trainer runs ends the trainer step (TERM to $halo_srun): a dead server fails the job as a
# dead rank does. halo_servers_stop, once the trainer ended: stop every server step (never left
# running), after noting one that died first (then the job fails, halo_rc 1 for 0).
halo_server_dir=
halo_server_pids=
halo_server_step() {
  local halo_name=$1
  shift
  [ -n "$halo_server_dir" ] || halo_server_dir=$(mktemp -d "${TMPDIR:-/tmp}/halo-servers.XXXXXX")
  (
    "$@" &
    echo $! > "$halo_server_dir/$halo_name.pid"
    halo_src=0
    wait $! || halo_src=$?
    [ -e "$halo_server_dir/ending" ] && exit 0
    echo "$halo_name $halo_src" > "$halo_server_dir/$halo_name.died"
    echo "halo-sched: server $halo_name ended (exit $halo_src) while the trainer ran; stopping the trainer" >&2
    kill -TERM "$halo_srun" 2> /dev/null || true
  ) &
  halo_server_pids="$halo_server_pids $!"
}
halo_servers_stop() {
  local halo_dead halo_p
  halo_dead=$(cat "$halo_server_dir"/*.died 2> /dev/null | head -n 1)
  touch "$halo_server_dir/ending"
  for halo_p in "$halo_server_dir"/*.pid; do
    [ -e "$halo_p" ] && kill -TERM "$(cat "$halo_p")" 2> /dev/null || true
  done
  wait $halo_server_pids 2> /dev/null || true
  rm -rf "$halo_server_dir"
  if [ -n "$halo_dead" ]; then
    echo "halo-sched: job $SLURM_JOB_ID failed: server ${halo_dead% *} ended (exit ${halo_dead#* }) while the trainer ran" >&2
    [ "$halo_rc" != 0 ] || halo_rc=1
  fi
}

# halo_watch_batch_host SECONDS (--no-kill, more than one node): SLURM takes a lost node out of
# the job, this host too, and the job would then hold its other nodes with no batch script until
# its time limit. A step on another node (--overlap --no-kill: it holds nothing) asks slurmctld
# every SECONDS whether this host is still in the job and cancels it once not; the attempt's
# guardian carries the run on (node/guardian.py, docs/recovery.md). halo_guard_end GUARDIAN: at the
# script's end, the watcher stops and (1) the attempt's pending guardian is cancelled.
halo_watcher=
halo_watch_batch_host() {
  local halo_me=${SLURMD_NODENAME:-}
  [ -n "$halo_me" ] || return 0
  (
    halo_c=
    trap '[ -z "$halo_c" ] || kill -KILL "$halo_c" 2> /dev/null; exit 0' TERM
    halo_first=1
    while :; do
      if [ "$halo_first" = 0 ]; then  # started again: its node was lost, or SLURM did not answer
        sleep "$1" &
        halo_c=$!
        wait "$halo_c" || true
      fi
      halo_first=0
      halo_n=$(squeue -h -j "$SLURM_JOB_ID" -o %N 2> /dev/null) && [ -n "$halo_n" ] || continue
      halo_h=$(scontrol show hostnames "$halo_n" 2> /dev/null) && [ -n "$halo_h" ] || continue
      halo_h=$(printf '%s\n' "$halo_h" | grep -vxF "$halo_me" | head -n 1)
      [ -n "$halo_h" ] || exit 0
      srun --overlap --no-kill --nodes=1 --ntasks=1 --nodelist="$halo_h" --gres=none --kill-on-bad-exit=0 --quiet \
        bash -c 'while sleep "$3"; do
          halo_i=$(scontrol -o show job "$1" 2> /dev/null) || continue
          case " $halo_i " in *" JobState=RUNNING "*) ;; *) exit 0 ;; esac
          halo_n=$(printf "%s\n" "$halo_i" | sed -n "s/.* NodeList=\([^ ]*\).*/\1/p")
          [ -n "$halo_n" ] && [ "$halo_n" != "(null)" ] || continue
          halo_h=$(scontrol show hostnames "$halo_n" 2> /dev/null) && [ -n "$halo_h" ] || continue
          printf "%s\n" "$halo_h" | grep -qxF "$2" && continue
          echo "halo-sched: job $1: its batch host $2 left the allocation (SLURM marked it down; its nodes now $halo_n): cancelling the job, whose guardian carries the run on" >&2
          scancel "$1"
          exit 0
        done' halo-watch "$SLURM_JOB_ID" "$halo_me" "$1" &
      halo_c=$!
      wait "$halo_c" || true
    done
  ) &
  halo_watcher=$!
}
halo_guard_end() {  # GUARDIAN: 1 with retry: (the attempt has one)
  [ -z "$halo_watcher" ] || kill -TERM "$halo_watcher" 2> /dev/null || true
  [ "${1:-0}" != 1 ] || scancel --me --state=PENDING --name="halo-guardian-$SLURM_JOB_ID" 2> /dev/null || true
}

# halo_maint_watch EVERY RANKS USED (spares): node/maintenance.py beside the step (every EVERY s or
# HALO_MAINT_POLL_S); a node of RANKS to leave: the warning to every node. halo_maint_end, after
# the step: the watcher stops; halo_planned: the file of its lines when it warned.
halo_maint=
halo_maint_watch() {
  rm -f "$halo_batch_dir/maint"
  (
    halo_c=
    trap '[ -z "$halo_c" ] || kill "$halo_c" 2> /dev/null; exit 0' TERM
    halo_batch maintenance --job "$SLURM_JOB_ID" --ranks "$2" --used "$3" --every "${HALO_MAINT_POLL_S:-$1}" > "$halo_batch_dir/maint.new" &
    halo_c=$!
    wait "$halo_c" || exit 0
    halo_c=
    mv "$halo_batch_dir/maint.new" "$halo_batch_dir/maint"
    echo "halo-sched: job $SLURM_JOB_ID: to leave for maintenance: $(paste -sd';' "$halo_batch_dir/maint"); warning the trainers (the spare takes over at their checkpoint)" >&2
    halo_forward
  ) &
  halo_maint=$!
}
halo_maint_end() {
  halo_planned=
  [ -n "$halo_maint" ] || return 0
  kill -TERM "$halo_maint" 2> /dev/null || true
  wait "$halo_maint" 2> /dev/null || true
  halo_maint=
  [ ! -s "$halo_batch_dir/maint" ] || halo_planned=$halo_batch_dir/maint
}
