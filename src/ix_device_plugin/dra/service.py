"""The DRAPlugin gRPC service, in API versions v1 and v1beta1: translates the kubelet's calls for the driver."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim

Prepare = Callable[[Sequence[ClaimRef]], Awaitable[list[PreparedClaim | str]]]  # each: prepared, or why not
Unprepare = Callable[[ClaimRef], Awaitable[str | None]]  # None, or why not


class DraService:
    """NodePrepareResources and NodeUnprepareResources in one API version (its generated module pb2)."""

    def __init__(self, prepare: Prepare, unprepare: Unprepare, pb2: Any) -> None:
        self._prepare = prepare
        self._unprepare = unprepare
        self.pb2 = pb2
        self._shares = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name  # v1 has it, v1beta1 does not

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Prepare every claim; each answers its devices or its own error."""
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        outcomes = await self._prepare(refs)
        response = self.pb2.NodePrepareResourcesResponse()
        for ref, outcome in zip(refs, outcomes, strict=True):
            answer = response.claims[ref.uid]
            if isinstance(outcome, str):
                answer.error = outcome
                continue
            for device in outcome.devices:
                entry = self.pb2.Device(
                    request_names=list(device.request_refs),
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=list(device.cdi_ids),
                )
                if device.share_id and self._shares:
                    entry.share_id = device.share_id
                answer.devices.append(entry)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Unprepare every claim; unknown claims are already unprepared."""
        response = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = await self._unprepare(ClaimRef(claim.namespace, claim.name, claim.uid))
            response.claims[claim.uid].error = error or ""
        return response
