"""The sessions' nginx config: rendered from the playbook role's template, refusing values that would change its structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import ConfigError
from gpupool.proxy import ProxyConfig, render_sessions_conf, standalone_nginx_conf

KEY = "k" * 43


def config(**changes: object) -> ProxyConfig:
    values: dict[str, object] = dict(
        sessions_domain="sessions.example.com", api_url="http://127.0.0.1:8000", public_api_url="https://gpupool.example.com",
        proxy_key=KEY, listen=("0.0.0.0:443",),
    )
    values.update(changes)
    return ProxyConfig(**values)  # type: ignore[arg-type]


def test_the_rendered_config_names_only_hex_labels_under_the_domain_and_checks_every_request() -> None:
    text = render_sessions_conf(config())
    assert 'server_name "~^(?<gpupool_session>[0-9a-f]{20})\\.sessions\\.example\\.com$";' in text
    assert text.count(f'proxy_set_header X-Gpupool-Proxy-Key "{KEY}";') == 2
    assert "auth_request /.gpupool/auth;" in text
    assert "return 302 https://gpupool.example.com/ui/sessions/$gpupool_session/open;" in text
    assert "proxy_set_header X-Gpupool-Session-Secret $gpupool_secret;" in text
    assert "ssl" not in text.split("server_name")[0]


def test_tls_when_a_certificate_is_given() -> None:
    text = render_sessions_conf(config(tls_certificate="/etc/ssl/s.pem", tls_certificate_key="/etc/ssl/s.key"))
    assert "listen 0.0.0.0:443 ssl;" in text and "ssl_certificate /etc/ssl/s.pem;" in text


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
    ],
)
def test_values_that_would_change_the_structure_are_refused(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        render_sessions_conf(config(**changes))
    assert fragment in info.value.message


def test_standalone_config_keeps_its_state_in_its_folder(tmp_path: Path) -> None:
    text = standalone_nginx_conf(config(listen=("127.0.0.1:8080",)), tmp_path)
    assert f"pid {tmp_path}/nginx.pid;" in text and "daemon off;" in text
    assert {path.name for path in tmp_path.iterdir()} == {"client_body", "proxy", "fastcgi", "uwsgi", "scgi"}
