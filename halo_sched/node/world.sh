# A Nomad node entry's functions with hot spares (nomad.spare_nodes), printed after entry.sh's by
# `python -m halo_sched.node.shell world` (the entry's node runtime call then); left out of the
# SLURM and local copies of the node runtime (node.NOMAD_ONLY). HALO_* names are contract.py's.

# Hot spares on Nomad (nomad.spare_nodes; docs/nomad.md, "Hot spares"). halo_world NODES TIMEOUT_S
# CMD...: this allocation is slot $halo_slot of the trainer's group (NODES slots and the spares).
# The run's keeper (node/nomad_keeper.py) writes each world into a Variable the task renders into
# HALO_WORLD_FILE ("KEY VALUE" lines: attempt, generation, state, master, ranks "SLOT:RANK,...");
# generation 0, slots 0..NODES-1 as their own node ranks with rank 0 on slot 0, is the job's and
# never written. A slot runs CMD (torchrun, halo_run) as node rank halo_rank with rank 0's address
# from HALO_SLOTS_FILE ("halo-index-K ADDR PORT") for the newest world that names it, and watches
# for a newer one meanwhile: then it stops its torchrun and starts again in the new world. After
# CMD failed it waits at most TIMEOUT_S for the keeper's next world; a slot no world names yet (a
# spare) waits until one does; a world that leaves it out, or the world's end (state done), ends it
# with its last exit code.
halo_world_read() {  # NODES: halo_w_gen, halo_w_state, halo_w_master, halo_w_rank (this slot's, or empty)
  local halo_k halo_v halo_attempt= halo_g= halo_s= halo_m= halo_r= halo_pair
  halo_w_gen=0 halo_w_state=running halo_w_master=0 halo_w_rank=
  if [ "$halo_slot" -lt "$1" ]; then halo_w_rank=$halo_slot; fi
  if [ ! -s "${HALO_WORLD_FILE:-}" ]; then return 0; fi
  while read -r halo_k halo_v; do
    case "$halo_k" in
      attempt) halo_attempt=$halo_v ;; generation) halo_g=$halo_v ;; state) halo_s=$halo_v ;;
      master) halo_m=$halo_v ;; ranks) halo_r=$halo_v ;;
    esac
  done < "$HALO_WORLD_FILE"
  # Another attempt's world (the Variable outlives a version of the job), or one not well formed.
  if [ "$halo_attempt" != "${HALO_RESTART_COUNT:-0}" ]; then return 0; fi
  case "$halo_g$halo_m" in '' | *[!0-9]* | ??????????????????*) return 0 ;; esac
  halo_w_gen=$((10#$halo_g)) halo_w_master=$((10#$halo_m)) halo_w_state=${halo_s:-running} halo_w_rank=
  for halo_pair in ${halo_r//,/ }; do
    if [ "${halo_pair%%:*}" = "$halo_slot" ]; then halo_w_rank=${halo_pair#*:}; fi
  done
  case "$halo_w_rank" in *[!0-9]* | ??????????*) halo_w_rank= ;; esac
  return 0
}
halo_world_stop() {  # SIGNAL: Nomad stops the allocation: the running torchrun first
  if [ -n "${halo_world_pid:-}" ]; then
    kill -TERM "$halo_world_pid" 2> /dev/null || true
    wait "$halo_world_pid" 2> /dev/null || true
  fi
  trap - "$1"
  kill -s "$1" $$
}
halo_world() {
  local halo_n=$1 halo_t=$2 halo_gen=-1 halo_rc=0 halo_since halo_pid halo_line
  shift 2
  halo_slot=$halo_rank
  halo_world_pid=
  trap 'halo_world_stop TERM' TERM
  trap 'halo_world_stop INT' INT
  while :; do
    halo_since=$SECONDS
    while :; do
      halo_world_read "$halo_n"
      if [ "$halo_w_state" = done ]; then
        echo "halo-sched: slot $halo_slot: the run's world ended (generation $halo_w_gen)" >&2
        return "$halo_rc"
      fi
      if [ "$halo_w_gen" -gt "$halo_gen" ]; then
        if [ -n "$halo_w_rank" ]; then break; fi
        if [ "$halo_gen" -ge 0 ]; then
          echo "halo-sched: slot $halo_slot: generation $halo_w_gen of the run's world leaves this node out (the run's keeper gave its rank to a spare)" >&2
          return "$halo_rc"
        fi
      fi
      if [ "$halo_gen" -ge 0 ] && [ $((SECONDS - halo_since)) -ge "$halo_t" ]; then
        echo "halo-sched: slot $halo_slot: no new world from the run's keeper within ${halo_t}s after torchrun ended" >&2
        return "$halo_rc"
      fi
      sleep 0.5
    done
    halo_gen=$halo_w_gen
    halo_rank=$halo_w_rank
    halo_since=$SECONDS
    while :; do
      halo_line=$(awk -v t="halo-index-$halo_w_master" '$1 == t && $3 ~ /^[0-9]+$/ { print $2, $3; exit }' "${HALO_SLOTS_FILE:-/dev/null}" 2> /dev/null || true)
      if [ -n "$halo_line" ]; then break; fi
      [ $((SECONDS - halo_since)) -lt "$halo_t" ] ||
        halo_fail "slot $halo_w_master, rank 0 of generation $halo_gen, did not register within rendezvous.timeout_s=${halo_t}s (waited on ${HALO_SLOTS_FILE:-})"
      sleep 0.5
    done
    export HALO_MASTER_ADDR=${halo_line% *} HALO_MASTER_PORT=${halo_line#* }
    "$@" &
    halo_pid=$!
    halo_world_pid=$halo_pid
    while kill -0 "$halo_pid" 2> /dev/null; do
      halo_world_read "$halo_n"
      if [ "$halo_w_gen" -gt "$halo_gen" ] || [ "$halo_w_state" = done ]; then
        echo "halo-sched: node $halo_rank (slot $halo_slot): generation $halo_w_gen of the run's world: its torchrun stopped" >&2
        kill -TERM "$halo_pid" 2> /dev/null || true
        break
      fi
      sleep 0.5
    done
    halo_rc=0
    wait "$halo_pid" || halo_rc=$?
    halo_world_pid=
    if [ "$halo_rc" = 0 ]; then return 0; fi
    echo "halo-sched: node $halo_rank (slot $halo_slot): torchrun ended $halo_rc in generation $halo_gen of the run's world" >&2
  done
}
