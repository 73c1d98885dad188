#!/usr/bin/env bash
# A SLURM cluster of four hosts on one machine, each host its own network namespace and hostname,
# for tests where the wrong interface, a cut link and a slow link really happen (issue 31). See
# tests/cluster/multihost.md.
#
#   tests/cluster/multihost.sh up             # namespaces, bridges, munged, slurmctld, 4 x slurmd
#   eval "$(tests/cluster/multihost.sh env)"   # SLURM_CONF etc. for your shell
#   tests/cluster/multihost.sh cut h1          # h1 stops answering on both networks (nothing killed)
#   tests/cluster/multihost.sh heal h1
#   tests/cluster/multihost.sh cut h1 data0    # one network only
#   tests/cluster/multihost.sh delay h1 50     # +50 ms on every packet h1 sends on data0 (0: none)
#   tests/cluster/multihost.sh exec h1 CMD...  # a command on h1 (its network, hostname, hosts file)
#   tests/cluster/multihost.sh status          # exit 1 if anything is missing or dead
#   tests/cluster/multihost.sh down            # everything it made goes, also after a crash
#
# Hosts h0..h3: network namespace halo-hN, hostname hN (a UTS namespace held by a small anchor
# process), /etc/hosts bind-mounted from the rig's own file (host names resolve to mgmt0).
#   mgmt0  MGMT.1N/24  the management network: SLURM's NodeAddr, slurmctld at MGMT.1 (this
#                      machine's side of the bridge halo-mgmt; ip_forward stays as it is)
#   data0  DATA.1N/24  the training network: bridge halo-data, which has no address here, so no
#                      host reaches the other network through this machine
# Both bridges skip this machine's iptables (nf_call_iptables 0): bridged traffic is the rig's.
#
# Environment: HALO_MULTIHOST_DIR (state dir, default /tmp/halo-multihost: the namespaces and
# bridges are the machine's, so the state is too), HALO_MULTIHOST_PORT (slurmctld, default 6877;
# every slurmd listens on PORT+1 in its own namespace), HALO_MULTIHOST_MGMT_NET and
# HALO_MULTIHOST_DATA_NET (two /24s, default 10.77.0.0/24 and 10.78.0.0/24), HALO_SLURM_VERSION
# (22.05 = Debian 12's packages, the default; another X.Y is the release tests/cluster/slurm-cluster.sh
# builds once per machine, under /var/cache/halo-sched: the rig runs its daemons and commands).
# The rig is one per machine: an `up` for another release than the running one's takes it down first.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${HALO_MULTIHOST_DIR:-/tmp/halo-multihost}
LOCK=${HALO_MULTIHOST_LOCK:-/tmp/halo-multihost.lock}
CTLD_PORT=${HALO_MULTIHOST_PORT:-6877}
SLURMD_PORT=$((CTLD_PORT + 1))
MGMT_NET=${HALO_MULTIHOST_MGMT_NET:-10.77.0.0/24}
DATA_NET=${HALO_MULTIHOST_DATA_NET:-10.78.0.0/24}
HOSTS=(h0 h1 h2 h3)
NS_PREFIX=halo-
BR_MGMT=halo-mgmt
BR_DATA=halo-data
CONF=$STATE/etc/slurm.conf
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
UP_TIMEOUT=${HALO_MULTIHOST_UP_TIMEOUT:-60}
SLURM_VERSION=${HALO_SLURM_VERSION:-22.05}
[[ $SLURM_VERSION =~ ^[0-9]{2}\.[0-9]{2}$ ]] || { echo "multihost: HALO_SLURM_VERSION=$SLURM_VERSION is not X.Y (22.05, 24.11, 26.05)" >&2; exit 2; }
# A built release's daemons and commands come first on PATH (for print_env's users too), as in
# slurm-cluster.sh, which builds it.
if [[ $SLURM_VERSION != 22.05 ]]; then
    RELEASE_PREFIX=${HALO_SLURM_CACHE:-/var/cache/halo-sched}/slurm-$SLURM_VERSION
    case ":$PATH:" in
        *":$RELEASE_PREFIX/bin:"*) ;;
        *) PATH=$RELEASE_PREFIX/sbin:$RELEASE_PREFIX/bin:$PATH ;;
    esac
    export PATH
fi

log() { printf 'multihost: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=tests/cluster/debian-packages.sh
source "$SCRIPT_DIR/debian-packages.sh"
# shellcheck source=tests/cluster/own-pids.sh
source "$SCRIPT_DIR/own-pids.sh"
# shellcheck source=tests/cluster/slurm-conf.sh
source "$SCRIPT_DIR/slurm-conf.sh"

net_prefix() { # 10.77.0.0/24 -> 10.77.0
    [[ $1 =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] || die "$2 must be a /24 written A.B.C.0/24, not '$1'"
    echo "${BASH_REMATCH[1]}"
}
MGMT=$(net_prefix "$MGMT_NET" HALO_MULTIHOST_MGMT_NET)
DATA=$(net_prefix "$DATA_NET" HALO_MULTIHOST_DATA_NET)
[[ $MGMT != "$DATA" ]] || die "the management and data networks must differ"

host_index() {
    local i
    for i in "${!HOSTS[@]}"; do [[ ${HOSTS[$i]} == "$1" ]] && { echo "$i"; return 0; }; done
    die "no host '$1' in this rig (hosts: ${HOSTS[*]})"
}
ns() { echo "$NS_PREFIX$1"; }
mgmt_addr() { echo "$MGMT.$((10 + $(host_index "$1")))"; }
data_addr() { echo "$DATA.$((10 + $(host_index "$1")))"; }
# This machine's ends of a host's two veth pairs (the host's own ends are mgmt0 and data0).
veth_mgmt() { echo "hm-$1-m"; }
veth_data() { echo "hm-$1-d"; }

# ---------------------------------------------------------------------------------------------
# Networks: refuse to start when either /24 overlaps a network this machine already routes.
ip_int() { local a b c d; IFS=. read -r a b c d <<<"$1"; echo $(((a << 24) + (b << 16) + (c << 8) + d)); }

overlaps() { # overlaps NET/LEN OTHER/LEN
    local n1=${1%/*} l1=${1#*/} n2=${2%/*} l2=${2#*/} l m
    [[ $1 == */* ]] || l1=32
    [[ $2 == */* ]] || l2=32
    l=$((l1 < l2 ? l1 : l2))
    ((l == 0)) && return 0
    m=$(((0xffffffff << (32 - l)) & 0xffffffff))
    (($(($(ip_int "$n1") & m)) == $(($(ip_int "$n2") & m))))
}

check_networks() {
    local net line dst dev
    for net in "$MGMT_NET" "$DATA_NET"; do
        # Every route of every table (local and broadcast routes too, so 127.0.0.0/8 counts);
        # a default route is not a network; the rig's own bridges are not a clash.
        while read -r line; do
            [[ -n $line ]] || continue
            dst=$(awk '{ d = $1; if (d == "local" || d == "broadcast" || d == "unicast" || d == "anycast" || d == "multicast") d = $2; print d }' <<<"$line")
            dev=$(sed -n 's/.* dev \([^ ]*\).*/\1/p' <<<"$line")
            [[ $dst == default || $dst == 0.0.0.0/0 ]] && continue
            [[ $dev == "$BR_MGMT" || $dev == "$BR_DATA" ]] && continue
            [[ $dst =~ ^[0-9.]+(/[0-9]+)?$ ]] || continue
            if overlaps "$net" "$dst"; then
                die "network $net overlaps $dst, which this machine already routes ($line); set HALO_MULTIHOST_MGMT_NET / HALO_MULTIHOST_DATA_NET to free /24s"
            fi
        done < <(ip -4 route show table all 2>/dev/null)
    done
}

# ---------------------------------------------------------------------------------------------
install_packages() {
    # Another release: built (or found built) by slurm-cluster.sh; munge and iptables from Debian.
    if [[ $SLURM_VERSION != 22.05 ]]; then
        HALO_SLURM_VERSION=$SLURM_VERSION "$SCRIPT_DIR/slurm-cluster.sh" build 9>&- >&2 || die "Slurm $SLURM_VERSION is not built"
    fi
    install_debian_packages "" $([[ $SLURM_VERSION == 22.05 ]] && echo slurm-wlm) munge iptables
}

make_networks() {
    local br h i m d
    for br in "$BR_MGMT" "$BR_DATA"; do
        ip link add "$br" type bridge
        # Bridged frames do not pass through this machine's iptables (bridge-nf-call-iptables).
        ip link set "$br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 2>/dev/null || true
        ip link set "$br" up
    done
    ip addr add "$MGMT.1/24" dev "$BR_MGMT"
    for h in "${HOSTS[@]}"; do
        i=$(ns "$h")
        m=$(veth_mgmt "$h")
        d=$(veth_data "$h")
        ip netns add "$i"
        ip -n "$i" link set lo up
        ip link add "$m" type veth peer name mgmt0 netns "$i"
        ip link add "$d" type veth peer name data0 netns "$i"
        ip link set "$m" master "$BR_MGMT" up
        ip link set "$d" master "$BR_DATA" up
        ip -n "$i" addr add "$(mgmt_addr "$h")/24" dev mgmt0
        ip -n "$i" addr add "$(data_addr "$h")/24" dev data0
        ip -n "$i" link set mgmt0 up
        ip -n "$i" link set data0 up
        # No IPv6 chatter (router solicitations, DAD) on the rig's links.
        ip netns exec "$i" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 >/dev/null 2>&1 || true
    done
}

write_hosts() {
    local h
    {
        echo "# Generated by tests/cluster/multihost.sh: the rig's hosts, bind-mounted as /etc/hosts on each."
        echo "127.0.0.1 localhost"
        for h in "${HOSTS[@]}"; do echo "$(mgmt_addr "$h") $h"; done
        for h in "${HOSTS[@]}"; do echo "$(data_addr "$h") $h-data0"; done
    } >"$STATE/etc/hosts"
    chmod 0644 "$STATE/etc/hosts"
}

# Each host's anchor: a process that holds its UTS and mount namespaces (hostname hN, the rig's
# hosts file over /etc/hosts) inside its network namespace; everything else enters them by pid.
start_anchor() {
    local h=$1 pid
    pid=$(pid_from "$STATE/run/anchor-$h.pid")
    if pid_alive "$pid"; then return 0; fi
    # /sys is mounted again for this network namespace (its /sys/class/net are the host's own
    # interfaces, as NCCL reads them), with this machine's cgroup tree moved back under it
    # (slurmd will not start without /sys/fs/cgroup).
    install -d "$STATE/run/cgroup-$h"
    nsenter --net="/run/netns/$(ns "$h")" unshare --uts --mount --propagation private -- \
        bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts && mount --rbind /sys/fs/cgroup "$4" &&
            mount -t sysfs sysfs /sys && mount --move "$4" /sys/fs/cgroup && echo $$ > "$3" && exec sleep infinity' \
        halo-anchor "$h" "$STATE/etc/hosts" "$STATE/run/anchor-$h.pid" "$STATE/run/cgroup-$h" </dev/null >>"$STATE/log/anchor-$h.log" 2>&1 9>&- &
    local t
    for ((t = 0; t < 50; t++)); do
        pid=$(pid_from "$STATE/run/anchor-$h.pid")
        pid_alive "$pid" && [[ $(readlink "/proc/$pid/ns/uts") != $(readlink /proc/self/ns/uts) ]] && return 0
        sleep 0.1
    done
    die "the anchor of $h did not start (unshare --uts --mount)"
}

on_host() { # on_host HOST CMD...: the host's network, hostname and hosts file
    local h=$1 pid
    shift
    pid=$(pid_from "$STATE/run/anchor-$h.pid")
    pid_alive "$pid" || die "$h is not up (no anchor process); run '$0 up'"
    nsenter -t "$pid" --net --uts --mount -- "$@"
}

write_conf() {
    local tmp=$1 h
    cat >"$tmp" <<EOF
# Generated by tests/cluster/multihost.sh - edits are overwritten.
ClusterName=halomh
SlurmctldHost=localhost($MGMT.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
$(common_slurm_conf)
# Job ids apart from the suite's own clusters' (1..1000, tests/cluster/cluster.py): tests that find a job's
# processes by SLURM_JOB_ID in /proc run beside the rig on this one host.
FirstJobId=100001
# A cut host is DOWN 20-30 s after it stops answering (slurmctld pings every SlurmdTimeout/3).
SlurmdTimeout=20
MessageTimeout=5
EOF
    for h in "${HOSTS[@]}"; do
        echo "NodeName=$h NodeHostname=$h NodeAddr=$(mgmt_addr "$h") CPUs=2 RealMemory=2048 State=UNKNOWN" >>"$tmp"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$tmp"
}

start_munge() {
    local pid
    pid=$(pid_from "$MUNGE_DIR/munged.pid")
    if pid_alive "$pid"; then return 0; fi
    install -d -o munge -g munge -m 0755 "$MUNGE_DIR" /run/munge
    [[ -s $MUNGE_DIR/munge.key ]] || dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    chown munge:munge "$MUNGE_DIR/munge.key"
    chmod 0400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    runuser -u munge -- munged --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" 9>&- ||
        { tail -n 20 "$MUNGE_DIR/munged.log" >&2 || true; die "munged failed to start"; }
}

start_daemons() {
    export SLURM_CONF=$CONF
    start_munge
    # A clean start (-c), on the empty spool up left (cmd_up says why).
    pid_alive "$(pid_from "$STATE/run/slurmctld.pid")" ||
        slurmctld -c 9>&- || { tail -n 30 "$STATE/log/slurmctld.log" >&2 || true; die "slurmctld failed to start"; }
    local h
    for h in "${HOSTS[@]}"; do
        pid_alive "$(pid_from "$STATE/run/slurmd-$h.pid")" && continue
        on_host "$h" slurmd -N "$h" 9>&- || { tail -n 30 "$STATE/log/slurmd-$h.log" >&2 || true; die "slurmd -N $h failed to start"; }
    done
}

wait_idle() {
    local deadline=$((SECONDS + UP_TIMEOUT)) out="" bad
    while ((SECONDS < deadline)); do
        out=$(sinfo -h -N -o '%N %T' 2>&1 || true)
        bad=$(awk 'NF==2 && $2 !~ /^(idle|allocated|mixed|completing)$/' <<<"$out" | wc -l)
        if (($(grep -c '^h[0-9]' <<<"$out") == ${#HOSTS[@]})) && ((bad == 0)); then return 0; fi
        awk '$2 ~ /drain|down/ {print $1}' <<<"$out" | while read -r n; do
            scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        done
        sleep 1
    done
    log "hosts not idle after ${UP_TIMEOUT}s; sinfo says:"
    echo "$out" >&2
    local f
    for f in "$STATE"/log/*.log; do echo "---- tail $f" >&2; tail -n 15 "$f" >&2; done
    die "the rig did not come up (run '$0 down')"
}

print_env() {
    echo "export SLURM_CONF=$CONF"
    echo "export HALO_MULTIHOST_DIR=$STATE"
    echo "export HALO_MULTIHOST_HOSTS='${HOSTS[*]}'"
    echo "export HALO_MULTIHOST_MGMT_NET=$MGMT_NET"
    echo "export HALO_MULTIHOST_DATA_NET=$DATA_NET"
    echo "export HALO_SLURM_VERSION=$SLURM_VERSION"
    [[ $SLURM_VERSION == 22.05 ]] || echo "export PATH=$PATH"
}

# Held for up and down (and by the tests around their use of the rig, who then set
# HALO_MULTIHOST_LOCK_HELD=1 for the commands they run).
# fd 9 holds it: every daemon is started with 9>&- so that none holds the lock for its life.
take_lock() {
    [[ ${HALO_MULTIHOST_LOCK_HELD:-0} == 1 ]] && return 0
    exec 9>>"$LOCK"
    flock -w 600 9 || die "the rig's lock $LOCK was not free for 600 s"
}

healthy() {
    [[ -f $CONF ]] || return 1
    # The release its daemons run (written at up): another's are taken down and this one's started.
    [[ $(cat "$STATE/release" 2>/dev/null) == "$SLURM_VERSION" ]] || return 1
    pid_alive "$(pid_from "$MUNGE_DIR/munged.pid")" || return 1
    pid_alive "$(pid_from "$STATE/run/slurmctld.pid")" || return 1
    local h
    for h in "${HOSTS[@]}"; do
        ip netns list 2>/dev/null | grep -q "^$(ns "$h")\b" || return 1
        pid_alive "$(pid_from "$STATE/run/anchor-$h.pid")" || return 1
        pid_alive "$(pid_from "$STATE/run/slurmd-$h.pid")" || return 1
    done
    ip link show "$BR_MGMT" >/dev/null 2>&1 && ip link show "$BR_DATA" >/dev/null 2>&1
}

cmd_up() {
    local fd
    for fd in /proc/$$/fd/*; do
        fd=${fd##*/}
        if ((fd > 2 && fd != 255)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    [[ $(id -u) == 0 ]] || die "needs root (network namespaces, bridges)"
    take_lock
    check_networks
    if healthy; then
        write_hosts  # rewritten in place: the hosts' bind mounts see it
        log "already up"
        print_env
        return 0
    fi
    # Whatever a crashed or half-made rig left is removed first, its daemons' state too. up always starts
    # clean (-c), and what a spool keeps would get in the way: another release's state stops slurmctld at
    # once (26.05 after 22.05: "fatal: Can not recover assoc_usage state, incompatible version"; the
    # cluster name it recorded, "halomh|ID": CLUSTER NAME MISMATCH; slurmd: "protocol_version 0 not
    # supported"), and -c still numbers on from the last job id in job_state (read_config.c:
    # load_last_job_id), out of FirstJobId's band.
    down_all quiet
    rm -rf "$STATE/spool"
    install_packages
    install -d "$STATE" "$STATE/etc" "$STATE/log" "$STATE/run" "$STATE/spool/ctld"
    local h
    for h in "${HOSTS[@]}"; do install -d "$STATE/spool/$h"; done
    write_conf "$CONF"
    echo "$SLURM_VERSION" >"$STATE/release"
    write_hosts
    export SLURM_CONF=$CONF
    make_networks
    for h in "${HOSTS[@]}"; do start_anchor "$h"; done
    start_daemons
    wait_idle
    log "up: $(sinfo -h -N -o '%N=%T' | tr '\n' ' ')"
    print_env
}

# Every process of the rig: those in its network namespaces (the anchors, slurmd, slurmstepd, the
# ranks, a delayer), and munged/slurmctld by pid file, or by this state dir in their command
# line or environment (slurmscriptd inherits SLURM_CONF). Nothing else is touched.
our_pids() {
    local h f p d comm
    for h in "${HOSTS[@]}"; do ip netns pids "$(ns "$h")" 2>/dev/null || true; done
    for f in "$STATE"/run/*.pid "$MUNGE_DIR/munged.pid"; do
        p=$(pid_from "$f" 2>/dev/null)
        pid_alive "$p" && echo "$p"
    done
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        comm=$(cat "$d/comm" 2>/dev/null) || continue
        case $comm in munged | slurmctld | slurmscriptd | slurmd | slurmstepd) ;; *) continue ;; esac
        if is_ours "$p"; then echo "$p"; fi
    done
}

down_all() {
    local quiet=${1:-}
    export SLURM_CONF=$CONF
    if pid_alive "$(pid_from "$STATE/run/slurmctld.pid")"; then
        local jobs
        jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null | tr '\n' ' ' || true)
        # shellcheck disable=SC2086
        [[ -z ${jobs// /} ]] || timeout 10 scancel $jobs 2>/dev/null || true
    fi
    local round pids
    for round in TERM TERM TERM TERM TERM TERM KILL KILL KILL; do
        pids=$(our_pids | sort -u | { grep -vx "$$" || true; } | tr "\n" " ")
        [[ -z ${pids// /} ]] && break
        # shellcheck disable=SC2086
        kill -s "$round" $pids 2>/dev/null || true
        sleep 0.5
    done
    pids=$(our_pids | sort -u | tr '\n' ' ')
    [[ -z ${pids// /} ]] || { ps -o pid,comm,args -p "${pids// /,}" >&2 || true; die "processes left after down: $pids"; }
    local h l
    for h in "${HOSTS[@]}"; do
        ip netns del "$(ns "$h")" 2>/dev/null || true
    done
    for l in "${HOSTS[@]/#/hm-}"; do
        ip link del "$l-m" 2>/dev/null || true
        ip link del "$l-d" 2>/dev/null || true
    done
    ip link del "$BR_MGMT" 2>/dev/null || true
    ip link del "$BR_DATA" 2>/dev/null || true
    rm -f "$STATE"/run/*.pid "$MUNGE_DIR/munged.pid" "$STATE"/run/delay-*
    # Verify: nothing of the rig is left in this machine's network configuration.
    local left
    left=$({ ip netns list 2>/dev/null | grep -E "^$NS_PREFIX(h[0-9])\b" || true
        ip -o link show 2>/dev/null | grep -oE "(hm-h[0-9]-[md]|$BR_MGMT|$BR_DATA)[:@]" || true; })
    [[ -z $left ]] || die "left after down: $left"
    [[ -n $quiet ]] || log "down: no process, namespace, bridge or veth of the rig left"
}

cmd_down() {
    take_lock
    down_all
}

# cut: this machine's ends of the host's two veth pairs go down, so the host's own interfaces lose
# their carrier: its packets are dropped at its NICs and nothing reaches it, while every process
# on it runs on, as behind a pulled cable. Its addresses and routes stay.
# `cut HOST data0` (or mgmt0) cuts that network alone.
links_of() {
    case ${2:-both} in
        both) veth_mgmt "$1"; veth_data "$1" ;;
        mgmt0) veth_mgmt "$1" ;;
        data0) veth_data "$1" ;;
        *) die "no network '$2' (mgmt0 or data0)" ;;
    esac
}

cmd_cut() {
    local h=$1 l
    host_index "$h" >/dev/null
    for l in $(links_of "$h" "${2:-}"); do ip link set "$l" down; done
    log "cut $h (${2:-mgmt0 and data0}): its link carries nothing"
}

cmd_heal() {
    local h=$1 l
    host_index "$h" >/dev/null
    for l in $(links_of "$h" "${2:-}"); do ip link set "$l" up; done
    log "healed $h"
}

# delay: this kernel may have no netem qdisc (CONFIG_NET_SCH_NETEM), so the delay is netem's where
# it exists, and otherwise the rig's own: on every other host, each IPv4 packet that arrives on
# data0 from h's data0 address goes to an NFQUEUE (iptables INPUT in that host's namespace) and a
# small program there (multihost_delay.py) lets it go MS later, in order. Either way every packet
# h sends on data0 reaches its peer MS late, as with netem on h's data0 root.
# Not on h's own OUTPUT: netem lets go of a delayed packet's socket memory at once
# (net/sched/sch_netem.c netem_enqueue: skb_orphan_partial when a delay is set), an NFQUEUE on
# the sender does not, so TCP Small Queues held h's sockets to ~2 packets per delay: 1 MB took
# 16 s from h1 to h0 with 50 ms there (70 KB/s), 0.33 s held on the receiving side.
delay_queue() { echo $((70 + $(host_index "$1"))); }  # one queue per delayed host, in each peer

undelay() {
    local h=$1 g i q pidf pid src
    i=$(ns "$h")
    q=$(delay_queue "$h")
    src=$(data_addr "$h")
    ip netns exec "$i" tc qdisc del dev data0 root 2>/dev/null || true
    for g in "${HOSTS[@]}"; do
        [[ $g == "$h" ]] && continue
        while ip netns exec "$(ns "$g")" iptables -w -D INPUT -i data0 -s "$src" -j NFQUEUE --queue-num "$q" --queue-bypass 2>/dev/null; do :; done
        pidf=$STATE/run/delay-$h-at-$g.pid
        pid=$(pid_from "$pidf")
        if pid_alive "$pid"; then kill "$pid" 2>/dev/null || true; fi
        rm -f "$pidf"
    done
}

cmd_delay() {
    local h=$1 ms=$2 g q pidf logf t
    host_index "$h" >/dev/null
    [[ $ms =~ ^[0-9]+$ ]] || die "delay takes whole milliseconds, not '$ms'"
    undelay "$h"
    if ((ms == 0)); then log "delay $h: none"; return 0; fi
    if ip netns exec "$(ns "$h")" tc qdisc add dev data0 root netem delay "${ms}ms" 2>/dev/null; then
        log "delay $h: +$ms ms on data0 (netem)"
        return 0
    fi
    command -v iptables >/dev/null || install_packages
    q=$(delay_queue "$h")
    for g in "${HOSTS[@]}"; do
        [[ $g == "$h" ]] && continue
        pidf=$STATE/run/delay-$h-at-$g.pid
        logf=$STATE/log/delay-$h-at-$g.log
        : >"$logf"
        on_host "$g" setsid python3 "$SCRIPT_DIR/multihost_delay.py" --queue "$q" --delay-ms "$ms" \
            --pid-file "$pidf" </dev/null >>"$logf" 2>&1 9>&- &
        for ((t = 0; t < 50; t++)); do
            grep -q "^bound" "$logf" 2>/dev/null && [[ -s $pidf ]] && break
            sleep 0.1
        done
        [[ -s $pidf ]] || { tail -n 5 "$logf" >&2 || true; undelay "$h"; die "the delay program did not start on $g"; }
        ip netns exec "$(ns "$g")" iptables -w -A INPUT -i data0 -s "$(data_addr "$h")" -j NFQUEUE --queue-num "$q" --queue-bypass
    done
    log "delay $h: +$ms ms on every packet it sends on data0 (NFQUEUE at its peers; this kernel has no netem)"
}

cmd_status() {
    export SLURM_CONF=$CONF
    local rc=0 h i p state delay release
    # Another release's daemons than the one asked for (HALO_SLURM_VERSION) are not this rig: up replaces them.
    release=$(cat "$STATE/release" 2>/dev/null || echo none)
    echo "release $release"
    [[ $release == "$SLURM_VERSION" ]] || { echo "(not the release asked for: $SLURM_VERSION)"; rc=1; }
    for f in "$MUNGE_DIR/munged.pid" "$STATE/run/slurmctld.pid"; do
        p=$(pid_from "$f")
        if pid_alive "$p"; then echo "running $(basename "$f" .pid) pid $p"; else echo "dead    $(basename "$f" .pid)"; rc=1; fi
    done
    for h in "${HOSTS[@]}"; do
        i=$(ns "$h")
        if ! ip netns list 2>/dev/null | grep -q "^$i\b"; then echo "$h: no namespace $i"; rc=1; continue; fi
        state=linked
        [[ $(cat "/sys/class/net/$(veth_mgmt "$h")/operstate" 2>/dev/null) == up ]] || state=cut
        delay=""
        for f in "$STATE"/run/delay-"$h"-at-*.pid; do
            [[ -e $f ]] || continue
            delay=$(tr '\0' ' ' <"/proc/$(pid_from "$f")/cmdline" 2>/dev/null | sed -n 's/.*--delay-ms \([0-9]*\).*/\1 ms/p' || true)
            break
        done
        [[ -n $delay ]] || delay=$(ip netns exec "$i" tc qdisc show dev data0 2>/dev/null | sed -n 's/.*delay \([0-9.]*ms\).*/\1/p')
        p=$(pid_from "$STATE/run/slurmd-$h.pid")
        pid_alive "$p" || rc=1
        printf '%s: mgmt0 %s data0 %s %s, slurmd %s%s\n' "$h" "$(mgmt_addr "$h")" "$(data_addr "$h")" "$state" \
            "$(pid_alive "$p" && echo "pid $p" || echo dead)" "${delay:+, data0 delay $delay}"
    done
    if pid_alive "$(pid_from "$STATE/run/slurmctld.pid")"; then timeout 10 sinfo -N -o '%N %T' || rc=1; fi
    return $rc
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    env) print_env ;;
    status) cmd_status ;;
    cut) [[ $# == 2 || $# == 3 ]] || die "usage: $0 cut HOST [mgmt0|data0]"; cmd_cut "$2" "${3:-}" ;;
    heal) [[ $# == 2 || $# == 3 ]] || die "usage: $0 heal HOST [mgmt0|data0]"; cmd_heal "$2" "${3:-}" ;;
    delay) [[ $# == 3 ]] || die "usage: $0 delay HOST MS"; cmd_delay "$2" "$3" ;;
    exec) [[ $# -ge 3 ]] || die "usage: $0 exec HOST CMD..."; h=$2; shift 2; host_index "$h" >/dev/null; on_host "$h" "$@" ;;
    *) echo "usage: $0 up|down|env|status|cut HOST|heal HOST|delay HOST MS|exec HOST CMD..." >&2; exit 2 ;;
esac
