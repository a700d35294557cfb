#!/usr/bin/env bash
# image.sh: the cached root file system of a fresh Debian 12 server, for the
# real-hosts tier.
#
#   image.sh path    build the image if it is not cached; print its root folder
#
# What a cloud provider hands over: Debian 12 with systemd as PID 1,
# openssh-server, python3, sudo, iproute2, ca-certificates, curl, and an
# `admin` account with passwordless sudo. Nothing of gpupool. What makes one
# server differ from another (host name, address, SSH host keys, the admin's
# authorized key, resolv.conf) is not in the image: hosts.sh writes it into
# each server's own copy-on-write layer. The image is keyed on a hash of the
# suite, the package list, the mirror and IMAGE_FORMAT (bump it when build()
# changes); a warm cache skips debootstrap. The servers are systemd containers
# (hosts.sh): they share this machine's kernel, so the image has none.
set -euo pipefail

readonly SUITE=${REALHOSTS_SUITE:-bookworm}
readonly PACKAGES=systemd-sysv,dbus,openssh-server,python3,sudo,iproute2,ca-certificates,curl,procps
readonly IMAGE_FORMAT=2
readonly CACHE_DIR=${REALHOSTS_CACHE_DIR:-/var/cache/gpupool-realhosts}
here=$(cd "$(dirname "$0")" && pwd)

log() { echo "realhosts: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=../lib/containers.sh
. "$here/../lib/containers.sh"

mirror() { debian_mirror "${REALHOSTS_MIRROR:-}"; }

image_dir() {
    local key
    key=$(echo "$SUITE $PACKAGES $(mirror) $IMAGE_FORMAT" | sha256sum | cut -c1-16)
    echo "$CACHE_DIR/debian-$SUITE-server-$key"
}

build() {
    local dir=$1 root
    command -v debootstrap >/dev/null || die "debootstrap is not installed: apt-get install debootstrap"
    mkdir -p "$CACHE_DIR"
    build_dir=$(mktemp -d "$CACHE_DIR/build.XXXXXX")
    trap 'rm -rf --one-file-system "$build_dir"' EXIT
    root=$build_dir/root
    log "debootstrap $SUITE from $(mirror) (once; cached as $dir)"
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$(mirror)" >"$build_dir/debootstrap.log" 2>&1; then
        tail -20 "$build_dir/debootstrap.log" >&2
        die "debootstrap failed: check that $(mirror) can be reached"
    fi

    # The provider's admin account: key login only, passwordless sudo.
    chroot "$root" /usr/sbin/useradd --create-home --shell /bin/bash --uid 1000 --user-group admin
    chroot "$root" /usr/bin/passwd --lock admin >/dev/null
    echo 'admin ALL=(ALL) NOPASSWD:ALL' > "$root/etc/sudoers.d/90-admin"
    chmod 0440 "$root/etc/sudoers.d/90-admin"
    printf 'PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin no\n' \
        > "$root/etc/ssh/sshd_config.d/10-keys-only.conf"

    : > "$root/etc/fstab"
    echo localhost > "$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
    # Each server its own: systemd makes a machine-id at first boot, hosts.sh
    # brings the host keys.
    : > "$root/etc/machine-id"
    rm -f "$root"/etc/ssh/ssh_host_* "$root/var/lib/dbus/machine-id"
    # What a container cannot run (no devices to manage, the network is set
    # up from outside, no consoles), and dbus-daemon, which hangs in
    # activation here (the sandbox's kernel refuses it inotify); systemctl
    # reaches systemd over its private socket without it.
    mask_units "$root" systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
        systemd-networkd.service systemd-networkd.socket systemd-logind.service \
        systemd-remount-fs.service systemd-resolved.service getty@tty1.service \
        console-getty.service systemd-timesyncd.service dbus.service dbus.socket \
        e2scrub_reap.service systemd-networkd-wait-online.service

    # As an installer leaves it: no apt lists, no downloaded packages.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb

    rm -rf "$dir"
    mv "$root" "$dir"
    rm -rf "$build_dir"
}

case ${1:-} in
    path)
        dir=$(image_dir)
        [ -x "$dir/usr/sbin/sshd" ] || build "$dir"
        echo "$dir" ;;
    *) echo "usage: $0 path" >&2; exit 2 ;;
esac
