"""Node templates: the ResourceSlices a node of a given shape would publish, before the node exists.

Pure. A shape is a product, a number of boards and the node's policy (flags.splitboard, time-slicing replicas);
its inventory is the one the simulated backend makes for `<product>:<boards>`, and its slices are made by the
driver's own steps (`slice_content`, the publisher's `pool_devices`, `pool_objects`) as a fresh node's first
write: every device healthy, an API server that keeps shared counters, device taints and
allowMultipleAllocations, pool generation 1, no owner (there is no Node to own them yet). What differs on a real
node is what identifies its hardware (uuid, boardUUID, pciBusID, pcieRoot, numaNode, driverVersion): the
template has the simulated node's.
"""

from __future__ import annotations

import re
from typing import Any

from ix_device_plugin.apiserver.objects import RESOURCE_SLICE
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.products import PRODUCTS, lookup
from ix_device_plugin.dra.pool import pool_objects
from ix_device_plugin.dra.publisher import pool_devices
from ix_device_plugin.dra.slices import SlicePolicy, semver, slice_content
from ix_device_plugin.hardware.simulated import DEFAULT_DRIVER_VERSION, MAX_BOARDS, parse_spec

DEFAULT_NODE = "template"
FIRST_GENERATION = 1  # the pool generation of a node's first write: one more than the none stored
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_NODE_NAME = 253


class TemplateError(ValueError):
    """A shape no node can have: its message says which input was wrong and what is accepted."""


def node_inventory(product: str, boards: int | str, driver_version: str = DEFAULT_DRIVER_VERSION) -> Inventory:
    """The inventory of a node of boards boards of product, as the simulated backend discovers it; TemplateError."""
    known = lookup(product)
    if known is None:
        raise TemplateError(f"--product: unknown product {product!r} (known: {', '.join(PRODUCTS)})")
    count = _board_count(boards)
    version = driver_version.strip()
    if not version.isascii() or not version.isprintable() or semver(version) is None:
        raise TemplateError(f"--driver-version: {driver_version!r} is not a version such as {DEFAULT_DRIVER_VERSION}")
    return Inventory(boards=parse_spec(f"{known.name}:{count}"), driver_version=version)


def _board_count(boards: int | str) -> int:
    text = str(boards).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_BOARDS:
        raise TemplateError(f"--boards: expected a whole number from 1 to {MAX_BOARDS}, got {str(boards)[:40]!r}")
    return int(text)


def check_node_name(node: str) -> str:
    """node when it can name a Node (a DNS subdomain); TemplateError otherwise."""
    if len(node) > MAX_NODE_NAME or not _NODE_NAME.match(node):
        raise TemplateError(
            f"--node: {node[:80]!r} is not a node name (lower-case letters, digits, '-' and '.', at most "
            f"{MAX_NODE_NAME} characters)"
        )
    return node


def template_slices(
    product: str,
    boards: int | str,
    policy: SlicePolicy,
    node: str = DEFAULT_NODE,
    driver_version: str = DEFAULT_DRIVER_VERSION,
) -> list[dict[str, Any]]:
    """The ResourceSlices (resource.k8s.io/v1, in name order) the driver would write first on node, a node of
    boards boards of product under policy; TemplateError for a shape no node can have."""
    inventory = node_inventory(product, boards, driver_version)
    content = slice_content(inventory, policy=policy)
    devices, counter_sets = pool_devices(content, {})  # no PCIe roots: the simulated node's sysfs has none
    objects = pool_objects(check_node_name(node), devices, FIRST_GENERATION, None, counter_sets)
    return [{"apiVersion": RESOURCE_SLICE.api_version, "kind": RESOURCE_SLICE.kind, **obj} for obj in objects]
