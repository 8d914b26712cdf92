"""Chips and their health from Iluvatar's IXML library (libixml.so): the backend the daemon runs on real nodes."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from ix_device_plugin.core.inventory import ChipStatus, Inventory
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.hardware.backend import DEFAULT_IXSMI, BackendError, XidSink
from ix_device_plugin.hardware.devnodes import check_device_nodes, device_access_problem, node_checked_status
from ix_device_plugin.hardware.ixml.boards import boards, links
from ix_device_plugin.hardware.ixml.devices import DeviceReader, unidentified_at
from ix_device_plugin.hardware.ixml.events import XidWatch
from ix_device_plugin.hardware.ixml.library import (
    LIBRARY_LOCK,
    CallError,
    Library,
    find_library,
    load_library,
)
from ix_device_plugin.hardware.ixml.sampling import Sampler
from ix_device_plugin.hardware.resetaccess import drivers_dir
from ix_device_plugin.hardware.resetpath import LocalReset, Resetter

log = logging.getLogger(__name__)


_DRIVER_VERSION_BUFFER_SIZE = 80


class NoDevicesError(BackendError):
    """The library works but lists no devices."""


class IxmlBackend:
    """Chips and their health from Iluvatar's IXML library."""

    name = "ixml"

    def __init__(
        self,
        library_path: str | None = None,
        dev_root: str | Path = "/",
        sysfs_root: str | Path = "/sys",
        ixsmi_path: str = DEFAULT_IXSMI,
        resetter: Resetter | None = None,
    ) -> None:
        self._library_path = library_path
        # Who runs ixsmi -r (hardware/resetpath.py): by default this process, which must then be privileged.
        self._resetter: Resetter = resetter or LocalReset(ixsmi_path, drivers_dir(Path(sysfs_root), simulated=False))
        self._dev_root = Path(dev_root)
        self._library: Library | None = None
        self._initialized = False
        self._devices = DeviceReader(Path(sysfs_root))
        self._sampler = Sampler()
        self._xids = XidWatch()

    def discover(self) -> Inventory:
        """Every board and chip with its current status; raises BackendError when it cannot."""
        with LIBRARY_LOCK:
            library = self._start()
            devices = self._devices.enumerate(library)
            if not devices:
                raise NoDevicesError(f"IXML library {library.path} reports no Iluvatar devices")
            inventory = Inventory(
                boards=boards(library, devices),
                driver_version=_driver_version(library),
                cuda_version=_cuda_version(library),
                links=links(library, devices),
            )
            self._xids.watch(library, {d.handle: d.chip.uuid for d in devices if d.handle is not None})
        return check_device_nodes(inventory, self._dev_root)

    def watch_xids(self, sink: XidSink) -> None:
        """From the next discover() on, hand each critical XID event to sink, from a thread of its own."""
        with LIBRARY_LOCK:
            self._xids.hand_to(sink)

    def health(self, inventory: Inventory) -> Mapping[str, ChipStatus]:
        """Current status of each chip of inventory, by UUID; chips it cannot reach are not present."""
        try:
            with LIBRARY_LOCK:
                library = self._start()
                devices = self._devices.enumerate(library)
                # A reset lets go of the library and its XID waiter; after one that failed no discovery follows, and
                # the XIDs would go unheard until the next: the poll waits for them again (a no-op while it runs).
                self._xids.watch(library, {d.handle: d.chip.uuid for d in devices if d.handle is not None})
        except BackendError as exc:
            lost = ChipStatus(present=False, problems=(str(exc),))
            return {chip.uuid: lost for chip in inventory.chips()}
        by_uuid = {device.chip.uuid: device.chip for device in devices}
        by_bus = {device.chip.bus_id: device.chip for device in devices if device.chip.bus_id}
        statuses: dict[str, ChipStatus] = {}
        for chip in inventory.chips():
            current = by_uuid.get(chip.uuid) or unidentified_at(by_bus, chip.bus_id)
            if current is None:
                statuses[chip.uuid] = ChipStatus(present=False)
            else:
                statuses[chip.uuid] = node_checked_status(current, self._dev_root)
        return statuses

    def sample(self, inventory: Inventory) -> dict[str, ChipSample]:
        """Every chip's telemetry in one pass; a call the library lacks, does not support, or that hung gives None.

        Only starting the library takes the lock: a read that hangs must not hold up health (see sampling.py).
        """
        with LIBRARY_LOCK:
            library = self._start()
        self._sampler.begin_pass()
        return {device.chip.uuid: self._sampler.sample(library, device) for device in self._devices.handles(library)}

    def reset(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None) -> None:
        """Shut the library down and run `ixsmi -r -i <uuids>`; BackendError with ixsmi's words on failure
        (or when abort is set before it ends: it is killed)."""
        self.close()
        self._resetter.run(uuids, timeout, abort)

    def reset_problem(self) -> str | None:
        """Why no reset can work here (the resetter's answer); None when one can."""
        return self._resetter.problem()

    def xids_watched(self) -> frozenset[str] | None:
        """The chips the XID waiter waits for now; None when the library has no XID events."""
        with LIBRARY_LOCK:
            return self._xids.watched()

    def close(self) -> None:
        """Stop the XID waiter, then shut the library down; a later discover() starts it again."""
        with LIBRARY_LOCK:
            if not self._xids.stop() or self._sampler.busy:
                return  # shutting down under a thread that is inside the library would pull it from under it
            if self._library is not None and self._initialized:
                try:
                    self._library.call("shutdown")
                except CallError as exc:
                    log.warning("IXML shutdown: %s", exc)
            self._initialized = False

    def _start(self) -> Library:
        if self._library is None:
            path = find_library(self._library_path)
            self._library = Library(load_library(path), path)
        if not self._initialized:
            problem = device_access_problem(self._dev_root)
            if problem is not None:
                raise BackendError(problem)
            try:
                self._library.call("init")
            except CallError as exc:
                raise BackendError(f"IXML library {self._library.path} failed to initialise: {exc}") from exc
            self._initialized = True
        return self._library


def _driver_version(library: Library) -> str:
    if not library.has("driver_version"):
        return ""
    try:
        return library.string("driver_version", size=_DRIVER_VERSION_BUFFER_SIZE)
    except CallError as exc:
        log.warning("IXML driver version unknown: %s", exc)
        return ""


def _cuda_version(library: Library) -> str | None:
    if not library.has("cuda_version"):
        return None
    version = ctypes.c_int()
    try:
        library.call("cuda_version", ctypes.byref(version))
    except CallError as exc:
        log.info("CUDA driver version unknown: %s", exc)
        return None
    return str(version.value)
