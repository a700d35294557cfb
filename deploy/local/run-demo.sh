#!/usr/bin/env bash
# `make run`: the API on 127.0.0.1:5000 against the local cluster, with SQLite,
# a demo account and a token. Everything it writes lives under ./var.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${VENV:-.venv}
port=${GPUPOOL_PORT:-5000}

mkdir -p var/jobs
chmod 0750 var
if [ ! -s var/jwt-secret ]; then
  (umask 077; "$venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(48))' > var/jwt-secret)
fi
export GPUPOOL_DATABASE_URL=${GPUPOOL_DATABASE_URL:-sqlite:///$PWD/var/gpupool.db}
export GPUPOOL_JWT_SECRET=${GPUPOOL_JWT_SECRET:-$(cat var/jwt-secret)}
export GPUPOOL_RATELIMIT_STORAGE_URI=${GPUPOOL_RATELIMIT_STORAGE_URI:-memory://}
export GPUPOOL_JOB_ROOT=${GPUPOOL_JOB_ROOT:-$PWD/var/jobs}

"$venv/bin/gpupool" db upgrade
"$venv/bin/gpupool" account create demo --gpu-limit 4
token=$("$venv/bin/gpupool" token create --user demo-user --account demo --ttl 86400)
if [ -z "$("$venv/bin/gpupool" price list)" ]; then
  "$venv/bin/gpupool" price set '*' 0.00012 --from 2020-01-01   # every GPU type, per GPU-second
fi
# What cron or the systemd timer does in production, every minute here; it ends
# with this script's process, which becomes gunicorn below.
(while kill -0 $$ 2>/dev/null; do
   sleep 60
   "$venv/bin/gpupool" billing run >> var/billing.log 2>&1 || true
 done) &

cat <<MSG

gpupool is starting on http://127.0.0.1:$port (Ctrl-C stops it).

Demo token (account "demo", valid 24 h):
  export TOKEN=$token

Submit a job:
  curl -s -X POST http://127.0.0.1:$port/submit -H "Authorization: Bearer \$TOKEN" \\
       -H 'Content-Type: application/json' \\
       -d '{"template": "hello", "gpus": 1, "params": {"message": "hi from gpupool", "seconds": 5}}'

Then follow it (use the job_id from the answer):
  curl -s http://127.0.0.1:$port/jobs/JOB_ID -H "Authorization: Bearer \$TOKEN"
  curl -s http://127.0.0.1:$port/jobs/JOB_ID/logs -H "Authorization: Bearer \$TOKEN"

Billing runs every minute (var/billing.log); then see the month's usage and invoice:
  curl -s http://127.0.0.1:$port/usage -H "Authorization: Bearer \$TOKEN"
  curl -s http://127.0.0.1:$port/invoices/$(date -u +%Y-%m) -H "Authorization: Bearer \$TOKEN"

MSG
# One worker: memory:// rate-limit storage is per process (use redis:// for more).
exec "$venv/bin/gunicorn" --workers 1 --worker-class gthread --threads 8 --timeout 30 \
  --bind "127.0.0.1:$port" 'api:create_app()'
