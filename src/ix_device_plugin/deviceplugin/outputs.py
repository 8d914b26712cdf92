"""Files the plugin keeps on the host for others to read: the CDI spec and the NFD feature file.

Thin shells over the pure `cdi` and `labels` modules. Every write is atomic (a temporary file in the same
directory, fsynced, then renamed over the target), and happens only when the content changed, so readers
(container runtimes, the NFD worker) never see a partial file and are not woken for nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ix_device_plugin.core.cdi import CDI_CLASS, CDI_VENDOR, build_spec, spec_text
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import is_valid_label_value
from ix_device_plugin.runtime.files import OutputError, reason, remove_stale_temporaries, write_atomically
from ix_device_plugin.settings.documents import DocumentError, read_file

DEFAULT_CDI_DIR = Path("/var/run/cdi")
# The CDI library's GenerateSpecName: <vendor>-<class>, plus the encoding's extension (as ix-ctk writes it).
CDI_SPEC_FILE = f"{CDI_VENDOR}-{CDI_CLASS}.yaml"
DEFAULT_FEATURES_DIR = Path("/etc/kubernetes/node-feature-discovery/features.d")
DEFAULT_FEATURE_FILE = "ix-device-plugin"
DMI_PRODUCT_NAME = Path("class/dmi/id/product_name")

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


CURRENT_LIMIT = 4 * 1024 * 1024  # what we write is far smaller; anything larger is not ours and gets replaced


def _current_text(path: Path) -> str | None:
    """The file's text when it is a regular file we may have written; None for anything else (replaced).

    Read without following a symlink or blocking: a FIFO or a link to /dev/zero at the path never hangs us.
    """
    try:
        return read_file(path, CURRENT_LIMIT, follow_symlinks=False).decode("utf-8")
    except (OSError, UnicodeDecodeError, DocumentError):
        return None


def _write_if_changed(path: Path, text: str) -> bool:
    if _current_text(path) == text:
        return False
    write_atomically(path, text)
    return True


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"cannot remove {path}: {reason(exc)}") from exc
    return True


def cdi_spec_text(inventory: Inventory, dev_root: Path) -> str:
    """The CDI spec file's text for inventory; raises OutputError when no chip can be described."""
    result = build_spec(inventory, dev_root)
    if result.empty:
        reasons = "; ".join(result.warnings) or "the node has no chips"
        raise OutputError(f"no CDI spec: a spec needs at least one device, and none could be described ({reasons})")
    return spec_text(result.document)


class CdiSpecWriter:
    """Keeps `<directory>/iluvatar.com-gpu.yaml` describing the node's chips; the file outlives the plugin."""

    def __init__(self, directory: Path = DEFAULT_CDI_DIR, dev_root: Path = Path("/")) -> None:
        self.directory = Path(directory)
        self.dev_root = Path(dev_root)
        self.path = self.directory / CDI_SPEC_FILE
        self.warnings: tuple[str, ...] = ()
        remove_stale_temporaries(self.directory, CDI_SPEC_FILE)  # a kill -9 mid-write left one behind

    def apply(self, inventory: Inventory) -> bool:
        """Write the spec for inventory when it differs from the file; True when the file changed.

        With no chip to describe the file is removed (CDI rejects a spec without devices). The chips left
        out, and why, are in `warnings` afterwards. Raises OutputError naming the path.
        """
        result = build_spec(inventory, self.dev_root)
        self.warnings = result.warnings
        if result.empty:
            return _remove(self.path)
        return _write_if_changed(self.path, spec_text(result.document))


def cdi_generate(inventory: Inventory, dev_root: Path, output: Path | None = None) -> str:
    """The CDI spec text for inventory, also written atomically to output when given; raises OutputError."""
    text = cdi_spec_text(inventory, dev_root)
    if output is not None:
        write_atomically(Path(output), text)
    return text


def feature_file_text(labels: Mapping[str, str]) -> str:
    """The NFD local feature file for labels: a comment line, then `name=value` lines in name order."""
    lines = ["# Node labels for Iluvatar GPUs, kept up to date by ix-device-plugin; edits are overwritten."]
    lines.extend(f"{name}={labels[name]}" for name in sorted(labels))
    return "\n".join(lines) + "\n"


def check_label(name: str, value: str) -> None:
    """Raise OutputError unless name is a valid label key and value a valid label value."""
    prefix, _, short = name.rpartition("/")
    if not _LABEL_NAME.match(short) or (prefix and not _LABEL_PREFIX.match(prefix)):
        raise OutputError(f"label {name!r}: not a valid label name")
    if not is_valid_label_value(value):
        raise OutputError(f"label {name!r}: value {value!r} is not a valid label value")


class FeatureFileWriter:
    """Keeps an NFD local feature file (`features.d/<name>`) holding the plugin's node labels."""

    def __init__(self, directory: Path = DEFAULT_FEATURES_DIR, name: str = DEFAULT_FEATURE_FILE) -> None:
        if not name or name.startswith(".") or "/" in name:
            raise OutputError(f"feature file name {name!r}: must be non-empty, without '/', not start with '.'")
        self.directory = Path(directory)
        self.path = self.directory / name
        remove_stale_temporaries(self.directory, name)

    def apply(self, labels: Mapping[str, str]) -> bool:
        """Write labels when they differ from the file; no labels removes it. True when the file changed.

        Raises OutputError naming a bad label or the path.
        """
        if not labels:
            return _remove(self.path)
        for name, value in labels.items():
            check_label(name, value)
        return _write_if_changed(self.path, feature_file_text(labels))

    def remove(self) -> bool:
        """Remove the feature file (clean shutdown); True when there was one."""
        return _remove(self.path)


def read_machine_name(sysfs_root: Path) -> str | None:
    """The machine's DMI product name (`<sysfs_root>/class/dmi/id/product_name`), None when unknown."""
    try:
        raw = (Path(sysfs_root) / DMI_PRODUCT_NAME).read_bytes()
    except OSError:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    return text or None
