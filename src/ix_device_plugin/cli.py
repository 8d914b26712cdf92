"""Command line: `ix-device-plugin [run|list|demo|check-config|cdi generate|dra|reset-helper|template]`.

Parse the command line once, resolve the mode's settings once (flags, environment, defaults), then hand
the result to the command. Bad flags and variables exit 2 before anything starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ix_device_plugin import __version__
from ix_device_plugin.apiserver.settings import KubeConfigError, KubeSettings, settings_from
from ix_device_plugin.runtime import earlystop
from ix_device_plugin.runtime.logs import setup as setup_logging
from ix_device_plugin.runtime.memory import limit_malloc_arenas
from ix_device_plugin.settings.argv import CHECK_CONFIG, TEMPLATE, Command, parse_command_line
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import (
    DraOptions,
    Options,
    dra_options_from,
    load_config,
    node_options_from,
    options_from,
)
from ix_device_plugin.settings.resolve import Resolved, resolve
from ix_device_plugin.settings.table import CDI_GENERATE, DEMO, DRA, LIST, LIST_DRA, RESET_HELPER, RUN

log = logging.getLogger("ix_device_plugin")
USAGE_ERROR = 2  # as argparse exits for a bad flag
Start = Callable[[], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    env = dict(os.environ)
    command = parse_command_line(sys.argv[1:] if argv is None else argv, __version__)
    if command.mode in {RUN, DRA, RESET_HELPER}:
        earlystop.catch()  # (again: main() called without entry.py) a SIGTERM while starting is not lost
    else:
        earlystop.release()
    if command.mode == CHECK_CONFIG:
        from ix_device_plugin.tools.checkconfig import check_config

        assert command.path is not None
        return check_config(command.path, command.strict)
    if command.mode == TEMPLATE:
        from ix_device_plugin.tools.nodetemplate import template_command

        return template_command(command.arguments, command.output)
    try:
        settings = resolve(command.mode, command.flags, env, command.upstream)
        start = _PREPARE[command.mode](command, settings, env)
    except SettingsError as error:
        for message in error.messages:
            print(f"ix-device-plugin {command.mode}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    setup_logging(settings["log_level"], settings["log_format"])
    if (note := settings.note()) is not None:
        log.log(logging.WARNING if command.mode in {RUN, DRA, RESET_HELPER} else logging.INFO, "%s", note)
    for conflict in settings.conflicts:
        log.warning("%s", conflict)
    return start()


# ---- each mode: check what it was given, then start ---------------------------------------------


def _run(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    options = options_from(settings)
    kube = api_access(settings, env, "--per-node-config" if options.per_node_config else None)
    return lambda: run_device_plugin(options, kube)


def _list(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    from ix_device_plugin.tools.listing import list_command

    options = options_from(settings)
    kube = api_access(settings, env, "--per-node-config" if options.per_node_config else None)
    return lambda: list_command(options, kube, command.output)


def _cdi_generate(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    from ix_device_plugin.tools.cdigen import cdi_generate_command

    options = node_options_from(settings)
    return lambda: cdi_generate_command(options, command.output)


def _demo(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    from ix_device_plugin.tools.demo import run_demo

    return lambda: run_demo(settings, command.output)


def _dra(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    options = dra_options_from(settings)
    kube = api_access(settings, env, "dra")
    assert kube is not None
    return lambda: run_dra_driver(options, kube)


def _list_dra(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    from ix_device_plugin.tools.dralist import dra_list_command

    options = dra_options_from(settings)
    return lambda: dra_list_command(options, command.output)


def _reset_helper(command: Command, settings: Resolved, env: Mapping[str, str]) -> Start:
    from ix_device_plugin.resethelper.command import helper_options_from, run_reset_helper

    options = helper_options_from(settings)
    return lambda: run_reset_helper(options, run_until_done)


_PREPARE: dict[str, Callable[[Command, Resolved, Mapping[str, str]], Start]] = {
    RUN: _run,
    LIST: _list,
    CDI_GENERATE: _cdi_generate,
    DEMO: _demo,
    DRA: _dra,
    LIST_DRA: _list_dra,
    RESET_HELPER: _reset_helper,
}


def api_access(settings: Resolved, env: Mapping[str, str], needs: str | None) -> KubeSettings | None:
    """How to reach the API server: required (SettingsError saying what is missing) when needs names what
    needs it; else when at hand (flags.reset_gpu and flags.usevolcano, which a live config change can turn
    on, use it then), or None."""
    node = settings.values.get("node_name") or ""
    try:
        return settings_from({**env, "NODE_NAME": node}, settings.flag("kubeconfig"), needs or "the API features")
    except KubeConfigError as error:
        if needs is None:
            return None
        raise SettingsError([str(error)]) from None


# ---- the daemons ------------------------------------------------------------------------------


def run_device_plugin(options: Options, kube: KubeSettings | None) -> int:
    """Run the device plugin until SIGTERM or SIGINT."""
    from ix_device_plugin.deviceplugin.daemon import Daemon

    log.info("ix-device-plugin %s starting (backend %s)", __version__, options.backend)

    async def serve() -> int:
        daemon = Daemon(options, kube=kube)
        daemon.install_signal_handlers()
        return await daemon.run()

    return run_until_done(serve())


def run_dra_driver(options: DraOptions, kube: KubeSettings) -> int:
    """Read the config file, then run the DRA driver until SIGTERM or SIGINT."""
    from ix_device_plugin.dra.driver import run_dra

    try:
        config, warnings = load_config(options.base)
    except SettingsError as error:
        for message in error.messages:
            log.error("%s", message)
        return 1
    for warning in warnings:
        log.warning("%s", warning)
    log.info("ix-device-plugin %s starting in DRA mode (driver gpu.iluvatar.com, node %s)", __version__, kube.node_name)
    return run_dra(replace(options, config=config), kube, run_until_done)


def run_until_done(main: Coroutine[Any, Any, int]) -> int:
    """Run main on a new event loop; tasks it abandoned get a short grace, nothing waits on worker threads."""
    limit_malloc_arenas()  # before the service's threads start
    loop = asyncio.new_event_loop()
    try:
        code = loop.run_until_complete(main)
        leftover = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.wait(leftover, timeout=0.2))
        return code
    finally:
        loop.close()
