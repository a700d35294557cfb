"""Losing one host of several (issue 36), on the servers test_site_on_real_hosts.py converged (one boot).

The customers' address is HAProxy on gpu02 (inventories/realhosts-ha: api on head and
head2, PostgreSQL under Patroni on both, etcd on head, head2 and gpu01, the backup
slurmctld on head2). Each case runs a bounded client loop that submits through
HAProxy while one thing is taken away, then counts what the customer was told
against what Slurm (sacct) and the database (GET /jobs/<id>) hold:

a) head's API processes killed (-9): head2 answers;
b) the database leader's Patroni stopped: the standby takes over, billing bills once;
c) head's slurmctld stopped: head2's backup takes control, a running job finishes;
d) one playbook run brings every stopped piece back; a second changes nothing.
"""

from __future__ import annotations

import collections
import csv
import datetime as dt
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.support.services import wait_for

from .conftest import HA, LOG_DIR, SITE_INVENTORY, Cluster, PlaybookRun, Server, curl_api

pytestmark = [
    pytest.mark.realhosts,
    pytest.mark.skipif(not HA, reason="the several-hosts cases run with REALHOSTS_HA=1 (make test-realhosts-ha)"),
]

ACCOUNT = "acme"
TENANT = f"gp-{ACCOUNT}"
# HAProxy on gpu02 (inventories/realhosts-ha/hosts.yml: loadbalancer).
LOADBALANCER = "https://10.50.0.22"
# This machine, the customer, on the servers' link (deploy/realhosts/hosts.sh's bridge).
CUSTOMER_ADDRESS = "10.50.0.1"
# A loop never runs longer than this many submits, whatever happens. One a second at
# most: the API allows 60 submits a minute per host (its rate limit).
MAX_SUBMITS = 150
# A loop ends once the takeover is done and this many submits in a row got 201.
SETTLED_RUN = 8
# What a customer may be told while a piece is away: a 503 JSON (the API's, or nginx's
# own while HAProxy has not yet seen /readyz fail on a host whose gunicorn is gone), or
# no answer at all (000). Never a 500, never nginx's HTML 502.
TRANSIENT = {0, 503}
PATRONI_CONFIG = "/etc/patroni/config.yml"


def lb_curl(token: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """The customer's side through HAProxy; 0 when no HTTP answer came (connection refused or cut)."""
    code, text, _ = curl_api(LOADBALANCER, token, method, path, body, max_time_s=40)
    return code, text


def lb_curl_as_a_client(token: str, method: str, path: str, body: dict[str, Any] | None = None, *,
                        pause_s: float = 2) -> tuple[int, str]:
    """``lb_curl``, asked again (five tries in all) while the answer is one a client retries (TRANSIENT)."""
    for _ in range(5):
        code, text = lb_curl(token, method, path, body)
        if code not in TRANSIENT:
            break
        time.sleep(pause_s)
    return code, text


@dataclass
class Tally:
    """What one client loop saw, and what Slurm and the database hold for it."""

    case: str
    codes: list[int] = field(default_factory=list)
    # Each answer other than 201, by code: its first few distinct bodies (the errors a customer saw).
    bodies: dict[int, list[str]] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)

    @property
    def answered_201(self) -> int:
        return len(self.created)

    def settled(self) -> bool:
        return len(self.codes) >= SETTLED_RUN and all(code == 201 for code in self.codes[-SETTLED_RUN:])


def only_transient(tally: Tally) -> None:
    """Every answer but a 201 was one a client retries: a 503 in the API's error shape, or none."""
    assert set(tally.codes) <= {201} | TRANSIENT, (tally.codes, tally.bodies)
    for body in tally.bodies.get(503, []):
        assert set(json.loads(body)) >= {"error", "message"}, body


def submit_loop(token: str, tally: Tally, until: Callable[[], bool], interval_s: float = 1.0) -> Tally:
    """Submits one short job at a time through HAProxy until ``until()`` holds and the last
    SETTLED_RUN submits got 201, or MAX_SUBMITS were made."""
    done = False
    while len(tally.codes) < MAX_SUBMITS:
        code, text = lb_curl(token, "POST", "/submit", {"template": "hello", "gpus": 1, "params": {"seconds": 1}})
        tally.codes.append(code)
        if code == 201:
            tally.created.append(json.loads(text))
        else:
            seen = tally.bodies.setdefault(code, [])
            if text not in seen and len(seen) < 4:
                seen.append(text)
        done = done or until()
        if done and tally.settled():
            break
        time.sleep(interval_s)
    return tally


def slurm_jobs_of_tenant(head: Server, since: str) -> list[str]:
    """The tenant's jobs submitted since ``since`` (sacct -S also lists an earlier case's jobs still queued then)."""
    out = head.out(f"sacct -X -n -P -u {TENANT} -S {since} -o JobID,Submit")
    return [job for job, _, submitted in (line.partition("|") for line in out.splitlines() if line) if submitted >= since]


def count(head: Server, token: str, tally: Tally, since: str) -> dict[str, int]:
    """The counts every case prints and asserts: a 201 job is in Slurm and in the database exactly once."""
    answered = [str(job["slurm_job_id"]) for job in tally.created]

    def all_in_slurm() -> list[str] | None:
        known = set(slurm_jobs_of_tenant(head, since))
        return sorted(known) if set(answered) <= known else None

    # sacct learns of a job from slurmctld through slurmdbd: allow it the time.
    try:
        in_slurm = wait_for(all_in_slurm, timeout_s=120, interval_s=5, what="every 201 job in sacct")
    except Exception:  # noqa: BLE001 - counted below as lost
        in_slurm = slurm_jobs_of_tenant(head, since)
    in_ledger = 0
    for job in tally.created:
        # A pooled connection to a database host that went away fails one request (503): ask again.
        code, text = lb_curl_as_a_client(token, "GET", f"/jobs/{job['job_id']}")
        found = code == 200 and str(json.loads(text)["slurm_job_id"]) == str(job["slurm_job_id"])
        in_ledger += found
        if not found:
            print(f"realhosts HA {tally.case}: job {job['job_id']} not read back: {code} {text[:300]}")
    duplicates = sum(n - 1 for n in collections.Counter(answered).values() if n > 1)
    counts = {
        "submitted": len(tally.codes),
        "answered_201": tally.answered_201,
        "in_slurm": len(set(answered) & set(in_slurm)),
        "in_ledger": in_ledger,
        "duplicates": duplicates,
        "lost": len(set(answered) - set(in_slurm)) + (tally.answered_201 - in_ledger),
        # Slurm jobs no 201 told the customer of (a submit cut off after sbatch).
        "unanswered_in_slurm": len(set(in_slurm) - set(answered)),
    }
    other = collections.Counter(code for code in tally.codes if code != 201)
    print(f"\nrealhosts HA {tally.case}: {counts}, other answers {dict(other)}, bodies {tally.bodies}")
    return counts


def no_loss(counts: dict[str, int]) -> None:
    assert counts["answered_201"] > 0, counts
    assert counts["in_slurm"] == counts["in_ledger"] == counts["answered_201"], counts
    assert counts["duplicates"] == 0 and counts["lost"] == 0, counts


def patroni_members(server: Server) -> dict[str, str]:
    """Patroni's own answer (through etcd): member -> role."""
    members = json.loads(server.out(f"patronictl -c {PATRONI_CONFIG} list -f json"))
    return {member["Member"]: member["Role"] for member in members}


def leader(server: Server) -> str | None:
    leaders = [name for name, role in patroni_members(server).items() if role == "Leader"]
    return leaders[0] if len(leaders) == 1 else None


def sacct_since(head: Server) -> str:
    return head.out("date +%Y-%m-%dT%H:%M:%S")


@pytest.fixture(scope="module")
def token(cluster: Cluster, first_run: PlaybookRun) -> str:
    """A token of the account the site module made (made here too when this module runs alone)."""
    assert first_run.returncode == 0, first_run.tail()
    head = cluster.head
    if head.run(f"getent passwd {TENANT}", check=False).returncode != 0:
        head.run(f"gpupool account create {ACCOUNT} --gpu-limit 4")
        head.run(f"gpupool price set '*' 0.0002 --from {dt.datetime.now(dt.UTC).date().replace(day=1).isoformat()}")
        cluster.playbook("--tags", "tenants", inventories=inventories(cluster), label="ha-tenants")
    return head.out(f"gpupool token create --user carol --account {ACCOUNT}").splitlines()[-1]


def inventories(cluster: Cluster) -> tuple[Path, ...]:
    """The realhosts inventory, with gpu03 where the site module added it (else it would leave slurm.conf)."""
    if "gpu03" not in cluster.servers:
        return (SITE_INVENTORY,)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    extra = LOG_DIR / "gpu03-inventory.yml"
    extra.write_text(
        "all:\n  children:\n    compute:\n      hosts:\n        gpu03:\n          ansible_host: 10.50.0.23\n"
        "          slurm_node_gpus: [{type: rtx3090, count: 1}]\n"
    )
    return (SITE_INVENTORY, extra)


def test_haproxy_sends_to_both_api_hosts_and_both_are_ready(cluster: Cluster, token: str) -> None:
    for server in (cluster.servers["head"], cluster.servers["head2"]):
        ready = server.out("curl -sk https://127.0.0.1/readyz")
        assert json.loads(ready)["status"] == "ready", (server.name, ready)
    # HAProxy's own view: both servers UP.
    stat = cluster.servers["gpu02"].out(
        "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock');"
        " s.sendall(b'show stat\\n'); print(s.makefile().read())\"")
    rows = {row["svname"]: row["status"] for row in csv.DictReader(io.StringIO(stat.lstrip("# ")))
            if row["pxname"] == "gpupool_api" and row["svname"] in ("head", "head2")}
    assert rows == {"head": "UP", "head2": "UP"}, stat
    code, text = lb_curl(token, "GET", "/jobs")
    assert code == 200, text
    # Each API host sees the customer's address (HAProxy's PROXY protocol header), not HAProxy's: in nginx's log,
    # in what it hands the API. Four requests, round robin: two on each host.
    probe = f"probe-{time.monotonic_ns()}"
    for _ in range(4):
        assert lb_curl(token, "GET", f"/jobs?{probe}")[0] == 200
    for server in (cluster.servers["head"], cluster.servers["head2"]):
        logged = server.out(f"grep -h -- {probe} /var/log/nginx/access.log").splitlines()
        assert logged and all(line.startswith(f"{CUSTOMER_ADDRESS} ") for line in logged), (server.name, logged)


def test_a_killed_api_host_loses_no_submit(cluster: Cluster, token: str) -> None:
    head = cluster.head
    since = sacct_since(head)
    tally = Tally("a: head's API killed")
    killed = {"done": False}

    def kill_once() -> bool:
        if not killed["done"] and len(tally.codes) >= 4:
            # gunicorn's master and workers, the API's processes alone (systemctl kill also signals
            # processes these containers refuse it: "Input/output error").
            head.run("pkill -KILL -u gpupool -f 'gunicorn'")
            killed["done"] = True
        return killed["done"]

    submit_loop(token, tally, kill_once)
    assert killed["done"] and tally.settled(), tally.codes
    counts = count(head, token, tally, since)
    no_loss(counts)
    only_transient(tally)


def test_the_database_standby_takes_over_and_billing_bills_once(cluster: Cluster, token: str) -> None:
    head, head2 = cluster.servers["head"], cluster.servers["head2"]
    before = wait_for(lambda: leader(head), timeout_s=60, interval_s=2, what="a Patroni leader")
    standby = "head2" if before == "head" else "head"
    since = sacct_since(head)
    tally = Tally(f"b: database leader {before} stopped")
    stopped = {"done": False}

    def stop_leader() -> bool:
        if not stopped["done"] and len(tally.codes) >= 4:
            cluster.servers[before].run("systemctl stop patroni")
            stopped["done"] = True
        return stopped["done"] and leader(head2 if before == "head" else head) == standby

    submit_loop(token, tally, stop_leader)
    # Patroni's own answer: the standby leads (the loop waited for it; bounded by MAX_SUBMITS).
    assert wait_for(lambda: leader(cluster.servers[standby]) == standby, timeout_s=30, interval_s=1,
                    what=f"{standby} to lead the database")
    counts = count(head, token, tally, since)
    no_loss(counts)
    # The API says what it is while it has no database: JSON, never a 500.
    only_transient(tally)

    # Billing (its timer on both API hosts) bills each of these jobs once, exactly.
    slurm_ids = [str(job["slurm_job_id"]) for job in tally.created]
    wait_for(lambda: not {"PENDING", "RUNNING", "COMPLETING"} & set(
        head.out(f"sacct -X -n -P -j {','.join(slurm_ids)} -o State").split()),
             timeout_s=600, interval_s=10, what="the loop's jobs to end")
    elapsed = {row.split("|")[0]: int(row.split("|")[1]) for row in
               head.out(f"sacct -X -n -P -j {','.join(slurm_ids)} -o JobID,ElapsedRaw").splitlines()}
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")

    def billed() -> dict[str, list[int]] | None:
        code, text = lb_curl(token, "GET", f"/invoices/{period}")
        if code != 200:
            return None
        rows: dict[str, list[int]] = collections.defaultdict(list)
        for row in csv.DictReader(io.StringIO(text)):
            if row["line_type"] == "job" and row["slurm_job_id"] in elapsed:
                rows[row["slurm_job_id"]].append(int(row["gpu_seconds"]))
        return dict(rows) if set(rows) == set(elapsed) else None

    lines = wait_for(billed, timeout_s=300, interval_s=10, what="the billing timer to bill the loop's jobs")
    assert lines == {job: [seconds] for job, seconds in elapsed.items()}, lines


def test_the_backup_slurmctld_takes_over_and_a_running_job_finishes(cluster: Cluster, token: str) -> None:
    head, head2 = cluster.servers["head"], cluster.servers["head2"]
    # Right after case (b)'s failover an API worker may still hold a connection to the old leader: one 503 with
    # Retry-After, as designed (the pool then empties); ask again, as a client does.
    code, text = lb_curl_as_a_client(token, "POST", "/submit", {"template": "hello", "gpus": 1, "params": {"seconds": 90}},
                                     pause_s=5)
    assert code == 201, text
    running_job = json.loads(text)
    wait_for(lambda: head.out(f"sacct -X -n -P -j {running_job['slurm_job_id']} -o State") == "RUNNING",
             timeout_s=300, interval_s=3, what="the long job to run")
    since = sacct_since(head)
    tally = Tally("c: head's slurmctld stopped")
    stopped = {"done": False}

    def backup_in_control() -> bool:
        if not stopped["done"] and len(tally.codes) >= 4:
            head.run("systemctl stop slurmctld")
            stopped["done"] = True
        if not stopped["done"]:
            return False
        ping = head2.run("scontrol ping", check=False).stdout
        return "(backup) at head2 is UP" in ping and "(primary) at head is DOWN" in ping

    submit_loop(token, tally, backup_in_control)
    ping = head2.out("scontrol ping")
    assert "(primary) at head is DOWN" in ping and "(backup) at head2 is UP" in ping, ping
    counts = count(head2, token, tally, since)
    no_loss(counts)
    only_transient(tally)
    # The job that ran across the takeover ends as it would have.
    done = wait_for(lambda: (s := head2.out(f"sacct -X -n -P -j {running_job['slurm_job_id']} -o State")) not in
                    ("RUNNING", "PENDING", "COMPLETING") and s, timeout_s=300, interval_s=5, what="the long job to end")
    assert done == "COMPLETED", done


def test_one_playbook_run_brings_every_host_back_and_a_second_changes_nothing(
        cluster: Cluster, first_run: PlaybookRun, request: pytest.FixtureRequest) -> None:
    from .test_site_on_real_hosts import converged

    back = cluster.playbook(inventories=inventories(cluster), label="ha-back")
    converged(back, list(cluster.servers))
    # The customer's token once the run is done: nothing of the API is needed before it.
    token = request.getfixturevalue("token")
    head, head2 = cluster.servers["head"], cluster.servers["head2"]
    for name, server in (("head", head), ("head2", head2)):
        states = server.run("systemctl is-active patroni slurmctld gpupool-api", check=False).stdout.split()
        assert states == ["active"] * 3, (name, states)
    # Both database members again, one leading, the other its synchronous standby.
    def both_members() -> dict[str, str] | None:
        members = patroni_members(head)
        return members if sorted(members.values()) == ["Leader", "Sync Standby"] else None

    roles = wait_for(both_members, timeout_s=120, interval_s=3, what="both Patroni members, one a synchronous standby")
    assert set(roles) == {"head", "head2"}, roles
    # The first controller has control back; the backup waits again.
    def primary_up() -> str | None:
        answer = head.run("scontrol ping", check=False).stdout
        return answer if "(primary) at head is UP" in answer else None

    ping = wait_for(primary_up, timeout_s=120, interval_s=3, what="head's slurmctld to answer")
    assert "(backup) at head2 is UP" in ping, ping
    code, text = lb_curl(token, "POST", "/submit", {"template": "hello", "gpus": 1, "params": {"seconds": 1}})
    assert code == 201, text

    second = cluster.playbook(inventories=inventories(cluster), label="ha-second")
    converged(second, list(cluster.servers))
    changed = {host: counts["changed"] for host, counts in second.recap.items()}
    assert changed == {host: 0 for host in cluster.servers}, f"changed on the second run: {changed}\n{second.log}"
