"""Node labels describing the node's GPUs, for Node Feature Discovery's local feature files.

Pure: from the Inventory, the Plan and the Config (plus the machine name and CUDA version, which the
caller reads) to a label set; `nodelabels.featurefile.FeatureFileWriter` puts it on disk.

Names and value formats follow Iluvatar's ix-feature-discovery (`iluvatar.com/gpu.product`, `.count`,
`.memory`, `.machine`, `iluvatar.com/ix.driver-version.*`, `iluvatar.com/cuda.runtime-version.*`);
`gpu.replicas` and `gpu.sharing-strategy` follow NVIDIA's GPU feature discovery.

Both front ends write the same labels from the same facts (the DRA driver plans the node as the device plugin
would, with the same ix-config), so a node moved from one to the other keeps their values; the DRA driver adds
`iluvatar.com/dra.*` (`dra_labels`): the driver it serves and the devices its ResourceSlices offer.

A node without chips gets no labels at all (as ix-feature-discovery does), so the feature file is removed
rather than claiming `present=false`: a GPU node whose driver is briefly away keeps no stale GPU facts, and
nothing here is written that could move a DaemonSet selecting on `iluvatar.com/gpu.present` off the node
while the plugin waits for its GPUs.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ix_device_plugin.core import products
from ix_device_plugin.core.inventory import Chip, Inventory
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.settings.config import Config

PREFIX = "iluvatar.com"
PRESENT = f"{PREFIX}/gpu.present"
PRODUCT = f"{PREFIX}/gpu.product"
COUNT = f"{PREFIX}/gpu.count"
MEMORY = f"{PREFIX}/gpu.memory"
MACHINE = f"{PREFIX}/gpu.machine"
BOARDS = f"{PREFIX}/gpu.boards"
SPLITBOARD = f"{PREFIX}/gpu.splitboard"
HEALTHY = f"{PREFIX}/gpu.healthy"
REPLICAS = f"{PREFIX}/gpu.replicas"
SHARING_STRATEGY = f"{PREFIX}/gpu.sharing-strategy"
DRIVER_VERSION = f"{PREFIX}/ix.driver-version"
CUDA_RUNTIME_VERSION = f"{PREFIX}/cuda.runtime-version"
DRA_DRIVER = f"{PREFIX}/dra.driver"
DRA_CHIPS = f"{PREFIX}/dra.chips"
DRA_BOARDS = f"{PREFIX}/dra.boards"
DRA_SHARES = f"{PREFIX}/dra.shares"

SHARING_NONE = "none"
SHARING_TIME_SLICING = "time-slicing"
MAX_LABEL_VALUE_LENGTH = 63

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_NOT_VALUE_CHARACTER = re.compile(r"[^A-Za-z0-9_.\-\s]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_WHITESPACE = re.compile(r"\s+")
_CUDA_DOTTED = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True)
class LabelSet:
    """The labels for a node, plus notes worth a log line (mixed products, unreadable versions)."""

    labels: dict[str, str]
    notes: tuple[str, ...] = ()


def labels(
    inventory: Inventory, plan: Plan, config: Config, machine: str | None, cuda_version: str | None
) -> dict[str, str]:
    """The node labels for inventory as planned; see `label_set` for the notes that go with them."""
    return label_set(inventory, plan, config, machine, cuda_version).labels


def label_set(
    inventory: Inventory, plan: Plan, config: Config, machine: str | None, cuda_version: str | None
) -> LabelSet:
    """The node labels and notes for inventory as planned under config.

    machine is the DMI product name (None when unknown); cuda_version is what nvmlSystemGetCudaDriverVersion
    gives, either its integer (`10020`) or dotted (`10.2`), None when unknown. Empty when there are no chips.
    """
    chips = list(inventory.chips())
    if not chips:
        return LabelSet(labels={})
    notes: list[str] = []
    product, product_chips = _main_product(chips, notes)
    result = {
        PRESENT: "true",
        PRODUCT: sanitise_label_value(product),
        COUNT: str(len(product_chips)),
        BOARDS: str(len(inventory.boards)),
        SPLITBOARD: "true" if config.splitboard else "false",
        HEALTHY: str(plan.healthy_count()),
        REPLICAS: str(plan.replicas if plan.shared else 1),
        SHARING_STRATEGY: SHARING_TIME_SLICING if plan.shared else SHARING_NONE,
    }
    memory = _memory_mib(product_chips)
    if memory is not None:
        result[MEMORY] = str(memory)
    if machine is not None and (machine_value := sanitise_label_value(machine)):
        result[MACHINE] = machine_value
    result.update(_driver_labels(inventory.driver_version, notes))
    result.update(_cuda_labels(cuda_version, notes))
    return LabelSet(labels=result, notes=tuple(notes))


def dra_labels(driver: str, chips: int, boards: int, shares: int) -> dict[str, str]:
    """The DRA driver's own labels: the driver the node serves, the chip and whole-board devices its
    ResourceSlices offer, and the shares of each shared device (0: none shared, and no label)."""
    result = {DRA_DRIVER: driver, DRA_CHIPS: str(chips), DRA_BOARDS: str(boards)}
    if shares >= 2:
        result[DRA_SHARES] = str(shares)
    return result


def _main_product(chips: list[Chip], notes: list[str]) -> tuple[str, list[Chip]]:
    counts = Counter(products.model(chip.product) for chip in chips)
    product = counts.most_common(1)[0][0]  # ties: the product seen first
    if len(counts) > 1:
        described = ", ".join(f"{count} x {name}" for name, count in counts.most_common())
        notes.append(f"chips of several products on this node ({described}); labels describe {product}")
    return product, [chip for chip in chips if products.model(chip.product) == product]


def _memory_mib(chips: list[Chip]) -> int | None:
    known = [chip.memory_mib for chip in chips if chip.memory_mib > 0]
    return min(known) if known else None


def parse_driver_version(version: str) -> tuple[str, str, str] | None:
    """(major, minor, revision) as ix-feature-discovery reads the driver version, None when it has no such form.

    The text is split on dots into two or three parts, taken as they are: `4.1.0-rc1` gives
    ("4", "1", "0-rc1"), `4.1` gives ("4", "1", ""); one part or more than three is no version.
    """
    parts = version.split(".")
    if not 2 <= len(parts) <= 3:
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def _driver_labels(version: str, notes: list[str]) -> dict[str, str]:
    full = version.strip()
    parsed = parse_driver_version(full)
    if parsed is None:
        shown = repr(version) if version else "unknown"
        notes.append(f"driver version {shown} is not of the form X.Y[.Z]: no driver version labels")
        return {}
    major, minor, revision = parsed
    result = {
        f"{DRIVER_VERSION}.full": full,
        f"{DRIVER_VERSION}.major": major,
        f"{DRIVER_VERSION}.minor": minor,
        f"{DRIVER_VERSION}.revision": revision,
    }
    invalid = next(((name, value) for name, value in result.items() if not is_valid_label_value(value)), None)
    if invalid is not None:
        name, value = invalid
        notes.append(
            f"driver version {version!r} gives {name} {value!r}, not a valid label value: no driver version labels"
        )
        return {}
    return result


def _cuda_labels(version: str | None, notes: list[str]) -> dict[str, str]:
    if version is None:
        return {}
    parsed = parse_cuda_version(version)
    if parsed is None:
        notes.append(f"CUDA version {version!r} is neither an integer like 10020 nor X.Y: no CUDA version labels")
        return {}
    major, minor = parsed
    return {
        f"{CUDA_RUNTIME_VERSION}.full": f"{major}.{minor}",
        f"{CUDA_RUNTIME_VERSION}.major": str(major),
        f"{CUDA_RUNTIME_VERSION}.minor": str(minor),
    }


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from NVML's integer encoding (1000 * major + 10 * minor) or from `X.Y`; None otherwise."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        value = int(text)
        return value // 1000, value % 1000 // 10
    match = _CUDA_DOTTED.match(text)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def sanitise_label_value(text: str) -> str:
    """text made into a valid Kubernetes label value (possibly empty).

    As ix-feature-discovery does for the machine name: characters other than ASCII letters, digits, `-`,
    `_`, `.` and whitespace are dropped and whitespace runs become `-`; then the value is cut to 63
    characters and stripped of leading and trailing non-alphanumerics.
    """
    kept = _NOT_VALUE_CHARACTER.sub("", text)
    joined = _WHITESPACE.sub("-", kept.strip())
    return _EDGE.sub("", joined[:MAX_LABEL_VALUE_LENGTH])


def is_valid_label_value(value: str) -> bool:
    """True when value is a valid Kubernetes label value."""
    return len(value) <= MAX_LABEL_VALUE_LENGTH and bool(_LABEL_VALUE.match(value))
