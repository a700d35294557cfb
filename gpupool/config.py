"""Settings, read in exactly one place.

Precedence, lowest first: the defaults below, then the TOML file named by
``GPUPOOL_CONFIG`` (keys are the field names), then ``GPUPOOL_<FIELD>``
environment variables. Lists in the environment are comma-separated.
Relative paths are resolved against the working directory at load time, so a
running service never changes meaning when something calls ``chdir``.
"""

from __future__ import annotations

import dataclasses
import getpass
import grp
import ipaddress
import os
import re
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.clock import Clock, FrozenClock, parse_instant, system_clock
from gpupool.errors import ConfigError
from gpupool.storage.sizes import parse_size

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def allowed_networks(cidrs: Iterable[str], setting: str) -> tuple[Network, ...]:
    """A setting's list of addresses and networks (``metrics_allow_cidrs``, ``webhook_allow_cidrs``), parsed."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ConfigError(f"{setting}: {cidr!r} is not an address or network ({exc})") from exc
    return tuple(networks)

ENV_PREFIX = "GPUPOOL_"
CONTAINER_RUNTIMES = ("none", "pyxis", "docker")
# Secrets systemd hands one unit alone (LoadCredential=NAME:FILE, NAME the field):
# read from $CREDENTIALS_DIRECTORY/NAME, over the file and the environment, so
# they never sit in an environment that child processes inherit.
CREDENTIAL_FIELDS = (
    "database_url", "billing_database_url", "jwt_secret", "web_session_secret", "ratelimit_storage_uri", "session_proxy_key",
    "operator_webhook_secret",
)
# Each idle check recounts the idle GPU-seconds of the last hour from its samples, and the
# samples up to one 5-minute gap before it (gpupool.gpu_usage.idle_time): an hour and two gaps.
IDLE_MIN_SAMPLE_RETENTION_MIN = 70
# Slurm keeps GrpSubmitJobs in 32 bits; far above any job table slurmctld can hold.
MAX_SUBMIT_JOBS = 1_000_000
_PATH_FIELDS = ("templates_dir", "job_root", "storage_root", "runas_socket", "jwt_public_key_file", "jwt_private_key_file", "billing_archive_dir")


@dataclass(frozen=True)
class Settings:
    # One database host, or libpq's host list for a cluster that fails over (Patroni):
    # postgresql://gpupool@db1:5432,db2:5432/gpupool?target_session_attrs=read-write
    # (libpq connects to whichever host takes writes; gpupool.db.normalize_url).
    database_url: str = "sqlite:///var/gpupool.db"
    # A round trip before each request's first statement, so that not even the first request
    # after a failover fails (503). Off: SQLAlchemy empties a worker's pool on the first
    # connection that failed, and only that one request answers 503.
    database_pre_ping: bool = False
    # Patroni's REST API on each database host (http://db1:8008,http://db2:8008): `gpupool status`
    # reads the members, their roles and lag from /cluster. Empty: it asks PostgreSQL alone.
    patroni_urls: tuple[str, ...] = ()
    # The billing commands connect here (empty: database_url), as a role that may only add ledger rows.
    billing_database_url: str = ""
    # PostgreSQL roles of the API and of billing: `gpupool db upgrade` grants them
    # exactly gpupool.db.roles.TABLE_ACCESS. Empty: no separate roles, nothing granted.
    database_api_role: str = ""
    database_billing_role: str = ""
    # The webhook sender's and the email sender's own roles (each given its database_url): only
    # their queue. Optional; they need the two above.
    database_webhooks_role: str = ""
    database_email_role: str = ""

    jwt_secret: str = ""
    jwt_algorithm: str = "HS256"
    jwt_public_key_file: str = ""
    jwt_private_key_file: str = ""
    jwt_audience: str = "gpupool"
    jwt_default_ttl_s: int = 3600
    # No token outlives this, whatever `token create --ttl` asks for.
    jwt_max_ttl_s: int = 90 * 24 * 3600
    # How long each API worker trusts its last look at a token's revocation and its
    # account's disabled flag: the bound on "a revoked token stops working at once".
    token_check_cache_s: float = 5.0
    # No API key a customer creates (POST /keys) outlives this many days.
    api_key_max_days: int = 90
    # Signs the web pages' session cookies (api.web). Empty: derived from jwt_secret
    # (HS256 only; with RS256 the pages stay closed until this is set).
    web_session_secret: str = ""

    ratelimit_storage_uri: str = "memory://"
    # Connect and read timeout for a redis:// store: a hung Redis answers 503, not never.
    ratelimit_storage_timeout_s: float = 1.0
    ratelimit_default: str = "1200/minute"
    ratelimit_submit: str = "60/minute"
    # A Server-Timing header on every response, with a submit's stages (api.metrics.stage): for
    # profiling, as bench/submit does; off in production, where it would tell callers too much.
    server_timing: bool = False
    # Requests without a valid token, counted per client address before the 401.
    ratelimit_unauthenticated: str = "60/minute"
    # Reverse proxies in front of gunicorn (nginx: 1) whose X-Forwarded-For is
    # trusted for the client's address; 0 trusts none, so nobody can forge one.
    proxy_hops: int = 0

    slurm_bin_dir: str = "/usr/bin"
    slurm_partition: str = "gpu"
    # The Unix user the API and billing run as. It submits nothing itself: every
    # job runs as its account's tenant user, through the run-as helper (gpupool.slurm.runas).
    service_user: str = field(default_factory=getpass.getuser)
    # Job folders belong to the tenant and this group, so the service can read logs.
    service_group: str = field(default_factory=lambda: grp.getgrgid(os.getgid()).gr_name)
    # Each account's jobs run as "<prefix><account>", uid from this range, member of tenant_group.
    tenant_user_prefix: str = "gp-"
    tenant_group: str = "gpupool-tenants"
    tenant_uid_min: int = 200_000
    tenant_uid_max: int = 299_999
    # The root-owned helper that runs sbatch and scancel as a tenant. Empty: run
    # them directly, which only works for a caller that is root (the operator's CLI).
    runas_socket: str = ""
    # The client's allowance on top of a command's own timeout; the helper closes a
    # connection that has not sent its whole request within this long.
    runas_timeout_s: float = 10.0
    # Connections the helper serves at once; one more waits a moment, then is refused.
    runas_max_connections: int = 16
    slurm_submit_timeout_s: float = 6.0
    slurm_query_timeout_s: float = 4.0
    refresh_interval_s: float = 5.0
    # A job neither squeue nor sacct has answered for in this long is marked UNKNOWN
    # and stops counting against its account's budget (sacct purged it, slurmdbd lost it).
    unknown_after_s: float = 7 * 24 * 3600
    cluster_shape_ttl_s: float = 60.0

    # `gpupool top` and `gpupool idle check` read each node's GPU exporter at http://<node>:<port>/metrics,
    # or at gpu_exporter_url when set: a template with {node} (and {port}) in it.
    gpu_exporter_port: int = 9400
    gpu_exporter_url: str = ""
    gpu_exporter_timeout_s: float = 2.0
    # Idle GPUs (gpupool.gpu_usage.idle), the default policy where neither the job's account nor its
    # template has one (`gpupool idle policy set`): a job whose every GPU stays under idle_threshold_pct
    # for idle_window_min minutes gets job.idle; idle_grace_min later, with idle_cancel, it is cancelled.
    # idle_window_min = 0: no default policy (only jobs with a policy of their own are judged).
    idle_window_min: int = 60
    idle_threshold_pct: int = 5
    idle_grace_min: int = 30
    idle_cancel: bool = False
    # Per-GPU samples are kept this long (the job page's chart, and the longest window judged);
    # at least IDLE_MIN_SAMPLE_RETENTION_MIN.
    idle_sample_retention_min: int = 24 * 60
    # Who may read the API's /metrics (no token needed); anyone else gets 404. Empty: nobody.
    metrics_allow_cidrs: tuple[str, ...] = (
        "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
    )

    # Webhooks (gpupool.webhooks). Receivers on loopback, private, link-local or
    # metadata addresses are refused unless inside one of these networks.
    webhook_allow_cidrs: tuple[str, ...] = ()
    # The whole attempt (resolving, connecting, sending, the full answer), not each read.
    webhook_timeout_s: float = 10.0
    # Attempts in flight at once, and at most this many of them for one account's
    # endpoints: a slow receiver holds its own slots, never another account's deliveries.
    webhook_concurrency: int = 8
    webhook_concurrency_per_account: int = 2
    # More of a receiver's answer than this is not read; 1 KiB of it is kept.
    webhook_max_response_bytes: int = 64 * 1024
    # First retry after this, doubling up to an hour, until the event is a day old.
    webhook_backoff_s: float = 10.0
    webhook_retry_window_s: int = 24 * 3600

    # Spend-alert email (gpupool.email_outbox): the operator's SMTP server. No host: no email.
    smtp_host: str = ""
    smtp_port: int = 587
    smtp_starttls: bool = True
    smtp_username: str = ""
    # A file holding the password (never the password itself in the environment or a log).
    smtp_password_file: str = ""
    smtp_from: str = "gpupool@localhost"
    # The operator's address: told of each node the GPU check drains (billing.node_health). Empty: no email.
    operator_email: str = ""
    # The operator's webhook: each drain (billing.node_health) also goes there as a node.drained
    # event, through the customers' outbox and sender, signed with the secret as theirs are
    # (Gpupool-Signature). The operator's own receiver: not held to webhook_allow_cidrs. Empty: none.
    operator_webhook_url: str = ""
    operator_webhook_secret: str = ""
    smtp_timeout_s: float = 10.0
    # First retry after this, doubling up to an hour; given up after this many attempts.
    email_backoff_s: float = 30.0
    email_max_attempts: int = 10

    templates_dir: str = "slurm_templates"
    job_root: str = "var/jobs"
    # A finished job's folder (its outputs, logs and script) is removed this many days after its end
    # (gpupool.retention: `gpupool outputs prune`, and each billing run). 0 keeps them for ever.
    job_output_retention_days: int = 7
    job_path: str = "/usr/local/bin:/usr/bin:/bin"
    # Each account's storage (gpupool.storage): storage_root/<account> is the mount point of the
    # account's own filesystem, whose size is its quota; jobs see it as $GPUPOOL_DATA (/data in a
    # container) and the API serves it under /files. Empty (the default): no storage at all; the
    # playbook sets /srv/gpupool/data, make run /var/lib/gpupool/data.
    storage_root: str = ""
    # An account's quota when the operator gives none of its own (`account create --storage-quota`):
    # a size with a binary unit (K, M, G, T: 10G is 10 GiB), preallocated on the storage host.
    storage_default_quota: str = "10G"
    # The interpreter the storage agent runs under as the tenant: the host's own, since a tenant may
    # execute nothing of gpupool's installation (gpupool.storage.agent).
    storage_agent_python: str = "/usr/bin/python3"
    # The most one storage operation (an open, a listing, a recursive delete) may take in the helper.
    storage_op_timeout_s: float = 30.0
    # How often a billing pass measures each account's storage (billing.storage): the first pass this
    # long after an account's last sample takes the next one, however often passes run.
    storage_meter_interval_s: int = 3600
    container_runtime: str = "none"
    container_allowlist: tuple[str, ...] = ()
    container_mounts: tuple[str, ...] = ()

    # Billing. Money is kept in integer nano-units of this currency (billing.money).
    currency: str = "USD"
    # Each pass reads sacct from (last mark - overlap): records slurmdbd receives
    # late, after an outage of up to this long, are still billed.
    billing_overlap_s: int = 6 * 3600
    # The very first pass, with no mark yet, looks back this far; older usage
    # is billed with `gpupool billing run --since`.
    billing_initial_lookback_s: int = 24 * 3600
    billing_backfill_chunk_s: int = 24 * 3600
    billing_sacct_timeout_s: float = 300.0
    billing_archive_dir: str = "var/billing"
    billing_credit_failed_nodes: bool = True
    # Runs gpupool-gpu-check ended for a failed GPU are credited in full (billing.credits), and so
    # are runs that failed on the node within one check interval before it drained for a failed GPU.
    billing_credit_gpu_failures: bool = True
    # Slurm's HealthCheckInterval (the playbook writes both from slurm_common_health_check_interval_s):
    # how long a GPU can be failed before the check sees it.
    gpu_check_interval_s: int = 60
    billing_cancel_exhausted: bool = False
    # The operator report's payback: what a kWh costs, in `currency`, as exact decimal text.
    electricity_price_per_kwh: str = "0"

    # Interactive sessions (gpupool.sessions). Each has its own origin,
    # <label>.<host of sessions_url>, reached with sessions_url's scheme and port.
    sessions_url: str = "http://sessions.localhost:8080"
    # The ports a session's shim may listen on, on its node's cluster address: the
    # proxy goes nowhere else, so keep every other service of the nodes out of it.
    session_ports: str = "20000-29999"
    # Shared with the proxy (nginx sends it to the auth endpoint). Empty: the proxy's endpoints answer 404.
    # It also keys the MAC on session links and cookies (gpupool.sessions.grant_value_signed).
    session_proxy_key: str = ""
    session_link_ttl_s: int = 60
    session_cookie_ttl_s: int = 12 * 3600
    # How long nginx keeps the API's answer about a session cookie, refusals included (X-Accel-Expires).
    session_auth_cache_s: float = 5.0
    session_status_timeout_s: float = 3.0

    max_request_bytes: int = 256 * 1024
    # The most one GET /jobs/<id>/logs answer carries, and the most it reads from disk.
    log_read_max_bytes: int = 1024 * 1024
    default_cpus: int = 1
    default_mem_gb: int = 4
    # What a job may ask for per GPU; 0: the smallest node's share (its CPUs or
    # memory divided by its GPUs), so one job never strands another's GPU.
    max_cpus_per_gpu: int = 0
    max_mem_gb_per_gpu: int = 0
    default_time_limit_min: int = 60
    max_time_limit_min: int = 7 * 24 * 60
    # The most tasks one array job (or sweep) may have. Slurm's own bound is
    # MaxArraySize in slurm.conf (the highest index + 1; Slurm's default 1001),
    # which a tenant calling sbatch itself cannot step around: keep this below it.
    max_array_tasks: int = 1000
    # The most jobs one account may have pending or running at once, each array task
    # counted as a job: Slurm's GrpSubmitJobs on the account's association, which
    # `gpupool account create` and every billing pass set, so that no tenant, by any
    # path, fills the controller's job table (slurm.conf's MaxJobCount) and blocks
    # everyone's submits. `gpupool account set NAME --max-submit-jobs N` overrides it.
    max_submit_jobs: int = 1000
    # An instant (ISO 8601) that every decision by the calendar takes as "now", the API's
    # and the operator commands' (which month /usage and budgets count, an invoice's and a
    # report's default period): for drills and for the tests (make test-calendar). Empty,
    # as in production: the system clock. Recorded times (created_at, audit rows, a billing
    # pass's end) always take the real time.
    calendar_now: str = ""

    def __post_init__(self) -> None:
        if self.container_runtime not in CONTAINER_RUNTIMES:
            raise ConfigError(
                f"container_runtime must be one of {', '.join(CONTAINER_RUNTIMES)}, "
                f"not {self.container_runtime!r}"
            )
        if self.jwt_algorithm not in ("HS256", "RS256"):
            raise ConfigError(f"jwt_algorithm must be HS256 or RS256, not {self.jwt_algorithm!r}")
        low, _, high = self.session_ports.partition("-")
        if not (low.isdigit() and high.isdigit() and 1024 <= int(low) <= int(high) <= 65535):
            raise ConfigError(f"session_ports must be a range low-high within 1024-65535, not {self.session_ports!r}")
        if not re.fullmatch(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?", self.sessions_url):
            raise ConfigError(f"sessions_url must be http(s)://<domain>[:port] with no path, not {self.sessions_url!r}")
        if self.refresh_interval_s <= 0:
            raise ConfigError("refresh_interval_s must be positive")
        if self.storage_meter_interval_s <= 0:
            raise ConfigError("storage_meter_interval_s must be positive")
        for url in self.patroni_urls:
            if not re.fullmatch(r"https?://[!-~]+", url):
                raise ConfigError(f"patroni_urls must be http(s) URLs of Patroni's REST API, not {url!r}")
        if self.ratelimit_storage_timeout_s <= 0:
            raise ConfigError("ratelimit_storage_timeout_s must be positive")
        if self.webhook_timeout_s <= 0:
            raise ConfigError("webhook_timeout_s must be positive")
        if self.operator_webhook_url and not re.fullmatch(r"https?://[!-~]+", self.operator_webhook_url):
            raise ConfigError(f"operator_webhook_url must be an http(s) URL, not {self.operator_webhook_url!r}")
        # No check that the secret is there: only the webhook sender holds it (its credential); billing,
        # which enqueues, has the URL alone. A sender without it records each attempt as failed, and says why.
        if not 0 < self.webhook_concurrency_per_account <= self.webhook_concurrency:
            raise ConfigError("webhook_concurrency_per_account must be positive and at most webhook_concurrency")
        if self.runas_timeout_s <= 0 or self.runas_max_connections <= 0:
            raise ConfigError("runas_timeout_s and runas_max_connections must be positive")
        if self.unknown_after_s <= 0:
            raise ConfigError("unknown_after_s must be positive")
        if self.log_read_max_bytes <= 0:
            raise ConfigError("log_read_max_bytes must be positive")
        if not 1 <= self.max_array_tasks <= 100_000:
            raise ConfigError("max_array_tasks must be between 1 and 100000")
        if self.calendar_now:
            try:
                parse_instant(self.calendar_now)
            except ValueError as exc:
                raise ConfigError(f"calendar_now must be an ISO 8601 instant such as 2026-12-31T23:59:59Z, not {self.calendar_now!r}") from exc
        if not 1 <= self.max_submit_jobs <= MAX_SUBMIT_JOBS:
            raise ConfigError(f"max_submit_jobs must be between 1 and {MAX_SUBMIT_JOBS}")
        if not 0 < self.jwt_default_ttl_s <= self.jwt_max_ttl_s:
            raise ConfigError("jwt_default_ttl_s must be positive and at most jwt_max_ttl_s")
        if self.token_check_cache_s < 0:
            raise ConfigError("token_check_cache_s must be 0 or more")
        if self.proxy_hops < 0:
            raise ConfigError("proxy_hops must be 0 or more")
        if not 0 < self.tenant_uid_min <= self.tenant_uid_max:
            raise ConfigError("tenant_uid_min must be positive and at most tenant_uid_max")
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,15}", self.tenant_user_prefix):
            raise ConfigError("tenant_user_prefix must be a short lower-case word such as 'gp-'")
        if self.max_cpus_per_gpu < 0 or self.max_mem_gb_per_gpu < 0:
            raise ConfigError("max_cpus_per_gpu and max_mem_gb_per_gpu must be 0 (the node's share) or more")
        if self.billing_overlap_s < 0 or self.billing_backfill_chunk_s <= 0:
            raise ConfigError("billing_overlap_s must be 0 or more and billing_backfill_chunk_s positive")
        if not re.fullmatch(r"\d{1,9}(\.\d{1,9})?", self.electricity_price_per_kwh):
            raise ConfigError("electricity_price_per_kwh must be a decimal such as 0.15 (at most 9 decimals)")
        if bool(self.database_api_role) != bool(self.database_billing_role):
            raise ConfigError("set both database_api_role and database_billing_role, or neither")
        if (self.database_webhooks_role or self.database_email_role) and not self.database_api_role:
            raise ConfigError("database_webhooks_role and database_email_role need database_api_role and database_billing_role")
        if self.gpu_exporter_url and "{node}" not in self.gpu_exporter_url and "{port}" not in self.gpu_exporter_url:
            # One fixed address for every node would judge every node by one node's GPUs.
            raise ConfigError("gpu_exporter_url must contain {node} or {port}, e.g. http://{node}:9400/metrics")
        try:
            self.gpu_exporter_url.format(node="node", port=self.gpu_exporter_port)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"gpu_exporter_url may name only {{node}} and {{port}}: {exc}") from exc
        try:
            parse_size(self.storage_default_quota)
        except ValueError as exc:
            raise ConfigError(f"storage_default_quota: {exc}") from exc
        for mount in self.container_mounts if self.storage_root else ():
            if mount.split(":")[1:2] == ["/data"]:
                raise ConfigError(f"container_mounts: {mount!r} mounts over /data, where jobs see their account's storage")
        if self.storage_op_timeout_s <= 0:
            raise ConfigError("storage_op_timeout_s must be positive")
        if self.job_output_retention_days < 0:
            raise ConfigError("job_output_retention_days must be 0 (keep for ever) or more")
        if self.idle_window_min < 0 or self.idle_grace_min < 0 or not 0 <= self.idle_threshold_pct <= 100:
            raise ConfigError("idle_window_min and idle_grace_min must be 0 or more, idle_threshold_pct 0 to 100")
        if self.idle_sample_retention_min < IDLE_MIN_SAMPLE_RETENTION_MIN:
            raise ConfigError(
                f"idle_sample_retention_min must be at least {IDLE_MIN_SAMPLE_RETENTION_MIN}: "
                "each idle check recounts the last hour's idle GPU-seconds from its samples"
            )

    @property
    def storage_default_quota_bytes(self) -> int:
        return parse_size(self.storage_default_quota)

    def calendar_clock(self) -> Clock:
        """The clock of decisions by the calendar: frozen at ``calendar_now`` when set, else the system clock."""
        return FrozenClock(parse_instant(self.calendar_now)) if self.calendar_now else system_clock

    def billing_url(self) -> str:
        return self.billing_database_url or self.database_url

    def slurm_bin(self, command: str) -> str:
        return str(Path(self.slurm_bin_dir) / command)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    try:
        if annotation is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if annotation is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            if not isinstance(raw, (int, float, str)):
                raise ValueError(raw)
            return int(raw)
        if annotation is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise ValueError(raw)
            return float(raw)
        if origin is tuple:
            if isinstance(raw, str):
                return tuple(item.strip() for item in raw.split(",") if item.strip())
            if isinstance(raw, (list, tuple)):
                return tuple(str(item) for item in raw)
            raise ValueError(raw)
        if annotation is str or isinstance(annotation, types.UnionType):
            if not isinstance(raw, (str, int, float)):
                raise ValueError(raw)
            return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name}: cannot read {raw!r} as {annotation}") from exc
    return raw


def load_settings(
    environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Build Settings from defaults, then GPUPOOL_CONFIG's file, then GPUPOOL_* variables."""
    env = os.environ if environ is None else environ
    hints = _field_types()
    values: dict[str, Any] = {}

    config_file = env.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            file_values = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"GPUPOOL_CONFIG names {path}, which does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        unknown = set(file_values) - set(hints)
        if unknown:
            raise ConfigError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")
        for name, raw in file_values.items():
            values[name] = _coerce(name, raw, hints[name])

    for name, annotation in hints.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw, annotation)

    values.update(_credentials(env))

    for name, raw in (overrides or {}).items():
        if name not in hints:
            raise ConfigError(f"unknown setting {name}")
        values[name] = _coerce(name, raw, hints[name])

    for name in _PATH_FIELDS:
        if values.get(name):
            values[name] = str(Path(values[name]).expanduser().resolve())
    values.setdefault("templates_dir", str(Path(Settings.templates_dir).resolve()))
    values.setdefault("job_root", str(Path(Settings.job_root).resolve()))
    values.setdefault("billing_archive_dir", str(Path(Settings.billing_archive_dir).resolve()))
    values["database_url"] = _absolute_sqlite_url(values.get("database_url", Settings.database_url))
    values["billing_database_url"] = _absolute_sqlite_url(values.get("billing_database_url", ""))
    return Settings(**values)


def _credentials(env: Mapping[str, str]) -> dict[str, str]:
    """The CREDENTIAL_FIELDS systemd placed in this unit's credentials folder, if any."""
    folder = env.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return {}
    found: dict[str, str] = {}
    for name in CREDENTIAL_FIELDS:
        path = Path(folder) / name
        try:
            found[name] = path.read_text().rstrip("\r\n")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot read the credential {path}: {exc.strerror}") from exc
    return found


def _absolute_sqlite_url(url: str) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != "sqlite://":
        relative = url[len(prefix):]
        if relative and relative != ":memory:":
            return prefix + str(Path(relative).resolve())
    return url
