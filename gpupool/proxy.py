"""nginx in front of the sessions: the playbook role's own template, rendered here for `make run` and the tests.

The role (deploy/ansible/roles/gpupool_proxy) renders the same file with
Ansible; this module gives it the same variables, and wraps it in a whole
nginx.conf for an unprivileged nginx on a loopback port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from gpupool.errors import ConfigError

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy/ansible/roles/gpupool_proxy/templates/gpupool-sessions.conf.j2"
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_KEY = re.compile(r"^[A-Za-z0-9_-]{32,128}$")
_URL = re.compile(r"^https?://[A-Za-z0-9.:\[\]-]+$")
_LISTEN = re.compile(r"^[0-9.:\[\]a-z]+$")


@dataclass(frozen=True)
class ProxyConfig:
    sessions_domain: str
    api_url: str
    public_api_url: str
    proxy_key: str
    listen: tuple[str, ...]
    tls_certificate: str = ""
    tls_certificate_key: str = ""

    def check(self) -> None:
        """Refuse values that would change the config's structure: each is written into it unquoted or in quotes."""
        if not _DOMAIN.match(self.sessions_domain):
            raise ConfigError(f"sessions domain {self.sessions_domain!r} is not a DNS name")
        for url in (self.api_url, self.public_api_url):
            if not _URL.match(url):
                raise ConfigError(f"{url!r} must be http(s)://host[:port] with no path")
        if not _KEY.match(self.proxy_key):
            raise ConfigError("the proxy key must be 32 to 128 URL-safe characters (session_proxy_key)")
        if not self.listen or not all(_LISTEN.match(address) for address in self.listen):
            raise ConfigError("listen addresses must be host:port")


def render_sessions_conf(config: ProxyConfig) -> str:
    config.check()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["regex_escape"] = re.escape
    template = env.from_string(TEMPLATE.read_text())
    return template.render(
        gpupool_proxy_sessions_domain=config.sessions_domain,
        gpupool_proxy_api_url=config.api_url,
        gpupool_proxy_public_api_url=config.public_api_url,
        gpupool_proxy_key=config.proxy_key,
        gpupool_proxy_listen=list(config.listen),
        gpupool_proxy_tls_certificate=config.tls_certificate,
        gpupool_proxy_tls_certificate_key=config.tls_certificate_key,
    )


def standalone_nginx_conf(config: ProxyConfig, state_dir: Path) -> str:
    """A whole nginx.conf for nginx run by hand (make run, tests): pid, logs and temp files under ``state_dir``."""
    sessions = render_sessions_conf(config)
    temp = {name: state_dir / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    return f"""daemon off;
worker_processes 1;
pid {state_dir}/nginx.pid;
error_log {state_dir}/error.log info;
events {{
    worker_connections 256;
}}
http {{
    access_log {state_dir}/access.log;
    client_body_temp_path {temp['client_body']};
    proxy_temp_path {temp['proxy']};
    fastcgi_temp_path {temp['fastcgi']};
    uwsgi_temp_path {temp['uwsgi']};
    scgi_temp_path {temp['scgi']};
{sessions}
}}
"""
