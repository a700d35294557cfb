# containers.sh: what the fresh-host (deploy/freshhost) and real-hosts
# (deploy/realhosts) tiers both do to run a Debian 12 root as a systemd
# container on this machine. Sourced, not run; each function says what it
# needs. The callers define log and die.

# The archive this machine's apt uses (deb822 or one-line sources), so the
# containers reach the same package registry; $1 overrides it when set.
debian_mirror() {
    local uri
    uri=$(grep -hoE '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$2 ~ /\/debian\/?$/ {print $2; exit}')
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    echo "${1:-${uri:-http://deb.debian.org/debian}}"
}

# Units a container cannot run (no devices, a network set up from outside,
# no consoles), masked in the root ($1).
mask_units() {
    local root=$1 unit; shift
    for unit in "$@"; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done
}

# The host's own name, found in /etc/hosts as Debian's installer leaves it,
# and this machine's resolver.
write_host_names() {
    local root=$1 name=$2
    echo "$name" > "$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$name" > "$root/etc/hosts"
    rm -f "$root/etc/resolv.conf"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
}

# The package registries as this machine reaches them: the certificate
# authorities it adds (a TLS-inspecting egress proxy's) and its pip settings,
# less the local wheel folders, which stay here.
copy_registry_settings() {
    local root=$1 file
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" /usr/sbin/update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in $root"
    fi
    if [ -f /etc/pip.conf ]; then
        grep -vE '^\s*(find-links|extra-index-url)\s*=' /etc/pip.conf > "$root/etc/pip.conf" || true
    fi
    if [ -d /etc/xdg/pip ]; then
        mkdir -p "$root/etc/xdg/pip"
        for file in /etc/xdg/pip/*; do
            grep -vE '^\s*(find-links|extra-index-url)\s*=' "$file" > "$root/etc/xdg/pip/$(basename "$file")" || true
        done
    fi
}

# NAT out through this machine for the addresses $2 behind the interface $3,
# in the nft table $1: the package registries answer, nothing else private on
# this machine's side does, except its resolver.
nat_out() {
    local table=$1 source=$2 iface=$3 nameserver
    nameserver=$(awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf)
    nft -f - <<NFT
table ip $table
delete table ip $table
table ip $table {
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr $source oifname != "$iface" masquerade
    }
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname "$iface" oifname != "$iface" ip daddr { 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 } ip daddr != $nameserver drop
    }
}
NFT
}

# The pid of the systemd that unshare ($1) forks and execs as the namespaces'
# PID 1, once it has; nothing after 10 s.
systemd_of() {
    local unshare_pid=$1 pid tries
    for tries in $(seq 100); do
        pid=$(pgrep -P "$unshare_pid" | head -1 || true)
        if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd ]; then
            echo "$pid"
            return 0
        fi
        sleep 0.1
    done
}

# A container's folder ($1) and the mounts under it: those made inside stayed
# in the container's own mount namespace; these are this machine's.
remove_container_dir() {
    local dir=$1
    [ -d "$dir" ] || return 0
    if findmnt -rn -o TARGET | grep -q "^$dir/"; then
        findmnt -rn -o TARGET | grep "^$dir/" | sort -r | xargs -r -n1 umount -l
    fi
    rm -rf --one-file-system "$dir"
}

# What Slurm left of the container's node $1 in this machine's cgroup v1
# hierarchies, which its systemd mounts as they are: slurmd keeps its jobs'
# cgroups under slurm_<node name> (Debian builds Slurm for several slurmds per
# machine), and a container killed while a job runs leaves them behind, frozen
# maybe, for the next host of that name (the real-hosts tier's job ids start at
# 1 again; the fresh host's name is new each run, so its folders would pile
# up). Only empty cgroups are removed: rmdir refuses any with a process left.
remove_slurm_cgroups() {
    local node=$1
    find /sys/fs/cgroup -mindepth 2 -maxdepth 4 -type d -name "slurm_$node" -prune -print 2>/dev/null \
        | while read -r dir; do find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
}
