#!/usr/bin/env bash
# netns.sh: the hosts of the multinode CI cluster, emulated on this machine.
#
#   netns.sh up      create the bridge and each host's namespaces (idempotent)
#   netns.sh down    stop everything running in them; remove them, the bridge
#                    and the hosts' /run and logs. Their configuration and Slurm
#                    state stay, so job ids go on where they stopped: slurmdbd
#                    keeps every job record, and a restarted count would give
#                    new jobs the ids of recorded ones.
#   netns.sh purge   down, then the hosts' folders and the cluster's record in
#                    slurmdbd too (job ids then start again at 1)
#   netns.sh status  list the hosts, their addresses and what runs in them
#
# Each host is a network namespace (ip netns) with its own address on the
# bridge, plus a UTS namespace with its own host name: Debian's slurmd runs
# once per host, so each emulated node needs both. The namespaces share this
# machine's filesystem, users, munge daemon and slurmdbd. Nothing is routed
# beyond the bridge: the namespaces have no default route, and the bridge's
# subnet is the only route this machine gets.
# Must match inventories/multinode (host names, ansible_host, slurm_address).
set -euo pipefail

readonly BRIDGE=gpmn0
readonly BRIDGE_ADDRESS=10.47.0.1
readonly PREFIX_LENGTH=24
# host name = namespace name, then its address
readonly HOSTS=("mn-ctl 10.47.0.10" "mn-gpu1 10.47.0.11" "mn-gpu2 10.47.0.12")
readonly RUN_DIR=/run/gpupool-multinode
readonly UTS_DIR=$RUN_DIR/uts
# The hosts' own folders (inventories/multinode/group_vars/all.yml): what goes
# with the hosts, and what stays until a purge.
readonly RUNTIME_FOLDERS=(/var/log/gpupool-multinode "$RUN_DIR/hosts")
readonly KEPT_FOLDERS=(/etc/gpupool-multinode /var/lib/gpupool-multinode)
readonly CLUSTER_NAME=gpupool_mn

log() { echo "netns: $*"; }

uts_bound() { findmnt --noheadings "$1" >/dev/null 2>&1; }

host_up() {
    local name=$1 address=$2 veth=v-$1
    # A half-made host from an interrupted run: start it again from nothing.
    if [ ! -e "/run/netns/$name" ] && ip link show "$veth" >/dev/null 2>&1; then
        ip link delete "$veth"
    fi
    [ -e "/run/netns/$name" ] || ip netns add "$name"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$name"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -netns "$name" link set lo up
    ip -netns "$name" address replace "$address/$PREFIX_LENGTH" dev eth0
    ip -netns "$name" link set eth0 up
    local uts=$UTS_DIR/$name
    if ! uts_bound "$uts"; then
        touch "$uts"
        unshare --uts="$uts" true
    fi
    nsenter --uts="$uts" hostname "$name"
    # The host's own /run, for its daemons' pid files, and its own /etc/slurm,
    # which Slurm's packages would have made on a machine of its own.
    install -d -m 0755 "$RUN_DIR/hosts/$name" "/etc/gpupool-multinode/$name/slurm"
    log "$name is up at $address"
}

up() {
    mkdir -p "$UTS_DIR"
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip address replace "$BRIDGE_ADDRESS/$PREFIX_LENGTH" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local host
    for host in "${HOSTS[@]}"; do
        # shellcheck disable=SC2086 # "name address"
        host_up $host
    done
}

# Every process in a host's network namespace (its slurmd, slurmctld, jobs).
namespace_pids() {
    if [ -e "/run/netns/$1" ]; then ip netns pids "$1" 2>/dev/null || true; fi
}

stop_processes() {
    local name=$1 pids waited=0
    pids=$(namespace_pids "$name")
    [ -n "$pids" ] || return 0
    # SIGTERM first: slurmctld then tells slurmdbd it has gone, so slurmdbd does
    # not keep trying to reach an address that is about to disappear.
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    while [ -n "$(namespace_pids "$name")" ] && [ $waited -lt 20 ]; do
        sleep 1
        waited=$((waited + 1))
    done
    pids=$(namespace_pids "$name")
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
}

down() {
    local host name
    # The controller first, while its nodes still answer it.
    for host in "${HOSTS[@]}"; do
        name=${host%% *}
        stop_processes "$name"
    done
    for host in "${HOSTS[@]}"; do
        name=${host%% *}
        if uts_bound "$UTS_DIR/$name"; then umount "$UTS_DIR/$name"; fi
        rm -f "$UTS_DIR/$name"
        if ip link show "v-$name" >/dev/null 2>&1; then ip link delete "v-$name"; fi
        if [ -e "/run/netns/$name" ]; then ip netns delete "$name"; fi
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
    rm -rf "${RUNTIME_FOLDERS[@]}" "$UTS_DIR"
    log "removed the multinode hosts and bridge $BRIDGE; kept ${KEPT_FOLDERS[*]}"
}

purge() {
    down
    if sacctmgr --noheader --parsable2 show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
        sacctmgr --immediate delete cluster "$CLUSTER_NAME" >/dev/null
    fi
    rm -rf "${KEPT_FOLDERS[@]}"
    log "removed ${KEPT_FOLDERS[*]} and cluster $CLUSTER_NAME from slurmdbd"
}

status() {
    local host name
    for host in "${HOSTS[@]}"; do
        name=${host%% *}
        if [ -e "/run/netns/$name" ]; then
            echo "$name ${host#* }: $(namespace_pids "$name" | xargs -r ps -o comm= -p | sort | uniq -c | xargs)"
        else
            echo "$name: absent"
        fi
    done
}

case ${1:-} in
    up) up ;;
    down) down ;;
    purge) purge ;;
    status) status ;;
    *) echo "usage: $0 up|down|purge|status" >&2; exit 2 ;;
esac
