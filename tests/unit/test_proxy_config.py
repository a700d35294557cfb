"""The sessions' nginx config: rendered from the playbook role's template, refusing values that would change its structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import ConfigError
from gpupool.proxy import ProxyConfig, render_sessions_conf, sessions_domain_problem, standalone_nginx_conf

KEY = "k" * 43


def config(**changes: object) -> ProxyConfig:
    values: dict[str, object] = dict(
        sessions_domain="sessions.example.net", api_url="http://127.0.0.1:8000", public_api_url="https://gpupool.example.com",
        proxy_key=KEY, listen=("0.0.0.0:443",),
    )
    values.update(changes)
    return ProxyConfig(**values)  # type: ignore[arg-type]


def test_the_rendered_config_names_only_hex_labels_under_the_domain_and_checks_every_request() -> None:
    text = render_sessions_conf(config())
    assert 'server_name "~^(?<gpupool_session>[0-9a-f]{20})\\.sessions\\.example\\.net$";' in text
    assert text.count(f'proxy_set_header X-Gpupool-Proxy-Key "{KEY}";') == 2
    assert "auth_request /.gpupool/auth;" in text
    assert "return 302 https://gpupool.example.com/ui/sessions/$gpupool_session/open;" in text
    assert "proxy_set_header X-Gpupool-Session-Secret $gpupool_secret;" in text
    assert "ssl" not in text.split("server_name")[0]
    # Before gpupool is asked: a sibling's request, a write from another origin, two grant cookies; then the limit.
    location = text.split("    location / {")[1]
    assert location.index("if ($gpupool_refused)") < location.index("if ($gpupool_grant_twice)") < location.index("limit_req ")
    assert location.index("limit_req ") < location.index("auth_request ")
    assert "js_header_filter gpupool_sessions.app_cookies;" in location
    assert "limit_req zone=gpupool_session_links" in text.split("location = /.gpupool/open")[1].split("}")[1]
    # gpupool's answers are cached as long as it says, in one cache for every worker.
    auth = text.split("location = /.gpupool/auth {")[1].split("}")[0]
    assert "proxy_cache gpupool_session_auth;" in auth and 'proxy_cache_key "$gpupool_session $gpupool_grant";' in auth
    assert "X-Accel-Expires" not in auth.split("proxy_ignore_headers")[1].split(";")[0]


def test_tls_when_a_certificate_is_given() -> None:
    text = render_sessions_conf(config(tls_certificate="/etc/ssl/s.pem", tls_certificate_key="/etc/ssl/s.key", scheme="https"))
    assert "listen 0.0.0.0:443 ssl;" in text and "ssl_certificate /etc/ssl/s.pem;" in text


def test_the_grant_cookie_is_host_prefixed_over_tls_and_origin_takes_the_scheme() -> None:
    over_tls = render_sessions_conf(config(scheme="https"))
    assert 'proxy_set_header Cookie "__Host-gpupool_session_grant=$gpupool_grant";' in over_tls
    assert 'map "$http_origin|https://$http_host" $gpupool_own_origin' in over_tls
    plain = render_sessions_conf(config(scheme="http"))
    assert 'proxy_set_header Cookie "gpupool_session_grant=$gpupool_grant";' in plain and "__Host-" not in plain
    assert 'map "$http_origin|http://$http_host" $gpupool_own_origin' in plain


@pytest.mark.parametrize(
    ("sessions_domain", "api_url", "same_site"),
    [
        ("sessions.example.com", "https://gpupool.example.com", True),
        ("example.com", "https://api.example.com", True),
        ("sessions.gpupool.example.com", "https://gpupool.example.com", True),
        ("sessions.b.co.uk", "https://api.b.co.uk", True),
        ("sessions.example.net", "https://gpupool.example.com", False),
        ("example-sessions.com", "https://example.com:8443", False),
        ("sessions.a.co.uk", "https://api.b.co.uk", False),
        # make run: the API on an address, the sessions under *.localhost.
        ("sessions.localhost", "http://127.0.0.1:5000", False),
        # A suffix on the Public Suffix List makes each label a site of its own.
        ("sessions.github.io", "https://api.github.io", False),
    ],
)
def test_the_sessions_need_a_site_of_their_own(sessions_domain: str, api_url: str, same_site: bool) -> None:
    problem = sessions_domain_problem(sessions_domain, api_url)
    assert bool(problem) == same_site, problem
    if same_site:
        with pytest.raises(ConfigError) as info:
            render_sessions_conf(config(sessions_domain=sessions_domain, public_api_url=api_url))
        assert "a registrable domain of their own" in info.value.message


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"sessions_domain": "x.com; include /etc/passwd"}, "is not a DNS name"),
        ({"sessions_domain": "Sessions.example.com"}, "is not a DNS name"),
        ({"api_url": "http://127.0.0.1:8000/; return 200"}, "must be http(s)://host[:port]"),
        ({"public_api_url": "javascript:alert(1)"}, "must be http(s)://host[:port]"),
        ({"proxy_key": 'short"'}, "the proxy key must be"),
        ({"proxy_key": "k" * 40 + '";'}, "the proxy key must be"),
        ({"listen": ("127.0.0.1:80; deny all",)}, "listen addresses"),
        ({"listen": ()}, "listen addresses"),
        ({"scheme": "ftp"}, "http or https"),
        ({"js_path": "/etc/x.js; load_module /tmp/x.so"}, "must be an absolute path"),
        ({"burst": 0}, "whole numbers of 1 or more"),
    ],
)
def test_values_that_would_change_the_structure_are_refused(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        render_sessions_conf(config(**changes))
    assert fragment in info.value.message


def test_standalone_config_keeps_its_state_in_its_folder(tmp_path: Path) -> None:
    text = standalone_nginx_conf(config(listen=("127.0.0.1:8080",)), tmp_path)
    assert f"pid {tmp_path}/nginx.pid;" in text and "daemon off;" in text
    assert text.startswith("load_module /usr/lib/nginx/modules/ngx_http_js_module.so;")
    assert {path.name for path in tmp_path.iterdir()} == {"client_body", "proxy", "fastcgi", "uwsgi", "scgi", "auth-cache"}
    assert f"proxy_cache_path {tmp_path}/auth-cache " in text and (tmp_path / "auth-cache").stat().st_mode & 0o777 == 0o700
