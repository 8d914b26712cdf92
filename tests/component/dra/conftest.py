"""Fixtures of the DRA component tests: an API server with no node yet, a DRA node on it, and driver processes."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers.dra_support import DraNode

from ix_device_plugin.standins.apiserver import ApiServerStandIn


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    """An API-server stand-in; the driver creates what it needs."""
    async with ApiServerStandIn() as server:
        yield server


@pytest.fixture
async def node(short_dir: Path, api: ApiServerStandIn) -> AsyncIterator[DraNode]:
    """A DRA node (kubelet stand-in, folders, drivers) on api, stopped at the end."""
    dra_node = DraNode(short_dir, api)
    yield dra_node
    await dra_node.stop_all()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Driver processes the test starts (appended by it); killed at the end if still running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)
