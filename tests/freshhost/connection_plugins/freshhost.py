"""Ansible connection to a fresh host of deploy/freshhost/host.sh (tests only).

The host is a container on this machine: its own PID, mount, UTS, IPC and
network namespaces, chrooted into its own root, with systemd as PID 1. Every
command runs through `host.sh exec NAME`, which enters all of them with a
root login's environment, so systemctl, apt and the rest act on that host
alone. Files travel through the same door (cat on stdin and stdout): the
host's mounts (/run, /tmp) are its own, not this machine's view of its root.
"""

from __future__ import annotations

import os
import shlex

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
    name: freshhost
    short_description: run commands in a deploy/freshhost host
    description:
        - The local connection, with each command run through host.sh exec in the fresh host named by ansible_host.
    author: gpupool
    options:
        host_sh:
            description: deploy/freshhost/host.sh of the checkout.
            type: str
            required: true
            vars:
                - name: ansible_freshhost_host_sh
        become_success_timeout:
            type: int
            default: 10
            description: As for the local connection.
            vars:
                - name: ansible_local_become_success_timeout
        become_strip_preamble:
            type: bool
            default: true
            description: As for the local connection.
            vars:
                - name: ansible_local_become_strip_preamble
    extends_documentation_fragment:
        - connection_pipelining
"""


class Connection(LocalConnection):
    """Local commands, entered into the fresh host's namespaces."""

    transport = "freshhost"

    def _prefix(self) -> str:
        name = self._play_context.remote_addr
        host_sh = self.get_option("host_sh")
        if not name or not os.access(host_sh, os.X_OK):
            raise AnsibleConnectionFailure(f"freshhost: no host name ({name!r}) or no host.sh at {host_sh!r}")
        return f"{shlex.quote(host_sh)} exec {shlex.quote(name)}"

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        """Run ``cmd`` (a shell command line, as the shell plugin builds it) in the host."""
        return super().exec_command(f"{self._prefix()} {cmd}", in_data=in_data, sudoable=sudoable)

    def put_file(self, in_path: str, out_path: str) -> None:
        """Copy a file of this machine to ``out_path`` in the host."""
        with open(in_path, "rb") as source:
            data = source.read()
        rc, _, stderr = super().exec_command(
            f"{self._prefix()} /bin/sh -c {shlex.quote('cat > ' + shlex.quote(out_path))}", in_data=data, sudoable=False,
        )
        if rc != 0:
            raise AnsibleConnectionFailure(f"freshhost: could not write {out_path}: {stderr!r}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        """Copy ``in_path`` of the host to this machine."""
        rc, stdout, stderr = super().exec_command(f"{self._prefix()} cat -- {shlex.quote(in_path)}", sudoable=False)
        if rc != 0:
            raise AnsibleConnectionFailure(f"freshhost: could not read {in_path}: {stderr!r}")
        with open(out_path, "wb") as target:
            target.write(stdout)
