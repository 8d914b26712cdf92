"""Where the device plugin's configuration comes from: the ix-config file, or the ConfigMap key a node label names.

`ConfigSource` knows which file is in force and why, tells whether it changed since it was last read, and reads
it. With --per-node-config it follows the node label `iluvatar.com/device-plugin.config` through the API server
(as an input of the reconcile loop: each value is handed to `label_seen`'s callback).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import Options, config_file_for, load_config
from ix_device_plugin.settings.table import NODE_CONFIG_LABEL
from ix_device_plugin.settings.yamlsafe import MAX_BYTES

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.apiserver.nodelabel import AlsoFollowed

log = logging.getLogger(__name__)


class ConfigSource:
    """The config file in force (per the node label when asked), and whether it changed since it was read."""

    def __init__(self, options: Options, api: ApiConnection | None = None) -> None:
        self.options = options
        self.api = api
        self.label: str | None = None  # the node's configuration label, with --per-node-config
        self.path, self.reason = config_file_for(options, None)
        self._seen: bytes | None = None
        self._warned: frozenset[str] = frozenset()

    def load(self) -> Config:
        """Read the file in force, logging its warnings (one the last reading logged is not logged again);
        raises SettingsError."""
        self._seen = _read_bytes(self.path)
        config, warnings = load_config(self.options, self.path)
        for warning in dict.fromkeys(warnings):
            if warning not in self._warned:
                log.warning("%s", warning)
        self._warned = frozenset(warnings)
        return config

    def load_at_start(self) -> Config:
        """load(); when the file a node label picked is invalid, say so and start with ix-config instead.

        A broken named configuration must not crash-loop the plugin; its fix is picked up live. SettingsError
        only when ix-config itself is invalid.
        """
        try:
            return self.load()
        except SettingsError as error:
            if self.path == self.options.config_path:
                raise
            for line in error.messages:
                log.error("%s", line)
            log.error("%s is invalid; starting with %s until it is fixed", self.reason, self.options.config_path)
            self.path, self.reason = self.options.config_path, f"{self.options.config_path} (fallback)"
            return self.load()

    def label_seen(self, value: str | None) -> None:
        """The node's configuration label now (None: not set); changed() then tells whether another file is in
        force."""
        self.label = value

    def changed(self) -> bool:
        """True when the file in force is another one now (the label moved), or its bytes changed since load()."""
        path, self.reason = config_file_for(self.options, self.label)
        if path != self.path:
            log.info("configuration now from %s", self.reason)
            self.path = path
            return True
        return _read_bytes(path) != self._seen

    async def follow_label(
        self,
        spawn: Callable[..., None],
        put: Callable[[str | None], None],
        also: AlsoFollowed | None = None,
    ) -> None:
        """Start following the node label (put gets each value); wait briefly for its first value. also: what
        else is followed on the Node by the same watch (see NodeLabelWatcher)."""
        first: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

        def seen(value: str | None) -> None:
            if not first.done():
                first.set_result(value)
            put(value)

        spawn("node-label", lambda: self._watch_label(seen, also))
        try:
            async with asyncio.timeout(self.options.label_wait):
                self.label = await asyncio.shield(first)
        except TimeoutError:
            log.warning(
                "no answer about node label %s within %gs; starting with %s",
                NODE_CONFIG_LABEL,
                self.options.label_wait,
                self.options.config_path,
            )
        self.path, self.reason = config_file_for(self.options, self.label)
        log.info("configuration from %s", self.reason)

    async def _watch_label(self, put: Callable[[str | None], None], also: AlsoFollowed | None) -> None:
        from ix_device_plugin.apiserver.nodelabel import NodeLabelWatcher

        assert self.api is not None
        await NodeLabelWatcher(self.api, NODE_CONFIG_LABEL, also).run(put)


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, at most one more than a ConfigMap can hold (enough to tell it changed)."""
    try:
        with path.open("rb") as stream:
            return stream.read(MAX_BYTES + 1)
    except OSError:
        return None
