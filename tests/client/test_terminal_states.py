"""The client's copy of the terminal job states is the server's, plus gpupool's own UNKNOWN.

The client is a separate distribution that depends only on httpx, so it keeps
its own copy; this test is what ties the two.
"""

from __future__ import annotations

from gpupool_client._core import TERMINAL_STATES as CLIENT_TERMINAL_STATES

from gpupool.models.jobs import TERMINAL_STATES, UNKNOWN


def test_the_client_stops_waiting_exactly_where_the_server_stops_tracking() -> None:
    assert CLIENT_TERMINAL_STATES == TERMINAL_STATES | {UNKNOWN}
