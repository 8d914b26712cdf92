"""The DRA driver's prepared claims: one owner of the claims, their CDI spec files and the checkpoint.

Every change runs under one lock, held across processes (a file lock, so that two drivers overlapping during
an update take turns): read the checkpoint if another driver changed it, decide with the pure `claims.prepare`,
write the claim's CDI spec and the checkpoint, each atomically, and only then change what is kept in memory.
A prepare is answered OK only after the checkpoint holds the claim; an unprepare only after it no longer does.

At start (`restore`), before the kubelet is served, every checkpointed claim's CDI spec is written again: CDI
specs live on a tmpfs that a reboot empties, the checkpoint does not.

A claim configured with `reset: true` has its chips reset after it is committed (so that no other claim can
take them meanwhile) and before the prepare is answered, outside the lock; a reset that fails unprepares the
claim again and fails the prepare. A prepare of the same claim during its reset waits for the reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ix_device_plugin.core.cdi import spec_text
from ix_device_plugin.dra.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    CheckpointTooNew,
    checkpoint_text,
    read_checkpoint,
)
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.claimspec import cdi_spec_file, claim_from_spec, claim_spec_files
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim, check_ref
from ix_device_plugin.dra.slices import SliceDevice
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import OutputError, reason, remove_stale_temporaries, write_atomically
from ix_device_plugin.runtime.locks import FileLock, LockError
from ix_device_plugin.settings.documents import DocumentError, load_yaml, read_file

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
LOCK_FILE = "serialize.lock"  # the name the upstream kubelet-plugin helper uses for the same purpose
LOCK_TIMEOUT = 10.0
START_LOCK_TIMEOUT = 30.0  # a start that cannot have the lock fails, saying so, and the kubelet starts it again
LOCK_POLL = 0.005  # another driver holds the lock for milliseconds (one prepare's writes)
SPEC_LIMIT = 1024 * 1024
ClaimReader = Callable[[ClaimRef], Awaitable[Any]]  # the ResourceClaim object; ClaimError when it cannot
Resetter = Callable[[PreparedClaim], Awaitable[str | None]]  # resets the claim's reset_chips; None, or why not


def read_boot_id(path: Path = BOOT_ID) -> str:
    """This boot's ID ('' when the kernel does not say)."""
    try:
        return read_file(path, 128).decode("ascii", "replace").strip()
    except (OSError, DocumentError):
        return ""


class DraState:
    """The prepared claims of this node, their CDI specs and the checkpoint."""

    def __init__(self, directory: Path, cdi_dir: Path, pool: str, dev_root: Path, boot_id: str = "") -> None:
        self.directory = directory
        self.path = directory / CHECKPOINT_FILE
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.dev_root = dev_root
        self.boot_id = boot_id
        self.claims: dict[str, PreparedClaim] = {}
        self.restored = 0  # claims found at start
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the checkpoint as last read
        self._checkpoint_boot = ""  # the boot the checkpoint on disk was written in
        self._lock = asyncio.Lock()
        self.lock_timeout = LOCK_TIMEOUT  # seconds a prepare or unprepare waits for the lock
        self.start_lock_timeout = START_LOCK_TIMEOUT  # the same at start
        self._resetting: dict[str, asyncio.Future[None]] = {}  # claim UID -> done when its reset is over

    # ---- start ----------------------------------------------------------------------------------

    async def restore(self) -> None:
        """Load the checkpoint and write every claim's CDI spec again; StartupError for a newer checkpoint, or when
        another process holds the lock longer than start_lock_timeout (the wait is said in the log; cancelling the
        start ends it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.directory, CHECKPOINT_FILE)
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*"))
        async with self._locked(self.start_lock_timeout, at_start=True):
            self._load(rebuild=True)
            earlier = 0
            for claim in self.claims.values():
                self._write_spec(claim)
            if self.claims and self._checkpoint_boot != self.boot_id:
                earlier = len(self.claims)
                self._save(self.claims)
            self._remove_orphan_specs()
        self.restored = len(self.claims)
        if self.claims:
            log.info(
                "restored %d prepared claims from %s (%d from an earlier boot); their CDI specs written again",
                len(self.claims),
                self.path,
                earlier,
            )

    def _load(self, rebuild: bool = False) -> None:
        """Read the checkpoint if it changed since last read; a corrupt one is moved aside and rebuilt."""
        seen = _identity(self.path)
        if seen is not None and seen == self._seen:
            return
        try:
            checkpoint = read_checkpoint(self.path)
        except CheckpointTooNew as error:
            raise StartupError(str(error)) from None
        except CheckpointError as error:
            if not rebuild:
                raise
            self.claims = self._set_aside(error)
            return
        self._checkpoint_boot = checkpoint.boot_id if checkpoint else self.boot_id
        self.claims = dict(checkpoint.claims) if checkpoint else {}
        self._seen = seen

    def _set_aside(self, error: CheckpointError) -> dict[str, PreparedClaim]:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        with contextlib.suppress(OSError):
            self.path.rename(aside)
        rebuilt = self._claims_from_specs()
        log.error(
            "%s; moved to %s; %d claims rebuilt from their CDI specs in %s",
            error,
            aside,
            len(rebuilt),
            self.cdi_dir,
        )
        self._save(rebuilt)
        return rebuilt

    def _claims_from_specs(self) -> dict[str, PreparedClaim]:
        claims = {}
        for uid, path in claim_spec_files(self.cdi_dir):
            try:
                claim = claim_from_spec(uid, load_yaml(read_file(path, SPEC_LIMIT, follow_symlinks=False)), self.pool)
            except (OSError, DocumentError) as error:
                log.warning("%s: not a claim spec this driver can read: %s", path, error)
                continue
            if claim is not None:
                claims[uid] = claim
        return claims

    def _remove_orphan_specs(self) -> None:
        """Remove claim specs the checkpoint does not hold (an unprepare cut short after the checkpoint write)."""
        for uid, path in claim_spec_files(self.cdi_dir):
            if uid not in self.claims:
                with contextlib.suppress(OSError):
                    path.unlink()
                log.info("removed %s: no prepared claim has it", path)

    # ---- the kubelet's calls --------------------------------------------------------------------

    async def prepare(
        self,
        ref: ClaimRef,
        read: ClaimReader,
        devices: Mapping[str, SliceDevice],
        control_nodes: tuple[str, ...],
        reset: Resetter | None = None,
    ) -> PreparedClaim | str:
        """The prepared claim, or this claim's error message; never raises."""
        node = NodeView(devices, self.pool, control_nodes, self.dev_root)
        while True:
            ongoing = self._resetting.get(ref.uid)
            if ongoing is not None:  # prepared just now by another call, whose reset is not over
                await asyncio.shield(ongoing)
                continue
            outcome = await self._prepare(ref, read, node, resetting=reset is not None)
            if isinstance(outcome, str):
                return outcome
            prepared, fresh = outcome
            if ref.uid not in self._resetting:
                return prepared
            if fresh and reset is not None:
                return await self._reset(prepared, reset)

    async def _reset(self, prepared: PreparedClaim, reset: Resetter) -> PreparedClaim | str:
        """Reset a claim just committed; unprepare it again when that fails."""
        try:
            error = await reset(prepared)
            if error is None:
                return prepared
            log.warning("NodePrepareResources: claim %s: %s", prepared.ref, error)
            undone = await self._unprepare(prepared.ref)
            return f"claim {prepared.ref}: {error}" + (f"; and unpreparing it failed: {undone}" if undone else "")
        finally:
            self._resetting.pop(prepared.ref.uid).set_result(None)

    async def _prepare(
        self, ref: ClaimRef, read: ClaimReader, node: NodeView, resetting: bool
    ) -> tuple[PreparedClaim, bool] | str:
        """The prepared claim and whether it was prepared just now, or this claim's error message. resetting: a
        claim prepared now whose config asks for a reset is marked as being reset before the lock is let go."""
        try:
            check_ref(ref)
            claim = None
            while True:
                known = self.claims.get(ref.uid)
                if claim is None and (known is None or not known.complete):
                    claim = await read(ref)  # outside the lock: the API server may be slow
                async with self._locked():
                    self._load()
                    known = self.claims.get(ref.uid)
                    if known is not None and known.complete:
                        self._write_spec(known, only_if_missing=True)  # a reboot emptied the CDI directory
                        return known, False
                    if claim is None:
                        continue  # another driver unprepared it meanwhile: read the claim, then decide
                    others = {uid: c for uid, c in self.claims.items() if uid != ref.uid}
                    prepared = prepare(ref, claim, node, others)
                    self._commit_prepared(prepared)
                    if resetting and prepared.reset_chips:
                        self._resetting[ref.uid] = asyncio.get_running_loop().create_future()
                    break
        except (ClaimError, OutputError, CheckpointError) as error:
            log.warning("NodePrepareResources: %s", error)
            return str(error)
        except Exception as error:  # a claim nobody foresaw: this claim fails, the others are served
            log.error("NodePrepareResources: claim %s: %s: %s", ref, type(error).__name__, error)
            return f"claim {ref}: cannot be prepared: {type(error).__name__}: {error}"
        log.info("prepared claim %s: %s", ref, describe(prepared))
        return prepared, True

    async def unprepare(self, ref: ClaimRef) -> str | None:
        """Forget the claim (checkpoint first, then its CDI spec); the error message, or None."""
        ongoing = self._resetting.get(ref.uid)
        if ongoing is not None:
            await asyncio.shield(ongoing)
        return await self._unprepare(ref)

    async def _unprepare(self, ref: ClaimRef) -> str | None:
        try:
            check_ref(ref)
            async with self._locked():
                self._load()
                known = ref.uid in self.claims
                if known:
                    remaining = {uid: c for uid, c in self.claims.items() if uid != ref.uid}
                    self._save(remaining)
                    self.claims = remaining
                self._remove_spec(ref.uid)
        except (ClaimError, OutputError, CheckpointError) as error:
            log.warning("NodeUnprepareResources: %s", error)
            return f"claim {ref}: {error}" if not str(error).startswith("claim ") else str(error)
        log.info("unprepared claim %s%s", ref, "" if known else " (was not prepared)")
        return None

    # ---- files ------------------------------------------------------------------------------------

    def _commit_prepared(self, claim: PreparedClaim) -> None:
        """Write claim's CDI spec, then the checkpoint with it; memory changes only when both are written."""
        self._write_spec(claim)
        claims = {**self.claims, claim.ref.uid: claim}
        try:
            self._save(claims)
        except OutputError:
            with contextlib.suppress(OutputError):
                self._remove_spec(claim.ref.uid)
            raise
        self.claims = claims

    def _write_spec(self, claim: PreparedClaim, only_if_missing: bool = False) -> None:
        path = self.cdi_dir / cdi_spec_file(claim.ref.uid)
        if only_if_missing and path.is_file() and not path.is_symlink():
            return
        write_atomically(path, spec_text(claim.spec))

    def _remove_spec(self, uid: str) -> None:
        spec = self.cdi_dir / cdi_spec_file(uid)
        try:
            spec.unlink(missing_ok=True)
        except OSError as error:
            raise OutputError(f"cannot remove {spec}: {reason(error)}") from None

    def _save(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomically(self.path, checkpoint_text(claims, self.boot_id))
        self._seen = _identity(self.path)
        self._checkpoint_boot = self.boot_id

    # ---- locking ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, timeout: float | None = None, at_start: bool = False) -> AsyncIterator[None]:
        """Hold this driver's turn and the file lock shared with other drivers, both had within timeout
        (lock_timeout by default); OutputError past it, StartupError at_start."""
        timeout = self.lock_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        lock = FileLock(self.directory / LOCK_FILE)
        try:
            async with asyncio.timeout(timeout):
                await self._lock.acquire()
        except TimeoutError:
            raise OutputError(f"{lock.path}: this driver's other calls kept it for more than {timeout:g}s") from None
        try:
            try:
                await lock.take(max(0.0, deadline - time.monotonic()), poll=LOCK_POLL, purpose="prepared claims")
            except LockError as error:
                if at_start:
                    raise StartupError(f"cannot start: {error}") from None
                raise
            try:
                yield
            finally:
                lock.release()
        finally:
            self._lock.release()


def describe(claim: PreparedClaim) -> str:
    """The claim's devices for a log line: `gpu-0`, `board-2`, `gpu-1 share 2 of ... (slots 0,1)`."""
    parts = []
    for device in claim.devices:
        part = device.device
        if device.share_id:
            part += f" share {device.share_id} (slot {','.join(map(str, device.slots))})"
        parts.append(part + (" (admin access)" if device.admin else ""))
    return ", ".join(parts)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
