"""The names of health errors and XID events, as `IX_DISABLE_HEALTHCHECKS` and a chip's reasons use them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# IXML health bits (ixmlDeviceGetHealth); 0 means healthy.
HEALTH_BITS: dict[str, int] = {
    "SYSHUB": 0x1,
    "MC": 0x2,
    "OverTemp": 0x4,
    "OverVoltage": 0x8,
    "ECC": 0x10,
    "Memory": 0x20,
    "PCIE": 0x40,
}
HEALTH_ERROR_NAMES: tuple[str, ...] = tuple(HEALTH_BITS)
IGNORE_ALL = "all"
IGNORE_XIDS = "xids"  # in the ignored set: no XID event makes a chip Unhealthy
# Application XIDs (a program's fault, not the chip's), ignored as NVIDIA's device plugin ignores them.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


def xid_name(xid: int) -> str:
    """How a critical XID is named among a chip's reasons and in the ignored set: `XID 79`."""
    return f"XID {xid}"


def parse_disabled_healthchecks(value: Any, from_text: bool = True) -> frozenset[str]:
    """The checks `IX_DISABLE_HEALTHCHECKS` turns off: a comma list of `all`, `xids`, IXML health error
    names and XID numbers; raises ValueError naming the first unknown item and the known ones."""
    if not isinstance(value, str):
        raise ValueError("expected a comma-separated list of checks")
    by_lower = {name.lower(): name for name in (*HEALTH_ERROR_NAMES, IGNORE_ALL, IGNORE_XIDS)}
    names: set[str] = set()
    for item in filter(None, (part.strip() for part in value.split(","))):
        name = by_lower.get(item.lower()) or _xid_item(item)
        if name is None:
            known = ", ".join((IGNORE_ALL, IGNORE_XIDS, *HEALTH_ERROR_NAMES))
            raise ValueError(f"unknown check {item!r} (known: {known}, or an XID number such as 79)")
        names.add(name)
    return frozenset(names)


def _xid_item(item: str) -> str | None:
    """`XID <n>` for an XID number (`79`, `xid79`, `XID 79`), None for anything else."""
    digits = item.lower().removeprefix("xid").strip()
    if not digits.isdigit() or not digits.isascii():
        return None
    xid = int(digits)
    return xid_name(xid) if 0 < xid < 2**32 else None


# ---- the health policy: what the agent does about each XID and health error ---------------------

IGNORE, RESET, OPERATOR = "ignore", "reset", "operator"
ACTIONS = (IGNORE, RESET, OPERATOR)
NOT_PRESENT = "not present"  # a chip fallen off the bus or gone from enumeration: always OPERATOR


@dataclass(frozen=True)
class PolicyRow:
    """One entry of the default policy: an XID (`XID 48`) or IXML health error, what is done, and why."""

    name: str
    action: str
    meaning: str
    reboot_clears: bool = False  # besides what a reset clears: a reboot is the remedy (a chip fallen off the bus)


# The defaults follow what the XID or error means (IXML numbers XIDs as NVML does). ignore: a program's fault, not
# the chip's; reset: a GPU reset clears it (`ixsmi -r` once no container holds the chip); operator: a reset cannot
# clear it, the chip stays out of service until someone acts (an XID) or until the error clears by itself (a
# health error, which is read again at every poll).
HEALTH_POLICY: tuple[PolicyRow, ...] = (
    PolicyRow("XID 13", IGNORE, "graphics engine exception: a program's fault"),
    PolicyRow("XID 31", IGNORE, "GPU memory page fault: a program's fault"),
    PolicyRow("XID 43", IGNORE, "a program's channel stopped: a program's fault"),
    PolicyRow("XID 45", IGNORE, "preemptive cleanup after a program ended"),
    PolicyRow("XID 68", IGNORE, "video processor exception: a program's fault"),
    PolicyRow("XID 109", IGNORE, "context switch timeout: a program's fault"),
    PolicyRow("XID 46", RESET, "the GPU stopped processing"),
    PolicyRow("XID 48", RESET, "double-bit ECC error: the page is retired at the next reset"),
    PolicyRow("XID 61", RESET, "internal micro-controller breakpoint"),
    PolicyRow("XID 62", RESET, "internal micro-controller halt"),
    PolicyRow("XID 63", RESET, "page retirement pending: it takes effect at the next reset"),
    PolicyRow("XID 74", RESET, "chip interconnect link error"),
    PolicyRow("XID 94", RESET, "contained ECC error: the memory is remapped at the next reset"),
    PolicyRow("XID 95", RESET, "uncontained ECC error"),
    PolicyRow("XID 119", RESET, "firmware call timed out"),
    PolicyRow("XID 120", RESET, "firmware error"),
    PolicyRow("XID 64", OPERATOR, "a page could not be retired: the memory needs service"),
    PolicyRow("XID 79", OPERATOR, "the chip fell off the bus: the node needs a reboot", reboot_clears=True),
    PolicyRow("SYSHUB", RESET, "system hub error"),
    PolicyRow("MC", RESET, "memory controller error"),
    PolicyRow("ECC", RESET, "uncorrectable ECC error"),
    PolicyRow("Memory", RESET, "memory error: retirement pending"),
    PolicyRow("PCIE", RESET, "PCIe link error: a reset trains the link again"),
    PolicyRow("OverTemp", OPERATOR, "over temperature: a reset does not cool it; back once it cools"),
    PolicyRow("OverVoltage", OPERATOR, "power fault: the board or its supply needs service"),
)
OTHER_XIDS = RESET  # an XID the table does not list (IXML reports an unknown one as 999)
OTHER_ERRORS = OPERATOR  # a health bit the table does not know (`bit0x..`)
_DEFAULT_ACTIONS = {row.name: row.action for row in HEALTH_POLICY}
_REBOOT_CLEARS = frozenset(row.name for row in HEALTH_POLICY if row.reboot_clears)
OTHER_XID_LABEL = "other"


def xid_label(xid: int) -> str:
    """An XID as a metric's label value: its number where the table lists it, else `other`, so that a chip reporting
    any numbers at all adds at most one series per XID the table knows."""
    return str(xid) if xid_name(xid) in _DEFAULT_ACTIONS else OTHER_XID_LABEL


def is_xid(name: str) -> bool:
    """True for an XID's name (`XID 79`), False for a health error's."""
    return name.startswith("XID ")


@dataclass(frozen=True)
class HealthPolicy:
    """What is done about each XID and health error: the table's defaults, the entries ix-config moves to another
    action (`health.reset`, `health.operator`, `health.ignore`), and the checks IX_DISABLE_HEALTHCHECKS turns off."""

    reset: frozenset[str] = frozenset()
    operator: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    disabled: frozenset[str] = frozenset()

    def action(self, name: str) -> str:
        """IGNORE, RESET or OPERATOR for an XID's or health error's name (NOT_PRESENT: always OPERATOR)."""
        if name == NOT_PRESENT:
            return OPERATOR
        for action, names in ((RESET, self.reset), (OPERATOR, self.operator), (IGNORE, self.ignore)):
            if name in names:
                return action
        return _DEFAULT_ACTIONS.get(name, OTHER_XIDS if is_xid(name) else OTHER_ERRORS)

    def cleared_by_reboot(self, name: str) -> bool:
        """True when a reboot clears it: what a reset clears (a reboot resets every chip), and what the table says a
        reboot is the remedy for, unless ix-config's health.operator names it (someone wants to look first)."""
        action = self.action(name)
        return action != OPERATOR or (name in _REBOOT_CLEARS and name not in self.operator)

    def ignores(self, name: str) -> bool:
        """True when name must not make a chip unhealthy: ignored by the policy, or turned off by
        IX_DISABLE_HEALTHCHECKS (`all`, `xids` for every XID, or the name itself)."""
        disabled = self.disabled
        if IGNORE_ALL in disabled or name in disabled or (IGNORE_XIDS in disabled and is_xid(name)):
            return True
        return self.action(name) == IGNORE

    def with_disabled(self, disabled: frozenset[str]) -> HealthPolicy:
        """This policy with these checks turned off too."""
        return self if disabled <= self.disabled else replace(self, disabled=self.disabled | disabled)


DEFAULT_POLICY = HealthPolicy()
SELF_HEALING_CHOICES = ("auto", "true", "false")


def parse_health_names(value: Any, from_text: bool = True) -> tuple[str, ...]:
    """XID numbers and IXML health error names (a YAML list, or a comma list as text), as `XID 48` and `ECC`, sorted;
    ValueError naming the first item that is neither."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError("expected a list of XID numbers and health error names")
    by_lower = {name.lower(): name for name in HEALTH_ERROR_NAMES}
    names: set[str] = set()
    for item in items:
        text = str(item).strip() if isinstance(item, int | str) and not isinstance(item, bool) else None
        if text == "":
            continue
        name = None if text is None else by_lower.get(text.lower()) or _xid_item(text)
        if name is None:
            raise ValueError(
                f"unknown item {item!r} (known: XID numbers such as 48, and the health errors "
                f"{', '.join(HEALTH_ERROR_NAMES)})"
            )
        names.add(name)
    return tuple(sorted(names, key=_name_order))


def parse_self_healing(value: Any, from_text: bool = True) -> str:
    """`auto` (heal where a reset is safe), `true` or `false`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value.strip().lower() if isinstance(value, str) else ""
    text = {"yes": "true", "on": "true", "1": "true", "no": "false", "off": "false", "0": "false"}.get(text, text)
    if text not in SELF_HEALING_CHOICES:
        raise ValueError("expected auto, true or false")
    return text


def _name_order(name: str) -> tuple[int, int, str]:
    return (0, int(name[4:]), "") if is_xid(name) else (1, 0, name)
