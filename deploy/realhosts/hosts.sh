#!/usr/bin/env bash
# hosts.sh: fresh Debian 12 servers as systemd containers on a private link,
# for the real-hosts tier (tests/realhosts).
#
#   hosts.sh up NAME ADDRESS      boot a fresh server from the cached image
#                                 (image.sh) at 10.50.0.x; waits for SSH
#   hosts.sh ssh NAME [CMD...]    run CMD on it as `admin` over SSH
#   hosts.sh down NAME            power it off and remove everything of it
#   hosts.sh clean                down every server, the link and the NAT rules
#                                 (also what an interrupted run left)
#   hosts.sh ssh-config           print the ssh options the tests use
#
# Each server is systemd as PID 1 of its own PID, mount, UTS, IPC, network and
# cgroup namespaces, its root (pivot_root) an overlay of the image with an upper layer
# of its own: its own /etc/passwd, machine-id, host keys, Slurm state. Its
# network is a veth on the bridge gpr0 (10.50.0.1/24 on this machine) with NAT
# out through this machine, so apt and PyPI work from inside. `reboot` inside
# ends PID 1 (the kernel kills a PID namespace's init with SIGHUP for a
# restart); the supervisor then boots the same root again in new namespaces,
# units starting as at boot. The kernel is this machine's, which has no NFS:
# the job root is one folder of this machine bind-mounted at /srv/gpupool in
# every server (inventories/realhosts: shared_storage_mode none).
set -euo pipefail

readonly BASE_DIR=${REALHOSTS_BASE_DIR:-/var/tmp/gpupool-realhosts}
readonly BRIDGE=gpr0 BRIDGE_ADDRESS=10.50.0.1 PREFIX_LENGTH=24 NETWORK=10.50.0.0/24
readonly NFT_TABLE=gpupool_realhosts
readonly SSH_DIR=$BASE_DIR/ssh SHARED_DIR=$BASE_DIR/shared SHARED_PATH=/srv/gpupool
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/containers.sh
. "$here/../lib/containers.sh"

log() { echo "realhosts: $(date -u +%H:%M:%S) $*" >&2; }
die() { log "$*"; exit 1; }

host_dir() { echo "$BASE_DIR/hosts/$1"; }
veth_name() { echo "gpr-${1:0:11}"; }
init_pid() { cat "$(host_dir "$1")/init.pid" 2>/dev/null; }

ssh_options() {
    echo -o BatchMode=yes -o IdentitiesOnly=yes -i "$SSH_DIR/id_ed25519" \
        -o UserKnownHostsFile="$SSH_DIR/known_hosts" -o StrictHostKeyChecking=yes \
        -o ConnectTimeout=10 -o ServerAliveInterval=15 -o ServerAliveCountMax=8
}

link_up() {
    mkdir -p "$SSH_DIR" "$SHARED_DIR"
    chmod 0700 "$SSH_DIR"
    chmod 0755 "$SHARED_DIR"
    [ -s "$SSH_DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C gpupool-realhosts -f "$SSH_DIR/id_ed25519"
    touch "$SSH_DIR/known_hosts"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip address replace "$BRIDGE_ADDRESS/$PREFIX_LENGTH" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    [ -s "$BASE_DIR/ip_forward.before" ] || sysctl -n net.ipv4.ip_forward > "$BASE_DIR/ip_forward.before"
    sysctl -q -w net.ipv4.ip_forward=1
    nat_out "$NFT_TABLE" "$NETWORK" "$BRIDGE"
}

# What makes this server itself, written into its own layer before its first boot.
identity() {
    local name=$1 address=$2 root=$3 type file
    write_host_names "$root" "$name"
    for type in ed25519 ecdsa rsa; do
        ssh-keygen -q -t "$type" -N '' -C "root@$name" -f "$root/etc/ssh/ssh_host_${type}_key"
    done
    install -d -o 1000 -g 1000 -m 0700 "$root/home/admin/.ssh"
    install -o 1000 -g 1000 -m 0600 "$SSH_DIR/id_ed25519.pub" "$root/home/admin/.ssh/authorized_keys"
    # This machine's apt sources and settings, then what copy_registry_settings brings.
    if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
        cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
        rm -f "$root/etc/apt/sources.list"
    fi
    for file in /etc/apt/apt.conf.d/99*; do
        [ -f "$file" ] && grep -qiE 'Acquire::(Check|https?::Proxy|IndexTargets)' "$file" && cp "$file" "$root/etc/apt/apt.conf.d/"
    done
    copy_registry_settings "$root"
    sed -i "/^$address /d" "$SSH_DIR/known_hosts"
    for type in ed25519 ecdsa rsa; do
        echo "$address $(cut -d' ' -f1,2 "$root/etc/ssh/ssh_host_${type}_key.pub")" >> "$SSH_DIR/known_hosts"
    done
}

up() {
    local name=$1 address=$2 dir root image
    [[ $name =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "server name must be lower case letters, digits and -: $name"
    [[ $address =~ ^10\.50\.0\.([0-9]{1,3})$ ]] && [ "${BASH_REMATCH[1]}" -ge 2 ] && [ "${BASH_REMATCH[1]}" -le 254 ] ||
        die "address must be in 10.50.0.2-254: $address"
    dir=$(host_dir "$name"); root=$dir/root
    [ ! -e "$dir" ] || die "$dir exists: run '$0 down $name' first"
    image=$("$here/image.sh" path)
    link_up
    mkdir -p "$root" "$dir/upper" "$dir/work"
    echo "$address" > "$dir/address"
    # The image read-only under an overlay: each server starts from an empty
    # upper layer, so nothing of an earlier run stays.
    mount -t overlay "realhosts-$name" -o "lowerdir=$image,upperdir=$dir/upper,workdir=$dir/work" "$root"
    mkdir -p "$root$SHARED_PATH"
    mount --bind "$SHARED_DIR" "$root$SHARED_PATH"
    identity "$name" "$address" "$root"
    setsid "$0" supervise "$name" </dev/null >>"$dir/supervisor.log" 2>&1 &
    local tries
    for tries in $(seq 100); do [ -e "$dir/supervisor.pid" ] && break; sleep 0.1; done
    log "$name booting at $address (root $root)"
}

# PID 1 of the server, booted again whenever it exits for a reboot.
supervise() {
    local name=$1 dir root address veth upid pid status boots=0
    dir=$(host_dir "$name"); root=$dir/root; address=$(cat "$dir/address"); veth=$(veth_name "$name")
    echo $$ > "$dir/supervisor.pid"
    while :; do
        boots=$((boots + 1))
        # pivot_root, not chroot: the kernel refuses a chrooted process user
        # namespaces, which systemd's sandboxing (PrivateUsers=, as in
        # Debian's redis-server unit) needs. Mounts shared, as systemd-nspawn
        # leaves them: systemd does not do it itself in a container, and
        # LoadCredential= needs it (the credentials' ramfs is mounted in a
        # child namespace and reaches the unit's by propagation).
        unshare --pid --fork --mount --uts --ipc --net --cgroup --mount-proc="$root/proc" \
            /bin/bash -c 'set -e; cd "$1"; mkdir -p .host; pivot_root . .host; cd /
                          umount -l /.host; rmdir /.host; mount --make-rshared /
                          exec /usr/bin/env -i container=gpupool-realhosts /lib/systemd/systemd --system' \
            pivot "$root" </dev/null >>"$dir/console.log" 2>&1 &
        upid=$!
        pid=$(systemd_of "$upid")
        if [ -z "$pid" ]; then
            log "$name: systemd did not start (boot $boots)"
            kill -KILL "$upid" 2>/dev/null || true
            break
        fi
        ip link delete "$veth" 2>/dev/null || true
        ip link add "$veth" type veth peer name eth0 netns "$pid"
        ip link set "$veth" master "$BRIDGE"
        ip link set "$veth" up
        nsenter -t "$pid" -n ip link set lo up
        nsenter -t "$pid" -n ip address add "$address/$PREFIX_LENGTH" dev eth0
        nsenter -t "$pid" -n ip link set eth0 up
        nsenter -t "$pid" -n ip route add default via "$BRIDGE_ADDRESS"
        echo "$pid" > "$dir/init.pid"
        echo "$boots" > "$dir/boots"
        log "$name: boot $boots, systemd pid $pid"
        status=0
        wait "$upid" || status=$?
        rm -f "$dir/init.pid"
        log "$name: PID 1 ended with status $status"
        # 129: killed by SIGHUP, which is how the kernel ends a PID
        # namespace's init that asked reboot(2) for a restart.
        [ "$status" -eq 129 ] && [ ! -e "$dir/stopping" ] || break
    done
    rm -f "$dir/supervisor.pid"
}

# Up to the point where SSH and sudo answer.
wait_ssh() {
    local name=$1 dir address tries
    dir=$(host_dir "$name"); address=$(cat "$dir/address")
    for tries in $(seq "${REALHOSTS_BOOT_TIMEOUT:-300}"); do
        [ -e "$dir/supervisor.pid" ] || { tail -n 30 "$dir/supervisor.log" "$dir/console.log" >&2; die "$name is not running"; }
        # shellcheck disable=SC2046
        if ssh $(ssh_options) -o ConnectTimeout=3 "admin@$address" sudo -n true 2>/dev/null; then
            log "$name answers on SSH"
            return 0
        fi
        sleep 1
    done
    tail -n 30 "$dir/console.log" >&2
    die "$name did not answer on SSH in time"
}

ssh_to() {
    local name=$1 dir; shift
    dir=$(host_dir "$name")
    [ -s "$dir/address" ] || die "$name is not up"
    # shellcheck disable=SC2046
    exec ssh $(ssh_options) "admin@$(cat "$dir/address")" "$@"
}

down() {
    local name=$1 dir pid tries
    dir=$(host_dir "$name")
    if [ -d "$dir" ]; then
        touch "$dir/stopping"
        pid=$(cat "$dir/init.pid" 2>/dev/null || true)
        # The namespaces' PID 1 takes every process of the server with it.
        [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
        for tries in $(seq 100); do [ -e "$dir/supervisor.pid" ] || break; sleep 0.1; done
        pid=$(cat "$dir/supervisor.pid" 2>/dev/null || true)
        [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
    fi
    ip link delete "$(veth_name "$name")" 2>/dev/null || true
    if [ -s "$dir/address" ] && [ -f "$SSH_DIR/known_hosts" ]; then
        sed -i "/^$(cat "$dir/address") /d" "$SSH_DIR/known_hosts"
    fi
    remove_container_dir "$dir"
    remove_slurm_cgroups "$name"
    log "$name is down"
}

clean() {
    local dir
    if [ -d "$BASE_DIR/hosts" ]; then
        for dir in "$BASE_DIR"/hosts/*/; do
            [ -d "$dir" ] && down "$(basename "$dir")"
        done
    fi
    ip link delete "$BRIDGE" 2>/dev/null || true
    nft delete table ip "$NFT_TABLE" 2>/dev/null || true
    if [ -s "$BASE_DIR/ip_forward.before" ]; then
        sysctl -q -w "net.ipv4.ip_forward=$(cat "$BASE_DIR/ip_forward.before")" || true
    fi
    rm -rf --one-file-system "$BASE_DIR"
    return 0
}

case ${1:-} in
    up) up "${2:?server name}" "${3:?address}" && wait_ssh "$2" ;;
    boot) up "${2:?server name}" "${3:?address}" ;;
    wait) wait_ssh "${2:?server name}" ;;
    supervise) supervise "${2:?server name}" ;;
    ssh) name=${2:?server name}; shift 2; ssh_to "$name" "$@" ;;
    ssh-config) ssh_options ;;
    down) down "${2:?server name}" ;;
    clean) clean ;;
    *) echo "usage: $0 up|boot|wait|ssh|down NAME [...] | clean | ssh-config" >&2; exit 2 ;;
esac
