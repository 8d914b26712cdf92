"""The DRA driver's prepared claims: one lock over the claims, their CDI spec files and the checkpoint.

Only `DraState` changes them. A prepare reads the claim (from the API server, through the reader it is given),
decides with the pure `claims.prepare`, writes the claim's CDI spec and then the checkpoint, each atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ix_device_plugin.core.cdi import spec_text
from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE, CheckpointError, checkpoint_text, read_checkpoint
from ix_device_plugin.dra.claims import ClaimError, ClaimRef, PreparedClaim, cdi_spec_file, holders, prepare
from ix_device_plugin.dra.slices import SliceDevice
from ix_device_plugin.runtime.files import OutputError, write_atomically

log = logging.getLogger(__name__)

ClaimReader = Callable[[ClaimRef], Awaitable[dict[str, Any]]]  # the ResourceClaim object; ClaimError when it cannot


class DraState:
    """The prepared claims of this node, their CDI specs and the checkpoint."""

    def __init__(self, directory: Path, cdi_dir: Path, pool: str, dev_root: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.dev_root = dev_root
        self.claims: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()  # prepare and unprepare change claims, specs and checkpoint one at a time

    def load(self) -> None:
        """Read the checkpoint; a corrupt one is moved aside (logged) and the driver starts empty."""
        try:
            self.claims = read_checkpoint(self.path)
        except CheckpointError as error:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                self.path.rename(aside)
            log.error("%s; moved to %s, starting without prepared claims", error, aside)
            return
        if self.claims:
            log.info("checkpoint %s: %d prepared claims", self.path, len(self.claims))

    async def prepare(
        self,
        ref: ClaimRef,
        read: ClaimReader,
        devices: Mapping[str, SliceDevice],
        control_nodes: tuple[str, ...],
    ) -> PreparedClaim | str:
        """The prepared claim, or the per-claim error message; never raises."""
        known = self.claims.get(ref.uid)
        if known is not None:
            return known  # prepared already (a repeated call, another pod of a shared claim, a restart)
        try:
            claim = await read(ref)
            async with self._lock:
                known = self.claims.get(ref.uid)
                if known is not None:
                    return known
                others = holders(self.claims)
                prepared = prepare(ref, claim, devices, others, self.pool, control_nodes, self.dev_root)
                self._add(prepared)
        except (ClaimError, OutputError) as error:
            log.warning("NodePrepareResources: %s", error)
            return str(error)
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in prepared.devices))
        return prepared

    async def unprepare(self, ref: ClaimRef) -> str | None:
        """Remove the claim's CDI spec and checkpoint entry; the error message, or None."""
        async with self._lock:
            try:
                known = self._remove(ref.uid)
            except OutputError as error:
                log.warning("NodeUnprepareResources: claim %s: %s", ref, error)
                return f"claim {ref}: {error}"
        log.info("unprepared claim %s%s", ref, "" if known else " (was not prepared)")
        return None

    def _add(self, claim: PreparedClaim) -> None:
        """Write claim's CDI spec, then the checkpoint with it; raises OutputError."""
        write_atomically(self.cdi_dir / cdi_spec_file(claim.ref.uid), spec_text(claim.spec))
        self.claims[claim.ref.uid] = claim
        self._save()

    def _remove(self, uid: str) -> bool:
        """Remove the claim's CDI spec and checkpoint entry; True when it was prepared. Raises OutputError."""
        spec = self.cdi_dir / cdi_spec_file(uid)
        try:
            spec.unlink(missing_ok=True)
        except OSError as error:
            raise OutputError(f"cannot remove {spec}: {error.strerror or error}") from None
        known = self.claims.pop(uid, None) is not None
        if known:
            self._save()
        return known

    def _save(self) -> None:
        write_atomically(self.path, checkpoint_text(self.claims))
