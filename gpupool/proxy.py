"""nginx in front of the sessions: the playbook role's own template, rendered here for `make run` and the tests.

The role (deploy/ansible/roles/gpupool_proxy) renders the same file with
Ansible; this module gives it the same variables, and wraps it in a whole
nginx.conf for an unprivileged nginx on a loopback port.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import jinja2
from publicsuffixlist import PublicSuffixList

from gpupool.errors import ConfigError

# The role's default: tmpfs on a systemd host, so the cached answers (the secrets in them) never reach a disk.
DEFAULT_AUTH_CACHE_DIR = "/run/nginx-gpupool-sessions"

ROLE = Path(__file__).resolve().parent.parent / "deploy/ansible/roles/gpupool_proxy"
TEMPLATE = ROLE / "templates/gpupool-sessions.conf.j2"
# The njs module nginx loads for the Set-Cookie filter (the role copies it to /etc/nginx).
JS = ROLE / "files/gpupool-sessions.js"
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_KEY = re.compile(r"^[A-Za-z0-9_-]{32,128}$")
_URL = re.compile(r"^https?://[A-Za-z0-9.:\[\]-]+$")
_LISTEN = re.compile(r"^[0-9.:\[\]a-z]+$")
_PATH = re.compile(r"^/[A-Za-z0-9._/-]+$")


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    # The list the package carries (its version is pinned in requirements.lock, like every dependency's).
    return PublicSuffixList()


def site_of(host: str) -> str:
    """A host's site, as browsers draw the line for SameSite and for cookies a page may set: its
    registrable domain (the public suffix and one label more), or the host itself (an address, a bare suffix)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return _public_suffixes().privatesuffix(host) or host


def sessions_domain_problem(sessions_domain: str, public_api_url: str) -> str:
    """Why the sessions may not live under ``sessions_domain`` beside the API at ``public_api_url``; "" when they may.

    A session's page is the tenant's code. Were its origin the same site as the API's, its
    scripts could set cookies for the domain both share (the API's web-session cookie among
    them) and the API would count its requests as same-site: the sessions need a registrable
    domain of their own, neither the API's nor one the API's host is under.
    """
    api_host = urlsplit(public_api_url).hostname or ""
    session_site = site_of("0" * 20 + "." + sessions_domain)
    api_site = site_of(api_host)
    if session_site == api_site:
        return (
            f"the sessions' domain {sessions_domain!r} is the same site ({session_site}) as the API's host {api_host!r}: "
            "a session's page could set cookies for it and reach gpupool's pages as the same site. Give the sessions "
            f"a registrable domain of their own: for example {_sibling_example(api_site)}, not sessions.{api_site}"
        )
    return ""


def _sibling_example(api_site: str) -> str:
    label, dot, suffix = api_site.partition(".")
    return f"{label}-sessions.{suffix}" if dot else f"{api_site}-sessions.example"


@dataclass(frozen=True)
class ProxyConfig:
    sessions_domain: str
    api_url: str
    public_api_url: str
    proxy_key: str
    listen: tuple[str, ...]
    # The scheme browsers reach the sessions with (the API's sessions_url): the grant cookie's name and Origin follow it.
    scheme: str = "http"
    tls_certificate: str = ""
    tls_certificate_key: str = ""
    js_path: str = str(JS)
    auth_cache_dir: str = ""
    # Per client address (the role's defaults): requests to sessions per second and their burst; links per minute.
    rate_per_s: int = 100
    burst: int = 400
    link_rate_per_min: int = 30
    link_burst: int = 10

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
        if self.scheme not in ("http", "https"):
            raise ConfigError(f"the sessions' scheme must be http or https, not {self.scheme!r}")
        for path in (self.js_path, self.auth_cache_dir):
            if path and not _PATH.match(path):
                raise ConfigError(f"{path!r} must be an absolute path of letters, digits, '.', '_', '-' and '/'")
        if min(self.rate_per_s, self.burst, self.link_rate_per_min, self.link_burst) < 1:
            raise ConfigError("the sessions' request limits must be whole numbers of 1 or more")
        problem = sessions_domain_problem(self.sessions_domain, self.public_api_url)
        if problem:
            raise ConfigError(problem)


def render_sessions_conf(config: ProxyConfig, *, auth_cache_dir: str | None = None) -> str:
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
        gpupool_proxy_sessions_scheme=config.scheme,
        gpupool_proxy_js=config.js_path,
        gpupool_proxy_auth_cache_dir=auth_cache_dir or config.auth_cache_dir or DEFAULT_AUTH_CACHE_DIR,
        gpupool_proxy_rate_per_s=config.rate_per_s,
        gpupool_proxy_burst=config.burst,
        gpupool_proxy_link_rate_per_min=config.link_rate_per_min,
        gpupool_proxy_link_burst=config.link_burst,
    )


def standalone_nginx_conf(config: ProxyConfig, state_dir: Path) -> str:
    """A whole nginx.conf for nginx run by hand (make run, tests): pid, logs and temp files under ``state_dir``."""
    temp = {name: state_dir / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi", "auth-cache")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    temp["auth-cache"].chmod(0o700)  # gpupool's answers hold the sessions' secrets
    sessions = render_sessions_conf(config, auth_cache_dir=str(temp["auth-cache"]))
    return f"""load_module {JS_MODULE};
daemon off;
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
