"""gpupool's own Jinja filters for the playbook: the same checks the service makes, from the same code.

The playbook runs from gpupool's virtualenv (../../.venv/bin/ansible-playbook), so
gpupool is importable here; the check is gpupool.proxy's, not a second copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError


def sessions_domain_problem(sessions_domain: str, public_api_url: str) -> str:
    """Why the sessions may not live under ``sessions_domain`` beside the API; "" when they may."""
    try:
        from gpupool.proxy import sessions_domain_problem as check
    except ImportError as exc:
        raise AnsibleFilterError(
            f"gpupool is not importable ({exc}): run the playbook from gpupool's virtualenv, "
            "../../.venv/bin/ansible-playbook (make venv makes it)"
        ) from exc
    return check(str(sessions_domain), str(public_api_url))


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"gpupool_sessions_domain_problem": sessions_domain_problem}
