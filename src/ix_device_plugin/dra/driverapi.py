"""The DRA driver's side of the API server, built once the API client is known.

The slice publisher, the claims' status writer, the reads a prepare makes and the containers' teller, complete when
built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.dra.apireads import ApiReads, ClaimMemo
from ix_device_plugin.dra.claimstatus import ClaimStatusWriter
from ix_device_plugin.dra.containerteller import ContainerTeller
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.dra.publisher import SlicePublisher
from ix_device_plugin.dra.slices import SliceContent
from ix_device_plugin.dra.state import DraState
from ix_device_plugin.runtime.service import bounded


class DriverApi:
    """What the driver does through the API server: publish the node's slices, read the claims it prepares, write
    their status, and have their CDI specs tell each container what it holds.

    counters: the node holds a prepared board (after a reboot the kubelet has deleted the slices, and chips alone
    would look free beside it): the publisher starts out knowing that the server keeps shared counters.
    """

    def __init__(
        self,
        kube: Kube,
        node: str,
        state: DraState,
        claim_read_timeout: float,
        wanted: tuple[SliceContent, Mapping[str, str]],
        *,
        counters: bool,
    ) -> None:
        self.publisher = SlicePublisher(kube, node, counters=True if counters else None, wanted=wanted)
        self.claim_status = ClaimStatusWriter(kube, node)
        self.reads = ApiReads(kube, claim_read_timeout)
        self.teller = ContainerTeller(state, self.reads)

    def memo(self) -> ClaimMemo:
        """A fresh memo of the claims one NodePrepareResources reads."""
        return ClaimMemo(self.reads)

    def prepared(self, claim: PreparedClaim, bus_ids: Mapping[str, str], as_read: dict[str, Any] | None) -> None:
        """Say in the claim's status which devices it holds (ClaimStatusWriter.prepared)."""
        self.claim_status.prepared(claim, bus_ids, as_read)

    def unprepared(self, ref: ClaimRef) -> None:
        """Take the claim's devices out of its status (ClaimStatusWriter.unprepared)."""
        self.claim_status.unprepared(ref)

    async def tell(self, seeds: Mapping[str, Any]) -> None:
        """Have the claims prepared in this call tell their containers what they hold (ContainerTeller.tell)."""
        await self.teller.tell(seeds)

    async def close(self, timeout: float) -> None:
        """At stop: write the claims' status still pending, within timeout."""
        await bounded("writing claim status", self.claim_status.close(), timeout)
