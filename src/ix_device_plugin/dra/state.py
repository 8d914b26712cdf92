"""The DRA driver's prepared claims: one owner of the claims, their CDI spec files and the checkpoint.

Every change runs under one lock, held across processes (a file lock, so that two drivers overlapping during
an update take turns): read the checkpoint if another driver changed it, decide with the pure `claims.prepare`,
write the claim's CDI spec and the checkpoint, each atomically, and only then change what is kept in memory.
A prepare is answered OK only after the checkpoint holds the claim; an unprepare only after it no longer does.

At start (`restore`), before the kubelet is served, every checkpointed claim's CDI spec is written again: CDI
specs live on a tmpfs that a reboot empties, the checkpoint does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
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
from ix_device_plugin.dra.claims import (
    CLAIM_CDI_CLASS,
    CLAIM_CDI_VENDOR,
    ClaimError,
    ClaimRef,
    PreparedClaim,
    cdi_spec_file,
    check_ref,
    claim_from_spec,
    holders,
    prepare,
)
from ix_device_plugin.dra.slices import SliceDevice
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import OutputError, remove_stale_temporaries, write_atomically
from ix_device_plugin.settings.documents import DocumentError, load_yaml, read_file

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
LOCK_FILE = "serialize.lock"  # the name the upstream kubelet-plugin helper uses for the same purpose
LOCK_TIMEOUT = 10.0
SPEC_LIMIT = 1024 * 1024
ClaimReader = Callable[[ClaimRef], Awaitable[Any]]  # the ResourceClaim object; ClaimError when it cannot


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

    # ---- start ----------------------------------------------------------------------------------

    def restore(self) -> None:
        """Load the checkpoint and write every claim's CDI spec again; StartupError for a newer checkpoint."""
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.directory, CHECKPOINT_FILE)
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*"))
        with self._file_lock_now():
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
        for path in sorted(self.cdi_dir.glob(cdi_spec_file("*"))):
            uid = path.name.removeprefix(f"{CLAIM_CDI_VENDOR}-{CLAIM_CDI_CLASS}_").removesuffix(".yaml")
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
        for path in self.cdi_dir.glob(cdi_spec_file("*")):
            uid = path.name.removeprefix(f"{CLAIM_CDI_VENDOR}-{CLAIM_CDI_CLASS}_").removesuffix(".yaml")
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
    ) -> PreparedClaim | str:
        """The prepared claim, or this claim's error message; never raises."""
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
                        return known
                    if claim is None:
                        continue  # another driver unprepared it meanwhile: read the claim, then decide
                    others = holders({uid: c for uid, c in self.claims.items() if uid != ref.uid})
                    prepared = prepare(ref, claim, devices, others, self.pool, control_nodes, self.dev_root)
                    self._commit_prepared(prepared)
                    break
        except (ClaimError, OutputError, CheckpointError) as error:
            log.warning("NodePrepareResources: %s", error)
            return str(error)
        except Exception as error:  # a claim nobody foresaw: this claim fails, the others are served
            log.error("NodePrepareResources: claim %s: %s: %s", ref, type(error).__name__, error)
            return f"claim {ref}: cannot be prepared: {type(error).__name__}: {error}"
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in prepared.devices))
        return prepared

    async def unprepare(self, ref: ClaimRef) -> str | None:
        """Forget the claim (checkpoint first, then its CDI spec); the error message, or None."""
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
            raise OutputError(f"cannot remove {spec}: {error.strerror or error}") from None

    def _save(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomically(self.path, checkpoint_text(claims, self.boot_id))
        self._seen = _identity(self.path)
        self._checkpoint_boot = self.boot_id

    # ---- locking ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self) -> Any:
        async with self._lock:
            descriptor = await _flock(self.directory / LOCK_FILE, LOCK_TIMEOUT)
            try:
                yield
            finally:
                os.close(descriptor)

    @contextlib.contextmanager
    def _file_lock_now(self) -> Iterator[None]:
        descriptor = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)


async def _flock(path: Path, timeout: float) -> int:
    """An exclusive lock on path (a file descriptor to close); OutputError when another holder keeps it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise OutputError(f"cannot open the lock {path}: {error.strerror or error}") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(descriptor)
                raise OutputError(f"{path} is held by another driver for more than {timeout:g}s") from None
            await asyncio.sleep(0.005)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
