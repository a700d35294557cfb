"""``gpupool node drain|resume``: the scontrol commands Slurm gets, what the operator reads, and the audit rows.

Slurm answers from recorded ``scontrol --oneliner show node`` outputs (23.11's
layout, where OS= holds spaces and Reason= comes last with Slurm's ``[user@time]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from sqlalchemy.orm import sessionmaker

from gpupool import audit
from gpupool.config import Settings
from gpupool.proc import CommandResult
from gpupool.slurm.client import SlurmClient
from gpupool_cli import main as cli_main
from gpupool_cli import node_cmds
from tests.app.conftest import RECORDED, NoTenants


@dataclass
class NodeSlurm:
    """scontrol for one node in one state; every update kept."""

    shown: str
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], *, timeout_s: float, check: bool = True, **_: object) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args[1:])
        if args[1:4] == ("--oneliner", "show", "node") and args[4] == "gpu1":
            return CommandResult(args, 0, (RECORDED / self.shown).read_text(), "", 0.0)
        if args[1:4] == ("--oneliner", "show", "node"):
            return CommandResult(args, 1, "", f"Node {args[4]} not found\n", 0.0)
        return CommandResult(args, 0, "", "", 0.0)

    def updates(self) -> list[tuple[str, ...]]:
        return [call for call in self.calls if call[0] == "update"]


@pytest.fixture
def run_cli(settings: Settings, session_factory: sessionmaker, monkeypatch: pytest.MonkeyPatch) -> object:
    def run(shown: str, *argv: str) -> tuple[int, NodeSlurm]:
        slurm = NodeSlurm(shown)
        monkeypatch.setattr(cli_main, "load_settings", lambda: settings)
        monkeypatch.setattr(node_cmds, "make_slurm", lambda s: SlurmClient(s, runner=slurm, tenants=NoTenants()))  # type: ignore[arg-type]
        return cli_main.main(list(argv)), slurm
    return run


def audit_rows(session_factory: sessionmaker) -> list[tuple[str, str | None, dict[str, object] | None]]:
    with session_factory() as session:
        return [(row.action, row.target, row.details) for row in audit.events(session, account=None, since=None, limit=10)]


def test_resume_brings_a_gpu_drained_node_back_and_audits_what_it_was(
    run_cli: object, session_factory: sessionmaker, capsys: pytest.CaptureFixture[str]
) -> None:
    status, slurm = run_cli("scontrol-show-node-drained.txt", "node", "resume", "gpu1")  # type: ignore[operator]

    assert status == 0
    assert slurm.updates() == [("update", "nodename=gpu1", "state=resume")]
    assert capsys.readouterr().out == "node gpu1 resumed (was IDLE+DRAIN: gpu: Xid 79 on 0000:86:00.0)\n"
    assert audit_rows(session_factory) == [
        ("node.resume", "gpu1", {"state_before": "IDLE+DRAIN", "reason_before": "gpu: Xid 79 on 0000:86:00.0"}),
    ]


def test_resume_of_a_node_in_service_changes_nothing(
    run_cli: object, session_factory: sessionmaker, capsys: pytest.CaptureFixture[str]
) -> None:
    status, slurm = run_cli("scontrol-show-node-idle.txt", "node", "resume", "gpu1")  # type: ignore[operator]

    assert status == 0
    assert slurm.updates() == []
    assert "in service (State=IDLE): nothing to resume" in capsys.readouterr().out
    assert audit_rows(session_factory) == []


def test_drain_gives_slurm_the_reason_and_audits_it(run_cli: object, session_factory: sessionmaker) -> None:
    status, slurm = run_cli("scontrol-show-node-idle.txt", "node", "drain", "gpu1", "--reason", "fan replacement")  # type: ignore[operator]

    assert status == 0
    assert slurm.updates() == [("update", "nodename=gpu1", "state=drain", "reason=fan replacement")]
    assert audit_rows(session_factory) == [
        ("node.drain", "gpu1", {"reason": "fan replacement", "state_before": "IDLE", "reason_before": None}),
    ]


def test_an_unknown_node_is_refused_with_slurms_answer(
    run_cli: object, session_factory: sessionmaker, capsys: pytest.CaptureFixture[str]
) -> None:
    status, slurm = run_cli("scontrol-show-node-idle.txt", "node", "resume", "gpu9")  # type: ignore[operator]

    assert status == 1
    assert slurm.updates() == []
    assert capsys.readouterr().err == "gpupool: error: Slurm has no node gpu9\n"
    assert audit_rows(session_factory) == []


@pytest.mark.parametrize("argv", [
    ("node", "resume", "gpu[1-2]"),
    ("node", "drain", "gpu1", "--reason", "two\nlines"),
    ("node", "drain", "gpu1"),
])
def test_a_host_list_or_a_bad_reason_is_a_usage_error(argv: tuple[str, ...], run_cli: object) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli("scontrol-show-node-idle.txt", *argv)  # type: ignore[operator]

    assert exit_info.value.code == 2

