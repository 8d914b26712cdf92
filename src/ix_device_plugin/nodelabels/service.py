"""Keeping the node's labels in the feature file: each front end hands over the label set it computes, and a
failed write is said once and retried."""

from __future__ import annotations

import logging
from pathlib import Path

from ix_device_plugin.core.labels import LabelSet
from ix_device_plugin.nodelabels.featurefile import FeatureFileWriter, read_machine_name
from ix_device_plugin.runtime.files import OutputError

log = logging.getLogger(__name__)

__all__ = ["NodeLabels", "OutputError"]


class NodeLabels:
    """The NFD feature file with the node's GPU labels, removed at a clean shutdown.

    machine: the DMI product name, read once from sysfs_root (the `gpu.machine` label).
    """

    name = "node labels"

    def __init__(self, directory: Path, sysfs_root: Path) -> None:
        self.writer = FeatureFileWriter(directory)
        self.machine = read_machine_name(sysfs_root)
        self._noted: tuple[str, ...] = ()

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

    def close(self) -> None:
        """Remove the labels: the node no longer has an agent telling the truth about its GPUs."""
        self.writer.remove()
