#!/usr/bin/env bash
# What gpupool's GPU code makes of this machine's real GPUs, in a minute or two,
# installing nothing: for a session lent a GPU machine (docs/testing.md, "Real
# GPUs"), where `make test-gpu` (a Slurm cluster, a virtualenv) may not fit.
# Run from anywhere, as root for /dev/kmsg: deploy/gpu-check/device-check.sh
# It prints, and copies to $OUT/device-check.txt when OUT is set:
#   1. the machine: OS, kernel, cgroup layout, driver, nvidia-smi -L;
#   2. slurm-gpu-discover --json and its gres.conf lines (the playbook's discovery);
#   3. gpupool-gpu-check --dry-run on those lines, the real nvidia-smi and
#      /dev/kmsg, twice, with its time (it never drains: --dry-run, drain false);
#   4. with systemd: nvidia-smi -L in a scope allowed /dev/nvidia<first> only, and
#      in one allowed no GPU (the device cgroup ConstrainDevices relies on);
#   5. with a Slurm whose gres.conf names /dev/nvidiaN: sinfo, and a --gres=gpu:1 job's nvidia-smi -L.
# Needs python3 >= 3.10 and nvidia-smi. Exit status: 1 when discovery or the check
# failed (or there is no GPU), else 0; steps 4 and 5 only print.
set -u
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then exec > >(tee "$OUT/device-check.txt") 2>&1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
section() { printf '\n== %s\n' "$*"; }

section "machine"
grep -h '^PRETTY_NAME=' /etc/os-release 2>/dev/null; uname -r
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then echo "cgroup v2: $(cat /sys/fs/cgroup/cgroup.controllers)"; else echo "cgroup v1/hybrid"; fi
echo "PID 1: $(cat /proc/1/comm)"; python3 --version
cat /proc/driver/nvidia/version 2>/dev/null | head -1
if ! timeout 30 nvidia-smi -L; then echo "device-check: no NVIDIA GPU/driver found (nvidia-smi -L failed)"; exit 1; fi
timeout 30 nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,mig.mode.current --format=csv

section "slurm-gpu-discover --json"
node=$(hostname -s)
discover="$repo/deploy/ansible/roles/slurm_compute/files/slurm-gpu-discover"
python3 "$discover" --json --node-name "$node" || status=1
python3 "$discover" --node-name "$node" > "$work/gres.conf" 2>/dev/null || status=1
echo "-- gres.conf:"; cat "$work/gres.conf"

section "gpupool-gpu-check --dry-run"
mkdir "$work/state"
printf '{"node_name": "%s", "gres_conf": "%s", "nvidia_smi": "%s", "kernel_log": "/dev/kmsg", "state_dir": "%s", "drain": false, "end_jobs": false}\n' \
  "$node" "$work/gres.conf" "$(command -v nvidia-smi)" "$work/state" > "$work/check.json"
for run in first second; do
  TIMEFORMAT="$run run: %3R s"
  time {
    python3 -I -c 'import sys; sys.path.insert(0, sys.argv[1]); from gpupool.gpu_health.main import main; sys.exit(main(sys.argv[2:]))' \
      "$repo" --config "$work/check.json" --dry-run
    rc=$?
  }
  echo "$run run: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
echo "-- state.json:"; cat "$work/state/state.json" 2>/dev/null; echo

first=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^File=/) { sub(/^File=/, "", $i); print $i; exit }}' "$work/gres.conf")
section "device cgroup (systemd-run), first GPU ${first:-none}"
if [ "$(cat /proc/1/comm)" = systemd ] && command -v systemd-run >/dev/null && [ -n "$first" ]; then
  echo "-- allowed $first:"
  systemd-run --quiet --wait --pipe -p DevicePolicy=closed -p "DeviceAllow=$first rw" \
    -p "DeviceAllow=/dev/nvidiactl rw" -p "DeviceAllow=/dev/nvidia-uvm rw" nvidia-smi -L; echo "exit $?"
  echo "-- allowed no GPU:"
  systemd-run --quiet --wait --pipe -p DevicePolicy=closed -p "DeviceAllow=/dev/nvidiactl rw" nvidia-smi -L; echo "exit $?"
else
  echo "skipped: needs systemd as PID 1, systemd-run and a discovered GPU"
fi

section "Slurm"
# Only a cluster whose gres.conf names real device files (make test-gpu's): never the emulated one.
if command -v srun >/dev/null && grep -qs 'File=/dev/nvidia' /etc/slurm/gres.conf; then
  sinfo -N -o '%N %G %T %E' 2>&1
  timeout 120 srun --nodes=1 --ntasks=1 --time=2 --gres=gpu:1 sh -c 'echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"; nvidia-smi -L' 2>&1
  echo "exit $?"
else
  echo "skipped: no srun, or no real GPU in /etc/slurm/gres.conf (make test-gpu provisions one)"
fi
exit "$status"
