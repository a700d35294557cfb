#!/usr/bin/env bash
# `make run`: the API on 127.0.0.1:5000 against the local cluster, with SQLite,
# a demo account and a token, in the same model as production:
#   - gunicorn and billing run as the service user (`gpupool` when this script
#     runs as root, else you), never as root, with no way to gain privileges;
#   - a root run-as helper submits and cancels as the account's tenant user, so
#     the demo account's jobs run as `gp-demo`;
#   - `gpupool account create` runs as root, since it creates that Unix user.
# State lives under ./var; job folders under /var/lib/gpupool/jobs and the
# accounts' storage under /var/lib/gpupool/data (each account's own filesystem,
# a preallocated image loop-mounted there), which tenants can reach wherever
# this checkout is.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${VENV:-.venv}
port=${GPUPOOL_PORT:-5000}
sessions_port=${GPUPOOL_SESSIONS_PORT:-8080}

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
  service_user=${GPUPOOL_SERVICE_USER:-gpupool}
else
  as_root=(sudo)
  service_user=$(id -un)
fi
if ! id -u "$service_user" >/dev/null 2>&1; then
  echo "run-demo: the service user $service_user does not exist; run 'make cluster' first" >&2
  exit 1
fi
service_group=$(id -gn "$service_user")
# The service's environment is its own (env -i): nothing of the caller's session
# (XDG_RUNTIME_DIR, where gunicorn would put its control socket, SSH_*, proxies)
# reaches gunicorn or billing; gpupool's own settings are added below.
base_env=(PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8)
as_service=(setpriv "--reuid=$service_user" "--regid=$service_group" --init-groups --no-new-privs --
            env -i "${base_env[@]}" "HOME=$PWD/var")
if ! "${as_root[@]}" "${as_service[@]}" test -r "$PWD/api/__init__.py" -a -x "$PWD/$venv/bin/gunicorn"; then
  echo "run-demo: the service user $service_user cannot read $PWD; clone gpupool where it can (for example under /opt or /srv), or run make as a normal user with sudo" >&2
  exit 1
fi

socket_dir=/run/gpupool-demo-$port
export GPUPOOL_DATABASE_URL=${GPUPOOL_DATABASE_URL:-sqlite:///$PWD/var/gpupool.db}
export GPUPOOL_RATELIMIT_STORAGE_URI=${GPUPOOL_RATELIMIT_STORAGE_URI:-memory://}
export GPUPOOL_JOB_ROOT=${GPUPOOL_JOB_ROOT:-/var/lib/gpupool/jobs}
export GPUPOOL_STORAGE_ROOT=${GPUPOOL_STORAGE_ROOT:-/var/lib/gpupool/data}
# The demo account's storage, preallocated on this machine's disk.
demo_storage_quota=${GPUPOOL_DEMO_STORAGE_QUOTA:-1G}
export GPUPOOL_SERVICE_USER=$service_user GPUPOOL_SERVICE_GROUP=$service_group
export GPUPOOL_RUNAS_SOCKET=$socket_dir/runas.sock
# Sessions get their own origins, <label>.sessions.localhost: browsers resolve *.localhost to 127.0.0.1.
export GPUPOOL_SESSIONS_URL=${GPUPOOL_SESSIONS_URL:-http://sessions.localhost:$sessions_port}
# Webhook receivers on this machine's loopback too (production refuses loopback and private
# addresses unless the operator lists them): the demo's customer is whoever runs it.
export GPUPOOL_WEBHOOK_ALLOW_CIDRS=${GPUPOOL_WEBHOOK_ALLOW_CIDRS:-127.0.0.0/8,::1/128}
gpupool_env=(GPUPOOL_DATABASE_URL GPUPOOL_RATELIMIT_STORAGE_URI GPUPOOL_JOB_ROOT GPUPOOL_STORAGE_ROOT GPUPOOL_SERVICE_USER
             GPUPOOL_SERVICE_GROUP GPUPOOL_RUNAS_SOCKET)
root_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
for name in "${gpupool_env[@]}"; do root_env+=("$name=${!name}"); done
# The run-as helper gets those of the settings it reads (gpupool.slurm.runas.launch.HELPER_SETTINGS)
# that are set here: not the database URL, not the JWT secret exported below.
# (It starts itself again with only its own settings in any case.)
helper_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin)
for name in GPUPOOL_JOB_ROOT GPUPOOL_STORAGE_ROOT GPUPOOL_SERVICE_USER GPUPOOL_SERVICE_GROUP GPUPOOL_SLURM_PARTITION GPUPOOL_SLURM_BIN_DIR \
            GPUPOOL_JOB_PATH GPUPOOL_CONTAINER_RUNTIME GPUPOOL_CONTAINER_ALLOWLIST GPUPOOL_CONTAINER_MOUNTS SLURM_CONF; do
  if [ -n "${!name+set}" ]; then helper_env+=("$name=${!name}"); fi
done

mkdir -p var
"${as_root[@]}" chown -R "$service_user:$service_group" var
chmod 0750 var
if [ ! -s var/jwt-secret ]; then
  "${as_service[@]}" sh -c 'umask 077; exec "$0" -c "import secrets; print(secrets.token_urlsafe(48))" > var/jwt-secret' "$venv/bin/python"
fi
# The secret reaches gunicorn through its environment, which no tenant can read (another uid).
GPUPOOL_JWT_SECRET=${GPUPOOL_JWT_SECRET:-$("${as_root[@]}" cat var/jwt-secret)}
export GPUPOOL_JWT_SECRET
# nginx's key to the API's session endpoints (api.sessions), in nginx's config and the API's environment.
if [ ! -s var/session-proxy-key ]; then
  "${as_service[@]}" sh -c 'umask 077; exec "$0" -c "import secrets; print(secrets.token_urlsafe(32))" > var/session-proxy-key' "$venv/bin/python"
fi
GPUPOOL_SESSION_PROXY_KEY=${GPUPOOL_SESSION_PROXY_KEY:-$("${as_root[@]}" cat var/session-proxy-key)}
export GPUPOOL_SESSION_PROXY_KEY
# gpupool's settings, the caller's GPUPOOL_* included, and Slurm's config path.
for name in $(compgen -e); do
  case $name in GPUPOOL_*|SLURM_CONF) as_service+=("$name=${!name}") ;; esac
done

"${as_service[@]}" "$venv/bin/gpupool" db upgrade

children=()
cleanup() {
  for pid in "${children[@]}"; do "${as_root[@]}" kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"${as_root[@]}" "${helper_env[@]}" "$venv/bin/gpupool" runas serve --socket "$GPUPOOL_RUNAS_SOCKET" \
  >> var/runas.log 2>&1 &
children+=($!)

# Root: it creates the demo account's Unix user gp-demo, its Slurm association and its storage.
# Exit 3: all but the storage (a host without loop devices); the rest of the demo still runs.
created=0
"${as_root[@]}" "${root_env[@]}" "$venv/bin/gpupool" account create demo --gpu-limit 4 \
  --storage-quota "$demo_storage_quota" || created=$?
if [ "$created" -eq 3 ]; then
  echo "run-demo: the demo account has no storage here: /files answers 503 storage_unavailable" >&2
elif [ "$created" -ne 0 ]; then
  exit "$created"
fi
"${as_root[@]}" chown -R "$service_user:$service_group" var   # SQLite's WAL files, if root made them
token=$("${as_service[@]}" "$venv/bin/gpupool" token create --user demo-user --account demo --ttl 86400)
if [ -z "$("${as_service[@]}" "$venv/bin/gpupool" price list)" ]; then
  "${as_service[@]}" "$venv/bin/gpupool" price set '*' 0.00012 --from 2020-01-01   # every GPU type, per GPU-second
  "${as_service[@]}" "$venv/bin/gpupool" price set storage 0.07 --from 2020-01-01  # account storage, per GiB-month
fi
# The sessions' nginx, as the service user on a loopback port, with the playbook role's
# config; and the idle stop, which cancels idle sessions as their tenant.
if [ -x /usr/sbin/nginx ]; then
  "${as_service[@]}" sh -c 'mkdir -p var/nginx && "$0" proxy nginx-config --listen "127.0.0.1:$1" \
      --api-url "http://127.0.0.1:$2" --state-dir "$PWD/var/nginx" > var/nginx/nginx.conf' \
    "$venv/bin/gpupool" "$sessions_port" "$port"
  "${as_service[@]}" /usr/sbin/nginx -p "$PWD/var/nginx" -c "$PWD/var/nginx/nginx.conf" >> var/nginx.log 2>&1 &
  children+=($!)
else
  echo "run-demo: /usr/sbin/nginx is missing (apt-get install nginx-light): sessions will not open" >&2
fi
"${as_service[@]}" "$venv/bin/gpupool" sessions sweep --every-s 30 >> var/sessions.log 2>&1 &
children+=($!)
# What cron or the systemd timer does in production, every minute here.
"${as_service[@]}" sh -c 'while sleep 60; do "$0" billing run || true; done' "$venv/bin/gpupool" >> var/billing.log 2>&1 &
children+=($!)
# The one webhook sender (gpupool-webhooks.service in production); SIGTERM at the end lets it
# finish the deliveries in hand. No idle check: this cluster's GPUs are emulated and no node runs
# a GPU exporter, so a pass would read nothing. No email sender: no SMTP server here.
"${as_service[@]}" "$venv/bin/gpupool" webhooks run >> var/webhooks.log 2>&1 &
children+=($!)

cat <<MSG

gpupool is starting on http://127.0.0.1:$port (Ctrl-C stops it). gunicorn,
billing and the webhook sender run as $service_user; the demo account's jobs run as gp-demo.

Demo token (account "demo", valid 24 h):
  export TOKEN=$token

Or open the dashboard at http://127.0.0.1:$port/ui/ and paste that token to sign in.

Submit a job:
  curl -s -X POST http://127.0.0.1:$port/submit -H "Authorization: Bearer \$TOKEN" \\
       -H 'Content-Type: application/json' \\
       -d '{"template": "hello", "gpus": 1, "params": {"message": "hi from gpupool", "seconds": 5}}'

Then follow it (use the job_id from the answer):
  curl -s http://127.0.0.1:$port/jobs/JOB_ID -H "Authorization: Bearer \$TOKEN"
  curl -s http://127.0.0.1:$port/jobs/JOB_ID/logs -H "Authorization: Bearer \$TOKEN"

Or be told: a webhook to a receiver of yours (this demo lets loopback in), signed with the
"secret" the answer shows (var/webhooks.log is the sender's log):
  curl -s -X POST http://127.0.0.1:$port/webhooks -H "Authorization: Bearer \$TOKEN" \\
       -H 'Content-Type: application/json' -d '{"url": "http://127.0.0.1:9000/hook", "events": ["job.ended"]}'

Start a web app as a session (jupyter: the same with "template": "jupyter", once
\`jupyter lab\` is on the node's PATH or in an image), then open its "link" once ready:
  curl -s -X POST http://127.0.0.1:$port/submit -H "Authorization: Bearer \$TOKEN" \\
       -H 'Content-Type: application/json' \\
       -d '{"template": "webapp", "params": {"command": "exec python3 -m http.server --bind 127.0.0.1 \"\$GPUPOOL_APP_PORT\""}}'
  curl -s http://127.0.0.1:$port/jobs/JOB_ID/session -H "Authorization: Bearer \$TOKEN"
It opens at http://<label>.sessions.localhost:$sessions_port/ (nginx, var/nginx), behind your sign-in.

Your data: the account's storage ($demo_storage_quota), which every job sees as \$GPUPOOL_DATA:
  curl -s -T ./README.md http://127.0.0.1:$port/files/docs/README.md -H "Authorization: Bearer \$TOKEN"
  curl -s http://127.0.0.1:$port/files/docs/ -H "Authorization: Bearer \$TOKEN"
  curl -s -o README.copy http://127.0.0.1:$port/files/docs/README.md -H "Authorization: Bearer \$TOKEN"
or with the client (pip install ./client): gpupool-client cp ./data.bin remote:data.bin

Billing runs every minute (var/billing.log); then see the month's usage and invoice:
  curl -s http://127.0.0.1:$port/usage -H "Authorization: Bearer \$TOKEN"
  curl -s http://127.0.0.1:$port/invoices/$(date -u +%Y-%m) -H "Authorization: Bearer \$TOKEN"

MSG
# One worker: memory:// rate-limit storage is per process (use redis:// for more).
"${as_service[@]}" "$venv/bin/gunicorn" --workers 1 --worker-class gthread --threads 8 --timeout 30 \
  --bind "127.0.0.1:$port" 'api:create_app()' &
children+=($!)
wait "${children[-1]}"
