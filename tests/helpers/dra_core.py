"""Inventories, claims and node views for the tests of the pure DRA cores."""

from __future__ import annotations

from pathlib import Path

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.dra.slices import (
    slice_content,
)
from ix_device_plugin.hardware.simulated import parse_spec

REF = ClaimRef("default", "claim", "uid-1")


def inventory(spec: str = "BI-V150:2", version: str = "4.1.0") -> Inventory:
    return Inventory(boards=parse_spec(spec), driver_version=version, control_nodes=("/dev/itrctl",))


def allocated_claim(*devices: str, uid: str = "uid-1", pool: str = "node-a") -> dict:
    results = [{"request": "gpu", "driver": "gpu.iluvatar.com", "pool": pool, "device": d} for d in devices]
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def node_view(spec: str = "BI-V150:2", control_nodes: tuple[str, ...] = ()) -> NodeView:
    return NodeView(slice_content(inventory(spec)).by_name(), "node-a", control_nodes, Path("/"))


def prepared_for(claim: dict, ref: ClaimRef = REF, others: dict[str, PreparedClaim] | None = None) -> PreparedClaim:
    return prepare(ref, claim, node_view(), others or {})
