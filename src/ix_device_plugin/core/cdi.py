"""Container Device Interface (CDI): the spec that names the node's chips, and the names that point into it.

Pure: builds plain data from an Inventory; `outputs.CdiSpecWriter` puts it on disk.

The spec follows what Iluvatar's `ix-ctk cdi generate` writes: kind `iluvatar.com/gpu`, one device per chip
whose edits are its `/dev/iluvatar<minor>` node, and a device `all` with every chip's node. Device names
are chip UUIDs (the IDs the plugin advertises when boards are split). `/dev/itrctl`, which every container
with a GPU also gets, goes into the spec-wide edits. Environment variables are left to Allocate, as
ix-ctk puts none into the spec either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.core.inventory import Chip, Inventory

CDI_VENDOR = "iluvatar.com"
CDI_CLASS = "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
ALL_DEVICE = "all"
# The plugin name in CDI annotation keys (`cdi.k8s.io/<plugin>_<id>`), as NVIDIA's plugin uses its own name.
ANNOTATION_PLUGIN = "ix-device-plugin"
ANNOTATION_PREFIX = "cdi.k8s.io/"
MAX_ANNOTATION_NAME_LENGTH = 63

# Spec versions: 0.3.0 is the earliest the CDI libraries accept; 0.5.0 added `hostPath` on device nodes
# and device names that start with a digit (specs-go/version.go, requiresV050).
EARLIEST_VERSION = "0.3.0"
HOST_PATH_VERSION = "0.5.0"


# parser.ValidateDeviceName: alphanumeric first and last, `_ - . :` allowed between.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ANNOTATION_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class CdiSpec:
    """A CDI spec document, plus why chips were left out of it."""

    document: dict[str, Any]
    warnings: tuple[str, ...] = ()

    @property
    def chip_devices(self) -> int:
        """Number of per-chip devices in the spec (the `all` device not counted)."""
        return sum(1 for device in self.document["devices"] if device["name"] != ALL_DEVICE)

    @property
    def empty(self) -> bool:
        """True when no chip could be described; CDI rejects a spec without devices, so none is written."""
        return self.chip_devices == 0


def build_spec(inventory: Inventory, dev_root: Path) -> CdiSpec:
    """The CDI spec for inventory's chips, whose device nodes the host has under dev_root."""
    devices: list[dict[str, Any]] = []
    all_nodes: list[dict[str, str]] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for chip in inventory.chips():
        path = chip.device_node
        problem = "its minor number, and so its device node, is unknown" if path is None else _unnameable(chip, seen)
        if path is None or problem is not None:
            warnings.append(f"chip {chip.uuid!r} left out of the CDI spec: {problem}")
            continue
        seen.add(chip.uuid)
        node = device_node(path, dev_root)
        devices.append({"name": chip.uuid, "containerEdits": {"deviceNodes": [node]}})
        all_nodes.append(node)
    if devices:
        devices.append({"name": ALL_DEVICE, "containerEdits": {"deviceNodes": [dict(n) for n in all_nodes]}})
    document: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": devices}
    if inventory.control_nodes:
        document["containerEdits"] = {"deviceNodes": [device_node(node, dev_root) for node in inventory.control_nodes]}
    document["cdiVersion"] = minimum_version(document)
    return CdiSpec(document=document, warnings=tuple(warnings))


def spec(inventory: Inventory, dev_root: Path) -> dict[str, Any]:
    """The CDI spec document for inventory (see `build_spec` for the chips left out and why)."""
    return build_spec(inventory, dev_root).document


def _unnameable(chip: Chip, seen: set[str]) -> str | None:
    if not _DEVICE_NAME.match(chip.uuid):
        return "the UUID is not a valid CDI device name"
    if chip.uuid == ALL_DEVICE:
        return f"the UUID clashes with the device {ALL_DEVICE!r}"
    if chip.uuid in seen:
        return "another chip has the same UUID"
    return None


def device_node(container_path: str, dev_root: Path) -> dict[str, str]:
    """A CDI device node at container_path in the container, from dev_root on the host."""
    node = {"path": container_path}
    host_path = Path(dev_root) / container_path.lstrip("/")
    if str(host_path) != container_path:
        node["hostPath"] = str(host_path)
    return node


def minimum_version(document: dict[str, Any]) -> str:
    """The lowest cdiVersion that covers every field document uses."""
    names = [str(device["name"]) for device in document.get("devices", ())]
    edits = [device.get("containerEdits", {}) for device in document.get("devices", ())]
    edits.append(document.get("containerEdits", {}))
    host_paths = any("hostPath" in node for edit in edits for node in edit.get("deviceNodes", ()))
    digit_first = any(name and not name[0].isalpha() for name in names)
    return HOST_PATH_VERSION if host_paths or digit_first else EARLIEST_VERSION


def qualified_name(device: str) -> str:
    """The fully qualified CDI name `iluvatar.com/gpu=<device>`."""
    return f"{CDI_KIND}={device}"


def qualified_names(uuids: Iterable[str]) -> list[str]:
    """The fully qualified CDI names of the chips with these UUIDs, in order."""
    return [qualified_name(uuid) for uuid in uuids]


def annotations(names: Sequence[str], response_id: str, plugin: str = ANNOTATION_PLUGIN) -> dict[str, str]:
    """The container annotation asking a CDI-aware runtime for the devices called names.

    The key is `cdi.k8s.io/<plugin>_<response_id>` (slashes in response_id become `_`), the value the
    comma-joined names, as the CDI library's UpdateAnnotations makes it. response_id must keep the key
    unique per container; NVIDIA's plugin uses a random UUID per container response.
    Raises ValueError naming what is wrong.
    """
    if not names:
        raise ValueError("CDI annotation: no device names given")
    if not plugin or not response_id:
        raise ValueError("CDI annotation: plugin name and response ID must not be empty")
    name = f"{plugin}_{response_id.replace('/', '_')}"
    if len(name) > MAX_ANNOTATION_NAME_LENGTH:
        raise ValueError(f"CDI annotation key {name!r} is longer than {MAX_ANNOTATION_NAME_LENGTH} characters")
    if not _ANNOTATION_NAME.match(name):
        raise ValueError(
            f"CDI annotation key {name!r} must start and end with a letter or digit and hold only "
            "letters, digits, '_', '-' and '.'"
        )
    for device in names:
        if not is_qualified_name(device):
            raise ValueError(f"CDI annotation: {device!r} is not a qualified CDI device name (vendor/class=name)")
    return {ANNOTATION_PREFIX + name: ",".join(names)}


_QUALIFIED = re.compile(
    r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?="
    r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"
)


def is_qualified_name(name: str) -> bool:
    """True when name has the form `vendor/class=device` CDI runtimes accept."""
    return bool(_QUALIFIED.match(name))


def spec_text(document: Mapping[str, object]) -> str:
    """A CDI spec document as the YAML file runtimes read (keys in the document's order)."""
    return yaml.safe_dump(dict(document), sort_keys=False, default_flow_style=False)
