"""ResourceClaim `status.devices`: what the driver says of each device it prepared (its chips' UUIDs and PCI bus IDs).

Written after a prepare and cleared at its unprepare, in the background: the kubelet's answer never waits for it,
and a failure is logged, never fatal. Entries of other drivers stay as they are: the list is read, changed
and written back at the claim's resourceVersion (a merge patch with it is refused if the claim changed since,
and then read again). After a prepare, the claim as the prepare read it is the first guess, so a prepare's
write is one request (not a read and a write) unless the claim changed in between.

The writes of one claim are made in the order they were asked for, one at a time, so that the last word is
the last call's (an unprepare's, after a prepare whose write was slow); a write asked for while another of the
same claim is under way waits, and is replaced by a later one before it is sent. At most CONCURRENT_WRITES
claims are written at once; stopping cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.errors import KubeConflict, KubeError, KubeNotFound
from ix_device_plugin.apiserver.objects import RESOURCE_CLAIM, Object
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.dra.slices import BOARD, DRIVER
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

ATTEMPTS = 3
CONCURRENT_WRITES = 4  # claims written at once; the others wait their turn


def device_entries(claim: PreparedClaim, bus_ids: Mapping[str, str]) -> list[dict[str, Any]]:
    """The `status.devices` entries for claim's devices: driver, pool, device (and share), and in `data` the chip
    (`uuid`, `pciBusID`), or a board's chips (`boardUUID`, `chips`), and a share's slots."""
    entries = []
    for device in claim.devices:
        chips = [_chip(uuid, bus_ids) for uuid in device.chip_uuids]
        data: dict[str, Any] = {"boardUUID": device.uuid, "chips": chips} if device.kind == BOARD else chips[0]
        entry: dict[str, Any] = {"driver": DRIVER, "pool": device.pool, "device": device.device}
        if device.share_id:
            entry["shareID"] = device.share_id
            data = {**data, "slots": list(device.slots)}
        entries.append({**entry, "data": data})
    return entries


def _chip(uuid: str, bus_ids: Mapping[str, str]) -> dict[str, str]:
    return {"uuid": uuid, "pciBusID": bus_ids[uuid]} if bus_ids.get(uuid) else {"uuid": uuid}


def with_entries(current: Any, pool: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """current's entries without this driver's for pool, then entries."""
    kept = [
        entry
        for entry in (current if isinstance(current, list) else [])
        if not (isinstance(entry, dict) and entry.get("driver") == DRIVER and entry.get("pool") == pool)
    ]
    return kept + entries


@dataclass(frozen=True)
class Wish:
    """What this driver's entries of a claim's status.devices should be; as_read: the claim as last read, if known."""

    ref: ClaimRef
    entries: list[dict[str, Any]]
    as_read: Object | None = None


class ClaimStatusWriter:
    """Keeps this driver's entries of status.devices in step with what is prepared: per claim, one background
    writer sends the last wish, in order."""

    def __init__(self, kube: Kube, pool: str) -> None:
        self.kube = kube
        self.pool = pool
        self._pending: dict[str, Wish] = {}  # by claim UID: the wish not yet sent
        self._writers: dict[str, asyncio.Task[None]] = {}  # by claim UID: the task sending its wishes in order
        self._turns = asyncio.Semaphore(CONCURRENT_WRITES)
        self._errors = OncePerError(log, logging.WARNING)

    def prepared(self, claim: PreparedClaim, bus_ids: Mapping[str, str], as_read: Object | None = None) -> None:
        """Say what claim's devices are (soon); as_read: the ResourceClaim as just read, if it was."""
        self._ask(Wish(claim.ref, device_entries(claim, bus_ids), as_read))

    def unprepared(self, ref: ClaimRef) -> None:
        """Take this driver's entries out of the claim's status (soon, after any write of it under way)."""
        self._ask(Wish(ref, []))

    @property
    def under_way(self) -> int:
        """How many claims have a status write under way or waiting."""
        return len(self._writers)

    async def close(self) -> None:
        """Cancel what is still under way, and forget what was not sent."""
        self._pending.clear()
        tasks = list(self._writers.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    def _ask(self, wish: Wish) -> None:
        uid = wish.ref.uid
        self._pending[uid] = wish  # a wish not sent yet is replaced, never sent after this one
        if uid not in self._writers:
            self._writers[uid] = asyncio.create_task(self._send(uid), name=f"claim-status-{uid}")

    async def _send(self, uid: str) -> None:
        """Send the claim's wishes, the last one each time, until none is left."""
        try:
            while (wish := self._pending.pop(uid, None)) is not None:
                async with self._turns:
                    await self._write(wish)
        finally:
            if self._writers.get(uid) is asyncio.current_task():  # at once: a wish asked from now on starts anew
                del self._writers[uid]

    async def _write(self, wish: Wish) -> None:
        ref, entries, claim = wish.ref, wish.entries, wish.as_read
        try:
            for _ in range(ATTEMPTS + (claim is not None)):  # a stale first guess costs no attempt
                if claim is None:
                    claim = await self.kube.get_object(RESOURCE_CLAIM, ref.name, ref.namespace)
                if claim is None or (claim.get("metadata") or {}).get("uid") != ref.uid:
                    return  # gone or replaced: nothing to say about it
                status = claim.get("status") or {}
                devices = with_entries(status.get("devices"), self.pool, entries)
                if devices == (status.get("devices") or []):
                    return
                if ref.uid in self._pending:
                    return  # a later wish came while this one was read: that one is sent instead
                version = (claim.get("metadata") or {}).get("resourceVersion", "")
                patch = {"metadata": {"resourceVersion": version}, "status": {"devices": devices}}
                try:
                    await self.kube.patch_status(RESOURCE_CLAIM, ref.name, ref.namespace, patch)
                except KubeConflict:
                    claim = None  # changed since: read it again
                    continue
                self._errors.succeeded("claim device status written again")
                return
        except KubeNotFound:
            return
        except KubeError as error:
            self._errors.failed("claim %s: device status not written: %s", ref, error.message)
