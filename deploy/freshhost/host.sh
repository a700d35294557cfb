#!/usr/bin/env bash
# host.sh: a fresh minimal Debian 12 host on this machine, with systemd as PID 1.
#
#   host.sh up NAME          unpack a fresh copy of the cached image (image.sh)
#                            and boot it; prints its root directory
#   host.sh exec NAME CMD..  run CMD in it as root, in a clean login environment
#                            (what an SSH session as root has, XDG_RUNTIME_DIR included)
#   host.sh down NAME        stop it and remove everything of it (also after a
#                            half-made `up`)
#   host.sh clean            down every host an interrupted run left
#
# The host is a container: its own PID, mount, UTS, IPC and network namespaces,
# chrooted into the unpacked image, with systemd as its PID 1. Its network is a
# veth pair to this machine with NAT, so it reaches the same package registries
# (apt, PyPI) while its Slurm, MariaDB and API ports stay apart from this
# machine's. Every run starts from the image: fresh /etc/passwd, no state.
set -euo pipefail

readonly BASE_DIR=${FRESHHOST_BASE_DIR:-/var/tmp/gpupool-freshhost}
readonly HOST_ADDRESS=10.49.0.1 GUEST_ADDRESS=10.49.0.2 PREFIX_LENGTH=30
readonly NFT_TABLE=gpupool_freshhost
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/containers.sh
. "$here/../lib/containers.sh"

log() { echo "freshhost: $*" >&2; }
die() { log "$*"; exit 1; }

host_dir() { echo "$BASE_DIR/$1"; }
veth_name() { echo "vfh-${1:0:10}"; }
init_pid() { cat "$(host_dir "$1")/init.pid" 2>/dev/null; }

up() {
    local name=$1 dir root tarball image pid veth
    [[ $name =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "host name must be lower case letters, digits and -: $name"
    dir=$(host_dir "$name"); root=$dir/root; veth=$(veth_name "$name")
    [ ! -e "$dir" ] || die "$dir exists: run '$0 down $name' first"
    # One at a time: the host's addresses and NAT table are fixed.
    local other
    for other in "$BASE_DIR"/*/; do
        [ -d "$other" ] || continue
        die "another fresh host is up ($(basename "$other")): run '$0 down $(basename "$other")' first"
    done
    tarball=$("$here/image.sh" path)
    # The image unpacked once beside its tarball, read-only under an overlay:
    # each host starts from an empty upper layer, so nothing of an earlier one
    # stays, and starting takes no copy of 850 MB.
    image=${tarball%.tar.zst}.root
    if [ ! -d "$image" ]; then
        rm -rf "$image.part"; mkdir -p "$image.part"
        zstd -q -d -c "$tarball" | tar --numeric-owner -x -C "$image.part"
        mv "$image.part" "$image"
    fi
    mkdir -p "$root" "$dir/upper" "$dir/work"
    mount -t overlay "freshhost-$name" -o "lowerdir=$image,upperdir=$dir/upper,workdir=$dir/work" "$root"
    # dbus-daemon hangs in activation here (the sandbox's kernel refuses it
    # inotify); nothing make run does needs the system bus.
    mask_units "$root" dbus.service dbus.socket e2scrub_reap.service
    write_host_names "$root" "$name"
    copy_registry_settings "$root"

    # PID 1 of its own namespaces; setsid so that nothing here signals it.
    setsid unshare --pid --fork --mount --uts --ipc --net --cgroup --mount-proc="$root/proc" \
        chroot "$root" /usr/bin/env -i container=gpupool-freshhost /lib/systemd/systemd --system \
        </dev/null >"$dir/console.log" 2>&1 &
    echo $! > "$dir/unshare.pid"
    pid=$(systemd_of "$(cat "$dir/unshare.pid")")
    [ -n "$pid" ] || { cat "$dir/console.log" >&2; die "systemd did not start in $root"; }
    echo "$pid" > "$dir/init.pid"

    # Its network: a veth pair, NAT out through this machine.
    ip link delete "$veth" 2>/dev/null || true
    ip link add "$veth" type veth peer name eth0 netns "$pid"
    ip address replace "$HOST_ADDRESS/$PREFIX_LENGTH" dev "$veth"
    ip link set "$veth" up
    nsenter -t "$pid" -n ip link set lo up
    nsenter -t "$pid" -n ip address add "$GUEST_ADDRESS/$PREFIX_LENGTH" dev eth0
    nsenter -t "$pid" -n ip link set eth0 up
    nsenter -t "$pid" -n ip route add default via "$HOST_ADDRESS"
    sysctl -n net.ipv4.ip_forward > "$dir/ip_forward.before"
    sysctl -q -w net.ipv4.ip_forward=1
    nat_out "$NFT_TABLE" "$GUEST_ADDRESS/$PREFIX_LENGTH" "$veth"

    # systemd up far enough to run commands (degraded: container units fail).
    local tries
    for tries in $(seq 300); do
        state=$(nsenter -t "$pid" -m -u -i -n -p -r -w /usr/bin/systemctl is-system-running 2>/dev/null || true)
        case $state in running|degraded) break ;; esac
        sleep 0.2
    done
    case $state in running|degraded) ;; *) cat "$dir/console.log" >&2; die "systemd in $name did not come up (state: ${state:-none})" ;; esac
    log "$name is up (systemd pid $pid, $state), root $root"
    echo "$root"
}

exec_in() {
    local name=$1 pid; shift
    pid=$(init_pid "$name") || die "$name is not up"
    # A root login's environment, as sshd and pam_systemd give it.
    mkdir -p "$(host_dir "$name")/root/run/user/0"
    chmod 0700 "$(host_dir "$name")/root/run/user/0"
    exec nsenter -t "$pid" -m -u -i -n -p -r -w -- /usr/bin/env -i \
        HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        XDG_RUNTIME_DIR=/run/user/0 XDG_SESSION_TYPE=tty XDG_SESSION_CLASS=user \
        "$@"
}

down() {
    local name=$1 dir pid veth
    dir=$(host_dir "$name"); veth=$(veth_name "$name")
    if [ -f "$dir/unshare.pid" ]; then
        pid=$(cat "$dir/unshare.pid")
        # The namespaces' PID 1 takes every process of the host with it.
        pkill -KILL -P "$pid" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
        local tries
        for tries in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    ip link delete "$veth" 2>/dev/null || true
    nft delete table ip "$NFT_TABLE" 2>/dev/null || true
    if [ -s "$dir/ip_forward.before" ]; then
        sysctl -q -w "net.ipv4.ip_forward=$(cat "$dir/ip_forward.before")" || true
    fi
    remove_container_dir "$dir"
    remove_slurm_cgroups "$name"
    log "$name is down"
}

# Every host an interrupted run left.
clean() {
    local dir
    for dir in "$BASE_DIR"/*/; do
        [ -d "$dir" ] && down "$(basename "$dir")"
    done
    return 0
}

case ${1:-} in
    up) up "${2:?host name}" ;;
    clean) clean ;;
    exec) name=${2:?host name}; shift 2; exec_in "$name" "$@" ;;
    down) down "${2:?host name}" ;;
    *) echo "usage: $0 up|exec|down NAME [CMD...] | clean" >&2; exit 2 ;;
esac
