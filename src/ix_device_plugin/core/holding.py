"""Who holds a chip, whatever it was given under: the rule self-healing asks before it resets a chip.

A container holds a chip through any device ID that stands for it, under any resource name (the one served now, one
served before a rename, `.shared`): the chip's UUID, its board's (a whole board holds every chip on it), or either
with a time-slicing replica suffix (`<uuid>::<i>`). A board is named by its first chip's UUID, so that chip's ID is
read as the whole board unless every plan served since the holders were given their devices split the boards
(`split_only`): otherwise a split board's first chip holds its second too, for this rule (a reset waits, never the
reverse). IDs are UUIDs, so an ID of another vendor's resource never
names one of ours. Through DRA, it holds the devices of the driver's claims: `gpu-<minor>` a chip, `board-<lowest
minor>` every chip of that board (the DRA driver's device names, shares included: a share names its chip).
"""

from __future__ import annotations

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import REPLICA_SEPARATOR
from ix_device_plugin.core.telemetry import Holdings, PodRef


def chip_holder(
    uuid: str, holdings: Holdings, inventory: Inventory, driver: str, split_only: bool = False
) -> PodRef | None:
    """The first container (in a stable order) that holds the chip uuid, or None."""
    held = [ref for _, device_id, ref in holdings.devices if uuid in _device_chips(device_id, inventory, split_only)]
    claims = [claim for claim in holdings.claims if claim.driver == driver]
    held += [claim.pod for claim in claims if uuid in _claim_chips(claim.device, inventory)]
    return min(held, key=lambda ref: (ref.namespace, ref.pod, ref.container), default=None)


UNKNOWN = "no one can tell"  # how a holder begins that cannot be known (it counts as a holder)


def unknown_holder(who: str, error: object) -> str:
    """A holder that cannot be known, as self-healing says it: `no one can tell whether <who> holds it: <why>`."""
    return f"{UNKNOWN} whether {who} holds it: {error}"


def describe(ref: PodRef) -> str:
    """`namespace/pod (container)`, as Events and logs name a holder."""
    return f"{ref.namespace}/{ref.pod} ({ref.container})"


def _device_chips(device_id: str, inventory: Inventory, split_only: bool) -> set[str]:
    base = device_id.partition(REPLICA_SEPARATOR)[0]
    if split_only:
        return {base}
    for board in inventory.boards:
        if board.uuid == base:
            return {chip.uuid for chip in board.chips}
    return {base}


def _claim_chips(device: str, inventory: Inventory) -> set[str]:
    kind, _, number = device.partition("-")
    if not number.isdigit():
        return set()
    minor = int(number)
    if kind == "gpu":
        return {chip.uuid for chip in inventory.chips() if chip.minor == minor}
    if kind == "board":
        for board in inventory.boards:
            minors = [chip.minor for chip in board.chips if chip.minor is not None]
            if minors and min(minors) == minor:
                return {chip.uuid for chip in board.chips}
    return set()
