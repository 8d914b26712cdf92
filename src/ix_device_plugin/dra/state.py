"""The DRA driver's prepared claims: one owner of the claims, their CDI spec files and the checkpoint.

Every change runs under one lock, held across processes (a file lock, so that two drivers overlapping during
an update take turns): read the checkpoint if another driver changed it, decide with the pure `claims.prepare`,
write the claim's CDI spec and the checkpoint, each atomically, and only then change what is kept in memory.
A prepare is answered OK only after the checkpoint holds the claim; an unprepare only after it no longer does.
The kubelet's calls on one claim run one at a time, in the order they came: the last one wins.

At start (`restore`), before the kubelet is served, every checkpointed claim's CDI spec is written again: CDI
specs live on a tmpfs that a reboot empties, the checkpoint does not. A checkpoint that cannot be read (or is
missing while claim specs are there) is rebuilt from the claims' CDI specs (checkpointfile.py).

Each prepared claim's device metadata files (and the CDI specs mounting them) are written with its CDI spec, kept
up to date when what the node says of its devices changes (`refresh_metadata`), and removed with it.

A claim configured with `reset: true` is committed with its reset pending (so that no other claim can take its
chips, and so that a driver killed in the middle of the reset runs it at the kubelet's next try instead of
answering without it), reset outside the lock, and recorded as reset before the prepare is answered; a reset
that fails unprepares the claim again and fails the prepare. Resets take the node's reset turn, shared by every pod
of the agent in either mode (runtime/noderole.py), and the claim is read again once the turn is had.

The state is given what it asks of the rest of the node at construction: the chips reserved for a reset (the
node-health record) and what the node publishes of its devices (for the claims' device metadata). Each call
brings its own claim reader and resetter. The files are its collaborators': `ClaimSpecFiles` (specfiles.py),
`CheckpointFile` (checkpointfile.py), `MetadataFiles` (metadatafiles.py); its locks are claimlocks.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ix_device_plugin.core.holding import unknown_holder
from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE, CheckpointError, CheckpointTooNew
from ix_device_plugin.dra.checkpointfile import CheckpointFile
from ix_device_plugin.dra.claimlocks import RESET_LOCK_FILE, ClaimTurns, claims_turn, forget_when_done
from ix_device_plugin.dra.claims import NodeView, check_not_reserved, prepare
from ix_device_plugin.dra.claimspec import ClaimEnv, with_env, with_relay_ids
from ix_device_plugin.dra.metadata import NodeFacts
from ix_device_plugin.dra.metadatafiles import MetadataFiles, with_generations
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim, check_ref, describe
from ix_device_plugin.dra.slices import SliceDevice
from ix_device_plugin.dra.specfiles import ClaimSpecFiles
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import OutputError, reason, remove_stale_temporaries
from ix_device_plugin.runtime.locks import TurnLock
from ix_device_plugin.runtime.noderole import reset_turn as node_reset_turn

log = logging.getLogger(__name__)

LOCK_TIMEOUT = 10.0
START_LOCK_TIMEOUT = 30.0  # a start that cannot have the lock fails, saying so, and the kubelet starts it again
RESET_WAIT = 60.0  # how long a reset, or the unprepare of a claim whose reset is pending, waits for another reset
ClaimReader = Callable[[ClaimRef], Awaitable[Any]]  # the ResourceClaim object; ClaimError when it cannot
Resetter = Callable[[PreparedClaim], Awaitable[str | None]]  # resets the claim's reset_chips; None, or why not
Reserved = Callable[[], Mapping[str, str]]  # chip UUID -> why it is reserved for a reset, by any pod of the agent


class DraState:
    """The prepared claims of this node, their CDI specs and the checkpoint.

    reserved: the chips reserved for a reset now (the node-health record, read under the claims' lock at every
    prepare); facts: what the node publishes of its devices now (the claims' device metadata says it).
    """

    def __init__(
        self,
        directory: Path,
        cdi_dir: Path,
        pool: str,
        dev_root: Path,
        boot_id: str = "",
        reset_turn: TurnLock | None = None,
        *,
        reserved: Reserved = dict,
        facts: Callable[[], NodeFacts] = NodeFacts,
    ) -> None:
        self.directory = directory
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.dev_root = dev_root
        self.boot_id = boot_id
        self._reset_turn = reset_turn or node_reset_turn((directory / RESET_LOCK_FILE,), RESET_WAIT)  # the node's
        self.reserved = reserved
        self.facts = facts
        self.claims: dict[str, PreparedClaim] = {}
        self.restored = 0  # claims found at start
        self.specs = ClaimSpecFiles(cdi_dir, pool)
        self.checkpoint = CheckpointFile(directory, boot_id, self.specs)
        self.metadata = MetadataFiles(directory, cdi_dir)
        self._claims_turn = claims_turn(directory, LOCK_TIMEOUT)  # shared with the other pods of the driver
        self.lock_timeout = LOCK_TIMEOUT  # seconds a prepare or unprepare waits for the lock
        self.start_lock_timeout = START_LOCK_TIMEOUT  # the same at start
        self._turns = ClaimTurns()
        self._work: set[asyncio.Task[PreparedClaim | str]] = set()  # resets going on to their end

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
        self.specs.remove_stale_temporaries()
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
                self.checkpoint.path,
                earlier,
            )
        for claim in self.claims.values():
            if claim.reset_pending:
                log.warning("claim %s: its GPU reset was cut short; it runs at the kubelet's next prepare", claim.ref)

    def _restore_locked(self) -> int:
        """Load, write the specs again, and the checkpoint when it came from an earlier boot; the claims from an
        earlier boot."""
        self._load(at_start=True)
        earlier = len(self.claims) if self.checkpoint.from_earlier_boot else 0
        self.metadata.adopt_named(self.claims)
        for claim in self.claims.values():
            self.specs.write(claim)
        self._write_metadata(self.facts())  # the specs mount the files by UID; a file not there is written
        if earlier:
            self.checkpoint.save(self.claims)
        self.specs.remove_orphans(self.claims)
        self.metadata.remove_orphans(self.claims)
        return earlier

    def _load(self, at_start: bool = False) -> None:
        """Read the checkpoint if it changed since last read (rebuilt from the claim specs when it cannot be read).
        CheckpointTooNew (a StartupError at start) is raised."""
        try:
            claims = self.checkpoint.load(self.claims)
        except CheckpointTooNew as error:
            if at_start:
                raise StartupError(str(error)) from None
            raise
        if claims is not None:
            self.claims = claims

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
            work.add_done_callback(forget_when_done(self._work))
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
                        self.specs.write(known, only_if_missing=True)  # a reboot emptied the CDI directory
                        self._write_metadata(self.facts(), only=ref.uid)
                        return known
                    if claim is None:
                        continue  # another driver unprepared it meanwhile: read the claim, then decide
                    others = {uid: c for uid, c in self.claims.items() if uid != ref.uid}
                    prepared = prepare(ref, claim, node, others)
                    check_not_reserved(prepared, self.reserved())
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
                self.checkpoint.save(claims)
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
                self.checkpoint.save(claims)
                self.claims = claims
                for claim in changed.values():
                    self.specs.write(claim)
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
                    self.checkpoint.save(remaining)
                    self.claims = remaining
                self.specs.remove(ref.uid)
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

    # ---- files ------------------------------------------------------------------------------------

    def _commit_prepared(self, claim: PreparedClaim) -> PreparedClaim:
        """Write claim's CDI spec and device metadata, then the checkpoint with it (and its files' generations);
        memory changes only when all are written. The claim as committed."""
        changes = self.metadata.changes(claim, self.facts())
        claim = with_generations(claim, changes)
        claims = {**self.claims, claim.ref.uid: claim}
        try:
            self.specs.write(claim)
            self.metadata.write(claim, changes)
            self.checkpoint.save(claims)
        except OutputError:
            with contextlib.suppress(OutputError):
                self.specs.remove(claim.ref.uid)
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
            self.checkpoint.save(saved)
            self.claims = saved
        written = 0
        for uid in changes:
            claim = self.claims[uid]
            try:
                written += self.metadata.write(claim, changes[uid])
            except OutputError as error:
                log.error("claim %s: cannot bring its device metadata up to date: %s", claim.ref, error)
        return written

    # ---- locking ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Hold this driver's turn and the file lock shared with the other pods of the driver, both had within
        timeout (lock_timeout by default); OutputError past it."""
        async with self._claims_turn.held(timeout or self.lock_timeout):
            yield

    @contextlib.asynccontextmanager
    async def reset_turn(self) -> AsyncIterator[None]:
        """The node's turn to reset GPUs, shared by every pod of the agent (a reset, the unprepare of a claim
        whose reset is pending, the handshake's repair at start); OutputError past its timeout."""
        async with self._reset_turn.held():
            yield


class _ResetPending(Exception):
    """The claim's reset is pending: it is unprepared in the node's reset turn."""


def _about(ref: ClaimRef, error: Exception) -> str:
    """error's message, naming the claim."""
    text = str(error)
    return text if text.startswith("claim ") else f"claim {ref}: {text}"
