"""Shared fixtures: short socket directories, a kubelet stand-in, and in-process daemons."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.host_tools import missing
from hypothesis import settings

from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.runtime.logs import LIBRARIES
from ix_device_plugin.settings.options import Options
from ix_device_plugin.standins.kubelet import KubeletStandIn

# Moderate by default so the suite stays quick; HYPOTHESIS_PROFILE=full runs 10,000 examples per test.
settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile("full", max_examples=10_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

IXML_DOUBLE_SOURCE = Path(__file__).parent / "ixml_double" / "libixml_double.c"
# Builds of the libixml.so test double: the full library, an old driver's (no _v2/_v3 names,
# no ixml* extensions), one without the topology call, and libupnp's unrelated libixml.so.
IXML_VARIANTS = {
    "full": [],
    "old": ["-DNO_VERSIONED_NAMES", "-DNO_IXML_EXTENSIONS"],
    "no_topology": ["-DNO_TOPOLOGY"],
    "no_telemetry": ["-DNO_TELEMETRY"],
    "no_events": ["-DNO_EVENTS"],
    "upnp": ["-DLIBUPNP_LIKE"],
}


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Each test starts from the same logging set-up: a test that runs the CLI in-process (which replaces
    the root handlers and sets levels) must not change what the next test on that worker captures."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in LIBRARIES}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in libraries.items():
        logging.getLogger(name).setLevel(library_level)


@pytest.fixture(scope="session")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The libixml.so test double, compiled with gcc in every variant."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        missing("no C compiler (gcc or cc) to build the libixml.so test double: apt-get install gcc")
    out = tmp_path_factory.mktemp("ixml_double")
    built: dict[str, Path] = {}
    for variant, flags in IXML_VARIANTS.items():
        target = out / variant / "libixml.so"
        target.parent.mkdir()
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-Wall", *flags, "-o", str(target), str(IXML_DOUBLE_SOURCE)],
            check=True,
        )
        built[variant] = target
    return built


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ixdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin_dir(short_dir: Path) -> Path:
    path = short_dir / "device-plugins"
    path.mkdir()
    return path


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletStandIn]:
    standin = KubeletStandIn(plugin_dir)
    await standin.start()
    yield standin
    await standin.stop()


@pytest.fixture
async def start_daemon(plugin_dir: Path, short_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start an in-process daemon on simulated devices; stopped at teardown."""
    daemons: list[Daemon] = []

    async def start(devices: str = "BI-V150:2", **overrides: Any) -> Daemon:
        """A started daemon; overrides are Options fields, or the Daemon's backend_factory, kube and healing_rules."""
        factory = overrides.pop("backend_factory", lambda: SimulatedBackend(devices))
        kube = overrides.pop("kube", None)
        rules = overrides.pop("healing_rules", None)
        options = Options(
            plugin_dir=plugin_dir,
            config_path=short_dir / "no-config",
            dev_root=short_dir,
            health_interval=0.2,
            health_address="off",
            poll_interval=0.2,
            kubelet_plugins_directory_path=short_dir / "plugins",
        )
        daemon = Daemon(replace(options, **overrides), backend_factory=factory, kube=kube, healing_rules=rules)
        await daemon.start()
        daemons.append(daemon)
        return daemon

    yield start
    for daemon in daemons:
        await daemon.shutdown()


_KINDS = ("unit", "component", "system")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its kind, the folder it lives in: tests/unit, tests/component or tests/system."""
    tests_dir = Path(__file__).parent
    for item in items:
        parts = Path(item.fspath).relative_to(tests_dir).parts
        if parts and parts[0] in _KINDS:
            item.add_marker(getattr(pytest.mark, parts[0]))
