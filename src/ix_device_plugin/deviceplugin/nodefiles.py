"""The files the plugin keeps on the node for other tools, kept in step with the served State.

Each output takes the whole State on every change and writes only what differs: the CDI spec for container
runtimes. (The node labels are the node-agent kit's: nodeagent/kit.py.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from ix_device_plugin.deviceplugin.outputs import CdiSpecWriter, OutputError
from ix_device_plugin.deviceplugin.state import State
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)


class NodeFile(Protocol):
    """One file output: apply(state) raises OutputError; close() runs at a clean shutdown."""

    name: str

    def apply(self, state: State) -> None:
        """Bring the file in step with state."""
        ...

    def close(self) -> None:
        """Clean up at shutdown."""
        ...


class CdiSpecFile:
    """The CDI spec: one device per chip, rewritten when the chips change, left in place at shutdown."""

    name = "CDI spec"

    def __init__(self, writer: CdiSpecWriter) -> None:
        self._writer = writer
        self._warned: set[str] = set()

    def apply(self, state: State) -> None:
        """Write the spec for state's chips when it changed."""
        if self._writer.apply(state.inventory):
            log.info("CDI spec %s updated (%d chips)", self._writer.path, state.inventory.chip_count())
        for warning in set(self._writer.warnings) - self._warned:
            log.warning("CDI spec: %s", warning)
        self._warned = set(self._writer.warnings)

    def close(self) -> None:
        """Keep the spec: a container restarted while the plugin is down still needs it."""


class NodeFiles:
    """Every node file turned on, kept in step with the served State; a failed write is logged once and retried."""

    def __init__(self, cdi_spec_dir: Path | None, dev_root: Path) -> None:
        self.files: list[NodeFile] = []
        if cdi_spec_dir is not None:
            self.files.append(CdiSpecFile(CdiSpecWriter(cdi_spec_dir, dev_root)))
        self._errors = {file.name: OncePerError(log) for file in self.files}
        self.due = bool(self.files)

    def changed(self) -> None:
        """The State changed: write at the next apply."""
        self.due = bool(self.files)

    def apply(self, state: State) -> None:
        """Write what is due for state; a file that fails stays due."""
        if not self.due:
            return
        self.due = False
        for file in self.files:
            errors = self._errors[file.name]
            try:
                file.apply(state)
            except OutputError as error:
                errors.failed("%s not written, retrying: %s", file.name, error)
                self.due = True
            else:
                errors.succeeded("%s written again", file.name)

    def close(self) -> None:
        """Clean up every file at a clean shutdown (the CDI spec stays)."""
        for file in self.files:
            try:
                file.close()
            except OutputError as error:
                log.warning("%s: %s", file.name, error)
