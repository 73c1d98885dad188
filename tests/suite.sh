#!/usr/bin/env bash
# `make test`: the whole suite, both Slurm releases at once.
#
#   pass A: every test (Slurm 22.05, the multi-host rig, real torchrun, the long property runs)
#   pass B: the SLURM suite again against SLURM_RELEASE (its own cluster, ports, lock and state)
#
# Most of the suite's time is waiting (torchrun start-up, slurmd, a rendezvous timeout), so each
# pass runs under pytest-xdist and the two run side by side: each worker has its own temporary
# directory and HALO_SCHED_HOME (tests/conftest.py), ports are reserved under a machine-wide flock
# (tests/helpers.py), each release's SLURM tests run on one worker, one after another (its lock,
# tests/cluster/fixtures.py), and the multi-host rig's tests stay on one worker (xdist_group).
# Pass B's output follows pass A's, whole; then each pass's failed tests, so the end of the output
# (what CI keeps) names them. The exit status is non-zero if either pass failed.
#
# Environment: HALO_TEST_WORKERS (pass A's workers, 4), HALO_RELEASE_WORKERS (pass B's, 1: its tests
# share one 3-node cluster and run one after another, tests/conftest.py),
# SLURM_RELEASE (24.11), PYTEST (.venv/bin/pytest). Extra arguments go to both passes.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
RELEASE=${SLURM_RELEASE:-24.11}
A_WORKERS=${HALO_TEST_WORKERS:-4}
B_WORKERS=${HALO_RELEASE_WORKERS:-1}
t0=$SECONDS

# The release is built once per machine (cached under /var/cache/halo-sched): before the clock
# of either pass starts, so a first build (about 5 minutes on 2 cores) is said apart.
HALO_SLURM_VERSION=$RELEASE tests/cluster/slurm-cluster.sh build || exit $?
echo "halo-sched tests: Slurm $RELEASE ready after $((SECONDS - t0)) s"

logdir=$(mktemp -d /tmp/halo-suite.XXXXXX)
trap 'rm -rf "$logdir"' EXIT
tb=$SECONDS
(
    xdist=()
    ((B_WORKERS > 1)) && xdist=(-n "$B_WORKERS" --dist loadgroup)
    HALO_SLURM_VERSION=$RELEASE "$PYTEST" -p no:cacheprovider "${xdist[@]}" \
        --basetemp="$logdir/tmp-b" -m "slurm and not multihost" "$@" >"$logdir/b.log" 2>&1
    echo $? >"$logdir/b.rc"
    echo $((SECONDS - tb)) >"$logdir/b.seconds"
) &
b_pid=$!

ta=$SECONDS
echo "== pass A: the whole suite on Slurm 22.05 ($A_WORKERS workers; Slurm $RELEASE's pass runs beside it)"
"$PYTEST" -p no:cacheprovider -n "$A_WORKERS" --dist loadgroup "$@" 2>&1 | tee "$logdir/a.log"
a_rc=${PIPESTATUS[0]}
a_s=$((SECONDS - ta))
wait "$b_pid"
b_rc=$(cat "$logdir/b.rc" 2>/dev/null || echo 1)
echo
echo "== pass B: the SLURM suite on Slurm $RELEASE ($B_WORKERS workers, beside pass A): its output"
cat "$logdir/b.log"
# CI shows the end of the output: each failed pass's failures come last. pytest's short summary
# (-ra) names them (colour codes stripped: a CI that forces colour must not hide them); a pass that
# failed with none named there (a crashed worker, an error outside a test) shows its last lines.
for pass in a b; do
    rc=$a_rc
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
echo "halo-sched tests: pass A (all, Slurm 22.05) exit $a_rc in ${a_s} s; pass B (SLURM, Slurm $RELEASE) exit $b_rc in $(cat "$logdir/b.seconds" 2>/dev/null || echo '?') s; $((SECONDS - t0)) s in all"
((a_rc == 0 && b_rc == 0))
