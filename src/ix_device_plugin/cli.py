"""Command line: `ix-device-plugin [run|list|demo|check-config]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from ix_device_plugin import __version__
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ChipSample, PodRef
from ix_device_plugin.deviceplugin.loop import Daemon
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.runtime.logs import setup as setup_logging
from ix_device_plugin.runtime.memory import limit_malloc_arenas
from ix_device_plugin.settings.config import CONFIG_KEY, ConfigError, load_document, read_bounded, resolve
from ix_device_plugin.settings.options import (
    NODE_CONFIG_LABEL,
    DraOptions,
    Options,
    OptionsError,
    config_file_for,
    load_config,
    options_from,
    parse_args,
    resolve_options,
)
from ix_device_plugin.settings.yamlsafe import MAX_BYTES

log = logging.getLogger("ix_device_plugin")
USAGE_ERROR = 2  # as argparse exits for a bad flag


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    env = dict(os.environ)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "check-config":
        return check_config(args.path)
    try:
        args = resolve_options(args, env)
        options = None if args.command == "demo" else options_from(args, env)
    except OptionsError as error:
        for message in error.messages:
            print(f"ix-device-plugin {args.command}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    setup_logging(args.log_level, args.log_format)
    if args.command == "demo":
        from ix_device_plugin.tools.demo import run_demo

        return run_demo(args, env)
    assert options is not None
    if args.command == "dra" or (args.command == "list" and args.dra):
        return dra_command(args, options, env)
    if args.command == "list":
        return list_command(args, options)
    if args.command == "cdi":
        return cdi_generate_command(args, options)
    return run_command(args, options)


def run_command(args: argparse.Namespace, options: Options) -> int:
    """Run the daemon until SIGTERM or SIGINT."""
    log.info("ix-device-plugin %s starting (backend %s)", __version__, args.backend)

    async def serve() -> int:
        daemon = Daemon(options)
        daemon.install_signal_handlers()
        return await daemon.run()

    return run_until_done(serve())


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


def check_config(path: str) -> int:
    """Validate a config file, a ConfigMap manifest (every data key) or `-` (stdin); print every problem."""
    origin = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read(MAX_BYTES + 1) if path == "-" else read_bounded(path)
        configs = load_document(data, origin)
        for config in configs.values():
            resolve(config, {}, {})  # settings that are each valid but not together
    except ConfigError as error:
        for message in error.messages:
            print(message, file=sys.stderr)
        print(f"{origin}: invalid", file=sys.stderr)
        return 1
    for config in configs.values():
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    keys = "" if list(configs) == [CONFIG_KEY] and configs[CONFIG_KEY].path == origin else f" ({', '.join(configs)})"
    print(f"{origin}: valid{keys}")
    return 0


def discover_once(options: Options) -> Inventory:
    """The node's inventory, with its control nodes, from one discovery; raises BackendError."""
    backend = options.backend_factory()
    try:
        return with_control_nodes(backend.discover(), options.dev_root)
    finally:
        backend.close()


def discover_and_sample(options: Options) -> tuple[Inventory, dict[str, ChipSample]]:
    """One discovery and one telemetry pass in the same library session; raises BackendError."""
    backend = options.backend_factory()
    try:
        inventory = with_control_nodes(backend.discover(), options.dev_root)
        return inventory, backend.sample(inventory)
    finally:
        backend.close()


def _pod_allocations(options: Options, resource_name: str) -> tuple[dict[str, PodRef] | None, str]:
    """Device ID -> the container holding it, from the kubelet's pod-resources socket; (None, why) without."""
    from ix_device_plugin.kubelet.podresources import PodResourcesError, list_allocations

    socket_path = options.pod_resources_socket
    if socket_path is None:
        return None, "pod-resources socket turned off"
    if not socket_path.exists():
        return None, f"{socket_path} does not exist (not a Kubernetes node, or not mounted)"
    try:
        return asyncio.run(list_allocations(socket_path, {resource_name}, timeout=5.0)), str(socket_path)
    except PodResourcesError as error:
        return None, str(error)


def _print_error(args: argparse.Namespace, error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    if isinstance(error, BackendError) and args.backend == "ixml":
        print("hint: on a machine without Iluvatar GPUs, try --backend simulated", file=sys.stderr)
    return 1


def cdi_generate_command(args: argparse.Namespace, options: Options) -> int:
    """Print or write the CDI spec for the node's chips."""
    from ix_device_plugin.deviceplugin.outputs import OutputError, cdi_generate

    try:
        text = cdi_generate(discover_once(options), options.dev_root, Path(args.output) if args.output else None)
    except (BackendError, OutputError) as error:
        return _print_error(args, error)
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def list_command(args: argparse.Namespace, options: Options) -> int:
    """Print the inventory and the devices the kubelet would be told about."""
    from ix_device_plugin.tools.listing import add_live_figures, inventory_report, render_text

    path, reason = config_file_for(options, _node_label_once(options))
    try:
        config, warnings = load_config(options, path)
        inventory, samples = discover_and_sample(options)
    except (ConfigError, BackendError) as error:
        return _print_error(args, error)
    report = {"config_file": reason, **inventory_report(inventory, config, options)}
    add_live_figures(report, samples, _pod_allocations(options, report["resource_name"]))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(f"Configuration from: {reason}\n{render_text(report)}")
    return 0


def _node_label_once(options: Options) -> str | None:
    """The node's configuration label as the API server has it now (with --per-node-config), else None."""
    if not options.per_node_config or options.kube is None:
        return None
    from ix_device_plugin.apiserver.client import KubeConfigError, KubeError, connect

    async def read() -> str | None:
        kube = await connect(settings)
        try:
            return (await kube.get_node(settings.node_name)).get(NODE_CONFIG_LABEL)
        finally:
            await kube.close()

    settings = options.kube
    try:
        return asyncio.run(read())
    except (KubeConfigError, KubeError) as error:
        print(f"warning: cannot read node label {NODE_CONFIG_LABEL}: {error}", file=sys.stderr)
        return None


def dra_command(args: argparse.Namespace, options: Options, env: dict[str, str]) -> int:
    """`dra` (run the DRA kubelet plugin) and `list --dra`; bad DRA options exit 2."""
    from ix_device_plugin.settings.options import dra_options_from

    try:
        if args.command == "list":  # no API server needed: a placeholder node when none is named
            node = args.node_name or options.node_name
            dra = DraOptions(
                options,
                node,
                None,
                Path(args.kubelet_registrar_directory_path),
                Path(args.kubelet_plugins_directory_path),
            )
        else:
            dra = dra_options_from(args, env, options)
    except OptionsError as error:
        for message in error.messages:
            print(f"ix-device-plugin {args.command}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    if args.command == "list":
        return dra_list_command(args, dra)
    from ix_device_plugin.dra.driver import run_dra

    log.info("ix-device-plugin %s starting in DRA mode (driver gpu.iluvatar.com, node %s)", __version__, dra.node_name)
    return run_dra(dra, run_until_done)


def dra_list_command(args: argparse.Namespace, options: DraOptions) -> int:
    """Print the devices the node's ResourceSlice would hold and the prepared claims of the checkpoint."""
    from ix_device_plugin.dra.claims import CheckpointError
    from ix_device_plugin.dra.driver import pcie_roots, read_checkpoint
    from ix_device_plugin.dra.slices import slice_content, slice_devices, slice_name

    try:
        inventory = discover_once(options.base)
        claims = read_checkpoint(options)
    except (BackendError, CheckpointError) as error:
        return _print_error(args, error)
    content = slice_content(inventory)
    report = {
        "resourceSlice": slice_name(options.node_name),
        "devices": slice_devices(content, pcie_roots(inventory, options.base.sysfs_root), taints=True),
        "warnings": list(content.warnings),
        "preparedClaims": {
            uid: {"claim": f"{c.ref.namespace}/{c.ref.name}", "devices": [d.device for d in c.devices]}
            for uid, c in claims.items()
        },
    }
    if args.output == "json":
        print(json.dumps(report, indent=2))
        return 0
    print(f"ResourceSlice {report['resourceSlice']} (driver gpu.iluvatar.com, pool {options.node_name}):")
    for device in report["devices"]:
        attributes = device["attributes"]
        taint = " UNHEALTHY (tainted)" if device.get("taints") else ""
        print(f"  {device['name']}: {attributes['uuid']['string']} board {attributes['boardUUID']['string']}{taint}")
    for warning in content.warnings:
        print(f"  warning: {warning}")
    print(f"Prepared claims ({len(claims)}):")
    for uid, claim in sorted(claims.items()):
        print(f"  {claim.ref.namespace}/{claim.ref.name} ({uid}): {', '.join(d.device for d in claim.devices)}")
    return 0
