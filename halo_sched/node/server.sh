# A rollout server's job-free functions, pure bash (its image need not have python): the server
# entry (templates/server.sh.j2) evaluates this text and calls them (docs/node-runtime.md).

halo_fail() { echo "halo-sched: server ${halo_server_name:-?}[${HALO_SERVER_INDEX:-?}]: $*" >&2; exit 1; }

# halo_server_start NAME NODES PORT [GROUP_PORT]: HALO_SERVER_INDEX in 0..NODES-1 (few digits: no
# arithmetic on it fails), exported in decimal with the role's name and ports.
halo_server_start() {
  unset HALO_SERVER_SHELL
  halo_server_name=$1 halo_server_port=$3
  case "${HALO_SERVER_INDEX:-}" in
    '' | *[!0-9]* | ?????????*) halo_fail "HALO_SERVER_INDEX must be a server index in 0..$(($2 - 1)), got '${HALO_SERVER_INDEX:-}'" ;;
  esac
  [ "$((10#$HALO_SERVER_INDEX))" -lt "$2" ] || halo_fail "HALO_SERVER_INDEX=$HALO_SERVER_INDEX is outside 0..$(($2 - 1))"
  export HALO_SERVER_INDEX=$((10#$HALO_SERVER_INDEX))
  export HALO_SERVER_NAME="$1" HALO_SERVER_PORT="$3"
  if [ -n "${4:-}" ]; then export HALO_SERVER_GROUP_PORT="$4"; fi
}

# halo_server_run TIMEOUT COMMAND...: rank 0's address (given, or a file waited on for TIMEOUT s),
# then the command, verbatim.
halo_server_run() {
  local halo_timeout=$1
  shift
  halo_started=$SECONDS
  if [ -n "${HALO_TRAINER_MASTER_ADDR_FILE:-}" ]; then
    while :; do
      HALO_TRAINER_MASTER_ADDR=$(head -n 1 "$HALO_TRAINER_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')
      [ -z "$HALO_TRAINER_MASTER_ADDR" ] || break
      if [ $((SECONDS - halo_started)) -ge "$halo_timeout" ]; then
        halo_fail "the trainer's rank 0 was not published within rendezvous.timeout_s=${halo_timeout}s (waited on $HALO_TRAINER_MASTER_ADDR_FILE); is the trainer's node rank 0 placed and running?"
      fi
      sleep 1
    done
  fi
  [ -n "${HALO_TRAINER_MASTER_ADDR:-}" ] || halo_fail "no trainer address: the backend set neither HALO_TRAINER_MASTER_ADDR nor HALO_TRAINER_MASTER_ADDR_FILE"
  export HALO_TRAINER_MASTER_ADDR
  echo "halo-sched: server $halo_server_name[$HALO_SERVER_INDEX] on $(hostname) (${HALO_SERVER_ADDR:-?}:$halo_server_port); trainer rank 0 at $HALO_TRAINER_MASTER_ADDR" >&2

  if [ -z "${HALO_TRAINER_MASTER_ADDR_FILE:-}" ]; then
    # SLURM and local: the batch script or supervisor stops it when the trainer ends.
    exec "$@"
  fi
  # Nomad: stop the server and exit 0 once rank 0's registration is gone for 3 looks in a row
  # (Nomad ends no group when the trainer's end). TERM is passed on: Nomad signals this shell alone.
  "$@" &
  halo_pid=$!
  trap 'kill -TERM "$halo_pid" 2> /dev/null || true' TERM INT
  local halo_gone=0 halo_rc=0
  while kill -0 "$halo_pid" 2> /dev/null; do
    if [ -z "$(head -n 1 "$HALO_TRAINER_MASTER_ADDR_FILE" 2> /dev/null | tr -d '[:space:]')" ]; then
      halo_gone=$((halo_gone + 1))
    else
      halo_gone=0
    fi
    if [ "$halo_gone" -ge 3 ]; then
      echo "halo-sched: server $halo_server_name[$HALO_SERVER_INDEX]: the trainer's rank 0 is gone; stopping the server" >&2
      kill -TERM "$halo_pid" 2> /dev/null || true
      wait "$halo_pid" 2> /dev/null || true
      exit 0
    fi
    sleep 2 &
    wait $! || true
  done
  wait "$halo_pid" || halo_rc=$?
  exit "$halo_rc"
}
