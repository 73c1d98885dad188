# Sourced by slurm-cluster.sh and multihost.sh, after they set STATE (the state dir) and CONF (its
# slurm.conf): which processes are this cluster's.
#
# A daemon that died (killed by a test, or crashed) leaves its pid file, and on a busy machine its
# pid is soon another process's: the suite's processes and threads take all of pid_max (32768 here)
# in a minute or two. A down that trusted such a file is the likeliest sender of the SIGTERM that a
# SLURM job's torchrun of another cluster got (2026-12-07, tests/test_cluster_pid_files.py).

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

# Whether process $1 is this cluster's: its command line or environment names the state dir or its
# slurm.conf (every daemon, step and helper the scripts start does). grep reads it all: with -q it
# would stop at the first match, tr would die of SIGPIPE, and pipefail would make the answer no.
is_ours() {
    { tr '\0' '\n' <"/proc/$1/cmdline" && tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null |
        grep -F -e "$STATE/" -e "SLURM_CONF=$CONF" >/dev/null
}

# The pid in pid file $1 while that process is still this cluster's, else nothing.
pid_from() {
    local p
    [[ -s "$1" ]] && p=$(tr -dc '0-9' <"$1") && [[ -n $p ]] && is_ours "$p" && echo "$p"
    return 0
}
