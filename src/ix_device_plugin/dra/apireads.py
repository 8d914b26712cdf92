"""The DRA driver's reads of one object from the API server while the kubelet waits.

A claim to prepare, the pods using it: retried with backoff for claim_read_timeout seconds, the errors said once
each, and a failure a `ClaimError` whose message names the object. Writes are elsewhere (claimstatus.py,
publisher.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.objects import RESOURCE_CLAIM, ObjectKind
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)


class ApiReads:
    """Reads through kube, each retried for timeout seconds."""

    def __init__(self, kube: Kube, timeout: float) -> None:
        self.kube = kube
        self.timeout = timeout

    async def claim(self, ref: ClaimRef) -> dict[str, Any]:
        """The ResourceClaim, retried for timeout; ClaimError naming the claim when it cannot be read."""
        return await self.read(RESOURCE_CLAIM, ref.name, ref.namespace, f"claim {ref}")

    async def read(self, kind: ObjectKind, name: str, namespace: str, what: str) -> dict[str, Any]:
        """The object, retried for timeout; ClaimError starting with what when it cannot be read."""
        found = await self.read_or_none(kind, name, namespace, what)
        if found is None:
            raise ClaimError(f"{what}: no such {kind.kind}")
        return found

    async def read_or_none(self, kind: ObjectKind, name: str, namespace: str, what: str) -> dict[str, Any] | None:
        """The object, None when there is none, retried for timeout; ClaimError starting with what when it cannot
        be read."""
        kube = self.kube

        async def read() -> dict[str, Any] | None:
            return await kube.get_object(kind, name, namespace)

        try:
            async with asyncio.timeout(self.timeout):
                return await Backoff(initial=0.1, cap=2.0).retry(read, errors=OncePerError(log, logging.WARNING))
        except TimeoutError:
            raise ClaimError(f"{what}: cannot read it from the API server within {self.timeout:g}s") from None
        except KubeError as error:
            raise ClaimError(f"{what}: {error.message}") from None


class ClaimMemo:
    """The claims one NodePrepareResources reads, each read once through reads and kept by UID: the prepare decides
    from the claim, the status write and the containers' tellers start from the same object."""

    def __init__(self, reads: ApiReads) -> None:
        self._reads = reads
        self.read: dict[str, dict[str, Any]] = {}  # claim UID -> the ResourceClaim, as read for this call

    async def __call__(self, ref: ClaimRef) -> dict[str, Any]:
        """The ResourceClaim (read again when asked again: a prepare that lost its turn reads it anew)."""
        self.read[ref.uid] = found = await self._reads.claim(ref)
        return found
