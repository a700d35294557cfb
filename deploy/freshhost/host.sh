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

log() { echo "freshhost: $*" >&2; }
die() { log "$*"; exit 1; }

host_dir() { echo "$BASE_DIR/$1"; }
veth_name() { echo "vfh-${1:0:10}"; }
init_pid() { cat "$(host_dir "$1")/init.pid" 2>/dev/null; }

up() {
    local name=$1 dir root tarball image pid veth unit
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
    for unit in dbus.service dbus.socket e2scrub_reap.service; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done

    # What Debian's installer leaves: the host's name, found in /etc/hosts.
    echo "$name" > "$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$name" > "$root/etc/hosts"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    # The package registries as this machine reaches them: the certificate
    # authorities it adds (a TLS-inspecting egress proxy's), its pip certificate
    # and constraints (local wheel folders stay here).
    if [ -f /etc/pip.conf ]; then
        grep -vE '^\s*(find-links|extra-index-url)\s*=' /etc/pip.conf > "$root/etc/pip.conf" || true
    fi
    if [ -d /etc/xdg/pip ]; then
        mkdir -p "$root/etc/xdg/pip"
        for file in /etc/xdg/pip/*; do
            grep -vE '^\s*(find-links|extra-index-url)\s*=' "$file" > "$root/etc/xdg/pip/$(basename "$file")" || true
        done
    fi

    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" /usr/sbin/update-ca-certificates >/dev/null 2>&1 ||
            die "update-ca-certificates failed in $root"
    fi

    # PID 1 of its own namespaces; setsid so that nothing here signals it.
    setsid unshare --pid --fork --mount --uts --ipc --net --cgroup --mount-proc="$root/proc" \
        chroot "$root" /usr/bin/env -i container=gpupool-freshhost /lib/systemd/systemd --system \
        </dev/null >"$dir/console.log" 2>&1 &
    echo $! > "$dir/unshare.pid"
    # unshare forks once: its child becomes the namespaces' PID 1 when it execs systemd.
    local tries
    pid=
    for tries in $(seq 100); do
        pid=$(pgrep -P "$(cat "$dir/unshare.pid")" | head -1 || true)
        [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd ] && break
        pid=
        sleep 0.1
    done
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
    nft -f - <<NFT
table ip $NFT_TABLE
delete table ip $NFT_TABLE
table ip $NFT_TABLE {
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr $GUEST_ADDRESS/$PREFIX_LENGTH oifname != "$veth" masquerade
    }
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname "$veth" ip daddr { 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 } ip daddr != $(awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf) drop
    }
}
NFT

    # systemd up far enough to run commands (degraded: container units fail).
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
    if [ -d "$dir" ]; then
        # Mounts made inside stayed in the host's own mount namespace.
        if findmnt -rn -o TARGET | grep -q "^$dir/"; then
            findmnt -rn -o TARGET | grep "^$dir/" | sort -r | xargs -r -n1 umount -l
        fi
        rm -rf --one-file-system "$dir"
    fi
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
