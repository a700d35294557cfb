"""The production site.yml on three fresh Debian 12 servers (four with REALHOSTS_HA=1; systemd containers, PID 1 systemd): issue 16.

One cluster for the module, in this order: the first run (reboots disallowed,
the example's defaults) converges on every host, the second changes nothing;
the services run under systemd as written; a customer's job goes through the
API on the head node to a GPU node and back; the billing timer bills it by
itself; the webhook sender delivers a customer's webhook when a job ends, and
the idle check's unit stays successful though no GPU node runs an exporter;
the munge key and tenant users match everywhere; GPU nodes cannot reach the
head node's databases; a driver upgrade reboots the GPU nodes one at a time
without killing a job; a new node joins with one more run; a spend alert
reaches the customer as a webhook and an email through the operator's SMTP
server.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpupool_client import verify_signature

from bench.support.services import wait_for
from tests.support.receiver import Delivery, serve_smtp, serve_webhooks

from .conftest import HA, INVENTORY, SITE_INVENTORY, Cluster, PlaybookRun, Server, boot, curl_api

pytestmark = pytest.mark.realhosts

ACCOUNT = "acme"
TENANT = f"gp-{ACCOUNT}"
API = "https://10.50.0.10"
UNITS_EVERYWHERE = ["munge.service"]
UNITS_HEAD = ["slurmctld.service", "slurmdbd.service", "gpupool-api.service", "gpupool-runas.service",
              "gpupool-billing.timer", "gpupool-webhooks.service", "gpupool-idle-check.timer", "gpupool-email.timer"]
# REALHOSTS_HA=1 (issue 36): PostgreSQL under Patroni and etcd on both head nodes; the second head node
# runs the backup slurmctld and a second API host.
HA_UNITS = ["patroni.service", "etcd.service"]
UNITS_HEAD2 = ["slurmctld.service", "gpupool-api.service", "gpupool-runas.service", "gpupool-billing.timer", *HA_UNITS]
# This machine's end of the servers' link: the customer's receiver and the SMTP server listen here
# (inventories/realhosts/group_vars/api.yml lets the head node's gpupool send to it).
TEST_MACHINE = "10.50.0.1"
API_VARS = yaml.safe_load((INVENTORY / "group_vars" / "api.yml").read_text())
SMTP_PORT = int(API_VARS["gpupool_api_extra_environment"]["GPUPOOL_SMTP_PORT"])
UNITS_GPU = ["slurmd.service"]
# With REALHOSTS_HA=1: etcd's third member on gpu01, HAProxy on gpu02 (inventories/realhosts-ha/hosts.yml).
UNITS = ({"head": UNITS_HEAD + HA_UNITS, "head2": UNITS_HEAD2, "gpu01": UNITS_GPU + ["etcd.service"],
          "gpu02": UNITS_GPU + ["haproxy.service"]} if HA else {"head": UNITS_HEAD, "gpu01": UNITS_GPU, "gpu02": UNITS_GPU})


def converged(run: PlaybookRun, hosts: list[str]) -> None:
    assert run.returncode == 0, f"site.yml exited {run.returncode} ({run.log}):\n{run.tail()}"
    for host in hosts:
        counts = run.recap.get(host)
        assert counts is not None, f"{host} is not in the PLAY RECAP ({run.log}):\n{run.tail()}"
        assert counts["failed"] == 0 and counts["unreachable"] == 0, f"{host}: {counts}\n{run.tail()}"


def curl(token: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """The customer's side: curl from this machine to nginx on the head node (its self-signed certificate)."""
    code, text, stderr = curl_api(API, token, method, path, body)
    assert code != 0, f"curl {method} {path}: {stderr}"
    return code, text


def job_state(token: str, job_id: str) -> dict[str, Any]:
    code, text = curl(token, "GET", f"/jobs/{job_id}")
    assert code == 200, text
    return json.loads(text)


def last_run(head: Server, unit: str) -> dict[str, str]:
    """How the timer's last run of a oneshot ``unit`` ended, once it is between runs (systemd's own record)."""
    def between_runs() -> dict[str, str] | None:
        shown = head.out(f"systemctl show -p ActiveState -p Result -p ExecMainStatus -p ExecMainExitTimestamp {unit}")
        fields = dict(line.split("=", 1) for line in shown.splitlines())
        return fields if fields["ActiveState"] in ("inactive", "failed") else None

    return wait_for(between_runs, timeout_s=180, interval_s=2, what=f"the run of {unit} the timer started to end")


def sacct(head: Server, slurm_job_id: int | str, fields: str) -> list[list[str]]:
    out = head.out(f"sacct -X -n -P --allusers -j {int(slurm_job_id)} -o {fields}")
    return [line.split("|") for line in out.splitlines() if line]


def test_first_run_converges_on_every_host_without_reboots(cluster: Cluster, first_run: PlaybookRun) -> None:
    converged(first_run, list(cluster.servers))
    # Nothing of gpupool was there before: the run did the work.
    assert all(first_run.recap[host]["changed"] > 0 for host in cluster.servers), first_run.recap


@pytest.mark.skipif(HA, reason="with REALHOSTS_HA=1 the several-hosts module's last case runs the playbook twice over "
                               "every host and checks that the second changes nothing (one playbook run fewer)")
def test_second_run_changes_nothing(cluster: Cluster, first_run: PlaybookRun) -> None:
    converged(first_run, list(cluster.servers))
    second = cluster.playbook(label="second")
    converged(second, list(cluster.servers))
    changed = {host: counts["changed"] for host, counts in second.recap.items()}
    assert changed == {host: 0 for host in cluster.servers}, f"changed on the second run: {changed}\n{second.log}"


def test_systemd_runs_every_service(cluster: Cluster) -> None:
    for name, server in cluster.servers.items():
        units = UNITS_EVERYWHERE + UNITS[name]
        states = server.run(f"systemctl is-active {' '.join(units)}", check=False).stdout.split()
        assert dict(zip(units, states, strict=True)) == {unit: "active" for unit in units}, name
    assert cluster.head.out("systemctl show -p NoNewPrivileges --value gpupool-api.service") == "yes"
    # gunicorn's own log: its control socket is off, where it used to fail under HOME=/nonexistent.
    api_log = cluster.head.out("journalctl -u gpupool-api.service --no-pager -o cat")
    assert "Starting gunicorn" in api_log and "control s" not in api_log.lower(), api_log[-4000:]
    # The webhook sender runs as its own user; each timer's unit has run and succeeded, as its
    # user (the email sender: the outbox is empty, but its role's claim already needs UPDATE).
    sender = cluster.head.out("systemctl show -p MainPID --value gpupool-webhooks.service")
    assert cluster.head.out(f"ps -o user= -p {sender}") == "gpupool-webhooks"
    for unit, user in (("gpupool-idle-check.service", "gpupool"), ("gpupool-email.service", "gpupool-email")):
        ended = last_run(cluster.head, unit)
        assert (ended["Result"], ended["ExecMainStatus"]) == ("success", "0") and ended["ExecMainExitTimestamp"], (unit, ended)
        assert cluster.head.out(f"systemctl show -p User --value {unit}") == user
    # slurmctld's own answer: both GPU nodes registered, with their GPU types.
    if HA:  # no Debian cluster beside Patroni's: it would hold the port
        assert cluster.head.run("systemctl is-active postgresql@15-main", check=False).stdout.strip() == "inactive"
    nodes = cluster.head.out("sinfo -h -N -o '%N %G %T'").splitlines()
    assert sorted(line.split()[0] for line in nodes) == ["gpu01", "gpu02"], nodes
    assert any("rtx4090" in line for line in nodes) and any("rtx3090" in line for line in nodes), nodes


@pytest.fixture(scope="module")
def token(cluster: Cluster) -> str:
    """An account made as the README says (on the API host, then the tenants step), and a customer's token."""
    head = cluster.head
    head.run(f"gpupool account create {ACCOUNT} --gpu-limit 4")
    today = dt.datetime.now(dt.UTC).date()
    head.run(f"gpupool price set '*' 0.0002 --from {today.replace(day=1).isoformat()}")
    tenants = cluster.playbook("--tags", "tenants", label="tenants")
    converged(tenants, list(cluster.servers))
    return head.out(f"gpupool token create --user alice --account {ACCOUNT}").splitlines()[-1]


@pytest.fixture(scope="module")
def api_job(cluster: Cluster, token: str) -> dict[str, Any]:
    """A customer's job through the API, watched while it runs: the node runs it as the account's user."""
    message = "written on a GPU node, read back through the API"
    code, text = curl(token, "POST", "/submit",
                      {"template": "hello", "gpus": 1, "params": {"message": message, "seconds": 40}})
    assert code == 201, text
    job = json.loads(text)
    running = wait_for(lambda: (s := job_state(token, job["job_id"]))["state"] == "RUNNING" and s,
                       timeout_s=300, interval_s=5, what="the job to run")
    node = cluster.servers[running["node"]]
    owners = node.out("ps -o user= -C sleep || true").split()
    assert owners == [TENANT], f"on {node.name}, sleep runs as {owners}"
    done = wait_for(lambda: (s := job_state(token, job["job_id"]))["state"] not in ("PENDING", "RUNNING") and s,
                    timeout_s=300, interval_s=5, what="the job to end")
    return {"job": done, "message": message}


def test_a_job_through_the_api_runs_as_the_tenant_and_writes_to_the_shared_job_root(
        cluster: Cluster, token: str, api_job: dict[str, Any]) -> None:
    job = api_job["job"]
    assert job["state"] == "COMPLETED", job
    assert job["node"] in ("gpu01", "gpu02"), job
    [[user, node, state]] = sacct(cluster.head, job["slurm_job_id"], "User,NodeList,State")
    assert (user, node, state) == (TENANT, job["node"], "COMPLETED")
    code, log = curl(token, "GET", f"/jobs/{job['job_id']}/logs")
    assert code == 200, log
    assert api_job["message"] in log.splitlines() and "gpus on node: 1" in log, log
    # The job wrote its log on the node into the shared job root (this
    # kernel has no NFS: one folder bind-mounted in every server); the API
    # on head served it from there.
    found = cluster.head.out(f"grep -rlxF {json.dumps(api_job['message'])} /srv/gpupool/jobs || true").splitlines()
    assert len(found) == 1 and found[0].endswith("stdout.log"), found
    assert cluster.head.out(f"stat -c %U {found[0]}") == TENANT


def test_the_billing_timer_bills_the_job_exactly(cluster: Cluster, token: str, api_job: dict[str, Any]) -> None:
    job = api_job["job"]
    [[elapsed, tres]] = sacct(cluster.head, job["slurm_job_id"], "ElapsedRaw,AllocTRES")
    assert "gres/gpu=1" in tres.split(","), tres
    expected = 1 * int(elapsed)
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")

    def billed() -> int | None:
        code, text = curl(token, "GET", f"/invoices/{period}")
        assert code == 200, text
        rows = [row for row in csv.DictReader(io.StringIO(text))
                if row["line_type"] == "job" and row["slurm_job_id"] == str(job["slurm_job_id"])]
        total = sum(int(row["gpu_seconds"]) for row in rows)
        return total if total == expected else None

    # Nobody runs `gpupool billing run` here: only the timer can bill it.
    assert wait_for(billed, timeout_s=240, interval_s=10, what="the timer to bill the job") == expected
    # systemd's own record: the timer started the pass, and it succeeded.
    # A run of the minute may end before our code runs (systemd's 219, its cgroup, in a loaded container): the
    # timer starts the next a minute later, whose result is the one to see.
    def succeeded() -> dict[str, str] | None:
        run = last_run(cluster.head, "gpupool-billing.service")
        return run if run["Result"] == "success" else None

    ended = wait_for(succeeded, timeout_s=150, interval_s=10, what="a billing timer run that succeeded")
    assert ended["ExecMainExitTimestamp"], ended


def test_a_customers_webhook_arrives_signed_when_its_job_ends_and_the_idle_check_stays_green(
        cluster: Cluster, token: str) -> None:
    head = cluster.head
    with serve_webhooks(host=TEST_MACHINE) as receiver:
        code, text = curl(token, "POST", "/webhooks", {"url": receiver.url, "events": ["job.started", "job.ended"]})
        assert code == 201, text
        endpoint = json.loads(text)
        try:
            code, text = curl(token, "POST", "/submit", {"template": "hello", "gpus": 1, "params": {"seconds": 30}})
            assert code == 201, text
            job_id = json.loads(text)["job_id"]
            running = wait_for(lambda: (s := job_state(token, job_id))["state"] == "RUNNING" and s,
                               timeout_s=300, interval_s=3, what="the job to run")
            # No GPU node runs an exporter here: the pass reads none, says which, and its unit
            # still succeeds (status 3, SuccessExitStatus=3); a failed unit every minute would cry wolf.
            head.run("systemctl start gpupool-idle-check.service")
            ended = last_run(head, "gpupool-idle-check.service")
            assert (ended["Result"], ended["ExecMainStatus"]) == ("success", "3"), ended
            journal = head.out("journalctl -u gpupool-idle-check.service -n 50 --no-pager -o cat")
            assert f"  {running['node']}: GPU metrics not read: " in journal, journal
            done = wait_for(lambda: (s := job_state(token, job_id))["state"] not in ("PENDING", "RUNNING") and s,
                            timeout_s=300, interval_s=3, what="the job to end")
            delivered = wait_for(
                lambda: [d for d in receiver.deliveries if d.headers.get("Gpupool-Event-Type") == "job.ended"],
                timeout_s=120, interval_s=2, what="job.ended at the customer's receiver")
        finally:
            curl(token, "DELETE", f"/webhooks/{endpoint['id']}")
    [ended_event] = [verify_signature(d.body, d.headers["Gpupool-Signature"], endpoint["secret"]) for d in delivered]
    assert ended_event["data"]["job"]["job_id"] == job_id and ended_event["data"]["job"]["state"] == done["state"] == "COMPLETED"
    started = [verify_signature(d.body, d.headers["Gpupool-Signature"], endpoint["secret"])
               for d in receiver.deliveries if d.headers.get("Gpupool-Event-Type") == "job.started"]
    assert [event["data"]["job"]["job_id"] for event in started] == [job_id]


def test_munge_key_and_tenant_users_are_the_same_on_every_host(cluster: Cluster, token: str) -> None:
    keys = {name: s.out("sha256sum /etc/munge/munge.key | cut -d' ' -f1") for name, s in cluster.servers.items()}
    assert len(set(keys.values())) == 1, keys
    users = {name: s.out(f"getent passwd {TENANT} | cut -d: -f3,4") for name, s in cluster.servers.items()}
    assert len(set(users.values())) == 1 and next(iter(users.values())), users
    # munge's own answer: a credential made on a GPU node decodes on the head node.
    credential = cluster.servers["gpu01"].out("munge -n")
    cluster.head.run(f"echo {json.dumps(credential)} | unmunge >/dev/null")


def test_gpu_nodes_cannot_reach_the_head_nodes_databases(cluster: Cluster) -> None:
    ports = {"PostgreSQL": 5432, "Redis": 6379, "MariaDB": 3306, "gunicorn": 8000}
    gpu = cluster.servers["gpu01"]
    # The same probe reaches what the port list opens to GPU nodes: slurmctld.
    gpu.run("timeout 10 bash -c 'exec 3<>/dev/tcp/10.50.0.10/6817'")
    for what, port in ports.items():
        answer = gpu.run(f"timeout 10 bash -c 'exec 3<>/dev/tcp/10.50.0.10/{port}'", check=False)
        assert answer.returncode != 0, f"{what} ({port}) on head answers gpu01"


def boot_time(server: Server) -> int:
    """When the server's PID 1 started, in clock ticks of the kernel all servers share."""
    return int(server.out("cut -d' ' -f22 /proc/1/stat"))


def node_states(head: Server) -> dict[str, str]:
    answer = head.run("sinfo -h -N -o '%N %T'", check=False).stdout.split()
    return dict(zip(answer[::2], answer[1::2], strict=True))


def out_of_service(state: str) -> bool:
    return any(word in state for word in ("drain", "down", "reboot", "maint", "fail")) or state.endswith("*")


def test_a_driver_upgrade_reboots_gpu_nodes_one_at_a_time_without_killing_a_job(
        cluster: Cluster, token: str) -> None:
    head = cluster.head
    gpus = {name: cluster.servers[name] for name in ("gpu01", "gpu02")}
    booted = {name: boot_time(server) for name, server in gpus.items()}
    # The tenant's own sbatch (as the README's direct-submit users do), pinned
    # to gpu02, running until the test lets it end: it must outlive gpu01's
    # whole reboot, however long this machine takes for it.
    release = "/srv/gpupool/realhosts-upgrade-release"
    head.run(f"rm -f {release}")
    slurm_job_id = head.out(
        f"cd /tmp && setpriv --reuid={TENANT} --regid={TENANT} --init-groups -- sbatch --parsable -A {ACCOUNT}"
        f" -w gpu02 --gres=gpu:1 -t 120 --chdir=/tmp -o /dev/null"
        f" --wrap 'until [ -e {release} ]; do sleep 2; done'").split(";")[0]
    wait_for(lambda: sacct(head, slurm_job_id, "State") == [["RUNNING"]], timeout_s=300, interval_s=5, what="the job to run")

    upgrade = cluster.playbook_start("-e", "nvidia_driver_upgrade=true", label="driver-upgrade")
    seen: list[dict[str, str]] = []
    gpu01_was_out = released = False
    deadline = time.monotonic() + 3000
    while upgrade.poll() is None and time.monotonic() < deadline:
        states = node_states(head)
        if states:
            seen.append(states)
        gpu01_was_out = gpu01_was_out or out_of_service(states.get("gpu01", ""))
        if not released and gpu01_was_out and states.get("gpu01") == "idle" and "drain" in states.get("gpu02", ""):
            # gpu01 is back in service and gpu02 waits for its job: the job is still alive.
            assert sacct(head, slurm_job_id, "State") == [["RUNNING"]]
            head.run(f"touch {release}")
            released = True
        time.sleep(3)
    if not released:
        head.run(f"touch {release}")
    run = cluster.playbook_finish(upgrade, timeout=600)
    converged(run, list(cluster.servers))
    assert released, f"never saw gpu01 back and gpu02 draining; node states seen: {seen[-20:]}"

    both_out = [states for states in seen if out_of_service(states.get("gpu01", "")) and
                out_of_service(states.get("gpu02", ""))]
    assert both_out == [], f"both GPU nodes out at once: {both_out[:5]}"
    rebooted = {name: boot_time(server) for name, server in gpus.items()}
    assert all(rebooted[name] > booted[name] for name in gpus), (booted, rebooted)
    assert rebooted["gpu01"] < rebooted["gpu02"], rebooted
    assert sacct(head, slurm_job_id, "State,NodeList") == [["COMPLETED", "gpu02"]]
    killed = head.out("sacct -X -n -P --allusers -S now-3hours -s NF,CA,F,TO,PR,RQ -o JobID,State")
    assert killed == "", f"jobs that did not complete: {killed}"
    assert node_states(head) == {"gpu01": "idle", "gpu02": "idle"}


def test_a_node_added_to_the_inventory_joins_with_one_more_run(cluster: Cluster, tmp_path: Path) -> None:
    cluster.servers.update(boot({"gpu03": "10.50.0.23"}))
    extra = tmp_path / "gpu03.yml"
    extra.write_text(
        "all:\n  children:\n    compute:\n      hosts:\n        gpu03:\n          ansible_host: 10.50.0.23\n"
        "          slurm_node_gpus: [{type: rtx3090, count: 1}]\n"
    )
    run = cluster.playbook(inventories=(SITE_INVENTORY, extra), label="add-gpu03")
    converged(run, list(cluster.servers))
    assert node_states(cluster.head).get("gpu03") == "idle"
    users = {name: s.out(f"getent passwd {TENANT} | cut -d: -f3,4") for name, s in cluster.servers.items()}
    assert len(set(users.values())) == 1, users


def test_a_spend_alert_reaches_the_customer_as_a_webhook_and_an_email(cluster: Cluster, token: str) -> None:
    """Last: the monthly limit it sets is spent. The billing pass fires the alerts; the sender and the email unit send them.

    Both units are started as their timers start them (test_the_billing_timer_bills_the_job_exactly has seen the
    billing timer fire): waiting for the next minute of each would cost two minutes of the tier for nothing."""
    head = cluster.head
    with serve_webhooks(host=TEST_MACHINE) as receiver, serve_smtp(TEST_MACHINE, SMTP_PORT) as inbox:
        code, text = curl(token, "POST", "/webhooks", {"url": receiver.url, "events": ["budget.threshold"]})
        assert code == 201, text
        endpoint = json.loads(text)
        try:
            # The module's jobs spent more than 0.005 (the first alone ran 40 GPU-seconds at 0.0002):
            # past 50 % of this limit, at the next billing pass.
            head.run(f"gpupool account set {ACCOUNT} --monthly-limit 0.01 --alert-email ops@{ACCOUNT}.example")
            head.run("systemctl start gpupool-billing.service")  # a oneshot: returns when the pass has ended
            def alerted_at_half() -> list[Delivery] | None:
                alerts = [d for d in receiver.deliveries if d.headers.get("Gpupool-Event-Type") == "budget.threshold"]
                return alerts if 50 in {json.loads(d.body)["data"]["alert"]["threshold"] for d in alerts} else None

            alerts = wait_for(alerted_at_half, timeout_s=300, interval_s=3, what="budget.threshold at 50 % at the customer's receiver")
            head.run("systemctl start gpupool-email.service")
            mails = wait_for(lambda: inbox.to(f"ops@{ACCOUNT}.example"), timeout_s=180, interval_s=3,
                             what="the spend alert's email at the SMTP server")
        finally:
            curl(token, "DELETE", f"/webhooks/{endpoint['id']}")
            head.run(f"gpupool account set {ACCOUNT} --monthly-limit none --alert-email none")
    events = [verify_signature(d.body, d.headers["Gpupool-Signature"], endpoint["secret"]) for d in alerts]
    assert {event["data"]["alert"]["account"] for event in events} == {ACCOUNT}
    assert {event["data"]["alert"]["kind"] for event in events} == {"limit"}, events
    assert f"Subject: gpupool: account {ACCOUNT} has used" in mails[0].content.decode()
    # The login came from the email unit's credential, which no other unit holds.
    assert set(inbox.logins) == {(b"gpupool", API_VARS["gpupool_api_smtp_password"].encode())}
    ended = last_run(head, "gpupool-email.service")
    assert ended["Result"] == "success", ended
