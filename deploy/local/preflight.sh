#!/usr/bin/env bash
# `make run`'s first step, before anything on the machine is changed: checks
# what would otherwise fail late, or as a wait that never ends. Each problem is
# one message on stderr; any problem exits 1.
#   - the machine's host name resolves (Slurm's daemons and sacctmgr find each
#     other by it; unresolved, slurmdbd's clients retry for minutes);
#   - the ports the API and the local cluster listen on are free, or held by the
#     cluster's own daemon from an earlier run;
#   - enough free disk for the packages and the virtualenv;
#   - root or sudo, and apt (Debian 12/13, Ubuntu 22.04/24.04).
# Uses only coreutils, getent and /proc: it runs before anything is installed.
set -uo pipefail
cd "$(dirname "$0")/../.."

api_port=${GPUPOOL_PORT:-5000}
# MiB free that a first `make run` needs (packages, MariaDB, the virtualenv).
min_free_mb=${GPUPOOL_PREFLIGHT_MIN_FREE_MB:-2048}
problems=0
problem() { echo "preflight: $*" >&2; problems=$((problems + 1)); }

# --- the host name
host_name=$(uname -n)
if ! getent ahosts "$host_name" >/dev/null 2>&1; then
  problem "this machine's host name '$host_name' does not resolve (getent ahosts $host_name finds no address), and Slurm's daemons and sacctmgr reach each other by it. Add a line such as '127.0.1.1 $host_name' to /etc/hosts, then run make run again."
fi

# --- the ports: port, the daemon that may already hold it (from an earlier run), what needs it
ports=(
  "$api_port - the API (gunicorn; set GPUPOOL_PORT to use another)"
  "${GPUPOOL_SESSIONS_PORT:-8080} - the sessions' nginx (set GPUPOOL_SESSIONS_PORT to use another)"
  "6817 slurmctld slurmctld"
  "6818 slurmd slurmd"
  "6819 slurmdbd slurmdbd"
  "3306 mariadbd|mysqld MariaDB (slurmdbd's database)"
)
# Every listening TCP socket's inode, by port: /proc/net/tcp{,6} in hex.
listening_inodes() {
  local port_hex
  port_hex=$(printf '%04X' "$1")
  awk -v port="$port_hex" 'FNR > 1 && $4 == "0A" { split($2, local, ":"); if (local[2] == port) print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u
}
# "name (pid N)" of the processes holding a socket inode.
socket_owners() {
  local fd pid
  find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$1\]" 2>/dev/null | while read -r fd; do
    pid=${fd#/proc/}; pid=${pid%%/*}
    echo "$(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid)"
  done | sort -u
}
for entry in "${ports[@]}"; do
  read -r port expected what <<<"$entry"
  for inode in $(listening_inodes "$port"); do
    owners=$(socket_owners "$inode" | paste -sd, -)
    owner_names=$(echo "$owners" | tr ',' '\n' | sed 's/ (pid.*//' | sort -u)
    if [ -n "$owner_names" ] && echo "$owner_names" | grep -qvxE "$expected"; then
      hint="stop it, or free the port"
      [ "$expected" = - ] && echo "$owner_names" | grep -qx gunicorn &&
        hint="is make run already running? Stop it (Ctrl-C), or start this one with GPUPOOL_PORT=$((api_port + 1)) make run"
      problem "port $port, which $what needs, is in use by ${owners}: $hint."
    elif [ -z "$owner_names" ]; then
      problem "port $port, which $what needs, is in use (by a process this user cannot see): free it."
    fi
  done
done

# --- disk: where apt installs (/, /var) and where the virtualenv goes (here)
declare -A seen_devices=()
for path in / /var "$PWD"; do
  device=$(stat -c %d "$path" 2>/dev/null) || continue
  [ -z "${seen_devices[$device]:-}" ] || continue
  seen_devices[$device]=1
  free_mb=$(df -Pm "$path" | awk 'NR == 2 { print $4 }')
  if [ "${free_mb:-0}" -lt "$min_free_mb" ]; then
    problem "only $free_mb MiB free on the file system of $path ($(df -Pm "$path" | awk 'NR == 2 { print $6 }')); make run needs about $min_free_mb MiB there for the packages, MariaDB and the virtualenv. Free some space, then run make run again."
  fi
done

# --- the checkout: as root, the service user (not made yet) and the tenants run
# the virtualenv here, so every folder above it must let others pass.
if [ "$(id -u)" -eq 0 ]; then
  dir=$PWD
  while [ "$dir" != / ]; do
    if [ $(( 0$(stat -c %a "$dir") & 1 )) -eq 0 ]; then
      problem "$dir does not let other users pass (mode $(stat -c %a "$dir")), so the service user could not run gpupool from $PWD. Clone gpupool under /opt or /srv instead, or make run as a normal user with sudo."
      break
    fi
    dir=$(dirname "$dir")
  done
fi

# --- privileges and the package manager
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
  problem "make run installs packages and starts Slurm as root: run it as root, or install sudo and run it as a user who may use it."
fi
if ! command -v apt-get >/dev/null; then
  problem "no apt-get here: make run supports Debian 12 and 13 and Ubuntu 22.04 and 24.04."
fi

if [ "$problems" -gt 0 ]; then
  echo "preflight: $problems problem(s) found; nothing was changed." >&2
  exit 1
fi
echo "preflight: ok (host name $host_name resolves; ports $api_port, 6817-6819 and 3306 free or held by the cluster's own daemons; at least $min_free_mb MiB free)"
