"""A prepared claim's CDI spec: what its containers get, and how to read a claim back from it.

Pure. The spec is transient and the claim's own (kind `gpu.iluvatar.com/claim`, file
`gpu.iluvatar.com-claim_<claim UID>.yaml`): a CDI device per allocated device and share
(`<claim UID>-<device>`, `<claim UID>-<device>-<share ID>`) with the device nodes of its chips (a board: all of
them), and spec-wide `/dev/itrctl`. The GPU variables the device plugin sets, `IX_VISIBLE_DEVICES` (chip UUIDs) and
`IX_REPLICA_DEVICES` (each device as the plugin names a replica: `<uuid>::<slot>` for a share, the UUID when held
whole), with their legacy `ILUVATAR_COREX_*` twins, are set where `containers.py` says (`ClaimEnv`): in the
spec's own edits, in a device's, or nowhere, so that each container is told what it holds. Until then (and for a
claim no known container uses) the spec's own edits name the claim's chips.

One more CDI device, `<claim UID>-record`, which no container is given, sets the claim's own chips, and names its
devices allocated with admin access (`IX_DRA_ADMIN_ACCESS`): the record a claim is read back from when the
checkpoint is lost. Where containers.py places one, a relay (`Relay`): two
env-only devices answered among the CDI IDs of two of the claim's devices. Its own kind keeps the spec apart from
the device plugin's node-wide `iluvatar.com/gpu` spec, so both modes can share a node while it moves from one to
the other.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.core.allocation import (
    DEVICE_NODE_PREFIX,
    LEGACY_REPLICA_DEVICES_ENV,
    LEGACY_VISIBLE_DEVICES_ENV,
    REPLICA_DEVICES_ENV,
    VISIBLE_DEVICES_ENV,
)
from ix_device_plugin.core.cdi import device_node, minimum_version
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import BOARD, CHIP, DRIVER, SliceDevice
from ix_device_plugin.settings.documents import kind_of
from ix_device_plugin.settings.yamlsafe import shown

CLAIM_CDI_VENDOR = DRIVER
CLAIM_CDI_CLASS = "claim"
CLAIM_CDI_KIND = f"{CLAIM_CDI_VENDOR}/{CLAIM_CDI_CLASS}"
_SHARED_NAME = re.compile(r"^(.+)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_MAX_DIGITS = 9  # a device minor or slot number; longer is not one this driver wrote
_NODE = re.compile(rf"^{re.escape(DEVICE_NODE_PREFIX)}(\d{{1,{_MAX_DIGITS}}})$")


_SPEC_FILE_PREFIX = f"{CLAIM_CDI_VENDOR}-{CLAIM_CDI_CLASS}_"
RECORD_DEVICE = "record"  # <claim UID>-record: the claim's own chips, for the driver alone
# In the record only: the claim's CDI devices (`<device>`, `<device>-<share ID>`) allocated with admin access, which
# hold their chip for nobody; a claim read back without it would hold them whole and refuse the claims beside it.
ADMIN_ACCESS_ENV = "IX_DRA_ADMIN_ACCESS"
RELAY_DEVICE = "relay_env"  # <claim UID>-relay_env: no request name (a DNS label) or device name can be it
RELAY_FIRST_DEVICE = "relay_first"  # <claim UID>-relay_first, likewise


def cdi_spec_file(uid: str) -> str:
    """The claim's transient CDI spec file name (the CDI library's `<vendor>-<class>_<id>.yaml`)."""
    return f"{_SPEC_FILE_PREFIX}{uid}.yaml"


def claim_spec_files(directory: Path) -> list[tuple[str, Path]]:
    """(claim UID, path) of every claim CDI spec file in directory, by name."""
    return [
        (path.name.removeprefix(_SPEC_FILE_PREFIX).removesuffix(".yaml"), path)
        for path in sorted(directory.glob(cdi_spec_file("*")))
    ]


def cdi_device_name(uid: str, device: str, share_id: str = "") -> str:
    """The claim's CDI device name for one allocated device (and share)."""
    return f"{uid}-{_device_part(device, share_id)}"


def _device_part(device: str, share_id: str) -> str:
    """A CDI device name of the claim without its UID: `<device>`, or `<device>-<share ID>` for a share."""
    return f"{device}-{share_id}" if share_id else device


def cdi_id(uid: str, device: str, share_id: str = "") -> str:
    """The fully qualified CDI ID the kubelet is given for one allocated device (and share)."""
    return f"{CLAIM_CDI_KIND}={cdi_device_name(uid, device, share_id)}"


def claim_spec(
    uid: str, devices: Sequence[tuple[PreparedDevice, SliceDevice]], control_nodes: tuple[str, ...], dev_root: Path
) -> dict[str, Any]:
    """The claim's CDI spec document: a device per allocated device and share, the claim's chips named in its own
    edits (until containers.py says otherwise), and the record device."""
    entries = []
    for prepared, device in devices:
        nodes = [device_node(chip.device_node, dev_root) for chip in device.chips if chip.device_node is not None]
        name = cdi_device_name(uid, prepared.device, prepared.share_id)
        entries.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
    own = Holding.of(prepared for prepared, _ in devices)
    admin = [_device_part(d.device, d.share_id) for d, _ in devices if d.admin]
    record_env = [*own.env(), f"{ADMIN_ACCESS_ENV}={','.join(admin)}"] if admin else own.env()
    entries.append({"name": record_device_name(uid), "containerEdits": {"env": record_env}})
    edits: dict[str, Any] = {}
    if control_nodes:
        edits["deviceNodes"] = [device_node(node, dev_root) for node in control_nodes]
    edits["env"] = own.env()
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CLAIM_CDI_KIND, "devices": entries, "containerEdits": edits}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def record_device_name(uid: str) -> str:
    """The claim's record device: no container is given it; it names the claim's chips."""
    return f"{uid}-{RECORD_DEVICE}"


def relay_device_names(uid: str) -> tuple[str, str]:
    """The claim's relay devices (see Relay): the relay, and the one after it in lead's CDI IDs."""
    return f"{uid}-{RELAY_DEVICE}", f"{uid}-{RELAY_FIRST_DEVICE}"


def _driver_only(name: Any) -> bool:
    """A device of the spec that is none of the claim's allocated devices (the record, the relay's)."""
    return isinstance(name, str) and name.endswith(
        tuple(f"-{d}" for d in (RECORD_DEVICE, RELAY_DEVICE, RELAY_FIRST_DEVICE))
    )


@dataclass(frozen=True)
class Holding:
    """What a container holds, as the GPU variables name it: chip UUIDs, and the devices as replica IDs."""

    visible: tuple[str, ...]
    replicas: tuple[str, ...]

    @classmethod
    def of(cls, devices: Iterable[PreparedDevice]) -> Holding:
        """The holding of these devices, each chip and replica once, in the order the devices name them."""
        listed = list(devices)
        visible = dict.fromkeys(uuid for device in listed for uuid in device.chip_uuids)
        replicas = dict.fromkeys(replica for device in listed for replica in device.replica_ids)
        return cls(tuple(visible), tuple(replicas))

    @property
    def key(self) -> tuple[frozenset[str], frozenset[str]]:
        """What the holding is, whatever the order: two containers told the same chips in another order agree."""
        return frozenset(self.visible), frozenset(self.replicas)

    def env(self) -> list[str]:
        """The variables the device plugin sets, with their legacy twins."""
        visible, replicas = ",".join(self.visible), ",".join(self.replicas)
        return [
            f"{VISIBLE_DEVICES_ENV}={visible}",
            f"{LEGACY_VISIBLE_DEVICES_ENV}={visible}",
            f"{REPLICA_DEVICES_ENV}={replicas}",
            f"{LEGACY_REPLICA_DEVICES_ENV}={replicas}",
        ]

    def __str__(self) -> str:
        return ",".join(self.visible) or "no chip"


@dataclass(frozen=True)
class Relay:
    """Two env-only CDI devices of the claim, answered among the CDI IDs of two of its devices (CDI device names):
    `name` and `first` right after lead's own ID, `name` again after tail's. The kubelet hands a container the IDs
    of its devices in order and containerd keeps the first of a repeated ID, so a container given lead and later
    tail is told tail's value (`name` came before it, with lead), one given tail without lead is told `value`
    (after tail's), and one given lead is told `first_value` (after `name`). Lead's own ID stays first among its
    IDs: the kubelet names a device's health in the pod's status by its first CDI ID."""

    name: str
    first: str
    lead: str
    tail: str
    value: Holding
    first_value: Holding


@dataclass(frozen=True)
class ClaimEnv:
    """Where a claim's spec sets the GPU variables: its own edits, each CDI device's (by name; None: nothing), and
    its relay where it has one."""

    spec: Holding | None
    devices: Mapping[str, Holding | None]
    relay: Relay | None = None


def claim_env(spec: Mapping[str, Any]) -> ClaimEnv:
    """What a claim's CDI spec sets now (the record device aside)."""
    edits = spec.get("containerEdits")
    devices = {}
    for entry in spec.get("devices") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and not _driver_only(name):
            devices[name] = _holding(entry.get("containerEdits"))
    return ClaimEnv(_holding(edits), devices)


def claim_relay(claim: PreparedClaim) -> Relay | None:
    """The claim's relay as answered (its devices' IDs after one device's own ID, the relay's alone after another's),
    with the values its spec sets; None where it has none."""
    uid = claim.ref.uid
    name, first = relay_device_names(uid)
    lead = tail = None
    for device in claim.devices:
        own = cdi_device_name(uid, device.device, device.share_id)
        names = [i.partition("=")[2] for i in device.cdi_ids]
        if own in names and name in names and names.index(name) > names.index(own):
            lead, tail = (own, tail) if first in names else (lead, own)
    listed = claim.spec.get("devices") if isinstance(claim.spec, Mapping) else None
    entries = {e.get("name"): e for e in listed if isinstance(e, dict)} if isinstance(listed, list) else {}
    value, first_value = (_holding(entries.get(n, {}).get("containerEdits")) for n in (name, first))
    if lead is None or tail is None or value is None or first_value is None:
        return None
    return Relay(name, first, lead, tail, value, first_value)


def with_relay_ids(claim: PreparedClaim, relay: Relay | None) -> PreparedClaim:
    """claim with the relay's CDI IDs answered right after lead's own ID and after tail's (once placed, they stay:
    the kubelet keeps what it was answered)."""
    if relay is None:
        return claim
    relay_id, first_id = (f"{CLAIM_CDI_KIND}={n}" for n in (relay.name, relay.first))
    devices = []
    for device in claim.devices:
        name, ids = cdi_device_name(claim.ref.uid, device.device, device.share_id), device.cdi_ids
        if name == relay.lead and relay_id not in ids:
            ids = (ids[0], relay_id, first_id, *ids[1:])
        if name == relay.tail and relay_id not in ids:
            ids = (*ids, relay_id)
        devices.append(device if ids == device.cdi_ids else dataclasses.replace(device, cdi_ids=ids))
    return dataclasses.replace(claim, devices=tuple(devices))


def _holding(edits: Any) -> Holding | None:
    """The holding edits set the variables to, None where they set none."""
    items = edits.get("env") if isinstance(edits, dict) else None
    if not isinstance(items, list):
        return None
    env = dict(str(item).partition("=")[::2] for item in items)
    if VISIBLE_DEVICES_ENV not in env:
        return None
    return Holding(_listed_ids(env[VISIBLE_DEVICES_ENV]), _listed_ids(env.get(REPLICA_DEVICES_ENV, "")))


def _listed_ids(value: str) -> tuple[str, ...]:
    return tuple(item for item in value.split(",") if item)


def with_env(spec: Mapping[str, Any], env: ClaimEnv) -> dict[str, Any]:
    """spec setting the GPU variables where env says, and nowhere else (the record device as it was)."""
    changed = copy.deepcopy(dict(spec))
    edits = changed.setdefault("containerEdits", {})
    _set_env(edits, env.spec)
    if not edits:
        del changed["containerEdits"]
    entries = changed.get("devices", [])
    relayed = {env.relay.name: env.relay.value, env.relay.first: env.relay.first_value} if env.relay else {}
    for entry in entries:
        name = entry.get("name")
        if not _driver_only(name):
            _set_env(entry.setdefault("containerEdits", {}), env.devices.get(name))
        elif name in relayed:
            _set_env(entry.setdefault("containerEdits", {}), relayed.pop(name))
    if relayed:  # written once placed, never removed: the kubelet may hold their IDs
        changed["devices"] = [*entries, *({"name": n, "containerEdits": {"env": h.env()}} for n, h in relayed.items())]
    return changed


def _set_env(edits: dict[str, Any], holding: Holding | None) -> None:
    if holding is None:
        edits.pop("env", None)
    else:
        edits["env"] = holding.env()


class SpecError(Exception):
    """A claim CDI spec that cannot be read back as a claim; the message says which field and why."""


def claim_from_spec(uid: str, spec: Any, pool: str) -> PreparedClaim:
    """The claim a CDI spec written by this driver describes (incomplete: see PreparedClaim); SpecError naming the
    field when it is not one. Total: whatever another writer put in the file, nothing else is raised.

    Each device's chips are found by its device nodes: IX_VISIBLE_DEVICES lists the chips' UUIDs in the order
    the devices first name them; its shares' slots come from IX_REPLICA_DEVICES; its admin access from the record's
    IX_DRA_ADMIN_ACCESS (a spec written before it was recorded reads as none).
    """
    if not isinstance(spec, dict):
        raise SpecError(f"expected a CDI spec (an object), got {kind_of(spec)}")
    if spec.get("kind") != CLAIM_CDI_KIND:
        raise SpecError(f"kind: expected {CLAIM_CDI_KIND}, got {shown(spec.get('kind'))}")
    entries = spec.get("devices")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"devices: expected a list of devices, got {kind_of(entries)}")
    record = [e for e in entries if isinstance(e, dict) and e.get("name") == record_device_name(uid)]
    entries = [e for e in entries if not (isinstance(e, dict) and e.get("name") in _own_devices(uid))]
    if not entries:
        raise SpecError("devices: expected a device besides the record")
    where = "devices[record].containerEdits" if record else "containerEdits"  # the spec's own: an earlier driver's
    env = _env(record[0].get("containerEdits", {}) if record else spec.get("containerEdits", {}), where)
    uuids = [uuid for uuid in env.get(VISIBLE_DEVICES_ENV, "").split(",") if uuid]
    listed = [_listed(uid, entry, f"devices[{index}]") for index, entry in enumerate(entries)]
    by_minor: dict[int, str] = {}
    for _, _, minors in listed:
        for minor in minors:
            if minor not in by_minor and len(by_minor) < len(uuids):
                by_minor[minor] = uuids[len(by_minor)]
    named = {minor for _, _, minors in listed for minor in minors}
    if len(by_minor) != len(uuids) or len(named) != len(uuids):
        raise SpecError(f"{VISIBLE_DEVICES_ENV} names {len(uuids)} chips, the devices {len(named)} device nodes")
    replicas = [item for item in env.get(REPLICA_DEVICES_ENV, "").split(",") if "::" in item]
    admin = set(env.get(ADMIN_ACCESS_ENV, "").split(",")) if record else set()
    devices = []
    for device, share_id, minors in listed:
        chips = tuple(by_minor[minor] for minor in minors)
        kind = BOARD if device.startswith(f"{BOARD}-") else CHIP
        admin_access = _device_part(device, share_id) in admin
        slots = () if admin_access else _slots(chips[0] if chips else "", replicas, listed, device, share_id)
        devices.append(
            PreparedDevice(
                (),
                pool,
                device,
                chips[0] if chips else "",
                (cdi_id(uid, device, share_id),),
                admin=admin_access,
                share_id=share_id,
                shares=max(1, len(slots)) if share_id else 0,
                slots=slots,
                chips=chips if kind == BOARD else (),
                kind=kind,
            )
        )
    return PreparedClaim(ClaimRef("", "", uid), tuple(devices), spec, complete=False)


def _own_devices(uid: str) -> tuple[str, ...]:
    return record_device_name(uid), *relay_device_names(uid)


def _env(edits: Any, where: str) -> dict[str, str]:
    """The environment edits set, by name; SpecError naming where when it is not a list of strings."""
    if not isinstance(edits, dict):
        raise SpecError(f"{where}: expected an object, got {kind_of(edits)}")
    items = edits.get("env") or []
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise SpecError(f"{where}.env: expected a list of NAME=value strings")
    return dict(item.partition("=")[::2] for item in items)


def _listed(uid: str, entry: Any, where: str) -> tuple[str, str, list[int]]:
    """(device, share ID, device node minors) of one CDI device of the claim; SpecError naming where."""
    name = entry.get("name") if isinstance(entry, dict) else None
    prefix = f"{uid}-"
    if not isinstance(name, str) or not name.startswith(prefix) or name == prefix:
        raise SpecError(f"{where}.name: expected {prefix}<device>, got {shown(name)}")
    minors = _minors(entry)
    if minors is None:
        raise SpecError(f"{where}.containerEdits.deviceNodes: expected a list of {DEVICE_NODE_PREFIX}<N> nodes")
    shared = _SHARED_NAME.match(name.removeprefix(prefix))
    device, share_id = shared.groups() if shared else (name.removeprefix(prefix), "")
    return device, share_id, minors


def _minors(entry: dict[str, Any]) -> list[int] | None:
    edits = entry.get("containerEdits")
    nodes = edits.get("deviceNodes") if isinstance(edits, dict) else None
    if not isinstance(nodes, list):
        return None
    minors = []
    for node in nodes:
        path = node.get("path") if isinstance(node, dict) else None
        match = _NODE.match(path) if isinstance(path, str) else None
        if match is None:
            return None
        minors.append(int(match.group(1)))
    return minors


def _slots(
    uuid: str, replicas: list[str], listed: list[tuple[str, str, list[int]]], device: str, share_id: str
) -> tuple[int, ...]:
    """The slots of one share: its device's `<uuid>::<slot>` entries, one to each share, the rest to the last."""
    if not share_id:
        return ()
    tails = [item.removeprefix(f"{uuid}::") for item in replicas if item.startswith(f"{uuid}::")]
    numbers = [int(tail) for tail in tails if tail.isdigit() and len(tail) <= _MAX_DIGITS]
    shares = [sid for name, sid, _ in listed if name == device and sid]
    index = shares.index(share_id)
    return tuple(numbers[index : index + 1] if index < len(shares) - 1 else numbers[index:])
