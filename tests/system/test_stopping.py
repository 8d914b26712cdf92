"""SIGTERM at random moments around kubelet sessions, restarts and reloads, with both cores busy:
every stop exits 0 within 2 s and removes the socket (`python -m bench --only stops` runs 200)."""

from __future__ import annotations

import os

from bench.stops import STOP_BOUND, busy_cores, stop_storm

STOPS = 12


async def test_every_stop_under_load_is_clean_and_bounded() -> None:
    seed = int(os.environ.get("IX_STOP_SEED", "7"))
    with busy_cores(seconds=120):
        results = await stop_storm(STOPS, seed)
    failed = [result for result in results if not result.ok]
    assert failed == [], f"seed {seed}: {failed}"
    assert max(result.seconds for result in results) < STOP_BOUND
    assert {result.action for result in results} >= {"kubelet session ended", "kubelet restarted"}
