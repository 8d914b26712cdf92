"""Keeps the node's ResourceSlice equal to what the driver wants published, through API server outages.

`SlicePublisher.want` takes the content to publish; `run` writes it (create, or replace at the stored
resourceVersion with the pool generation bumped), retried with backoff; it learns on the first tainted device
whether the API server keeps device taints, and leaves unhealthy chips out where it does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ix_device_plugin.apiserver.client import RESOURCE_SLICE, Backoff, Kube, KubeAlreadyExists, KubeError
from ix_device_plugin.dra.slices import (
    UNHEALTHY_TAINT,
    SliceContent,
    slice_devices,
    slice_name,
    slice_object,
    taints_dropped,
)
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 5  # a conflict means someone else wrote the slice: read it again, this many times


class SlicePublisher:
    """Publishes the content it is given; `published` is the slice as the API server stored it last."""

    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node
        self.name = slice_name(node)
        self.taints: bool | None = None  # None: not known yet whether the API server keeps device taints
        self.published: dict[str, Any] | None = None
        self._wanted: tuple[SliceContent, Mapping[str, str]] = (SliceContent((), None), {})
        self._generation = 0  # bumped with every new wish
        self._changed = asyncio.Event()

    def want(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Publish this content (with these PCIe roots) as soon as possible."""
        self._wanted = (content, roots)
        self._generation += 1
        self._changed.set()

    async def run(self) -> None:
        """Publish each new wish, retrying with backoff until the API server takes it; until cancelled."""
        backoff = Backoff(initial=0.2, cap=30.0)
        errors = OncePerError(log, logging.WARNING)
        published = -1
        while True:
            if published == self._generation:
                self._changed.clear()
                await self._changed.wait()
                continue
            generation = self._generation
            try:
                await self.publish(*self._wanted)
            except KubeError as error:
                errors.failed("cannot publish ResourceSlice %s: %s (retrying)", self.name, error.message)
                await backoff.sleep()
                continue
            errors.succeeded("API server answering again: ResourceSlice %s published", self.name)
            backoff.reset()
            published = generation

    async def publish(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Create or update the slice; raises KubeError."""
        devices = slice_devices(content, roots, taints=self.taints is not False)
        stored = await self._write(devices)
        if self.taints is None and any("taints" in d for d in devices):
            self.taints = not taints_dropped(devices, stored)
            if self.taints:
                log.info("the API server keeps device taints: unhealthy chips are tainted %s", UNHEALTHY_TAINT)
            else:
                log.warning("the API server drops device taints (DRADeviceTaints off): unhealthy chips are left out")
                stored = await self._write(slice_devices(content, roots, taints=False))
        self.published = stored
        left_out = [d.name for d in content.devices if not d.healthy and self.taints is False]
        tainted = [d.name for d in content.devices if not d.healthy and self.taints]
        spec = stored.get("spec") or {}
        log.info(
            "ResourceSlice %s: %d devices (generation %s)%s%s",
            self.name,
            len(spec.get("devices") or []),
            (spec.get("pool") or {}).get("generation"),
            f"; unhealthy, left out: {', '.join(left_out)}" if left_out else "",
            f"; unhealthy, tainted: {', '.join(tainted)}" if tainted else "",
        )

    async def _write(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        for _ in range(WRITE_ATTEMPTS):
            current = await self.kube.get_object(RESOURCE_SLICE, self.name)
            if current is None:
                try:
                    return await self.kube.create_object(RESOURCE_SLICE, slice_object(self.node, devices, 1))
                except KubeAlreadyExists:
                    continue
            spec = current.get("spec") or {}
            generation = int((spec.get("pool") or {}).get("generation") or 0)
            wanted = slice_object(self.node, devices, generation)
            if spec == wanted["spec"]:
                return current
            wanted["spec"]["pool"]["generation"] = generation + 1
            wanted["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion", "")
            try:
                return await self.kube.replace_object(RESOURCE_SLICE, wanted)
            except KubeError as error:
                if error.status != 409:
                    raise
        raise KubeError(
            f"update resourceslice {self.name}: still conflicting after {WRITE_ATTEMPTS} tries", 409, "Conflict"
        )
