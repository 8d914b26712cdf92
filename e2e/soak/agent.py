"""The agent under soak, as a host process over the soak's simulated hardware, healing through the ixsmi stand-in:
`ix-device-plugin run` (device plugin) or `ix-device-plugin dra`, killed, stopped and started again at will."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.cluster import Cluster
from harness.plugin import PluginRun, start_device_plugin, start_dra_driver

from .hardware import Hardware

RESET_TIMEOUT_S = 10


class Agent:
    def __init__(self, cluster: Cluster, mode: str, workdir: Path, hardware: Hardware, kubeconfig: Path) -> None:
        self.cluster, self.mode, self.workdir, self.hardware, self.kubeconfig = (
            cluster,
            mode,
            workdir,
            hardware,
            kubeconfig,
        )
        self.config: dict[str, Any] = {}
        self.base_config: dict[str, Any] = {}  # under every config the soak sets (a self-test: `health: {ignore}`)
        self.run: PluginRun | None = None
        self.starts = 0

    def start(self, timeout: float = 90) -> None:
        self.starts += 1
        name = f"soak-{self.mode}-{self.starts}"
        # The last --simulated-devices wins: the soak's file, with presence and health bits per chip.
        extra = ["--ixsmi-path", str(self.hardware.ixsmi), "--simulated-devices", str(self.hardware.devices)]
        extra += ["--reset-timeout", str(RESET_TIMEOUT_S)]  # a hanging ixsmi is given up on within the soak
        if self.mode == "device-plugin":
            extra += ["--kubeconfig", str(self.kubeconfig)]
            self.run = start_device_plugin(self.cluster, self.workdir, name, config=self.config, extra=extra)
        else:
            self.run = start_dra_driver(self.cluster, self.workdir, name, self.kubeconfig, extra=extra)
        self.run.wait_ready(timeout)

    @property
    def pid(self) -> int | None:
        return self.run.process.pid if self.run is not None and self.run.process.running() else None

    @property
    def log(self) -> Path | None:
        return self.run.process.log if self.run is not None else None

    def kill(self) -> None:
        if self.run is not None:
            self.run.process.kill()

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()

    def set_config(self, config: dict[str, Any]) -> None:
        config = self.base_config | config
        self.config = config
        if self.run is not None:
            self.run.set_config(config)
