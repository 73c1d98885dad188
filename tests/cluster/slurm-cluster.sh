#!/usr/bin/env bash
# A real SLURM cluster on one machine, for tests: munged + slurmctld + 3 x `slurmd -N nodeN`
# (+ slurmrestd: unix socket with rest_auth/local, 127.0.0.1 with JWT), all under one state
# directory. See tests/cluster/README.md.
#
#   tests/cluster/slurm-cluster.sh up       # install (apt) if needed, start, wait for idle nodes
#   tests/cluster/slurm-cluster.sh status   # daemons and sinfo
#   tests/cluster/slurm-cluster.sh down     # stop everything this script started, verify
#   eval "$(tests/cluster/slurm-cluster.sh env)"   # SLURM_CONF etc. for your shell
#
# Environment: HALO_CLUSTER_DIR (state dir, default /var/lib/halo-sched/cluster-X.Y: outside the
# checkout, which may sit in a 0700 home the daemons' users munge and slurm cannot enter), HALO_CLUSTER_NODES (3),
# HALO_CLUSTER_PORT (slurmctld port, default 6817; node i listens on PORT+i), HALO_CLUSTER_FIRST_JOB_ID (1; 501 for a release other than 22.05),
# HALO_CLUSTER_REST_PORT (slurmrestd on 127.0.0.1, default PORT+100),
# HALO_CLUSTER_NO_REST=1 (do not start slurmrestd), HALO_SLURM_VERSION (22.05 = Debian 12's
# packages, the default; 24.11, 26.05, ...: built from Debian's source package, see
# build_release; each release with its own default state dir and ports),
# HALO_SLURM_CACHE (/var/cache/halo-sched), HALO_SLURM_SOURCE, HALO_SLURM_REBUILD.
#
#   HALO_SLURM_VERSION=24.11 tests/cluster/slurm-cluster.sh build   # fetch and build, once per machine
#
# Only loopback is used: every node is NodeHostname=localhost NodeAddr=127.0.0.1.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Which Slurm: 22.05 is Debian 12's binary packages; any other X.Y is built from Debian's source
# package (build_release) into SLURM_CACHE. Each release has its own state dir and ports by
# default, so clusters of two releases run side by side (and tests of one never reach the other).
SLURM_VERSION=${HALO_SLURM_VERSION:-22.05}
[[ $SLURM_VERSION =~ ^[0-9]{2}\.[0-9]{2}$ ]] || { echo "slurm-cluster: HALO_SLURM_VERSION=$SLURM_VERSION is not X.Y (22.05, 24.11, 26.05)" >&2; exit 2; }
SLURM_CACHE=${HALO_SLURM_CACHE:-/var/cache/halo-sched}
# The state lives outside the checkout: munged runs as `munge` and slurmrestd as `slurm`, and a
# clone under a 0700 directory (root's home) is out of their reach. One state dir per release and
# machine, like the release's ports and lock: every clone on this machine shares that cluster.
STATE_ROOT=${HALO_CLUSTER_STATE_ROOT:-/var/lib/halo-sched}
DEFAULT_STATE=$STATE_ROOT/cluster-$SLURM_VERSION
case $SLURM_VERSION in
    22.05) DEFAULT_PORT=6817 ;;
    24.11) DEFAULT_PORT=6827 ;;
    26.05) DEFAULT_PORT=6837 ;;
    *) DEFAULT_PORT=6847 ;;
esac
STATE=${HALO_CLUSTER_DIR:-$DEFAULT_STATE}
NODES=${HALO_CLUSTER_NODES:-3}
CTLD_PORT=${HALO_CLUSTER_PORT:-$DEFAULT_PORT}
CLUSTER_NAME=halo
CONF=$STATE/etc/slurm.conf
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
REST_SOCKET=$STATE/run/slurmrestd.socket
REST_PORT=${HALO_CLUSTER_REST_PORT:-$((CTLD_PORT + 100))}
UP_TIMEOUT=${HALO_CLUSTER_UP_TIMEOUT:-60}
# A built release's commands come first on PATH, for this script and (print_env) for its users.
if [[ $SLURM_VERSION != 22.05 ]]; then
    RELEASE_PREFIX=$SLURM_CACHE/slurm-$SLURM_VERSION
    case ":$PATH:" in
        *":$RELEASE_PREFIX/bin:"*) ;;
        *) PATH=$RELEASE_PREFIX/sbin:$RELEASE_PREFIX/bin:$PATH ;;
    esac
    export PATH
fi

log() { printf 'slurm-cluster: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=tests/cluster/debian-packages.sh
source "$SCRIPT_DIR/debian-packages.sh"
# shellcheck source=tests/cluster/own-pids.sh
source "$SCRIPT_DIR/own-pids.sh"
# shellcheck source=tests/cluster/slurm-conf.sh
source "$SCRIPT_DIR/slurm-conf.sh"

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "node$i"; done; }

# ---------------------------------------------------------------------------------------------
install_packages() {
    # slurm-wlm-jwt-plugin: slurmctld refuses to start without it once AuthAltTypes=auth/jwt.
    # The packages' postinst scripts try to enable systemd units; there is no systemd here and
    # we start the daemons ourselves.
    install_debian_packages "" slurm-wlm munge slurmrestd slurm-wlm-jwt-plugin
}

# ---------------------------------------------------------------------------------------------
# Other releases, built from Debian's own source package `slurm-wlm` (trixie: 24.11, sid: 26.05;
# any X.Y that one of those suites carries), fetched with `apt-get source` through a private apt
# configuration (its own sources.list with deb-src lines, its own state and cache directories):
# this machine's /etc/apt and its package lists are not touched. Built once per machine into
# SLURM_CACHE/slurm-X.Y (outside the clone, so every clone and CI run reuses it) and reused while
# the version it was built from is X.Y; HALO_SLURM_REBUILD=1 builds it again.
APT_SUITES=${HALO_SLURM_APT_SUITES:-trixie sid}
APT_MIRROR=${HALO_SLURM_APT_MIRROR:-http://deb.debian.org/debian}
# Build dependencies, all in Debian 12: munge (auth), libjwt (auth/jwt), http-parser, json-c and
# yaml (slurmrestd and the data parsers), and what apt-get source needs to unpack the package.
BUILD_DEPS=(gcc make pkg-config dpkg-dev libmunge-dev libjwt-dev libhttp-parser-dev libjson-c-dev libyaml-dev munge)

release_prefix() { echo "$SLURM_CACHE/slurm-$SLURM_VERSION"; }

# The Slurm release (X.Y.Z) built in PREFIX, empty if no build finished there.
built_version() { [[ -s $1/.halo-built ]] && sed -n 's/^slurm_version=//p' "$1/.halo-built" || true; }

private_apt() {
    # Prints the APT_CONFIG path of a private apt set-up for deb-src lines of APT_SUITES.
    local dir=$SLURM_CACHE/apt suite
    install -d "$dir/etc/sources.list.d" "$dir/etc/preferences.d" "$dir/etc/apt.conf.d" \
        "$dir/state/lists/partial" "$dir/cache/archives/partial"
    {
        for suite in $APT_SUITES; do
            echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $APT_MIRROR $suite main"
        done
    } >"$dir/etc/sources.list"
    cat >"$dir/apt.conf" <<EOF
Dir::Etc::sourcelist "$dir/etc/sources.list";
Dir::Etc::sourceparts "$dir/etc/sources.list.d";
Dir::Etc::preferencesparts "$dir/etc/preferences.d";
Dir::Etc::parts "$dir/etc/apt.conf.d";
Dir::State "$dir/state";
Dir::State::status "/var/lib/dpkg/status";
Dir::Cache "$dir/cache";
// The signatures are still checked; sid's Release carries a Valid-Until a week ahead, which a
// mirror that lags (or this machine's clock) can pass: the source package is what matters here.
Acquire::Check-Valid-Until "false";
EOF
    echo "$dir/apt.conf"
}

install_build_deps() {
    install_debian_packages "build dependencies" "${BUILD_DEPS[@]}"
}

# slurmrestd refuses to run as root or SlurmUser: it runs as `slurm`, the user Debian's packages
# create (22.05); a built release makes it the same way if it is missing.
ensure_slurm_user() {
    id -u slurm >/dev/null 2>&1 && return 0
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin slurm
}

build_release() {
    local prefix aptconf version src t0 jobs
    prefix=$(release_prefix)
    install -d "$SLURM_CACHE"
    # One build per release at a time, whichever clone asks; the others wait and reuse it.
    exec {build_lock}>"$SLURM_CACHE/slurm-$SLURM_VERSION.lock"
    flock "$build_lock"
    if [[ ${HALO_SLURM_REBUILD:-0} != 1 ]] && [[ $(built_version "$prefix") == "$SLURM_VERSION".* ]]; then
        exec {build_lock}>&-
        return 0
    fi
    install_build_deps
    local tree orig patched=yes
    src=$SLURM_CACHE/src-$SLURM_VERSION
    rm -rf "$src" "$prefix"
    install -d "$src"
    if [[ -n ${HALO_SLURM_SOURCE:-} ]]; then
        # A release this machine's Debian mirror does not serve (sid's 26.05.5 was not, on
        # 2026-12-02): SchedMD's tarball or an unpacked tree of it, named by hand.
        version="upstream:$HALO_SLURM_SOURCE"
        patched=no
        install -d "$src/slurm-wlm-upstream"
        if [[ -d $HALO_SLURM_SOURCE ]]; then
            cp -a "$HALO_SLURM_SOURCE/." "$src/slurm-wlm-upstream/"
        else
            tar -xf "$HALO_SLURM_SOURCE" -C "$src/slurm-wlm-upstream" --strip-components=1
        fi
    else
        aptconf=$(private_apt)
        log "fetching Debian's source package lists ($APT_SUITES) into $SLURM_CACHE/apt"
        APT_CONFIG=$aptconf apt-get update -q >/dev/null || die "apt-get update (private deb-src lists) failed"
        version=$(APT_CONFIG=$aptconf apt-cache showsrc slurm-wlm 2>/dev/null |
            sed -n 's/^Version: //p' | grep -E "^${SLURM_VERSION//./\\.}\\." | sort -V | tail -n 1 || true)
        [[ -n $version ]] || die "no slurm-wlm $SLURM_VERSION.x source package in Debian $APT_SUITES (HALO_SLURM_APT_SUITES; or name SchedMD's tarball in HALO_SLURM_SOURCE)"
        log "apt-get source slurm-wlm=$version"
        if ! (cd "$src" && APT_CONFIG=$aptconf apt-get source -q "slurm-wlm=$version" >"$src/apt-source.log" 2>&1); then
            # Seen on this machine's package mirror (2026-12-02): it serves the upstream tarball
            # of 24.11.5 (slurm-wlm_24.11.5.orig.tar.gz) but answers 404 for the .dsc and the
            # .debian.tar.xz, and nothing of sid's 26.05.5. The upstream tarball is the release as
            # SchedMD shipped it; Debian's patches are packaging fixes. Build that, and say so.
            orig=$(find "$src" -maxdepth 1 -name "slurm-wlm_${version%%-*}.orig.tar.*" | head -n 1)
            [[ -n $orig ]] || { tail -n 20 "$src/apt-source.log" >&2; die "apt-get source slurm-wlm=$version failed (or name SchedMD's tarball in HALO_SLURM_SOURCE)"; }
            log "apt-get source could fetch only $(basename "$orig") (the .dsc/.debian.tar.xz are not served): building it without Debian's patches"
            patched=no
            install -d "$src/slurm-wlm-${version%%-*}"
            tar -xf "$orig" -C "$src/slurm-wlm-${version%%-*}" --strip-components=1
        fi
    fi
    tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'slurm-wlm-*' | head -n 1)
    [[ -n $tree ]] || die "apt-get source left no slurm-wlm-* tree in $src"
    jobs=$(nproc)
    t0=$SECONDS
    log "building Slurm $version into $prefix (nice; log $src/build.log)"
    (
        cd "$tree"
        nice -n 10 ./configure --prefix="$prefix" --sysconfdir="$prefix/etc" \
            --enable-multiple-slurmd --with-munge --with-jwt --with-yaml --with-json --with-http-parser \
            --disable-debug --without-pmix --without-hdf5 --without-rrdtool --without-ucx --without-nvml \
            --without-rsmi --without-hwloc --without-lua --without-freeipmi --without-ofed
        nice -n 10 make -j"$jobs"
        nice -n 10 make -j"$jobs" install
    ) >"$src/build.log" 2>&1 || { tail -n 40 "$src/build.log" >&2; die "building Slurm $version failed (log $src/build.log)"; }
    [[ -x $prefix/sbin/slurmrestd ]] || die "Slurm $version built without slurmrestd (log $src/build.log)"
    local built
    built=$("$prefix/sbin/slurmctld" -V | awk '{print $2}')
    [[ $built == "$SLURM_VERSION".* ]] || die "the source built Slurm $built, not $SLURM_VERSION (HALO_SLURM_SOURCE?)"
    {
        echo "slurm_version=$built"
        echo "debian_version=$version"
        echo "debian_patches=$patched"
        echo "built_seconds=$((SECONDS - t0))"
        echo "built_at=$(date -u +%FT%TZ)"
    } >"$prefix/.halo-built"
    log "built Slurm $version in $((SECONDS - t0)) s"
    rm -rf "$src"
    exec {build_lock}>&-
}

# ---------------------------------------------------------------------------------------------
write_conf() {
    local tmp=$1 i=0 n
    local cpus=2
    # Every slurmd on this host detects the whole machine; declaring 2 CPUs per node (and
    # config_overrides so slurmd believes the config, not the hardware) lets a 2-node job with
    # 2 processes per node run even on a 1-core box. Oversubscription is fine for tests.
    cat >"$tmp" <<EOF
# Generated by tests/cluster/slurm-cluster.sh - edits are overwritten.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
$(common_slurm_conf)
# JWT as the alternative auth, for slurmrestd: a token names the user a request acts as.
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$STATE/etc/jwt_hs256.key
# The first job id (HALO_CLUSTER_FIRST_JOB_ID; 1 for 22.05, 501 for another release): clusters that
# run side by side on this one host keep apart the rendezvous ports halo-sched derives from the job
# id (DERIVED_PORTS) and the job ids tests look for in /proc.
FirstJobId=${HALO_CLUSTER_FIRST_JOB_ID:-$([[ $SLURM_VERSION == 22.05 ]] && echo 1 || echo 501)}
SlurmdTimeout=60
MessageTimeout=10
EOF
    for n in $(node_names); do
        i=$((i + 1))
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((CTLD_PORT + i)) CPUs=$cpus RealMemory=2048 State=UNKNOWN" >>"$tmp"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$tmp"
}

# ---------------------------------------------------------------------------------------------
start_munge() {
    local pid
    pid=$(pid_from "$MUNGE_DIR/munged.pid")
    if pid_alive "$pid"; then return 0; fi
    install -d -o munge -g munge -m 0755 "$MUNGE_DIR"
    # munged refuses a key readable by anyone but itself, and a socket dir others can write.
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    fi
    chown munge:munge "$MUNGE_DIR/munge.key"
    chmod 0400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    # The package's default socket dir, owned by munge as the package expects; our munged uses
    # its own socket, but munge clients started without AuthInfo look here first.
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged \
        --key-file="$MUNGE_DIR/munge.key" \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" \
        --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" ||
        { tail -n 20 "$MUNGE_DIR/munged.log" >&2 || true; die "munged failed to start"; }
    munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET" >/dev/null ||
        die "munged runs but a munge/unmunge round trip fails"
}

start_slurmctld() {
    local pid
    pid=$(pid_from "$STATE/run/slurmctld.pid")
    if pid_alive "$pid"; then return 0; fi
    # -c: start from a clean state. A test cluster must come up with idle nodes, not with nodes
    # drained or jobs left over from a previous session; and the cluster name another release's
    # slurmctld recorded here ("halo|ID") would stop it at once (fatal: CLUSTER NAME MISMATCH).
    # -c still reads the last job id from job_state (read_config.c: load_last_job_id), so each start
    # numbered on from the last and walked out of its FirstJobId band into another cluster's, one
    # run after another (the derived ports and the job ids tests look for in /proc met): it goes too.
    rm -f "$STATE/spool/ctld/clustername" "$STATE/spool/ctld/job_state" "$STATE/spool/ctld/job_state.old"
    slurmctld -c || { tail -n 30 "$STATE/log/slurmctld.log" >&2 || true; die "slurmctld failed to start"; }
}

start_slurmd() {
    local n pid
    for n in $(node_names); do
        pid=$(pid_from "$STATE/run/slurmd-$n.pid")
        pid_alive "$pid" && continue
        slurmd -N "$n" || { tail -n 30 "$STATE/log/slurmd-$n.log" >&2 || true; die "slurmd -N $n failed to start"; }
    done
}

# slurmrestd 22.05, two instances, because its outgoing auth is process-wide:
#  - unix socket, rest_auth/local: the peer uid (SO_PEERCRED) must be root or slurmrestd's own
#    uid, and every request then acts as slurmrestd's uid (`slurm`), not as the caller.
#  - 127.0.0.1:REST_PORT, rest_auth/jwt with SLURM_JWT=daemon: headers X-SLURM-USER-NAME and
#    X-SLURM-USER-TOKEN (from `scontrol token`); requests act as the token's user. With
#    SLURM_JWT=daemon set, rest_auth/local requests fail (slurmctld: "jwt_decode failure").
# slurmrestd refuses to run as root or SlurmUser, hence the package's `slurm` user. It does
# not daemonize, so we keep its pid ourselves, and it keeps the directory it was started in:
# started from the log directory, never from the caller's (a test run's checkout, deleted
# after the run: slurmrestd 22.05 calls getcwd on a job submit and died there, "getcwd
# failed", failing every REST test of the next run).
# The OpenAPI plugins each release has: 22.05's per-version openapi/v0.0.38 (its v0.0.36/37 are
# older still); from 23.11 openapi/slurmctld serves every data_parser version the release has
# (24.11: v0.0.40-42; 26.05: v0.0.42-45), and there is no openapi/v0.0.38 plugin (25.11's
# slurmrestd dies at start when asked for it). openapi/slurmdbd is left out: no accounting here.
rest_plugins() {
    if [[ $SLURM_VERSION == 22.05 ]]; then echo openapi/v0.0.38; else echo openapi/slurmctld; fi
}

start_one_slurmrestd() {
    local name=$1 listen=$2 auth=$3 jwt=$4 pid
    pid=$(pid_from "$STATE/run/slurmrestd-$name.pid")
    if pid_alive "$pid"; then return 0; fi
    : >"$STATE/log/slurmrestd-$name.log"
    chown slurm "$STATE/log/slurmrestd-$name.log"
    local envs=(SLURM_CONF="$CONF")
    [[ $jwt == 1 ]] && envs+=(SLURM_JWT=daemon)
    (cd "$STATE/log" && exec setsid setpriv --reuid=slurm --regid=slurm --init-groups -- \
        env "${envs[@]}" slurmrestd -a "$auth" -s "$(rest_plugins)" "$listen") \
        >>"$STATE/log/slurmrestd-$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/run/slurmrestd-$name.pid"
}

rest_ready() {
    [[ -S $REST_SOCKET ]] && (exec 3<>"/dev/tcp/127.0.0.1/$REST_PORT") 2>/dev/null
}

start_slurmrestd() {
    [[ ${HALO_CLUSTER_NO_REST:-0} == 1 ]] && return 0
    command -v slurmrestd >/dev/null || return 0
    pid_alive "$(pid_from "$STATE/run/slurmrestd-local.pid")" || rm -f "$REST_SOCKET"
    start_one_slurmrestd local "unix:$REST_SOCKET" rest_auth/local 0
    start_one_slurmrestd jwt "127.0.0.1:$REST_PORT" rest_auth/jwt 1
    local t
    for ((t = 0; t < 50; t++)); do
        rest_ready && break
        sleep 0.1
    done
    if ! rest_ready; then
        tail -n 20 "$STATE"/log/slurmrestd-*.log >&2 || true
        die "slurmrestd did not listen on $REST_SOCKET and 127.0.0.1:$REST_PORT"
    fi
    # Let any local user reach it; rest_auth/local still decides who is accepted.
    chmod 0666 "$REST_SOCKET"
}

# ---------------------------------------------------------------------------------------------
wait_idle() {
    local deadline=$((SECONDS + UP_TIMEOUT)) out="" bad
    while ((SECONDS < deadline)); do
        out=$(sinfo -h -N -o '%N %T' 2>&1 || true)
        bad=$(awk 'NF==2 && $2 !~ /^(idle|allocated|mixed|completing)$/' <<<"$out" | wc -l)
        if (($(wc -l <<<"$out") == NODES)) && ((bad == 0)) && grep -q '^node' <<<"$out"; then
            return 0
        fi
        # Nodes that registered once as down (e.g. a slurmd that was restarted) come back
        # by themselves with ReturnToService=2; drained ones need a nudge.
        awk '$2 ~ /drain|down/ {print $1}' <<<"$out" | while read -r n; do
            scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        done
        sleep 1
    done
    log "nodes not idle after ${UP_TIMEOUT}s; sinfo says:"
    echo "$out" >&2
    local f
    for f in "$STATE"/log/*.log "$MUNGE_DIR/munged.log"; do
        [[ -f $f ]] || continue
        echo "---- tail $f" >&2
        tail -n 15 "$f" >&2
    done
    die "cluster did not come up (daemons left running for inspection; run '$0 down')"
}

print_env() {
    echo "export HALO_SLURM_VERSION=$SLURM_VERSION"
    echo "export SLURM_CONF=$CONF"
    [[ $SLURM_VERSION == 22.05 ]] || echo "export PATH=$PATH"
    echo "export HALO_SLURMRESTD_SOCKET=$REST_SOCKET"
    echo "export HALO_SLURMRESTD_URL=http://127.0.0.1:$REST_PORT"
}

# The state dir and its parents: root's, 0755 (munged as `munge` and slurmrestd as `slurm` must
# reach their files below it), writable by root alone; one owned by anyone else is refused.
state_dirs() {
    local d=$STATE owner
    while [[ $d != / ]]; do
        if [[ -e $d ]]; then
            owner=$(stat -c %u "$d")
            [[ $owner == 0 || $d == "$STATE" || $(stat -c %a "$d") == 1777 ]] ||
                die "state dir parent $d belongs to uid $owner, not root: choose HALO_CLUSTER_DIR elsewhere"
        fi
        d=$(dirname "$d")
    done
    install -d -m 0755 "$(dirname "$STATE")"
    install -d -m 0755 -o root "$STATE"
    [[ $(stat -c %u "$STATE") == 0 ]] || die "state dir $STATE does not belong to root"
    install -d "$STATE/etc" "$STATE/log" "$STATE/run" "$STATE/spool/ctld"
    local n
    for n in $(node_names); do install -d "$STATE/spool/$n"; done
    # slurmrestd (user slurm) must read the config and write its log and socket here.
    chmod 0755 "$STATE" "$STATE/etc" "$STATE/run"
    chown slurm "$STATE/run" 2>/dev/null || true
    local blocked
    if blocked=$(runuser -u munge -- test -x "$STATE" 2>&1 && echo ok) && [[ $blocked == ok ]]; then :; else
        die "munged (user munge) cannot enter $STATE: a parent directory is private (HALO_CLUSTER_DIR elsewhere)"
    fi
}

cmd_up() {
    # The daemons must not inherit the caller's descriptors: under `flock LOCK slurm-cluster.sh up`
    # munged and slurmrestd would hold the cluster lock for as long as they run.
    local fd
    for fd in /proc/$$/fd/*; do
        fd=${fd##*/}
        if ((fd > 2 && fd != 255)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    if [[ $SLURM_VERSION == 22.05 ]]; then
        install_packages
    else
        build_release
        ensure_slurm_user
    fi
    state_dirs

    # The JWT signing key: only slurmctld (root here) reads it.
    if [[ ! -s $STATE/etc/jwt_hs256.key ]]; then
        (umask 077 && dd if=/dev/urandom of="$STATE/etc/jwt_hs256.key" bs=32 count=1 status=none)
    fi
    chmod 0600 "$STATE/etc/jwt_hs256.key"

    local tmp
    tmp=$(mktemp "$STATE/etc/slurm.conf.XXXXXX")
    write_conf "$tmp"
    chmod 0644 "$tmp"
    if [[ -f $CONF ]] && ! cmp -s "$tmp" "$CONF"; then
        # Restarting cancels every job on the cluster, which others may share: not while any runs.
        if pid_alive "$(pid_from "$STATE/run/slurmctld.pid")" &&
            SLURM_CONF=$CONF squeue -h -o '%A' 2>/dev/null | grep -q .; then
            rm -f "$tmp"
            die "configuration changed, but the running cluster has jobs (squeue): not restarting it under them; run '$0 down' when they are done"
        fi
        log "configuration changed: restarting the cluster"
        cmd_down
    fi
    mv -f "$tmp" "$CONF"
    export SLURM_CONF=$CONF

    start_munge
    start_slurmctld
    start_slurmd
    wait_idle
    start_slurmrestd
    log "up: $(sinfo -h -o '%P %D nodes %t' | tr '\n' ' ')"
    print_env
}

# Every process of this cluster: the pid files, plus any slurm/munge process whose command line
# or environment names this state dir (slurmscriptd and slurmstepd inherit SLURM_CONF), so
# that lost pid files cannot leave daemons behind. Other processes are never touched, even if
# they have SLURM_CONF exported (the caller's shell, pytest).
our_pids() {
    local f p d comm
    for f in "$STATE"/run/*.pid "$MUNGE_DIR/munged.pid"; do
        p=$(pid_from "$f" 2>/dev/null)
        pid_alive "$p" && echo "$p"
    done
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        comm=$(cat "$d/comm" 2>/dev/null) || continue
        case $comm in
            munged | slurmctld | slurmscriptd | slurmd | slurmstepd | slurmrestd) ;;
            *) continue ;;
        esac
        if is_ours "$p"; then echo "$p"; fi
    done
}

cmd_down() {
    export SLURM_CONF=$CONF
    local pid
    pid=$(pid_from "$STATE/run/slurmctld.pid")
    if pid_alive "$pid"; then
        # Job steps outlive slurmd by design; cancel the jobs so their processes go too.
        local jobs
        jobs=$(squeue -h -o '%A' 2>/dev/null | tr '\n' ' ' || true)
        if [[ -n ${jobs// /} ]]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local t
            for ((t = 0; t < 20; t++)); do
                squeue -h -t R,CG,S -o '%A' 2>/dev/null | grep -q . || break
                sleep 0.5
            done
        fi
    fi
    local sig round pids
    for round in TERM TERM TERM TERM TERM TERM TERM TERM TERM TERM KILL KILL; do
        pids=$(our_pids | sort -u | tr '\n' ' ')
        [[ -z ${pids// /} ]] && break
        sig=$round
        # shellcheck disable=SC2086
        kill -s "$sig" $pids 2>/dev/null || true
        sleep 0.5
    done
    pids=$(our_pids | sort -u | tr '\n' ' ')
    if [[ -n ${pids// /} ]]; then
        ps -o pid,comm,args -p "${pids// /,}" >&2 || true
        die "processes left after down: $pids"
    fi
    rm -f "$STATE"/run/*.pid "$MUNGE_DIR/munged.pid" "$REST_SOCKET"
    log "down: no daemons left"
}

cmd_status() {
    export SLURM_CONF=$CONF
    local f p rc=0 any=0
    for f in "$MUNGE_DIR/munged.pid" "$STATE"/run/*.pid; do
        [[ -e $f ]] || continue
        any=1
        p=$(pid_from "$f")
        if pid_alive "$p"; then echo "running $(basename "$f" .pid) pid $p"; else echo "dead    $(basename "$f" .pid)"; rc=1; fi
    done
    if ((any == 0)); then
        echo "not running ($STATE)"
        return 1
    fi
    # sinfo retries for many seconds when slurmctld is gone: only ask a live one.
    if pid_alive "$(pid_from "$STATE/run/slurmctld.pid")"; then
        sinfo -N -o '%N %P %T %c' || rc=1
    fi
    return $rc
}

# A controller outage (restart, failover) for tests: stop slurmctld, keeping its state, and start
# it again from that state (no -c: the jobs it knew are still there). slurmd keeps running.
cmd_ctld_stop() {
    export SLURM_CONF=$CONF
    local pid i
    pid=$(pid_from "$STATE/run/slurmctld.pid")
    pid_alive "$pid" || die "slurmctld is not running"
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do pid_alive "$pid" || { log "ctld-stop: slurmctld stopped"; return 0; }; sleep 0.1; done
    die "slurmctld (pid $pid) did not stop within 10 s"
}

cmd_ctld_start() {
    export SLURM_CONF=$CONF
    local i
    pid_alive "$(pid_from "$STATE/run/slurmctld.pid")" && return 0
    slurmctld || { tail -n 30 "$STATE/log/slurmctld.log" >&2 || true; die "slurmctld failed to start"; }
    for ((i = 0; i < 100; i++)); do scontrol ping >/dev/null 2>&1 && { log "ctld-start: slurmctld answers"; return 0; }; sleep 0.1; done
    die "slurmctld started but does not answer scontrol ping within 10 s"
}

case ${1:-} in
    ctld-stop) cmd_ctld_stop ;;
    ctld-start) cmd_ctld_start ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) print_env ;;
    build) if [[ $SLURM_VERSION == 22.05 ]]; then install_packages; else build_release; fi ;;
    *) echo "usage: $0 up|down|status|env|ctld-stop|ctld-start" >&2; exit 2 ;;
esac
