"""bench/submit's slurmrestd side: a load generator that runs as the tenant user.

slurmrestd's local authentication (rest_auth/local) accepts a connection only
from the uid slurmrestd itself runs as, so the requests must come from a
process of the tenant's: bench/submit starts this script as the tenant and
drives it over stdin, one command a line, so its rounds stay interleaved with
the other sides'. Standard library only: it runs as a user that owns nothing.

    one              submit one job; prints the seconds it took
    burst JOBS CONC  submit JOBS jobs from CONC threads; prints the seconds all took

Usage: python3 bench/_restd_client.py SOCKET BODY_FILE
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import time

SUBMIT_PATH = "/slurm/v0.0.38/job/submit"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def submit(socket_path: str, body: bytes) -> None:
    """One POST on its own connection, as bench/submit's gpupool side makes them."""
    connection = UnixHTTPConnection(socket_path)
    try:
        connection.request("POST", SUBMIT_PATH, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        reply = json.loads(response.read() or b"{}")
    finally:
        connection.close()
    if response.status != 200 or reply.get("errors") or not reply.get("job_id"):
        raise RuntimeError(f"slurmrestd refused the job: {response.status} {reply.get('errors')}")


def burst(socket_path: str, body: bytes, jobs: int, concurrency: int) -> float:
    remaining = [jobs]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0 or failures:
                    return
                remaining[0] -= 1
            try:
                submit(socket_path, body)
            except Exception as exc:  # noqa: BLE001 - reported to the parent below
                failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - started


def main() -> None:
    socket_path, body_file = sys.argv[1], sys.argv[2]
    with open(body_file, "rb") as handle:
        body = handle.read()
    for line in sys.stdin:
        command = line.split()
        if command[0] == "one":
            started = time.perf_counter()
            submit(socket_path, body)
            elapsed = time.perf_counter() - started
        else:
            elapsed = burst(socket_path, body, int(command[1]), int(command[2]))
        print(f"{elapsed:.6f}", flush=True)


if __name__ == "__main__":
    main()
