"""Fixtures of the DRA component tests: an API server with no node yet, and a DRA node on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dra_support import DraNode

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
