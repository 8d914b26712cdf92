"""The reset handshake's document, kept exactly as Iluvatar's plugin and ix-exporter read and write it.

The ConfigMap `ix-gpu-reset-<node>` in the plugin's namespace holds under the key `gpuReset` a YAML
document `{nodename, occupy: {<user>: bool}, reset}`: who uses the GPUs, and whether a reset is under way.
Other processes write it, so it is read with the limits of every such document.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import yaml

from ix_device_plugin.gpureset.outcome import GpuResetError
from ix_device_plugin.settings.documents import DocumentError, Limits, load_yaml

CONFIG_MAP_PREFIX = "ix-gpu-reset-"
DATA_KEY = "gpuReset"
OUR_NAME = "ix-device-plugin"
DOCUMENT_LIMITS = Limits(max_bytes=64 * 1024)  # a few users' names and flags: far below this


@dataclass(frozen=True)
class ResetInfo:
    """The `gpuReset` document: who is using the GPUs (`occupy`) and whether a reset is under way."""

    nodename: str
    reset: bool = False
    occupy: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | None, node: str, where: str = "") -> ResetInfo:
        """The document in text (None or empty: a fresh one); GpuResetError naming where and what is wrong.

        Read with the limits of everything another process writes: bounded size, no anchors or aliases, a
        bounded depth, so that no document can exhaust or crash the plugin.
        """
        if not text or not text.strip():
            return cls(node)
        what = f"{where} key {DATA_KEY}" if where else DATA_KEY
        try:
            document = load_yaml(text.encode("utf-8", "surrogatepass"), DOCUMENT_LIMITS)  # a lone surrogate: not UTF-8
        except DocumentError as error:
            raise GpuResetError(f"{what} is not a reset document: {error}") from None
        if not isinstance(document, dict):
            raise GpuResetError(f"{what} is not a mapping with nodename, reset and occupy")
        occupy = document.get("occupy") or {}
        if not isinstance(occupy, dict) or not all(isinstance(value, bool) for value in occupy.values()):
            raise GpuResetError(f"{what}: occupy must map each IXML user to true or false")
        reset = document.get("reset", False)
        if not isinstance(reset, bool) and reset is not None:
            raise GpuResetError(f"{what}: reset must be true or false, not {reset!r:.40}")
        return cls(str(document.get("nodename") or node), bool(reset), {str(k): v for k, v in occupy.items()})

    def text(self) -> str:
        """The document as upstream writes it (keys in sorted order)."""
        return yaml.safe_dump({"nodename": self.nodename, "occupy": dict(self.occupy), "reset": self.reset})

    def ours(self, *, resetting: bool) -> ResetInfo:
        """This document with our part set: resetting, we let go; otherwise we hold the GPUs."""
        return replace(self, reset=resetting, occupy={**self.occupy, OUR_NAME: not resetting})

    def others(self) -> dict[str, bool]:
        """The other users' entries."""
        return {name: held for name, held in self.occupy.items() if name != OUR_NAME}

    def holding(self) -> list[str]:
        """The other users that still hold the GPUs."""
        return sorted(name for name, held in self.others().items() if held)

    def away(self) -> list[str]:
        """The other users that have let go and not come back."""
        return sorted(name for name, held in self.others().items() if not held)
