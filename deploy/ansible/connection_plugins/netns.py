"""Ansible connection to a host emulated by Linux namespaces on this machine.

The multinode CI cluster (inventories/multinode, deploy/multinode/netns-up.sh)
runs each Slurm host in its own network and UTS namespace: its own address on
a private bridge and its own host name, so that Debian's slurmd, which runs
once per host, runs once per namespace. The namespaces share this machine's
filesystem, users and processes. This plugin is the local connection with
every command started inside the host's two namespaces (nsenter), and with
the environment that host's login shell would have (its Slurm config, which
lives in a folder of its own because /etc is shared). Files are copied as the
local connection copies them: the filesystem is the same.
"""

from __future__ import annotations

import os
import re
import shlex

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
    name: netns
    short_description: run commands in a host's network and UTS namespaces on this machine
    description:
        - The local connection, with each command run through nsenter in the network namespace
          named by the host's address (ip netns) and the UTS namespace bound at uts_dir/<address>.
    author: gpupool
    options:
        uts_dir:
            description: Folder of the persistent UTS namespaces, one file per host, named like its network namespace.
            type: str
            default: /run/gpupool-multinode/uts
            vars:
                - name: ansible_netns_uts_dir
        environment:
            description: Variables every command on this host gets, as its login environment would give them.
            type: dict
            default: {}
            vars:
                - name: ansible_netns_environment
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

# What `ip netns add` accepts as a name, and what is safe in a path.
_NAMESPACE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NETNS_DIR = "/run/netns"


class Connection(LocalConnection):
    """Local commands, entered into the host's namespaces."""

    transport = "netns"

    def _namespace_prefix(self) -> str:
        name = self._play_context.remote_addr
        if not name or not _NAMESPACE_NAME.match(name):
            raise AnsibleConnectionFailure(f"netns: {name!r} is not a network namespace name (set ansible_host)")
        net = os.path.join(NETNS_DIR, name)
        uts = os.path.join(self.get_option("uts_dir"), name)
        for path in (net, uts):
            if not os.path.exists(path):
                raise AnsibleConnectionFailure(f"netns: {path} is missing: run deploy/multinode/netns-up.sh")
        environment = self.get_option("environment") or {}
        bad = [key for key in environment if not _ENV_NAME.match(str(key))]
        if bad:
            raise AnsibleConnectionFailure(f"netns: not environment variable names: {bad}")
        assignments = [f"{key}={value}" for key, value in sorted(environment.items())]
        argv = ["nsenter", f"--net={net}", f"--uts={uts}", "--", "env", *assignments]
        return " ".join(shlex.quote(arg) for arg in argv)

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        """Run ``cmd`` (a shell command line, as the shell plugin builds it) inside the host's namespaces."""
        # The shell plugin's command line starts with the shell to run; nsenter and env
        # only put the host's namespaces and environment in front of it.
        return super().exec_command(f"{self._namespace_prefix()} {cmd}", in_data=in_data, sudoable=sudoable)
