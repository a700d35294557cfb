"""The kernel closes gpupool's service ports to the accounts' uids, and to nobody else.

The playbook's firewall role (deploy/ansible/roles/firewall, run by `make
cluster`) loads table inet gpupool: a socket owned by a tenant uid
(200000-299999) that connects to one of the ports of gpupool's services on
this host is rejected with an ICMP admin-prohibited, which connect() reports
as EHOSTUNREACH. No listener can produce that errno (a closed port gives
ECONNREFUSED), so the test tells the firewall apart from a service that is
down. Where nothing listens on a port, the test listens there itself as root.
"""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from bench.support.tenancy import ensure_service_user
from gpupool.config import Settings
from gpupool.slurm.tenants import Tenant, ensure_tenant_user, remove_tenant_user

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switches to tenant uids; needs root"),
]

FIREWALL_DEFAULTS = Path(__file__).resolve().parents[2] / "deploy" / "ansible" / "roles" / "firewall" / "defaults" / "main.yml"

# Connects to 127.0.0.1 on each port given and prints {port: errno, 0 when connected}.
# /usr/bin/python3 and no imports of the checkout: a tenant cannot read the repository.
PROBE = """
import json, socket, sys
answers = {}
for port in sys.argv[1:]:
    with socket.socket() as sock:
        sock.settimeout(5)
        answers[port] = sock.connect_ex(("127.0.0.1", int(port)))
print(json.dumps(answers))
"""


def closed_ports() -> list[int]:
    """Every port the playbook closes to tenants, as the role's defaults list them."""
    defaults = yaml.safe_load(FIREWALL_DEFAULTS.read_text())
    return sorted(int(port) for port in defaults["firewall_tenant_closed_ports"])


@pytest.fixture(scope="module")
def tenant() -> Iterator[Tenant]:
    settings = Settings()
    name = f"fw{secrets.token_hex(4)}"
    created = ensure_tenant_user(settings, name, uid=random.randint(settings.tenant_uid_min + 50_000, settings.tenant_uid_max))
    try:
        yield created
    finally:
        remove_tenant_user(settings, name)


@pytest.fixture(scope="module")
def listening() -> Iterator[list[int]]:
    """Something accepts on 127.0.0.1 at every closed port: the real service, or a socket of root's."""
    with ExitStack() as stack:
        for port in closed_ports():
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue  # the service itself listens there
            sock.listen(16)
        yield closed_ports()


def connect_as(uid: int, gid: int, ports: list[int]) -> dict[int, int]:
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", "/usr/bin/python3", "-c", PROBE]
    if uid == 0:
        argv = ["/usr/bin/python3", "-c", PROBE]
    shown = subprocess.run([*argv, *map(str, ports)], capture_output=True, text=True, timeout=60, check=True, cwd="/")
    return {int(port): code for port, code in json.loads(shown.stdout).items()}


def firewall_loaded() -> bool:
    listed = subprocess.run(["nft", "list", "table", "inet", "gpupool"], capture_output=True, text=True, timeout=30, check=False)
    return listed.returncode == 0


def test_the_playbook_closes_every_service_port_to_tenant_uids(tenant: Tenant, listening: list[int]) -> None:
    assert firewall_loaded(), "table inet gpupool is not loaded: make cluster (the firewall role) loads it"
    answers = connect_as(tenant.uid, tenant.gid, listening)
    assert answers == {port: errno.EHOSTUNREACH for port in listening}, {
        port: os.strerror(code) if code else "connected" for port, code in answers.items()
    }
    # Redis, PostgreSQL and MariaDB themselves are among them.
    assert {3306, 5432, 6379} <= set(answers)


def test_root_and_the_service_user_still_reach_every_service_port(listening: list[int]) -> None:
    service = ensure_service_user()
    for uid, gid in ((0, 0), (service.pw_uid, service.pw_gid)):
        answers = connect_as(uid, gid, listening)
        assert answers == dict.fromkeys(listening, 0), (uid, {port: os.strerror(code) for port, code in answers.items() if code})


def test_a_tenant_still_reaches_slurm_and_its_own_ports(tenant: Tenant) -> None:
    with socket.socket() as own:
        # A port of the job's own (a server the job starts on the node), and slurmctld.
        own.bind(("127.0.0.1", 0))
        own.listen(4)
        own_port = own.getsockname()[1]
        answers = connect_as(tenant.uid, tenant.gid, [own_port, 6817])
    assert answers == {own_port: 0, 6817: 0}, {port: os.strerror(code) for port, code in answers.items() if code}
