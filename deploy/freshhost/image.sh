#!/usr/bin/env bash
# image.sh: the cached root filesystem of a fresh minimal Debian 12 host.
#
#   image.sh path    build the image if it is not cached; print the tarball's path
#
# What a new user has before typing the README's first command: a debootstrap
# `minbase` system with systemd as PID 1, plus git, make and curl (and the CA
# certificates curl and git need) to clone the repository. Nothing else: no
# Python, no python3-apt, no sudo. The tarball is keyed on a hash of the suite,
# the package list, the mirror and IMAGE_FORMAT (bump it when build() changes),
# so a change to any of them builds a new one; a run with a warm cache skips
# debootstrap (1.5 to 5 minutes, about 100 MB downloaded).
set -euo pipefail

readonly SUITE=${FRESHHOST_SUITE:-bookworm}
readonly PACKAGES=systemd-sysv,dbus,iproute2,ca-certificates,git,make,curl
readonly IMAGE_FORMAT=1
readonly CACHE_DIR=${FRESHHOST_CACHE_DIR:-/var/cache/gpupool-freshhost}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/containers.sh
. "$here/../lib/containers.sh"

mirror() { debian_mirror "${FRESHHOST_MIRROR:-}"; }

image_path() {
    local key
    key=$(echo "$SUITE $PACKAGES $(mirror) $IMAGE_FORMAT" | sha256sum | cut -c1-16)
    echo "$CACHE_DIR/debian-$SUITE-minbase-$key.tar.zst"
}

build() {
    local tarball=$1
    command -v debootstrap >/dev/null || {
        echo "freshhost: debootstrap is not installed: apt-get install debootstrap" >&2; exit 1; }
    command -v zstd >/dev/null || {
        echo "freshhost: zstd is not installed: apt-get install zstd" >&2; exit 1; }
    mkdir -p "$CACHE_DIR"
    build_root=$(mktemp -d "$CACHE_DIR/build.XXXXXX")
    trap 'rm -rf --one-file-system "$build_root" "$build_root.log"' EXIT
    local root=$build_root
    echo "freshhost: debootstrap $SUITE minbase from $(mirror) (once; cached as $tarball)" >&2
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$(mirror)" >"$root.log" 2>&1; then
        tail -20 "$root.log" >&2
        echo "freshhost: debootstrap failed (full log $root.log): check that $(mirror) can be reached" >&2
        exit 1
    fi
    # A container cannot run these; in a VM they would do nothing the test needs.
    mask_units "$root" systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
        systemd-networkd.service systemd-logind.service systemd-remount-fs.service \
        systemd-resolved.service getty@tty1.service console-getty.service systemd-timesyncd.service
    # As an installer leaves it: no apt lists, no host name of its own yet.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    : > "$root/etc/machine-id"
    tar --numeric-owner --xattrs -C "$root" -c . | zstd -q -T0 -o "$tarball.part"
    mv "$tarball.part" "$tarball"
    rm -f "$root.log"
}

case ${1:-} in
    path)
        tarball=$(image_path)
        [ -s "$tarball" ] || build "$tarball"
        echo "$tarball" ;;
    *) echo "usage: $0 path" >&2; exit 2 ;;
esac
