"""Keeping the node's labels in the feature file.

Each front end hands over the label set it computes (`want`, or `apply` where the front end does its own retrying);
a failed write is said once and retried.

`run` also watches the file's directory: when the agent before or beside this one stops and retires the file,
or an older agent removes it at its stop, this one's labels are written again at once (see featurefile.py on
handing over). At a clean stop `close` retires the file instead of removing it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ix_device_plugin.core.labels import LabelSet
from ix_device_plugin.nodelabels.featurefile import FeatureFileWriter, read_machine_name
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

__all__ = ["HANDOVER_GRACE", "NodeLabels", "OutputError"]

CHECK_INTERVAL = 5.0  # seconds between looks at the file when no inotify event came; and between retries
HANDOVER_GRACE = timedelta(minutes=10)  # how long retired labels hold for the agent that follows


class NodeLabels:
    """The NFD feature file with the node's GPU labels, handed over to the next agent at a clean stop.

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
        self._wanted = labels
        if labels.notes != self._noted:
            for note in labels.notes:
                log.info("node labels: %s", note)
            self._noted = labels.notes
        if self.writer.apply(labels.labels):
            log.info("node labels %s updated (%d labels)", self.writer.path, len(labels.labels))

    def want(self, labels: LabelSet) -> None:
        """Keep labels on the node from now on: written now, or said once and retried by `run`."""
        if labels == self._wanted and not self.due:
            return
        self._wanted = labels
        self._write()

    async def run(self) -> None:
        """Until cancelled: retry a write that failed, and write the labels again when another agent retired or
        removed the file."""
        watcher = Watcher()
        try:
            watcher.watch(self.writer.directory)
            while True:
                await watcher.wait(CHECK_INTERVAL)
                if self.due:
                    self._write()
                elif self.writer.handed_over():
                    log.info("node labels %s retired or removed by another agent: written again", self.path)
                    self._write()
        finally:
            watcher.close()

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
        """Retire the labels rather than remove them: they hold HANDOVER_GRACE for the agent that follows (an
        upgrade, a move between the device plugin and the DRA driver), then NFD drops them."""
        until = datetime.now(UTC) + HANDOVER_GRACE
        try:
            if self.writer.retire(until):
                log.info("node labels kept until %s for the agent that follows", until.strftime("%H:%M:%S UTC"))
        except OutputError as error:
            log.warning("%s: %s", self.name, error)
