# Sourced by slurm-cluster.sh and multihost.sh: Debian packages installed when missing, one
# installer at a time on this machine.
#
# make test starts the 22.05 cluster (slurm-wlm, munge, ...) and the multi-host rig (munge,
# iptables) from two pytest workers at once, and on a fresh machine both found packages missing:
# the second apt-get stopped at once on dpkg's lock ("Could not get lock
# /var/lib/dpkg/lock-frontend"), and every rig test was an ERROR (2026-12-07). So every installer
# here holds one flock for its update and install, and asks again inside it what is still missing
# (the other may have installed it meanwhile); an apt-get of someone else's is waited for
# (DPkg::Lock::Timeout) instead of failing.
#
# The caller defines log and die.
HALO_APT_LOCK=${HALO_APT_LOCK:-/tmp/halo-sched-apt.lock}
HALO_APT_WAIT_S=${HALO_APT_WAIT_S:-900}

# The packages of "$@" that dpkg does not have installed, one per line.
missing_debian_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

# install_debian_packages WHAT PKG...: install those of PKG that are missing (WHAT names them in the log).
install_debian_packages() {
    local what=$1
    shift
    local missing
    missing=$(missing_debian_packages "$@")
    [[ -z $missing ]] && return 0
    [[ $(id -u) == 0 ]] || die "need root to apt-get install $(echo $missing)"
    (
        flock -w "$HALO_APT_WAIT_S" 8 || die "another install held $HALO_APT_LOCK for ${HALO_APT_WAIT_S} s"
        missing=$(missing_debian_packages "$@")
        [[ -z $missing ]] && exit 0
        log "installing ${what:+$what }$(echo $missing) with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        local apt=(apt-get -q -o "DPkg::Lock::Timeout=$HALO_APT_WAIT_S")
        # A daemon a package's postinst starts must not hold this lock (8) or the rig's (9) for its life.
        "${apt[@]}" update >/dev/null 8>&- 9>&- || die "apt-get update failed"
        # $missing is dpkg's package names, one per line: split on purpose.
        # shellcheck disable=SC2086
        "${apt[@]}" install -y --no-install-recommends $missing >/dev/null 8>&- 9>&- || die "apt-get install $(echo $missing) failed"
    ) 8>>"$HALO_APT_LOCK"
}
