"""Resetting chips before a container gets them (`flags.reset_gpu` in plugin mode, `reset: true` in a DRA claim's
config), with Iluvatar's handshake so that other IXML users let go first.

Other IXML users on the node (ix-exporter) are asked to let go first through Iluvatar's handshake, kept
exactly so that they interoperate: the ConfigMap `ix-gpu-reset-<node>` in the plugin's namespace, key
`gpuReset`, a YAML document `{nodename, occupy: {<user>: bool}, reset}`. We set `reset: true` and our
`occupy` false, wait until every `occupy` is false, reset, then set `reset: false` and our `occupy` true,
and wait for the others to come back. Unlike upstream, each wait has a deadline, and `reset: true` is
never left behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.hardware.backend import BackendError

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.client import Kube
    from ix_device_plugin.hardware.worker import Hardware

log = logging.getLogger(__name__)

CONFIG_MAP_PREFIX = "ix-gpu-reset-"
DATA_KEY = "gpuReset"
OUR_NAME = "ix-device-plugin"
POLL_INTERVAL = 0.5
WRITE_ATTEMPTS = 5


class GpuResetError(Exception):
    """A reset did not happen or did not work; the message says why and is what Allocate answers."""

    def __init__(self, message: str, result: str = "failed") -> None:
        super().__init__(message)
        self.result = result  # for the metric: failed, refused, uuid_changed


@dataclass(frozen=True)
class ResetInfo:
    """The `gpuReset` document: who is using the GPUs (`occupy`) and whether a reset is under way."""

    nodename: str
    reset: bool = False
    occupy: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None, node: str) -> ResetInfo:
        """The document in text (None or empty: a fresh one); GpuResetError when it is not one."""
        if not text or not text.strip():
            return cls(node)
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise GpuResetError(f"{DATA_KEY} is not YAML: {error}") from None
        if not isinstance(document, dict):
            raise GpuResetError(f"{DATA_KEY} is not a mapping with nodename, reset and occupy")
        occupy = document.get("occupy") or {}
        if not isinstance(occupy, dict) or not all(isinstance(value, bool) for value in occupy.values()):
            raise GpuResetError(f"{DATA_KEY}: occupy must map each IXML user to true or false")
        return cls(
            str(document.get("nodename") or node), bool(document.get("reset")), {str(k): v for k, v in occupy.items()}
        )

    def text(self) -> str:
        """The document as upstream writes it (keys in sorted order)."""
        return yaml.safe_dump({"nodename": self.nodename, "occupy": dict(self.occupy), "reset": self.reset})

    def ours(self, *, resetting: bool) -> ResetInfo:
        """This document with our part set: resetting, we let go; otherwise we hold the GPUs."""
        return replace(self, reset=resetting, occupy={**self.occupy, OUR_NAME: not resetting})

    def holding(self) -> list[str]:
        """The other users that still hold the GPUs."""
        return sorted(name for name, held in self.occupy.items() if held and name != OUR_NAME)

    def away(self) -> list[str]:
        """The other users that have let go and not come back."""
        return sorted(name for name, held in self.occupy.items() if not held and name != OUR_NAME)


class ResetHandshake:
    """Iluvatar's reset handshake on the ConfigMap `ix-gpu-reset-<node>`."""

    def __init__(self, kube: Kube, namespace: str, node: str, poll_interval: float = POLL_INTERVAL) -> None:
        self.kube = kube
        self.namespace = namespace
        self.node = node
        self.name = CONFIG_MAP_PREFIX + node
        self.poll_interval = poll_interval
        self.resetting = False  # True from the moment reset: true may have been written until it is undone

    @property
    def where(self) -> str:
        """The ConfigMap, for messages."""
        return f"ConfigMap {self.namespace}/{self.name}"

    async def announce(self) -> None:
        """Say that we hold the GPUs (creating the ConfigMap when there is none); the others' entries stay."""
        await self._write(resetting=False)

    async def hold_off(self, timeout: float) -> None:
        """Ask every other user to let go and wait until they have; GpuResetError naming who did not."""
        self.resetting = True
        await self._write(resetting=True)
        info = await self._wait(lambda info: not info.holding(), timeout)
        if info.holding():
            raise GpuResetError(
                f"{', '.join(info.holding())} did not let go of the GPUs within {timeout:g}s ({self.where}); "
                "the GPUs were not reset"
            )

    async def welcome_back(self, timeout: float) -> list[str]:
        """Say the reset is over and wait for the others to come back; those that did not, by name."""
        await self._write(resetting=False)
        self.resetting = False
        info = await self._wait(lambda info: not info.away(), timeout)
        return info.away()

    async def _read(self) -> tuple[ResetInfo, str | None]:
        found = await self.kube.get_config_map(self.namespace, self.name)
        if found is None:
            return ResetInfo(self.node), None
        return ResetInfo.parse(found.data.get(DATA_KEY), self.node), found.resource_version

    async def _write(self, *, resetting: bool) -> None:
        from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeConflict

        for _ in range(WRITE_ATTEMPTS):
            info, version = await self._read()
            data = {DATA_KEY: info.ours(resetting=resetting).text()}
            try:
                if version is None:
                    await self.kube.create_config_map(self.namespace, self.name, data)
                else:
                    await self.kube.replace_config_map(self.namespace, self.name, data, version)
                return
            except (KubeConflict, KubeAlreadyExists):
                continue  # someone else wrote in between: read again
        raise GpuResetError(f"{self.where} kept changing under us ({WRITE_ATTEMPTS} attempts)")

    async def _wait(self, done: Callable[[ResetInfo], bool], timeout: float) -> ResetInfo:
        """Poll the document until done(info) or timeout; the last info read."""
        deadline = time.monotonic() + timeout
        while True:
            info, _ = await self._read()
            if done(info) or time.monotonic() >= deadline:
                return info
            await asyncio.sleep(self.poll_interval)


@dataclass
class ResetSettings:
    """How long each step may take."""

    wait_timeout: float = 60.0  # each handshake wait
    command_timeout: float = 120.0  # ixsmi -r


HandshakeSource = Callable[[], Awaitable[ResetHandshake | None]]


class ResetMetrics(Protocol):
    """Where resets are counted: a counter of resets by result, and a histogram of their durations."""

    gpu_resets: Any
    gpu_reset_duration: Any


class GpuReset:
    """Resets chips one request at a time, with the handshake when the API server is reachable."""

    def __init__(
        self,
        hardware: Hardware,
        handshake: HandshakeSource,
        rediscover: Callable[[], Awaitable[Inventory]],
        metrics: ResetMetrics,
        settings: ResetSettings,
    ) -> None:
        self._hardware = hardware
        self._handshake_source = handshake
        self._rediscover = rediscover
        self._metrics = metrics
        self._settings = settings
        self._turn = asyncio.Lock()
        self._handshake: ResetHandshake | None = None

    async def reset(self, uuids: Sequence[str]) -> None:
        """Reset these chips and rediscover; GpuResetError (with what Allocate should answer) when that fails."""
        async with self._turn:
            started, result = time.monotonic(), "failed"
            try:
                await self._reset(list(uuids))
                result = "ok"
            except GpuResetError as error:
                result = error.result
                raise
            finally:
                seconds = time.monotonic() - started
                self._metrics.gpu_resets.labels(result=result).inc()
                self._metrics.gpu_reset_duration.observe(seconds)
                log.info("GPU reset of %s: %s after %.1fs", ",".join(uuids), result, seconds)

    async def _reset(self, uuids: list[str]) -> None:
        handshake = await self._handshake_source()
        self._handshake = handshake
        if handshake is not None:
            try:
                await handshake.hold_off(self._settings.wait_timeout)
            except GpuResetError as error:
                await self._undo(handshake)
                raise GpuResetError(str(error), "refused") from None
            except KubeError as error:
                await self._undo(handshake)
                message = f"the reset handshake failed: {error}"
                raise GpuResetError(message, "refused") from None
        try:
            await self._run_reset(uuids)
        finally:
            if handshake is not None:
                await self._undo(handshake)
        await self._check_uuids(uuids, await self._rediscover())

    async def _run_reset(self, uuids: list[str]) -> None:
        timeout = self._settings.command_timeout

        def work(backend: Any) -> None:
            backend.reset(uuids, timeout)

        try:
            await self._hardware.call("reset", work, timeout=timeout + 5)
        except BackendError as error:
            raise GpuResetError(f"resetting {','.join(uuids)} failed: {error}") from None

    async def _undo(self, handshake: ResetHandshake) -> None:
        """reset: false and our occupy true again; shielded, so a stop mid-reset does not leave reset: true."""
        try:
            stragglers = await asyncio.shield(handshake.welcome_back(self._settings.wait_timeout))
        except Exception as error:  # the API server failing here must not hide the reset's own outcome
            log.error("could not end the GPU reset in %s: %s", handshake.where, error)
            return
        if stragglers:
            log.warning(
                "after the GPU reset, %s did not take the GPUs back within %gs (%s)",
                ", ".join(stragglers),
                self._settings.wait_timeout,
                handshake.where,
            )

    @staticmethod
    async def _check_uuids(uuids: list[str], inventory: Inventory) -> None:
        present = {chip.uuid for chip in inventory.chips() if chip.status.present}
        changed = [uuid for uuid in uuids if uuid not in present]
        if changed:
            raise GpuResetError(
                f"after the reset the node no longer lists {', '.join(changed)} (a new UUID?); "
                "the kubelet retries with the devices as they are now",
                "uuid_changed",
            )

    async def close(self, timeout: float) -> None:
        """On stop: never leave reset: true behind, even if the stop cut a reset short."""
        handshake = self._handshake
        if handshake is None or not handshake.resetting:
            return
        try:
            async with asyncio.timeout(timeout):
                await handshake.announce()  # reset: false, our occupy true
            handshake.resetting = False
            log.info("GPU reset cut short by the stop; %s says reset: false again", handshake.where)
        except Exception as error:
            log.error("could not end the GPU reset in %s before stopping: %s", handshake.where, error)
