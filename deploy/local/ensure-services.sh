#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis that the test suite uses are installed and
# answering on 127.0.0.1 (MariaDB for slurmdbd is the playbook's job). Safe to
# rerun: a service that answers is left alone. Needs root on a fresh machine.
set -euo pipefail

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

wait_for() {  # wait_for NAME COMMAND...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "ensure-services: $name did not come up" >&2
  return 1
}

postgres_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
if ! command -v pg_isready >/dev/null || ! postgres_up; then
  fresh_install=0
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql
    fresh_install=1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  if [ "$fresh_install" = 1 ]; then
    # A test machine only: let the suite connect over loopback as postgres.
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "/etc/postgresql/$version/main/pg_hba.conf"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for PostgreSQL postgres_up
fi
echo "ensure-services: PostgreSQL answers on 127.0.0.1:5432"

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
if ! command -v redis-cli >/dev/null || ! redis_up; then
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis redis_up
fi
echo "ensure-services: Redis answers on 127.0.0.1:6379"
