"""Telling the containers their chips after a NodePrepareResources.

The walk over the pods using the claims just prepared, and the other claims those pods use, that has the claims' CDI
specs tell each container what it holds.

The decisions are the pure cores': claimusers.py (which containers use which claims, as the kubelet hands them
the CDI devices) and containers.py (`solve`: where the specs set the GPU variables). Here are the reads and the
bounds. Who uses a claim: the pods its reservedFor lists, or the pod it was made for; the pods are read, and the
claims made on their own that they use besides, up to MAX_POD_READS and MAX_CLAIM_READS: a claim some of whose
pods are not known keeps what it sets. `DraState.tell_containers` writes the outcome, checkpoint first. One walk
runs at a time, each from the claims as they are then: the last one knows all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ix_device_plugin.apiserver.objects import POD, uid_of
from ix_device_plugin.dra.apireads import ApiReads
from ix_device_plugin.dra.claimusers import (
    Container,
    PodRef,
    containers_of,
    pod_ref,
    reserved_for,
    runs_containers,
    used_claims,
)
from ix_device_plugin.dra.containers import solve
from ix_device_plugin.dra.prepared import ClaimError, PreparedClaim
from ix_device_plugin.dra.state import DraState

log = logging.getLogger(__name__)

MAX_POD_READS = 16  # pods read to learn who uses the claims of one NodePrepareResources
MAX_CLAIM_READS = 16  # claims made on their own read besides, for the pods their reservedFor lists


class ContainerTeller:
    """Has the prepared claims of state tell their containers what they hold, reading pods and claims with reads."""

    def __init__(self, state: DraState, reads: ApiReads) -> None:
        self._state = state
        self._reads = reads
        self._telling = asyncio.Lock()  # what the claims' CDI specs tell containers is worked out one call at a time

    async def tell(self, seeds: Mapping[str, Any]) -> None:
        """Have the CDI specs of the claims the pods using seeds (claims just prepared, as read, by UID) use tell
        each of their containers what it holds. Never raises for a pod or claim that cannot be read."""
        async with self._telling:
            by_name = {(c.ref.namespace, c.ref.name): c for c in list(self._state.claims.values()) if c.complete}
            walk = _Walk(self._reads, by_name)
            for uid, claim in seeds.items():
                walk.learn(uid, reserved_for(claim))
            await walk.run()
            told = solve(walk.containers(), {c.ref.uid: c for c in by_name.values()}, walk.known(), placeable=seeds)
            for warning in told.warnings:
                log.warning("%s", warning)
            await self._state.tell_containers(told.envs)


@dataclass
class _Walk:
    """One walk from the claims just prepared to the pods using them, and on to the other claims those use."""

    reads: ApiReads
    by_name: Mapping[tuple[str, str], PreparedClaim]  # the complete prepared claims, by (namespace, name)
    users: dict[str, frozenset[str] | None] = field(default_factory=dict)  # claim UID -> its pods; None: not known
    pods: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # pod UID -> the pod (None: gone or done)
    unknown: set[str] = field(default_factory=set)  # pods that could not be read
    queue: list[PodRef] = field(default_factory=list)
    claim_reads: int = 0

    def learn(self, uid: str, found: tuple[PodRef, ...] | None) -> None:
        """The claim uid is used by the pods found (None: not known); they are read next."""
        self.users[uid] = None if found is None else frozenset(pod.uid for pod in found)
        self.queue.extend(found or ())

    async def run(self) -> None:
        """Read the pods in the queue, and learn who uses the claims they use, until none is left."""
        while self.queue:
            ref = self.queue.pop(0)
            if ref.uid in self.pods or ref.uid in self.unknown:
                continue
            if len(self.pods) + len(self.unknown) >= MAX_POD_READS:
                log.warning("pod %s: more than %d pods share claims with it: not read", ref, MAX_POD_READS)
                self.unknown.add(ref.uid)
                continue
            try:
                pod = await self.reads.read_or_none(POD, ref.name, ref.namespace, f"pod {ref}")
            except ClaimError as error:
                log.warning("%s: what its containers are told is not changed", error)
                self.unknown.add(ref.uid)
                continue
            if pod is None or uid_of(pod) != ref.uid or not runs_containers(pod):
                self.pods[ref.uid] = None
                continue
            self.pods[ref.uid] = pod
            await self._follow(ref, pod)

    async def _follow(self, ref: PodRef, pod: dict[str, Any]) -> None:
        """Learn who uses the prepared claims pod uses: the pod alone for a claim made for it, else the pods the
        claim's reservedFor lists (the claim read, while MAX_CLAIM_READS allows)."""
        for use in used_claims(pod):
            claim = self.by_name.get((ref.namespace, use.name))
            if claim is None or claim.ref.uid in self.users:
                continue
            if use.own:
                self.users[claim.ref.uid] = frozenset({ref.uid})
                continue
            found = None
            if self.claim_reads < MAX_CLAIM_READS:
                self.claim_reads += 1
                try:
                    found = await self.reads.claim(claim.ref)
                except ClaimError as error:
                    log.warning("%s: what its containers are told is not changed", error)
            self.learn(claim.ref.uid, reserved_for(found) if uid_of(found or {}) == claim.ref.uid else None)

    def known(self) -> set[str]:
        """The claims all of whose users are known (and were read)."""
        return {uid for uid, using in self.users.items() if using is not None and not using & self.unknown}

    def containers(self) -> list[Container]:
        """The containers of the pods read that use prepared claims, as the kubelet hands them the CDI devices."""
        containers = []
        for pod in self.pods.values():
            if pod is not None and (ref := pod_ref(pod)) is not None:
                in_namespace = {name: c for (ns, name), c in self.by_name.items() if ns == ref.namespace}
                containers += containers_of(pod, in_namespace)
        return containers
