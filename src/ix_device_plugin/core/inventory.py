"""What is on the node: boards made of chips, with their health.

Plain immutable data, produced by a backend and read by the planner. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from ix_device_plugin.settings.health import HEALTH_BITS, NOT_PRESENT, HealthPolicy, xid_name

# What decides which XIDs and health errors are ignored: a HealthPolicy, or the names IX_DISABLE_HEALTHCHECKS
# turns off (with the default policy, which ignores the application XIDs).
Ignored = HealthPolicy | frozenset[str]


def health_policy(ignored: Ignored) -> HealthPolicy:
    """ignored as a HealthPolicy (a set of names: the default policy with those checks turned off)."""
    return ignored if isinstance(ignored, HealthPolicy) else HealthPolicy(disabled=ignored)


def xid_ignored(xid: int, ignored: Ignored) -> bool:
    """True when an XID event must not make a chip Unhealthy under this policy or ignored set."""
    return health_policy(ignored).ignores(xid_name(xid))


def health_errors_from_mask(mask: int) -> frozenset[str]:
    """Names of the IXML health errors set in mask; unknown bits are named `bit0x..`."""
    names = {name for name, bit in HEALTH_BITS.items() if mask & bit}
    known = 0
    for bit in HEALTH_BITS.values():
        known |= bit
    unknown = mask & ~known
    bit = 1
    while unknown:
        if unknown & bit:
            names.add(f"bit{bit:#x}")
            unknown &= ~bit
        bit <<= 1
    return frozenset(names)


DEVICE_NODE_PROBLEM = "device node "  # how a missing /dev node is named among a chip's problems


def device_node_missing(node: str) -> str:
    """The problem of a chip whose device node is missing."""
    return f"{DEVICE_NODE_PROBLEM}{node} missing"


@dataclass(frozen=True)
class ChipStatus:
    """How one chip is doing: IXML health errors plus any other reason it is unusable.

    xids are the critical XID events the node has seen (the monitor keeps them across polls, the node-health record
    across restarts). held_out says why the agent keeps a chip out of service whatever its health reads (reserved for
    a GPU reset): a reason of the front ends', never of the chip's own health, and named only where the chip has no
    other (so that holding a broken chip for its reset writes nothing new to the API server).
    """

    errors: frozenset[str] = frozenset()
    problems: tuple[str, ...] = ()
    present: bool = True
    xids: frozenset[int] = frozenset()
    held_out: str = ""
    # What self-healing does about the chip while it is out of service (resetting, needs-operator, ...): shown where
    # it is published (a DRA device taint), never a reason of its own.
    care: str = ""

    def reasons(self, ignored: Ignored = frozenset()) -> tuple[str, ...]:
        """Why the chip is unusable (empty when healthy), leaving out the errors and XIDs ignored.

        `all` in the ignored set ignores every health error and XID; presence and other problems still count.
        """
        policy = health_policy(ignored)
        reasons: list[str] = []
        if not self.present:
            reasons.append(NOT_PRESENT)
        reasons.extend(self.problems)
        reasons.extend(sorted(e for e in self.errors if not policy.ignores(e)))
        reasons.extend(name for name in map(xid_name, sorted(self.xids)) if not policy.ignores(name))
        if not reasons and self.held_out:  # only where nothing else keeps it out: a hold changes no taint's value
            reasons.append(self.held_out)
        return tuple(reasons)

    def absence(self) -> str | None:
        """Why no container can be given the chip now (it is gone from enumeration, or its device node is missing),
        or None; a health error or an XID is no such reason."""
        if not self.present:
            return NOT_PRESENT
        return next((problem for problem in self.problems if problem.startswith(DEVICE_NODE_PROBLEM)), None)

    def with_xids(self, xids: frozenset[int]) -> ChipStatus:
        """This status with these XIDs added."""
        return self if xids <= self.xids else replace(self, xids=self.xids | xids)

    @property
    def own(self) -> ChipStatus:
        """The chip's own health: this status without the agent's hold."""
        return replace(self, held_out="", care="") if self.held_out or self.care else self

    def with_problem(self, problem: str) -> ChipStatus:
        """This status with one more reason."""
        return replace(self, problems=(*self.problems, problem))


HEALTHY_STATUS = ChipStatus()


@dataclass(frozen=True)
class Chip:
    """One GPU chip, the unit the driver exposes as /dev/iluvatar<minor>."""

    uuid: str
    minor: int | None
    product: str
    bus_id: str = ""
    numa_node: int | None = None
    memory_mib: int = 0
    status: ChipStatus = HEALTHY_STATUS

    @property
    def device_node(self) -> str | None:
        """Host path of the chip's device node, or None when the minor is unknown."""
        return None if self.minor is None else f"/dev/iluvatar{self.minor}"


@dataclass(frozen=True)
class Board:
    """One physical card; a BI-V150 carries two chips, most products one.

    expected_chips is how many chips the board should have when the product table does not say
    (an unknown product): learnt from the first discovery that saw the board.

    membership_known is False when the library could not say which board the chip sits on (a driver
    without board positions): the board is then that one chip, and no chip counts as missing from it.
    """

    product: str
    chips: tuple[Chip, ...]
    expected_chips: int | None = None
    membership_known: bool = True

    @property
    def uuid(self) -> str:
        """The board's identity: its first chip's UUID."""
        return self.chips[0].uuid


# Common-ancestor levels as NVML defines them: lower is closer.
TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10
TOPOLOGY_MULTIPLE = 20
TOPOLOGY_HOSTBRIDGE = 30
TOPOLOGY_NODE = 40
TOPOLOGY_SYSTEM = 50


@dataclass(frozen=True)
class Inventory:
    """Everything the node has, plus what the driver and host say about it."""

    boards: tuple[Board, ...] = ()
    driver_version: str = ""
    # What nvmlSystemGetCudaDriverVersion answers (e.g. "10020"); None when the library cannot say.
    cuda_version: str | None = None
    # Device nodes shared by all chips (e.g. /dev/itrctl) that exist on the host.
    control_nodes: tuple[str, ...] = ()
    # PCIe distance between chips, keyed by the sorted pair of chip UUIDs.
    links: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def chips(self) -> Iterator[Chip]:
        """Every chip, board by board."""
        for board in self.boards:
            yield from board.chips

    def chip_count(self) -> int:
        """Number of chips on the node."""
        return sum(len(board.chips) for board in self.boards)

    def link(self, uuid_a: str, uuid_b: str) -> int | None:
        """PCIe common-ancestor level between two chips, None when unknown."""
        if uuid_a == uuid_b:
            return TOPOLOGY_INTERNAL
        return self.links.get(link_key(uuid_a, uuid_b))

    def with_statuses(self, statuses: Mapping[str, ChipStatus]) -> Inventory:
        """A copy whose chips take their status from statuses (by UUID); others keep theirs."""
        boards = tuple(
            replace(board, chips=tuple(_with_status(chip, statuses) for chip in board.chips)) for board in self.boards
        )
        return replace(self, boards=boards)

    def statuses(self) -> dict[str, ChipStatus]:
        """Every chip's status by UUID."""
        return {chip.uuid: chip.status for chip in self.chips()}


MISSING_CHIP = "chip missing from enumeration"


def carry_missing(previous: Inventory, discovered: Inventory) -> Inventory:
    """discovered, where a board that lost chips since previous keeps them as not-present chips.

    A chip that vanished from enumeration does not shrink its board: the board keeps its identity (its
    first chip) and is planned Unhealthy until the chip is back. A board none of whose chips is enumerated
    any more is gone (hot-unplug). Boards seen for the first time learn their chip count. A board whose
    membership is not known is what was discovered, and teaches nothing about the chips a board has.
    """
    enumerated = {chip.uuid for chip in discovered.chips()}
    by_chip = {chip.uuid: board for board in previous.boards if board.membership_known for chip in board.chips}
    boards = []
    for board in discovered.boards:
        if not board.membership_known:
            boards.append(board)
            continue
        before = next((by_chip[chip.uuid] for chip in board.chips if chip.uuid in by_chip), None)
        boards.append(_with_vanished_chips(board, before, enumerated))
    return replace(discovered, boards=tuple(boards))


def _with_vanished_chips(board: Board, before: Board | None, enumerated: set[str]) -> Board:
    if before is None:
        return board if board.expected_chips is not None else replace(board, expected_chips=len(board.chips))
    now = {chip.uuid: chip for chip in board.chips}
    chips = []
    for chip in before.chips:  # the board's earlier order, so its identity (first chip) stays
        if chip.uuid in now:
            chips.append(now.pop(chip.uuid))
        elif chip.uuid not in enumerated:  # gone, not moved to another board
            chips.append(_vanished(chip))
    chips.extend(now.values())  # chips new to the board come last
    expected = max(before.expected_chips or len(before.chips), board.expected_chips or 0)
    return replace(board, chips=tuple(chips), expected_chips=expected)


def _vanished(chip: Chip) -> Chip:
    if not chip.status.present and MISSING_CHIP in chip.status.problems:
        return chip
    return replace(chip, status=ChipStatus(present=False, problems=(MISSING_CHIP,)))


def _with_status(chip: Chip, statuses: Mapping[str, ChipStatus]) -> Chip:
    status = statuses.get(chip.uuid)
    return chip if status is None or status == chip.status else replace(chip, status=status)


def link_key(uuid_a: str, uuid_b: str) -> tuple[str, str]:
    """The key of Inventory.links for a pair of chips."""
    return (uuid_a, uuid_b) if uuid_a < uuid_b else (uuid_b, uuid_a)
