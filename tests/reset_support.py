"""The GPU reset's end-to-end helpers: the node's chips, a fake ixsmi, ix-exporter's side of the handshake."""

from __future__ import annotations

import asyncio
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

import yaml

from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.deviceplugin.loop import Daemon
from ix_device_plugin.gpureset.sequence import DATA_KEY, ResetInfo, ResetSettings
from ix_device_plugin.hardware.backend import Backend
from ix_device_plugin.hardware.ixml.reset import run_ixsmi_reset
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.apiserver import ApiServerStandIn

from support import DaemonFactory, config_flags

NODE = "gpu-node-1"
NAMESPACE = "kube-system"
CONFIG_MAP = f"ix-gpu-reset-{NODE}"
EXPORTER = "ix-exporter"
CHIP_A, CHIP_B = "GPU-aaaa0000-0000-0000-0000-000000000001", "GPU-bbbb0000-0000-0000-0000-000000000002"
FAST = ResetSettings(wait_timeout=2.0, command_timeout=5.0)


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


def fake_ixsmi(path: Path, script: str) -> str:
    """An executable shell script standing in for ixsmi."""
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


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
