"""The names of health errors and XID events, as `IX_DISABLE_HEALTHCHECKS` and a chip's reasons use them."""

from __future__ import annotations

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
