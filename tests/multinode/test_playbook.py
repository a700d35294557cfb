"""The multinode playbook rerun: it changes nothing, and leaves an operator's drain alone."""

from __future__ import annotations

import pytest

from tests.multinode.conftest import GPU4_NODE, mn_cmd, node_line, node_state, run_multinode_playbook

pytestmark = [pytest.mark.multinode, pytest.mark.slow]
REASON = "multinode test: disk check"


def test_a_drained_node_stays_drained_across_a_rerun_that_changes_nothing(multinode_up: None) -> None:
    """The rerun is also the suite's idempotence check: changed=0 on every host."""
    mn_cmd("scontrol", "update", f"nodename={GPU4_NODE}", "state=drain", f"reason={REASON}")
    try:
        rerun = run_multinode_playbook()
        assert rerun.changed == {"mn-ctl": 0, "mn-gpu1": 0, "mn-gpu2": 0}, rerun.output
        assert f"{GPU4_NODE} stays out of service, as an operator left it" in rerun.output
        assert node_state(GPU4_NODE) == "drained"
        assert f"Reason={REASON} [root@" in node_line(GPU4_NODE)

        resumed = run_multinode_playbook("-e", "slurm_resume_nodes=true")
        assert resumed.changed == {"mn-ctl": 0, "mn-gpu1": 1, "mn-gpu2": 0}, resumed.output
        assert node_state(GPU4_NODE) == "idle"
    finally:
        mn_cmd("scontrol", "update", f"nodename={GPU4_NODE}", "state=resume", check=False)
