"""The CDI spec the plugin keeps on the host for container runtimes.

A thin shell over the pure `cdi` module. Every write is atomic (a temporary file in the same directory,
fsynced, then renamed over the target), and happens only when the content changed, so container runtimes
never see a partial file and are not woken for nothing. The node labels are a node service
(`nodelabels/`).
"""

from __future__ import annotations

from pathlib import Path

from ix_device_plugin.core.cdi import CDI_CLASS, CDI_VENDOR, build_spec, spec_text
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.runtime.files import (
    OutputError,
    remove_file,
    remove_stale_temporaries,
    write_atomically,
    write_if_changed,
)

DEFAULT_CDI_DIR = Path("/var/run/cdi")
# The CDI library's GenerateSpecName: <vendor>-<class>, plus the encoding's extension (as ix-ctk writes it).
CDI_SPEC_FILE = f"{CDI_VENDOR}-{CDI_CLASS}.yaml"

__all__ = ["CDI_SPEC_FILE", "DEFAULT_CDI_DIR", "CdiSpecWriter", "OutputError", "cdi_generate", "cdi_spec_text"]


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
            return remove_file(self.path)
        return write_if_changed(self.path, spec_text(result.document))


def cdi_generate(inventory: Inventory, dev_root: Path, output: Path | None = None) -> str:
    """The CDI spec text for inventory, also written atomically to output when given; raises OutputError."""
    text = cdi_spec_text(inventory, dev_root)
    if output is not None:
        write_atomically(Path(output), text)
    return text
