"""`ix-device-plugin reset-helper`: its options from the resolved settings, and its life from start to exit code.

SIGTERM and SIGINT stop it (a running ixsmi may end within the server's STOP_GRACE, then it is killed) with exit
code 0; a SIGTERM that came while it started (kept by runtime/earlystop.py) stops it as soon as it listens. A socket
it cannot make is exit code 1, naming the path and why.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.hardware.open import backend_factory
from ix_device_plugin.hardware.resetaccess import reset_drivers_dir
from ix_device_plugin.resethelper.listener import ListenError, listen, remove
from ix_device_plugin.resethelper.server import HelperConfig, ResetHelper
from ix_device_plugin.runtime import earlystop
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import NodeOptions, node_options_from
from ix_device_plugin.settings.resolve import Resolved

log = logging.getLogger(__name__)
Runner = Callable[[Coroutine[Any, Any, int]], int]


@dataclass(frozen=True)
class HelperOptions:
    """The helper's settings: the backend (to enumerate the node's chips), ixsmi, the socket and the rate limit."""

    node: NodeOptions
    socket_path: Path
    max_resets_per_minute: int

    def config(self) -> HelperConfig:
        return HelperConfig(
            backend_factory=backend_factory(self.node),
            drivers_dir=reset_drivers_dir(self.node),
            ixsmi_path=self.node.ixsmi_path,
            reset_timeout=self.node.reset_timeout,
            max_resets_per_minute=self.max_resets_per_minute,
        )


def helper_options_from(resolved: Resolved) -> HelperOptions:
    """The helper's options; SettingsError when the socket is not given (its default names one)."""
    socket_path = resolved["reset_helper_socket"]
    if socket_path is None:
        raise SettingsError(["reset-helper needs a socket: give --reset-helper-socket or IX_RESET_HELPER_SOCKET"])
    return HelperOptions(node_options_from(resolved), socket_path, resolved["max_resets_per_minute"])


def run_reset_helper(options: HelperOptions, run: Runner) -> int:
    """Listen on the socket and serve until SIGTERM or SIGINT; run is the event-loop runner (cli.run_until_done)."""
    try:
        listening, inode = listen(options.socket_path)
    except ListenError as error:
        log.error("%s", error)
        return 1
    log.info("reset helper on %s (backend %s, %s)", options.socket_path, options.node.backend, options.node.ixsmi_path)
    try:
        return run(_serve(options.config(), listening))
    finally:
        remove(options.socket_path, inode)
        listening.close()


async def _serve(config: HelperConfig, listening: Any) -> int:
    helper = ResetHelper(config, listening)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, helper.stop)
    if earlystop.caught():
        helper.stop()
    return await helper.serve()
