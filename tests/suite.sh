#!/usr/bin/env bash
# `make test`: the whole suite, both Slurm releases at once.
#
#   pass A: all but the SLURM cluster's tests (the multi-host rig, real torchrun, the long property runs)
#   pass S: the SLURM suite against Slurm 22.05
#   pass B: the SLURM suite again against SLURM_RELEASE
#
# Most of the suite's time is waiting (torchrun start-up, slurmd, a rendezvous timeout), so each
# pass runs under pytest-xdist and the three run side by side: each worker has its own temporary
# directory and HALO_SCHED_HOME (tests/conftest.py), ports are reserved under a machine-wide flock
# (tests/helpers.py), and the multi-host rig's tests stay on one worker (xdist_group). Passes S and B
# run on two workers each, each worker on a 3-node cluster of its own (HALO_CLUSTER_PER_WORKER=1,
# tests/cluster/cluster.py: its state dir, ports and job-id band), a test file at a time.
#
# Why seven tests at once (3 + 2 + 2), each figure the whole of .ci/run from a clean clone on 2 cores
# (bench/suite_time.sh): one cluster per release, its SLURM tests one after another
# (HALO_RELEASE_WORKERS=1, pass A's 4 workers holding 22.05's chain): 1767-1988 s, the last 10-15
# minutes on a half-idle machine while the two chains ran alone. Two clusters per release beside 4
# workers (eight at once): 1324-1468 s, but every run had a test over a timing bound. Beside 3
# workers: 1275-1404 s in seven runs, and 1557 s in CI's (2026-12-07; the first: A 1304 s, S 1201 s,
# B 1165 s), A's three workers busy to its end (3878 s of tests, the rig's chain 979 s of it).
#
# Passes B (and S) print their output after A's, whole; then each pass's failed tests, so the end
# of the output (what CI keeps) names them. The exit status is non-zero if any pass failed.
#
# Environment: HALO_TEST_WORKERS (pass A's workers, 3), HALO_RELEASE_WORKERS (2, or 1: each
# release's SLURM tests on one shared cluster, one after another: 22.05's in pass A, no pass S),
# SLURM_RELEASE (24.11), PYTEST (.venv/bin/pytest). Extra arguments go to every pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# Compiled modules are cached (the Makefile says why), and one collection fills the cache first:
# the passes' eleven pytest processes then each collect in a third of the time.
unset PYTHONDONTWRITEBYTECODE
PYTEST=${PYTEST:-.venv/bin/pytest}
RELEASE=${SLURM_RELEASE:-24.11}
A_WORKERS=${HALO_TEST_WORKERS:-3}
R_WORKERS=${HALO_RELEASE_WORKERS:-2}
# Each worker's cluster numbers its jobs in a band of its own (tests/cluster/cluster.py
# first_job_id): four bands, two SLURM passes.
((R_WORKERS >= 1 && R_WORKERS <= 2)) || { echo "tests/suite.sh: HALO_RELEASE_WORKERS must be 1 or 2" >&2; exit 2; }
t0=$SECONDS

# The release is built once per machine (cached under /var/cache/halo-sched): before the clock
# of either pass starts, so a first build (about 5 minutes on 2 cores) is said apart.
HALO_SLURM_VERSION=$RELEASE tests/cluster/slurm-cluster.sh build || exit $?
echo "halo-sched tests: Slurm $RELEASE ready after $((SECONDS - t0)) s"
"$PYTEST" -p no:cacheprovider --collect-only -q >/dev/null 2>&1 || true

logdir=$(mktemp -d /tmp/halo-suite.XXXXXX)
trap 'rm -rf "$logdir"' EXIT

# A SLURM pass (S or B) in the background: its release, each xdist worker on a cluster of its own.
slurm_pass() {
    local pass=$1 version=$2 t=$SECONDS xdist=()
    ((R_WORKERS > 1)) && xdist=(-n "$R_WORKERS" --dist loadgroup)
    (
        HALO_SLURM_VERSION=$version HALO_CLUSTER_PER_WORKER=1 "$PYTEST" -p no:cacheprovider "${xdist[@]}" \
            --basetemp="$logdir/tmp-$pass" -m "slurm and not multihost" "${@:3}" >"$logdir/$pass.log" 2>&1
        echo $? >"$logdir/$pass.rc"
        echo $((SECONDS - t)) >"$logdir/$pass.seconds"
    ) &
}
# Two workers each (the default): a cluster per worker. One: Slurm 22.05's SLURM tests run in pass A
# on one worker, on the release's shared cluster, and pass B on SLURM_RELEASE's; no pass S.
passes="b"
if ((R_WORKERS > 1)); then
    passes="s b"
    slurm_pass s 22.05 "$@"
    s_pid=$!
    slurm_pass b "$RELEASE" "$@"
    b_pid=$!
    a_select=(-m "not slurm or multihost")
    echo "== pass A: the suite but the SLURM cluster's tests ($A_WORKERS workers; the SLURM suite on 22.05 and on $RELEASE runs beside it, $R_WORKERS clusters each)"
else
    # One worker: no xdist worker id, so the release's shared cluster (tests/cluster/cluster.py).
    slurm_pass b "$RELEASE" "$@"
    b_pid=$!
    s_pid=
    echo 0 >"$logdir/s.rc"
    a_select=()
    echo "== pass A: the whole suite on Slurm 22.05 ($A_WORKERS workers; Slurm $RELEASE's SLURM suite runs beside it)"
fi

ta=$SECONDS
"$PYTEST" -p no:cacheprovider -n "$A_WORKERS" --dist loadgroup "${a_select[@]}" "$@" 2>&1 | tee "$logdir/a.log"
a_rc=${PIPESTATUS[0]}
a_s=$((SECONDS - ta))
wait $s_pid "$b_pid"
s_rc=$(cat "$logdir/s.rc" 2>/dev/null || echo 1)
b_rc=$(cat "$logdir/b.rc" 2>/dev/null || echo 1)
for pass in $passes; do
    echo
    [[ $pass == s ]] && echo "== pass S: the SLURM suite on Slurm 22.05 ($R_WORKERS workers, beside pass A): its output"
    [[ $pass == b ]] && echo "== pass B: the SLURM suite on Slurm $RELEASE ($R_WORKERS workers, beside pass A): its output"
    cat "$logdir/$pass.log"
done
# CI shows the end of the output: each failed pass's failures come last. pytest's short summary
# (-ra) names them (colour codes stripped: a CI that forces colour must not hide them); a pass that
# failed with none named there (a crashed worker, an error outside a test) shows its last lines.
for pass in a $passes; do
    rc=$a_rc
    [[ $pass == s ]] && rc=$s_rc
    [[ $pass == b ]] && rc=$b_rc
    ((rc == 0)) && continue
    sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$logdir/$pass.log" >"$logdir/$pass.plain" 2>/dev/null
    echo
    if grep -qE '^(FAILED|ERROR) |INTERNALERROR|crashed' "$logdir/$pass.plain"; then
        echo "== pass ${pass^} (exit $rc): what failed"
        grep -E '^(FAILED|ERROR) |INTERNALERROR|crashed' "$logdir/$pass.plain" | cut -c1-400 | head -60
    else
        echo "== pass ${pass^} (exit $rc): no test named as failed; the end of its output"
        tail -n 40 "$logdir/$pass.plain" | cut -c1-400
    fi
done
echo
secs() { cat "$logdir/$1.seconds" 2>/dev/null || echo '?'; }
s_said=
[[ $passes == "s b" ]] && s_said="pass S (SLURM, Slurm 22.05) exit $s_rc in $(secs s) s; "
echo "halo-sched tests: pass A exit $a_rc in ${a_s} s; ${s_said}pass B (SLURM, Slurm $RELEASE) exit $b_rc in $(secs b) s; $((SECONDS - t0)) s in all"
((a_rc == 0 && s_rc == 0 && b_rc == 0))
