"""`ix-device-plugin demo`: the real plugin and a kubelet stand-in, on simulated GPUs, in a temp dir.

It walks through the seed README's examples by editing the config the way the
kubelet updates a mounted ConfigMap (a `..data` symlink swap), so what it shows
is live reload as much as planning.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ix_device_plugin import __version__
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.runtime.logs import setup as setup_logging
from ix_device_plugin.settings.configfile import CONFIG_KEY, parse_text
from ix_device_plugin.settings.options import Options
from ix_device_plugin.settings.resolve import Resolved, config_from
from ix_device_plugin.standins.kubelet import KubeletStandIn

SCENARIOS: tuple[tuple[str, str], ...] = (
    ("one GPU per board (the default)", "flags:\n  splitboard: false\n"),
    ("split every board into its chips", "flags:\n  splitboard: true\n"),
    (
        "time-slicing, 4 replicas per GPU",
        "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4\n",
    ),
)


class ConfigMapDir:
    """A directory laid out as the kubelet mounts a ConfigMap: `key -> ..data/key`, `..data -> ..<n>`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        """The file the plugin reads."""
        return self.root / CONFIG_KEY

    def write(self, content: str | bytes) -> None:
        """Publish content atomically, as the kubelet does: new dir, new symlink, rename over ..data."""
        self.generation += 1
        version = self.root / f"..{self.generation}"
        version.mkdir()
        data = content.encode() if isinstance(content, str) else content
        (version / CONFIG_KEY).write_bytes(data)
        staging = self.root / "..data_tmp"
        staging.unlink(missing_ok=True)
        staging.symlink_to(version.name)
        os.replace(staging, self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to(f"..data/{CONFIG_KEY}")


def run_demo(settings: Resolved, output: str | None) -> int:
    """Run the demo with the demo's settings; prints what `kubectl describe node` and a pod would see."""
    if settings["log_level"] == "info":
        setup_logging("warning", settings["log_format"])
    return asyncio.run(_demo(settings, output != "json"))


async def _demo(settings: Resolved, text_output: bool) -> int:
    spec = settings["simulated_devices"]
    config_file = settings["config"]
    with tempfile.TemporaryDirectory(prefix="ix-demo-") as tmp:
        root = Path(tmp)
        plugin_dir = root / "device-plugins"
        configmap = ConfigMapDir(root / "ixconfig")
        try:
            scenarios = SCENARIOS if config_file is None else (("your configuration", config_file.read_text()),)
        except (OSError, UnicodeDecodeError) as error:
            print(f"demo: cannot read --config {config_file}: {error}", file=sys.stderr)
            return 1
        configmap.write(scenarios[0][1])
        options = Options(
            backend="simulated",
            simulated_devices=spec,
            plugin_dir=plugin_dir,
            config_path=configmap.path,
            config_required=True,
            ignored_health_errors=settings["disabled_healthchecks"],
            health_address="off",
            dev_root=root,
        )
        kubelet = KubeletStandIn(plugin_dir)
        await kubelet.start()
        daemon = Daemon(options)
        runner = asyncio.create_task(daemon.run())
        results: list[dict[str, Any]] = []
        if text_output:
            print(f"ix-device-plugin {__version__} demo: simulated {spec}, kubelet stand-in on {plugin_dir}")
        try:
            for index, (title, text) in enumerate(scenarios):
                if index:
                    configmap.write(text)
                result = await _scenario(kubelet, daemon, runner, title, text)
                results.append(result)
                if text_output:
                    _print_scenario(result)
        except (TimeoutError, _PluginStopped) as error:
            print(f"demo failed: {error or 'the plugin did not reach the expected state in time'}", file=sys.stderr)
        finally:
            daemon.stop()
            exit_code = await runner
            await kubelet.stop()
    if not text_output:
        print(json.dumps({"version": __version__, "devices": spec, "scenarios": results}, indent=2))
    return exit_code


class _PluginStopped(Exception):
    """The plugin stopped before the demo was done (its log says why)."""


async def _scenario(
    kubelet: KubeletStandIn, daemon: Daemon, runner: asyncio.Task[int], title: str, config_text: str
) -> dict[str, Any]:
    wanted = config_from(parse_text(config_text, title), {}, daemon.options.ignored_health_errors)

    def reached() -> bool:
        if runner.done():
            raise _PluginStopped("the plugin stopped (see the log above)")
        return daemon.config == wanted and daemon.registered and _kubelet_agrees(kubelet, daemon)

    await _until(reached)
    resource = daemon.plan.resource_name
    view = kubelet.resources[resource]
    container = await kubelet.admit(resource, 1)
    return {
        "title": title,
        "config": config_text,
        "resource": resource,
        "capacity": view.capacity,
        "allocatable": view.allocatable,
        "devices": sorted(view.devices),
        "allocation": {
            "devices": [spec.host_path for spec in container.devices],
            "envs": dict(sorted(container.envs.items())),
        },
    }


def _kubelet_agrees(kubelet: KubeletStandIn, daemon: Daemon) -> bool:
    view = kubelet.resources.get(daemon.plan.resource_name)
    return view is not None and view.connected and sorted(view.devices) == sorted(d.id for d in daemon.plan.devices)


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def _print_scenario(result: dict[str, Any]) -> None:
    print(f"\n== {result['title']} ==")
    print("ix-config:")
    print("".join(f"  {line}\n" for line in result["config"].splitlines()), end="")
    print("$ kubectl describe node")
    print(f"Capacity:\n  {result['resource']}: {result['capacity']}")
    print(f"Allocatable:\n  {result['resource']}: {result['allocatable']}")
    print(f"A pod with `limits: {{{result['resource']}: 1}}` gets:")
    for node in result["allocation"]["devices"]:
        print(f"  device {node} (rw)")
    for name, value in result["allocation"]["envs"].items():
        print(f"  env {name}={value}")
