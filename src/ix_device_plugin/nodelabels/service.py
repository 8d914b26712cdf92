"""Keeping the node's labels in the feature file: each front end hands over the label set it computes (`want`,
or `apply` where the front end does its own retrying); a failed write is said once and retried."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ix_device_plugin.core.labels import LabelSet
from ix_device_plugin.nodelabels.featurefile import FeatureFileWriter, read_machine_name
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

__all__ = ["NodeLabels", "OutputError"]

RETRY_INTERVAL = 5.0  # seconds between attempts at a write that failed


class NodeLabels:
    """The NFD feature file with the node's GPU labels, removed at a clean shutdown.

    machine: the DMI product name, read once from sysfs_root (the `gpu.machine` label).
    """

    name = "node labels"

    def __init__(self, directory: Path, sysfs_root: Path) -> None:
        self.writer = FeatureFileWriter(directory)
        self.machine = read_machine_name(sysfs_root)
        self._noted: tuple[str, ...] = ()
        self._wanted: LabelSet | None = None
        self._errors = OncePerError(log)
        self.due = False  # the wanted labels are not on disk yet

    @property
    def path(self) -> Path:
        """The feature file."""
        return self.writer.path

    def apply(self, labels: LabelSet) -> None:
        """Write labels when they changed (their notes logged once); raises OutputError."""
        if labels.notes != self._noted:
            for note in labels.notes:
                log.info("node labels: %s", note)
            self._noted = labels.notes
        if self.writer.apply(labels.labels):
            log.info("node labels %s updated (%d labels)", self.writer.path, len(labels.labels))

    def want(self, labels: LabelSet) -> None:
        """Keep labels on the node from now on: written now, or said once and retried by `run`."""
        self._wanted = labels
        self._write()

    async def run(self) -> None:
        """Retry a write that failed, every RETRY_INTERVAL, until cancelled."""
        while True:
            await asyncio.sleep(RETRY_INTERVAL)
            if self.due:
                self._write()

    def _write(self) -> None:
        if self._wanted is None:
            return
        try:
            self.apply(self._wanted)
        except OutputError as error:
            self._errors.failed("%s not written, retrying: %s", self.name, error)
            self.due = True
        else:
            self._errors.succeeded("%s written again", self.name)
            self.due = False

    def close(self) -> None:
        """Remove the labels: the node no longer has an agent telling the truth about its GPUs."""
        self.writer.remove()
