"""The DRA driver's prepared claims: one owner of the claims, their CDI spec files and the checkpoint.

Every change runs under one lock, held across processes (a file lock, so that two drivers overlapping during
an update take turns): read the checkpoint if another driver changed it, decide with the pure `claims.prepare`,
write the claim's CDI spec and the checkpoint, each atomically, and only then change what is kept in memory.
A prepare is answered OK only after the checkpoint holds the claim; an unprepare only after it no longer does.
The kubelet's calls on one claim run one at a time, in the order they came: the last one wins.

At start (`restore`), before the kubelet is served, every checkpointed claim's CDI spec is written again: CDI
specs live on a tmpfs that a reboot empties, the checkpoint does not. A checkpoint that cannot be read (or is
missing while claim specs are there) is rebuilt from the claims' CDI specs, at start or while running; the
rebuilt one is written before the old one is kept aside, and a spec that cannot be read is skipped with a
message, never removed and never a reason to forget the others.

Each prepared claim's device metadata files (and the CDI specs mounting them) are written with its CDI spec, kept
up to date when what the node says of its devices changes (`refresh_metadata`), and removed with it.

A claim configured with `reset: true` is committed with its reset pending (so that no other claim can take its
chips, and so that a driver killed in the middle of the reset runs it at the kubelet's next try instead of
answering without it), reset outside the lock, and recorded as reset before the prepare is answered; a reset
that fails unprepares the claim again and fails the prepare. Resets take a node-wide turn (a second file lock)
shared by the driver's pods, and the claim is read again once the turn is had.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ix_device_plugin.core.cdi import spec_text
from ix_device_plugin.core.holding import unknown_holder
from ix_device_plugin.dra.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    CheckpointTooNew,
    checkpoint_text,
    read_checkpoint,
)
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.claimspec import (
    ClaimEnv,
    SpecError,
    cdi_spec_file,
    claim_from_spec,
    claim_spec_files,
    with_env,
    with_relay_ids,
)
from ix_device_plugin.dra.metadata import NodeFacts
from ix_device_plugin.dra.metadatafiles import MetadataFiles, with_generations
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim, check_ref, valid_uid
from ix_device_plugin.dra.slices import SliceDevice
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import (
    OutputError,
    keep_aside,
    reason,
    remove_file,
    remove_oldest_aside,
    remove_stale_temporaries,
    write_atomically,
)
from ix_device_plugin.runtime.locks import FileLock
from ix_device_plugin.settings.documents import DocumentError, load_yaml, read_file

log = logging.getLogger(__name__)

LOCK_FILE = "serialize.lock"  # the name the upstream kubelet-plugin helper uses for the same purpose
RESET_LOCK_FILE = "reset.lock"  # held while a claim's chips are reset, by whichever pod of the driver does it
LOCK_TIMEOUT = 10.0
START_LOCK_TIMEOUT = 30.0  # a start that cannot have the lock fails, saying so, and the kubelet starts it again
LOCK_POLL = 0.005  # another driver holds the lock for milliseconds (one prepare's writes)
RESET_WAIT = 60.0  # how long a reset, or the unprepare of a claim whose reset is pending, waits for another reset
SPEC_LIMIT = 1024 * 1024
ASIDE_LABEL = "corrupt"  # checkpoint.json.corrupt-<Unix time>: unreadable checkpoints kept for the operator
ASIDE_KEPT = 5  # the newest kept: enough to see what spoiled it; a loop of bad writes fills no disk
ClaimReader = Callable[[ClaimRef], Awaitable[Any]]  # the ResourceClaim object; ClaimError when it cannot
Resetter = Callable[[PreparedClaim], Awaitable[str | None]]  # resets the claim's reset_chips; None, or why not


class DraState:
    """The prepared claims of this node, their CDI specs and the checkpoint."""

    def __init__(
        self,
        directory: Path,
        cdi_dir: Path,
        pool: str,
        dev_root: Path,
        boot_id: str = "",
        reset_wait: float = RESET_WAIT,
    ) -> None:
        self.directory = directory
        self.path = directory / CHECKPOINT_FILE
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.dev_root = dev_root
        self.boot_id = boot_id
        self.reset_wait = reset_wait
        self.claims: dict[str, PreparedClaim] = {}
        self.restored = 0  # claims found at start
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the checkpoint as last read
        self._checkpoint_boot = ""  # the boot the checkpoint on disk was written in
        self._lock = asyncio.Lock()
        self.lock_timeout = LOCK_TIMEOUT  # seconds a prepare or unprepare waits for the lock
        self.start_lock_timeout = START_LOCK_TIMEOUT  # the same at start
        self._resetting = asyncio.Lock()  # this process's part of the node-wide reset turn
        self._turns = _ClaimTurns()
        self._work: set[asyncio.Task[PreparedClaim | str]] = set()  # resets going on to their end
        # Chip UUID -> why it is reserved for a reset, by whichever pod of the agent (the node-health record).
        self.reserved: Callable[[], Mapping[str, str]] = dict
        self.metadata = MetadataFiles(directory, cdi_dir)
        self.facts: Callable[[], NodeFacts] = NodeFacts  # what the node publishes of its devices now

    # ---- start ----------------------------------------------------------------------------------

    async def restore(self) -> None:
        """Load the checkpoint (rebuilt from the claim specs when it cannot be read) and write every claim's CDI
        spec again; StartupError for a newer checkpoint, a directory or file that cannot be used, or a lock another
        process holds longer than start_lock_timeout (the wait is said in the log; cancelling the start ends it)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StartupError(f"cannot create the driver's directory {self.directory}: {reason(error)}") from None
        remove_stale_temporaries(self.directory, CHECKPOINT_FILE)
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*"))
        try:
            async with self._locked(self.start_lock_timeout):
                earlier = self._restore_locked()
        except (OutputError, CheckpointError) as error:
            raise StartupError(f"cannot restore the prepared claims: {error}") from None
        self.restored = len(self.claims)
        if self.claims:
            log.info(
                "restored %d prepared claims from %s (%d from an earlier boot); their CDI specs written again",
                len(self.claims),
                self.path,
                earlier,
            )
        for claim in self.claims.values():
            if claim.reset_pending:
                log.warning("claim %s: its GPU reset was cut short; it runs at the kubelet's next prepare", claim.ref)

    def _restore_locked(self) -> int:
        """Load, write the specs again, and the checkpoint when it came from an earlier boot; the claims from an
        earlier boot."""
        self._load(at_start=True)
        earlier = len(self.claims) if self._checkpoint_boot != self.boot_id else 0
        self.metadata.adopt_named(self.claims)
        for claim in self.claims.values():
            self._write_spec(claim)
        self._write_metadata(self.facts())  # the specs mount the files by UID; a file not there is written
        if earlier:
            self._save(self.claims)
        self._remove_orphan_specs()
        self.metadata.remove_orphans(self.claims)
        return earlier

    def _load(self, at_start: bool = False) -> None:
        """Read the checkpoint if it changed since last read; one that cannot be read, or is missing while claim
        specs are there, is rebuilt from them. CheckpointTooNew (a StartupError at start) is raised."""
        seen = _identity(self.path)
        if seen is not None and seen == self._seen:
            return
        try:
            checkpoint = read_checkpoint(self.path)
        except CheckpointTooNew as error:
            if at_start:
                raise StartupError(str(error)) from None
            raise
        except CheckpointError as error:
            self._rebuild(str(error))
            return
        if checkpoint is None:
            if claim_spec_files(self.cdi_dir):
                self._rebuild(f"{self.path} is missing, but claim CDI specs are there")
                return
            self.claims, self._seen, self._checkpoint_boot = {}, None, self.boot_id
            return
        self._checkpoint_boot = checkpoint.boot_id
        self.claims = dict(checkpoint.claims)
        self._seen = seen

    def _rebuild(self, why: str) -> None:
        """The claims from their CDI specs (as kept in memory where known), written as the checkpoint; the old
        one is kept aside only once the rebuild is done, and replaced only by the rebuilt one."""
        rebuilt = {uid: self.claims.get(uid, claim) for uid, claim in self._claims_from_specs().items()}
        aside = self._keep_aside()
        self._save(rebuilt)
        self.claims = rebuilt
        kept = f"; kept as {aside}" if aside is not None else ""
        log.error("%s%s; %d claims rebuilt from their CDI specs in %s", why, kept, len(rebuilt), self.cdi_dir)
        for removed in remove_oldest_aside(self.path, ASIDE_LABEL, ASIDE_KEPT):
            log.info("removed %s, older than the %d unreadable checkpoints kept", removed, ASIDE_KEPT)

    def _keep_aside(self) -> Path | None:
        """A copy of the checkpoint beside it, for the operator (None when there is none); OutputError."""
        return keep_aside(self.path, ASIDE_LABEL) if self.path.exists() else None

    def _claims_from_specs(self) -> dict[str, PreparedClaim]:
        claims = {}
        for uid, path in claim_spec_files(self.cdi_dir):
            claim = self._read_spec(uid, path)
            if claim is not None:
                claims[uid] = claim
        return claims

    def _read_spec(self, uid: str, path: Path) -> PreparedClaim | None:
        """The claim the spec at path describes; None (with a message naming it) when it cannot be read."""
        try:
            if not valid_uid(uid):
                raise SpecError(f"the file name does not hold a claim UID ({uid[:80]!r})")
            return claim_from_spec(uid, load_yaml(read_file(path, SPEC_LIMIT, follow_symlinks=False)), self.pool)
        except (OSError, DocumentError, SpecError) as error:
            why = reason(error) if isinstance(error, OSError) else str(error)
            log.error("%s: skipped, not a claim spec this driver can read: %s; left for the operator", path, why)
            return None

    def _remove_orphan_specs(self) -> None:
        """Remove the claim specs that the checkpoint does not hold (an unprepare cut short after the checkpoint
        write); a spec this driver cannot read is left alone."""
        for uid, path in claim_spec_files(self.cdi_dir):
            if uid in self.claims or self._read_spec(uid, path) is None:
                continue
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
        """The prepared claim, or this claim's error message; never raises.

        A claim whose reset is pending (cut short by a stop or a kill, or under way in another call) is reset
        before it is answered, whoever committed it: its containers cannot have started.
        """
        node = NodeView(devices, self.pool, control_nodes, self.dev_root)
        async with self._turns.of(ref.uid):
            prepared = await self._prepare(ref, read, node, resets=reset is not None)
            if isinstance(prepared, str) or not prepared.reset_pending:
                return prepared
            if reset is None:
                return f"claim {ref}: its GPU reset has not run, and this driver cannot reset GPUs"
            work = asyncio.create_task(self._reset(ref, reset), name=f"reset-claim-{ref.uid}")
            self._work.add(work)
            work.add_done_callback(_ended(self._work))
            return await asyncio.shield(work)  # a kubelet that gives up does not cut the reset short

    async def _prepare(self, ref: ClaimRef, read: ClaimReader, node: NodeView, resets: bool) -> PreparedClaim | str:
        """The prepared claim (committed; reset_pending when its config asks for a reset), or this claim's error."""
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
                        self._write_metadata(self.facts(), only=ref.uid)
                        return known
                    if claim is None:
                        continue  # another driver unprepared it meanwhile: read the claim, then decide
                    others = {uid: c for uid, c in self.claims.items() if uid != ref.uid}
                    prepared = prepare(ref, claim, node, others)
                    self._check_not_reserved(prepared)
                    if resets and prepared.reset_chips:
                        prepared = self._with_reset(prepared, rebuilt=known is not None)
                    if known is not None:  # rebuilt from its CDI spec: its files' generations go on
                        prepared = replace(prepared, metadata_generations=known.metadata_generations)
                    prepared = self._commit_prepared(prepared)
                    break
        except (ClaimError, OutputError, CheckpointError) as error:
            message = _about(ref, error)
            log.warning("NodePrepareResources: %s", message)
            return message
        except Exception as error:  # a claim nobody foresaw: this claim fails, the others are served
            log.error("NodePrepareResources: claim %s: %s: %s", ref, type(error).__name__, error)
            return f"claim {ref}: cannot be prepared: {type(error).__name__}: {error}"
        pending = "; its GPUs are reset next" if prepared.reset_pending else ""
        log.info("prepared claim %s: %s%s", ref, describe(prepared), pending)
        return prepared

    @staticmethod
    def _with_reset(prepared: PreparedClaim, rebuilt: bool) -> PreparedClaim:
        """prepared with its reset pending; a claim rebuilt from its CDI spec is not reset again (whether its reset
        ran is not known, and its containers may be running: a reset would stop them)."""
        if rebuilt:
            log.warning(
                "claim %s was rebuilt from its CDI spec: not resetting %s again (its containers may be running)",
                prepared.ref,
                ",".join(prepared.reset_chips),
            )
            return prepared
        return replace(prepared, reset_pending=True)

    async def _reset(self, ref: ClaimRef, reset: Resetter) -> PreparedClaim | str:
        """Reset a claim whose reset is pending, in the node's reset turn, and record it; when the reset fails, the
        claim is unprepared again. The claim is read again once the turn is had: another pod may have reset it."""
        try:
            async with self.reset_turn():
                async with self._locked():
                    self._load()
                    claim = self.claims.get(ref.uid)
                if claim is None:
                    return f"claim {ref}: unprepared by another driver before its GPU reset; the kubelet tries again"
                if not claim.reset_pending:
                    return claim  # another driver's reset of it ended while this one waited for its turn
                error = await reset(claim) if claim.reset_chips else None
                if error is not None:
                    log.warning("NodePrepareResources: claim %s: %s", ref, error)
                    undone = await self._unprepare(ref)
                    return f"claim {ref}: {error}" + (f"; and unpreparing it failed: {undone}" if undone else "")
                return await self._reset_done(ref)
        except (OutputError, CheckpointError) as error:
            message = _about(ref, error)
            log.warning("NodePrepareResources: %s", message)
            return message
        except Exception as error:  # nobody foresaw it: the claim stays pending, and the next try resets it
            log.error("NodePrepareResources: claim %s: GPU reset: %s: %s", ref, type(error).__name__, error)
            return f"claim {ref}: GPU reset: {type(error).__name__}: {error}"

    async def _reset_done(self, ref: ClaimRef) -> PreparedClaim | str:
        """Record that the claim's chips were reset; the claim, or why that could not be written."""
        try:
            async with self._locked():
                self._load()
                claim = self.claims.get(ref.uid)
                if claim is None:  # cannot happen while the reset turn is held; said rather than assumed
                    return f"claim {ref}: its GPUs were reset, but it was unprepared meanwhile"
                done = replace(claim, reset_pending=False)
                claims = {**self.claims, ref.uid: done}
                self._save(claims)
                self.claims = claims
        except (OutputError, CheckpointError) as error:
            return f"claim {ref}: its GPUs were reset, but recording it failed ({error}); the next try resets again"
        log.info("claim %s: GPU reset done and recorded", ref)
        return done

    async def tell_containers(self, envs: Mapping[str, ClaimEnv]) -> None:
        """Have the prepared claims' CDI specs set the GPU variables where envs says (by claim UID; see
        containers.py): checkpoint first, then the specs. Never raises: a claim whose spec cannot be written keeps
        what it set, which is logged."""
        try:
            async with self._locked():
                self._load()
                changed = {}
                for uid, env in envs.items():
                    claim = self.claims.get(uid)
                    if claim is None or not claim.complete:
                        continue
                    told = with_relay_ids(dataclasses.replace(claim, spec=with_env(claim.spec, env)), env.relay)
                    if told != claim:
                        changed[uid] = told
                if not changed:
                    return
                claims = {**self.claims, **changed}
                self._save(claims)
                self.claims = claims
                for claim in changed.values():
                    self._write_spec(claim)
        except (OutputError, CheckpointError) as error:
            log.error("cannot write what the containers are told into the claims' CDI specs: %s", error)
            return
        log.info("CDI specs of claims %s tell each of their containers what it holds", ", ".join(sorted(changed)))

    async def refresh_metadata(self, facts: NodeFacts) -> int:
        """Bring every prepared claim's device metadata up to date with facts; the files written. Never raises: a
        file that cannot be written is logged, and the next change tries again."""
        written = 0
        try:
            async with self._locked():
                self._load()
                written = self._write_metadata(facts)
        except (OutputError, CheckpointError) as error:
            log.error("cannot bring the claims' device metadata up to date: %s", error)
        if written:
            log.info("device metadata: %d files of prepared claims say what changed (next generation)", written)
        return written

    async def unprepare(self, ref: ClaimRef) -> str | None:
        """Forget the claim (checkpoint first, then its CDI spec); the error message, or None. A claim whose reset
        is pending is forgotten only in the node's reset turn: never while its chips are being reset."""
        async with self._turns.of(ref.uid):
            with contextlib.suppress(_ResetPending):
                return await self._unprepare(ref, in_reset_turn=False)
            try:
                async with self.reset_turn():
                    return await self._unprepare(ref)
            except OutputError as error:
                message = _about(ref, error)
                log.warning("NodeUnprepareResources: %s", message)
                return message

    async def _unprepare(self, ref: ClaimRef, in_reset_turn: bool = True) -> str | None:
        """Forget the claim; the error message, or None. _ResetPending outside the reset turn when its reset is."""
        try:
            check_ref(ref)
            async with self._locked():
                self._load()
                claim = self.claims.get(ref.uid)
                if claim is not None and claim.reset_pending and not in_reset_turn:
                    raise _ResetPending
                known = claim is not None
                if known:
                    remaining = {uid: c for uid, c in self.claims.items() if uid != ref.uid}
                    self._save(remaining)
                    self.claims = remaining
                self._remove_spec(ref.uid)
                self.metadata.remove(ref.uid)
        except (ClaimError, OutputError, CheckpointError) as error:
            message = _about(ref, error)
            log.warning("NodeUnprepareResources: %s", message)
            return message
        log.info("unprepared claim %s%s", ref, "" if known else " (was not prepared)")
        return None

    async def close(self, timeout: float) -> None:
        """On stop: end the resets still under way here (their claims stay pending, to be reset after the start)."""
        work = list(self._work)
        for task in work:
            task.cancel()
        if work:
            await asyncio.wait(work, timeout=timeout)

    # ---- self-healing -------------------------------------------------------------------------------

    async def claim_holding(self, uuid: str) -> str | None:
        """The healer's question: the prepared claim that holds the chip (any claim on it or its board, admin access
        too), why that cannot be told, or None. Asked in the node's reset turn, after the chip was reserved."""
        try:
            async with self._locked():
                self._load()
                holder = next((claim for claim in self.claims.values() if uuid in claim.uuids), None)
        except (OutputError, CheckpointError) as error:
            return unknown_holder("a claim", error)
        return None if holder is None else f"claim {holder.ref}"

    def _check_not_reserved(self, prepared: PreparedClaim) -> None:
        """Read under the claims' lock: a chip reserved for a reset (by any pod of the agent) gets no claim, admin
        access included (the reset would pull the chip from under its container)."""
        reserved = self.reserved()
        for device in prepared.devices:
            busy = [uuid for uuid in device.chip_uuids if uuid in reserved]
            if busy:
                raise ClaimError(
                    f"claim {prepared.ref}: device {device.device} ({', '.join(busy)}) is {reserved[busy[0]]} "
                    "(self-healing clears an error on it); the kubelet tries again"
                )

    # ---- files ------------------------------------------------------------------------------------

    def _commit_prepared(self, claim: PreparedClaim) -> PreparedClaim:
        """Write claim's CDI spec and device metadata, then the checkpoint with it (and its files' generations);
        memory changes only when all are written. The claim as committed."""
        changes = self.metadata.changes(claim, self.facts())
        claim = with_generations(claim, changes)
        claims = {**self.claims, claim.ref.uid: claim}
        try:
            self._write_spec(claim)
            self.metadata.write(claim, changes)
            self._save(claims)
        except OutputError:
            with contextlib.suppress(OutputError):
                self._remove_spec(claim.ref.uid)
            with contextlib.suppress(OutputError):
                self.metadata.remove(claim.ref.uid)
            raise
        self.claims = claims
        return claim

    def _write_metadata(self, facts: NodeFacts, only: str | None = None) -> int:
        """Bring the claims' metadata files (only's, when given) up to date with facts: the generations they are
        given are checkpointed first, so that no file can carry a number the checkpoint has not seen; the files
        written. A claim whose files cannot be written is logged, and the next change tries again; OutputError
        when the checkpoint cannot be."""
        claims = [claim for uid, claim in self.claims.items() if only is None or uid == only]
        changes = {claim.ref.uid: self.metadata.changes(claim, facts) for claim in claims}
        if any(changes.values()):
            updated = {uid: with_generations(self.claims[uid], found) for uid, found in changes.items() if found}
            saved = {**self.claims, **updated}
            self._save(saved)
            self.claims = saved
        written = 0
        for uid in changes:
            claim = self.claims[uid]
            try:
                written += self.metadata.write(claim, changes[uid])
            except OutputError as error:
                log.error("claim %s: cannot bring its device metadata up to date: %s", claim.ref, error)
        return written

    def _write_spec(self, claim: PreparedClaim, only_if_missing: bool = False) -> None:
        path = self.cdi_dir / cdi_spec_file(claim.ref.uid)
        if only_if_missing and path.is_file() and not path.is_symlink():
            return
        write_atomically(path, spec_text(claim.spec))

    def _remove_spec(self, uid: str) -> None:
        remove_file(self.cdi_dir / cdi_spec_file(uid))

    def _save(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomically(self.path, checkpoint_text(claims, self.boot_id))
        self._seen = _identity(self.path)
        self._checkpoint_boot = self.boot_id

    # ---- locking ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Hold this driver's turn and the file lock shared with the other pods of the driver, both had within
        timeout (lock_timeout by default); OutputError past it."""
        async with _both(self._lock, self.directory / LOCK_FILE, timeout or self.lock_timeout, "prepared claims"):
            yield

    @contextlib.asynccontextmanager
    async def reset_turn(self) -> AsyncIterator[None]:
        """The node's turn to reset GPUs, shared by every pod of the driver (a reset, the unprepare of a claim
        whose reset is pending, the handshake's repair at start); OutputError after reset_wait seconds."""
        async with _both(self._resetting, self.directory / RESET_LOCK_FILE, self.reset_wait, "a GPU reset"):
            yield


@contextlib.asynccontextmanager
async def _both(turn: asyncio.Lock, path: Path, timeout: float, purpose: str) -> AsyncIterator[None]:
    """This process's turn, then the file lock at path shared with the other pods, both within timeout seconds
    (the wait for the file is said in the log; cancelling ends it); OutputError past it."""
    deadline = time.monotonic() + timeout
    try:
        async with asyncio.timeout(timeout):
            await turn.acquire()
    except TimeoutError:
        raise OutputError(f"{path}: this driver's other calls kept it for more than {timeout:g}s ({purpose})") from None
    try:
        lock = FileLock(path)
        await lock.take(max(0.0, deadline - time.monotonic()), poll=LOCK_POLL, purpose=purpose)
        try:
            yield
        finally:
            lock.release()
    finally:
        turn.release()


class _ResetPending(Exception):
    """The claim's reset is pending: it is unprepared in the node's reset turn."""


class _ClaimTurns:
    """The calls on each claim, one at a time in the order they came (asyncio.Lock wakes its waiters in order)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, uid: str) -> AsyncIterator[None]:
        """This call's turn on the claim uid."""
        lock, users = self._locks.get(uid, (asyncio.Lock(), 0))
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users == 1:
                del self._locks[uid]
            else:
                self._locks[uid] = (lock, users - 1)


def _ended(work: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def ended(task: asyncio.Task[Any]) -> None:
        work.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the caller, if still there, got it

    return ended


def _about(ref: ClaimRef, error: Exception) -> str:
    """error's message, naming the claim."""
    text = str(error)
    return text if text.startswith("claim ") else f"claim {ref}: {text}"


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
