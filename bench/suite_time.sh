#!/usr/bin/env bash
# The suite's times, measured as CI meets them: a fresh clone of this checkout's HEAD inside a private
# (0700) directory, then `.ci/run` (make test: the install, both Slurm passes side by side), and
# `make test-fast` in the same clone afterwards. Writes the two figures into README.md's test section
# (the lines marked `make test-fast  #` and `make test       #`) with today's date.
#
#   bench/suite_time.sh            # measure and write README.md
#   bench/suite_time.sh --no-write # measure only
#
# Takes the whole suite's time and then some (about 35 minutes on 2 cores). Root (the suite needs it).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
write=1
[[ ${1:-} == --no-write ]] && write=0
private=$(mktemp -d "${HALO_SUITE_TIME_DIR:-$HOME}/halo-suite-time.XXXXXX")
chmod 0700 "$private"
trap 'rm -rf "$private"' EXIT
git clone -q "$here" "$private/halo-sched"
cd "$private/halo-sched"
log=$private/ci.log
t0=$(date +%s)
set +e
CI=true bash .ci/run >"$log" 2>&1
rc=$?
set -e
full=$(($(date +%s) - t0))
tail -n 5 "$log"
summary=$(grep '^halo-sched tests: pass A' "$log" | tail -n 1 || true)
counts=$(grep -E '^=+ .*(passed|failed).* in [0-9.]+s' "$log" | sed -E 's/^=+ (.*) in .*/\1/' | paste -sd ';' - | sed 's/;/; /g' || true)
echo "the whole of .ci/run: ${full} s, exit $rc (${counts}); ${summary}"
# The log outlives the clone (its per-test durations and per-file totals): kept beside the last run's.
cp "$log" /tmp/halo-suite-time.log
((rc == 0)) || { echo "suite_time: .ci/run failed (exit $rc); its log: /tmp/halo-suite-time.log" >&2; exit 1; }
t1=$(date +%s)
make test-fast >"$private/fast.log" 2>&1 || { tail -n 30 "$private/fast.log" >&2; exit 1; }
fast=$(($(date +%s) - t1))
echo "make test-fast: ${fast} s"
((write)) || exit 0
day=$(date -u +%F)
mmss() { printf '%d min %d s' $(($1 / 60)) $(($1 % 60)); }
cd "$here"
python3 - "$(mmss "$fast")" "$(mmss "$full")" "$day" "$counts" <<'EOF'
import re, sys
fast, full, day, counts = sys.argv[1:]
p = "README.md"
s = open(p).read()
s, n1 = re.subn(r"^make test-fast  #.*$",
                f"make test-fast  # no SLURM cluster, no real torchrun, no long property runs: {fast} on 2 cores "
                f"(bench/suite_time.sh, {day})", s, flags=re.M)
s, n2 = re.subn(r"^make test       #.*$",
                f"make test       # everything: Slurm 22.05 with the multi-host rig, and Slurm 24.11 beside it: {full} "
                f"on 2 cores, install included, from a clean clone in a 0700 directory (bench/suite_time.sh, {day}: "
                f"{counts}); needs root the first time (apt-get)", s, flags=re.M)
assert n1 == n2 == 1, (n1, n2)
open(p, "w").write(s)
print("wrote README.md")
EOF
