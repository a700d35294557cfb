"""``gpupool status``'s readers on recorded answers: scontrol ping (Slurm 22.05.8) and Patroni's /cluster (3.0's shape)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.cluster_status import (
    Controller,
    DatabaseMember,
    StatusParseError,
    parse_patroni_cluster,
    parse_scontrol_ping,
)
from gpupool_cli.status_cmds import ClusterStatus, DatabaseState, PatroniState, render_json, render_text

FIXTURES = Path(__file__).parent / "fixtures" / "status"


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        ("ping-one-controller.txt", [Controller("primary", "vm", True)]),
        ("ping-backup-down.txt", [Controller("primary", "mn-ctl", True), Controller("backup", "mn-ctl2", False)]),
        ("ping-primary-down.txt", [Controller("primary", "mn-ctl", False), Controller("backup", "mn-ctl2", True)]),
        ("ping-all-down.txt", [Controller("primary", "mn-ctl", False), Controller("backup", "mn-ctl2", False)]),
        (
            "ping-two-backups.txt",
            [Controller("primary", "mn-ctl", False), Controller("backup1", "mn-ctl2", True), Controller("backup2", "mn-ctl3", True)],
        ),
    ],
)
def test_scontrol_ping_names_each_controller_and_whether_it_answers(recorded: str, expected: list[Controller]) -> None:
    assert parse_scontrol_ping((FIXTURES / recorded).read_text()) == expected


@pytest.mark.parametrize(
    "text",
    ["", "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error\n", "Slurmctld(primary) at vm is UP\nSlurmctld(primary) at x is MAYBE\n"],
)
def test_anything_else_is_refused_rather_than_read(text: str) -> None:
    with pytest.raises(StatusParseError):
        parse_scontrol_ping(text)


def test_patroni_members_with_role_state_and_lag() -> None:
    members = parse_patroni_cluster((FIXTURES / "patroni-three-members.json").read_bytes())
    assert members == [
        DatabaseMember("db1", "leader", "running", "10.0.0.11", 5432, None),
        DatabaseMember("db2", "sync_standby", "streaming", "10.0.0.12", 5432, 0),
        DatabaseMember("db3", "replica", "streaming", "10.0.0.13", 5432, 16384),
    ]
    assert [member.leads for member in members] == [True, False, False]


def test_patroni_without_a_leader_and_unknown_lag() -> None:
    members = parse_patroni_cluster((FIXTURES / "patroni-leader-gone.json").read_text())
    assert not any(member.leads for member in members)
    assert [member.lag_bytes for member in members] == [None, None]
    assert [member.state for member in members] == ["running", "stopped"]


@pytest.mark.parametrize("body", ["not json", "[]", '{"members": {}}', '{"members": [{"role": "leader"}]}'])
def test_a_patroni_answer_of_another_shape_is_refused(body: str) -> None:
    with pytest.raises(StatusParseError):
        parse_patroni_cluster(body)


def a_status(*, writable: bool, controllers: list[Controller], patroni: PatroniState | None = None) -> ClusterStatus:
    database = DatabaseState("postgresql", address="10.0.0.11", port=5432, writable=writable)
    return ClusterStatus(database, patroni, controllers, None, "down")


def test_healthy_needs_a_writable_database_and_an_answering_controller() -> None:
    up, down = Controller("primary", "c1", True), Controller("backup", "c2", False)
    assert a_status(writable=True, controllers=[down, up]).healthy
    assert not a_status(writable=False, controllers=[up]).healthy
    assert not a_status(writable=True, controllers=[down]).healthy
    assert not a_status(writable=True, controllers=[]).healthy


def test_the_text_names_the_leader_each_member_and_controller() -> None:
    members = parse_patroni_cluster((FIXTURES / "patroni-three-members.json").read_bytes())
    patroni = PatroniState(url="http://db1:8008/cluster", members=members)
    status = a_status(writable=True, controllers=parse_scontrol_ping((FIXTURES / "ping-primary-down.txt").read_text()), patroni=patroni)
    assert render_text(status).splitlines() == [
        "database: 10.0.0.11:5432 (leader, takes writes)",
        "  patroni (http://db1:8008/cluster):",
        "    db1  leader        running    10.0.0.11:5432  lag -",
        "    db2  sync_standby  streaming  10.0.0.12:5432  lag 0 B",
        "    db3  replica       streaming  10.0.0.13:5432  lag 16384 B",
        "slurm controllers:",
        "  primary  mn-ctl   DOWN",
        "  backup   mn-ctl2  UP",
        "rate-limit store: NOT ANSWERING: each API worker limits on its own until it answers again",
    ]
    document = render_json(status)
    assert document["healthy"] is True
    assert [member["name"] for member in document["patroni"]["members"] if member["leads"]] == ["db1"]
