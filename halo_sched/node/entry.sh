# The node entry's functions that hold nothing of a job: its values come from the entry script
# (halo_sched/templates/entry.sh.j2) in variables, set before these run: halo_rank, halo_signal
# (the warning signal the ranks get), halo_nproc, halo_node_tag, halo_log_dir, halo_log_root,
# halo_node (the node runtime's launcher), halo_torchrun, halo_warned_at. Read by the entry with
# `python -m halo_sched.node.shell` from the node runtime (docs/node-runtime.md), so that each
# rendered job holds only what is its own. The HALO_* names are halo_sched/node/contract.py's
# (tests/test_node_runtime.py checks them).

# The warning. The job's warning signal ($halo_signal, slurm.signal's, USR2 by default) is ignored
# in the entry, in setup and in torchrun, and inherited as ignored by the ranks: torchrun would die
# from it (or, for a signal it handles, stop its workers after a short grace). The trainer installs
# its own handler (Python's signal.signal overrides an inherited SIG_IGN) and has until the
# deadline to checkpoint; a handler in the entry shell would not do (bash resets handled signals
# to the default in children). The warning reaches the entry as its carrier (URG; SLURM: the
# batch script passes slurm.signal's warning and `halo-sched cancel --signal` on, to every process
# of the job's steps), whose default action is to ignore it, so torchrun, the ranks and any server
# go on as if nothing came; the entry alone acts on it: halo_deliver hands $halo_signal to each
# rank (a process torchrun started) once that rank handles it (SigCgt in /proc/PID/status), at
# once or as soon as it installs its handler. A warning that comes while setup, torchrun or a
# trainer's imports still run is held, not lost: slurmctld looks at time limits every 30 s and
# sends slurm.signal's warning up to 30 s early, which for a short job can be its first seconds
# (job_mgr.c send_job_warn_signal).
# Runs in the background from the warning until torchrun ends (torchrun may start ranks again).
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
        kill -s "$halo_signal" "$halo_p" 2> /dev/null || continue
        halo_done+="$halo_p "
        halo_sent+="$halo_p "
      done
      for halo_p in $halo_sent; do
        halo_who=$(tr '\0' '\n' 2> /dev/null < "/proc/$halo_p/environ" | sed -n 's/^RANK=//p')
        echo "halo-sched: node $halo_rank: SIG$halo_signal to rank ${halo_who:-?} (pid $halo_p), $((SECONDS - halo_warned_at)) s after the warning" >&2
      done
      sleep 0.2
    done
    [ "$halo_done" != ' ' ] ||
      echo "halo-sched: node $halo_rank: no rank handled SIG$halo_signal before torchrun ended; the warning reached no trainer (install a handler for \$HALO_WARNING_SIGNAL)" >&2
  ) &
  halo_deliverer=$!
}
# torchrun's workers run in sessions of their own: when torchrun dies (SIGKILL), they are
# reparented to init, out of reach of its process tree and of SLURM's proctrack/linuxproc, and
# would outlive the job. Only torchrun gets the tag ($halo_node_tag, made at run time by the
# entry) in its environment, so it marks exactly what torchrun started, however deep or
# reparented. A subreaper would not do: bash cannot become one, and a helper process that did
# could itself be killed.
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
  local halo_pid halo_tee halo_rc halo_stop
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
    # The job's failure key in the collector's environment alone (the entry took it out of every
    # other's): the lines it signs are the only ones a reader trusts (docs/failures.md).
    HALO_FAILURE_KEY=$halo_failure_key "${halo_node[@]}" failure_collector "$halo_rank" "$halo_nproc" "$halo_log_dir" "$halo_rc" "$halo_stopped_at" < /dev/null ||
      echo "halo-sched-failure {\"node\":$halo_rank,\"rank\":null,\"host\":\"$(hostname)\",\"exit_code\":$halo_rc,\"time\":$(date +%s),\"error\":\"torchrun exited with $halo_rc\"}" >&2
  fi
  [ -n "${HALO_LOG_DIR:-}" ] || rm -rf "$halo_log_root"
  return "$halo_rc"
}
