"""How long the API server is asked to keep each watch open: long, and spread, so that a fleet's watches opened
together do not end together."""

from __future__ import annotations

from ix_device_plugin.apiserver.events import WATCH_SERVER_TIMEOUT, server_timeout


def test_each_watch_asks_for_between_one_and_two_server_timeouts_spread_over_that_range() -> None:
    drawn = [server_timeout() for _ in range(2_000)]

    assert all(WATCH_SERVER_TIMEOUT <= seconds < 2 * WATCH_SERVER_TIMEOUT for seconds in drawn)
    quarters = [sum(1 for s in drawn if WATCH_SERVER_TIMEOUT * (4 + q) / 4 <= s < WATCH_SERVER_TIMEOUT * (5 + q) / 4)
                for q in range(4)]  # fmt: skip
    assert min(quarters) > 300, quarters  # about 500 in each quarter: not bunched
