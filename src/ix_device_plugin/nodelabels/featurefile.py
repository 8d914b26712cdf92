"""The NFD local feature file that carries the node's GPU labels (`features.d/ix-device-plugin`).

Written atomically (a dot-named temporary, fsynced, renamed over the target: NFD skips dot-files) and only when
its text changed, so NFD never reads half a file and is not woken for nothing. Both front ends write this one
file, so the agent that takes over a node replaces the labels of the one before in one step.

Handing over: an agent that stops cleanly does not remove its labels (that would drop them from the node, and
every nodeSelector on them would stop matching, until the next agent writes its own). It retires the file: the
same labels under NFD's `# +expiry-time=` directive, a few minutes ahead. The next agent, of either mode, writes
its own labels over it; if none comes (the agent was uninstalled), NFD drops the labels once they expire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from ix_device_plugin.core.labels import is_valid_label_value
from ix_device_plugin.runtime.files import (
    OutputError,
    current_text,
    remove_file,
    remove_stale_temporaries,
    write_atomically,
    write_if_changed,
)

DEFAULT_FEATURES_DIR = Path("/etc/kubernetes/node-feature-discovery/features.d")
DEFAULT_FEATURE_FILE = "ix-device-plugin"
DMI_PRODUCT_NAME = Path("class/dmi/id/product_name")
EXPIRY_DIRECTIVE = "# +expiry-time="  # NFD's local source ignores the lines after it once the time has passed

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def feature_file_text(labels: Mapping[str, str]) -> str:
    """The NFD local feature file for labels: a comment line, then `name=value` lines in name order."""
    lines = ["# Node labels for Iluvatar GPUs, kept up to date by ix-device-plugin; edits are overwritten."]
    lines.extend(f"{name}={labels[name]}" for name in sorted(labels))
    return "\n".join(lines) + "\n"


def retired_text(text: str, until: datetime) -> str:
    """text with NFD's expiry directive first: the labels hold until `until` (RFC 3339, UTC), then NFD drops them."""
    return f"{EXPIRY_DIRECTIVE}{until.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}\n{text}"


def is_retired(text: str) -> bool:
    """True for a feature file an agent retired at its stop (it carries an expiry time)."""
    return text.startswith(EXPIRY_DIRECTIVE)


def check_label(name: str, value: str) -> None:
    """Raise OutputError unless name is a valid label key and value a valid label value."""
    prefix, _, short = name.rpartition("/")
    if not _LABEL_NAME.match(short) or (prefix and not _LABEL_PREFIX.match(prefix)):
        raise OutputError(f"label {name!r}: not a valid label name")
    if not is_valid_label_value(value):
        raise OutputError(f"label {name!r}: value {value!r} is not a valid label value")


class FeatureFileWriter:
    """Keeps an NFD local feature file (`features.d/<name>`) holding the node labels."""

    def __init__(self, directory: Path = DEFAULT_FEATURES_DIR, name: str = DEFAULT_FEATURE_FILE) -> None:
        if not name or name.startswith(".") or "/" in name:
            raise OutputError(f"feature file name {name!r}: must be non-empty, without '/', not start with '.'")
        self.directory = Path(directory)
        self.path = self.directory / name
        self.written: str | None = None  # the text this writer last put in the file (None: it removed it)
        remove_stale_temporaries(self.directory, name)

    def apply(self, labels: Mapping[str, str]) -> bool:
        """Write labels when they differ from the file; no labels removes it. True when the file changed.

        Raises OutputError naming a bad label or the path.
        """
        if not labels:
            changed = remove_file(self.path)
            self.written = None
            return changed
        for name, value in labels.items():
            check_label(name, value)
        text = feature_file_text(labels)
        changed = write_if_changed(self.path, text)
        self.written = text
        return changed

    def handed_over(self) -> bool:
        """True when this writer's labels are no longer in the file because another agent retired or removed it
        (after this writer last wrote): they are to be written again. A file another live agent wrote is left."""
        if self.written is None:
            return False
        current = current_text(self.path)
        return current != self.written and (current is None or is_retired(current))

    def retire(self, until: datetime) -> bool:
        """Keep this writer's labels in the file until `until`, for the agent that follows (see the module's
        docstring); True when it did. A file another agent has written since is left as it is."""
        if self.written is None or current_text(self.path) != self.written:
            return False
        write_atomically(self.path, retired_text(self.written, until))
        return True

    def remove(self) -> bool:
        """Remove the feature file; True when there was one."""
        return remove_file(self.path)


def read_machine_name(sysfs_root: Path) -> str | None:
    """The machine's DMI product name (`<sysfs_root>/class/dmi/id/product_name`), None when unknown."""
    try:
        raw = (Path(sysfs_root) / DMI_PRODUCT_NAME).read_bytes()
    except OSError:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    return text or None
