"""The GPU reset's end-to-end helpers: the node's chips, a fake ixsmi, ix-exporter's side of the handshake; and
self-healing's: fast healing rules and the Node Events it writes."""

from __future__ import annotations

import asyncio
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from helpers.support import DaemonFactory, config_flags
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.gpureset.sequence import DATA_KEY, OUR_NAME, ResetInfo, ResetSettings
from ix_device_plugin.hardware.backend import Backend
from ix_device_plugin.hardware.ixml.reset import run_ixsmi_reset
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.healing.events import EVENT_NAMESPACE
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "gpu-node-1"
NAMESPACE = "kube-system"
CONFIG_MAP = f"ix-gpu-reset-{NODE}"
EXPORTER = "ix-exporter"
CHIP_A, CHIP_B = "GPU-aaaa0000-0000-0000-0000-000000000001", "GPU-bbbb0000-0000-0000-0000-000000000002"
FAST = ResetSettings(wait_timeout=2.0, command_timeout=5.0)
FAST_HEALING = Rules(attempts=3, backoff=0.2, backoff_cap=1.0, refused_wait=0.5, settle=0.2)


def devices_file(path: Path, reset: dict[str, list[str]] | None = None) -> Path:
    """A simulated devices file with chips A and B; reset says which chips fail or change UUID at a reset."""
    document: dict[str, object] = {
        "boards": [
            {"product": "BI-V100", "chips": [{"uuid": CHIP_A, "minor": 0}]},
            {"product": "BI-V100", "chips": [{"uuid": CHIP_B, "minor": 1}]},
        ]
    }
    if reset:
        document["reset"] = reset
    path.write_text(yaml.safe_dump(document))
    return path


def node_sysfs(directory: Path) -> Path:
    """A sysfs root under directory as a node with Iluvatar's driver has it: the PCI driver directory ixsmi -r
    writes (the agent runs ixsmi itself only where it can write there, as root with CAP_SYS_ADMIN)."""
    root = directory / "sys"
    (root / "bus" / "pci" / "drivers" / "iluvatar").mkdir(parents=True, exist_ok=True)
    return root


def fake_ixsmi(path: Path, script: str) -> str:
    """An executable shell script standing in for ixsmi."""
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


class Ixsmi:
    """A fake ixsmi in directory: records each call's arguments; sleeps as long as its `delay` file says and exits
    with the code in its `code` file."""

    def __init__(self, directory: Path) -> None:
        self.calls = directory / "ixsmi-calls"
        self.code = directory / "ixsmi-code"
        self.code.write_text("0")
        self.delay = directory / "ixsmi-delay"
        self.delay.write_text("0")
        script = f'echo "$@" >> {self.calls}; sleep $(cat {self.delay}); exit $(cat {self.code})'
        self.path = fake_ixsmi(directory / "ixsmi", script)
        self.sysfs = node_sysfs(directory)  # the node's Iluvatar driver directory, which ixsmi -r writes

    def runs(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def node_events(apiserver: ApiServerStandIn, reason: str | None = None) -> list[dict]:
    """The Node Events the stand-in holds (of one reason)."""
    found = [e for e in apiserver.objects("events") if e["metadata"]["namespace"] == EVENT_NAMESPACE]
    return [e for e in found if reason is None or e["reason"] == reason]


async def start_resetting(
    start_daemon: DaemonFactory, backend: Backend, reset: ResetSettings = FAST, **overrides: object
) -> Daemon:
    """A daemon with flags.reset_gpu on over backend."""
    return await start_daemon(
        backend_factory=lambda: backend,
        given=config_flags(reset_gpu=True),
        reset_wait_timeout=reset.wait_timeout,
        reset_timeout=reset.command_timeout,
        **overrides,
    )


async def start_with_api(
    start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, backend: Backend, **extra: object
) -> Daemon:
    """A resetting daemon that speaks the handshake with the stand-in API server."""
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig", namespace=NAMESPACE)
    kube = settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "flags.reset_gpu")
    return await start_resetting(start_daemon, backend, kube=kube, **extra)  # type: ignore[arg-type]


def reset_document(apiserver: ApiServerStandIn) -> ResetInfo | None:
    """The handshake's document as the API server holds it now (None: no ConfigMap)."""
    found = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE)
    return None if found is None else ResetInfo.parse(found["data"][DATA_KEY], NODE)


def handed_back(apiserver: ApiServerStandIn) -> bool:
    """Whether the handshake's document says the reset is over and the agent holds the GPUs again."""
    info = reset_document(apiserver)
    return info is not None and info.reset is False and info.occupy.get(OUR_NAME) is True


def write_document(apiserver: ApiServerStandIn, info: ResetInfo | str) -> None:
    """Store the handshake's ConfigMap holding info (or this text under gpuReset)."""
    text = info if isinstance(info, str) else info.text()
    apiserver.put(
        "configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {DATA_KEY: text},
        },
    )


async def exporter(apiserver: ApiServerStandIn, seen: list[tuple[bool, dict[str, bool]]], lets_go: bool) -> None:
    """ix-exporter's side: lets go when reset turns true (if lets_go), takes the GPUs back when it turns false."""
    while True:
        info = reset_document(apiserver)
        if info is not None:
            if not seen or seen[-1] != (info.reset, info.occupy):
                seen.append((info.reset, dict(info.occupy)))
            wanted = not info.reset or not lets_go
            if info.occupy.get(EXPORTER) != wanted:
                answer = ResetInfo(info.nodename, info.reset, {**info.occupy, EXPORTER: wanted})
                write_document(apiserver, answer)  # no await between read and write: nothing else writes
                seen.append((answer.reset, dict(answer.occupy)))
        await asyncio.sleep(0.05)


class IxsmiBackend(SimulatedBackend):
    """Simulated chips, reset by running a (fake) ixsmi as the IXML backend runs it."""

    def __init__(self, devices: Path, ixsmi: str) -> None:
        super().__init__(str(devices))
        self.ixsmi = ixsmi

    def reset(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None) -> None:
        self.resets.append(tuple(uuids))
        run_ixsmi_reset(self.ixsmi, uuids, timeout, abort)


class Watched(SimulatedBackend):
    """Chips whose reset takes reset_seconds; records what telemetry did meanwhile."""

    def __init__(self, devices: Path, reset_seconds: float) -> None:
        super().__init__(str(devices))
        self.reset_seconds = reset_seconds
        self.events: list[str] = []

    def reset(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None) -> None:
        self.events.append("reset begins")
        time.sleep(self.reset_seconds)
        self.events.append("reset ends")
        super().reset(uuids, timeout, abort)

    def sample(self, inventory: Inventory) -> dict[str, ChipSample]:
        self.events.append("sample")
        return super().sample(inventory)

    def close(self) -> None:
        self.events.append("close")
