"""Random sequences of events against a running daemon: after each settles, the kubelet sees
plan(inventory, last valid config) and Allocate answers as that plan says."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path

import grpc
import yaml
from helpers.support import metric
from helpers.waits import until
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.core.allocation import AllocationError, allocate
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import parse_text
from ix_device_plugin.settings.options import Options
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

SETTLE_TIMEOUT = 8.0
VALID_CONFIGS = (
    "flags:\n  splitboard: false\n",
    "flags:\n  splitboard: true\n",
    "sharing:\n  timeSlicing:\n    replicas: 2\n",
    # Changes only what Allocate answers, not the device list:
    "sharing:\n  timeSlicing:\n    replicas: 2\n    failRequestsGreaterThanOne: true\n",
    "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 3\n    renameByDefault: true\n",
    "resourceName: iluvatar.com/vgpu\n",
)
# Refused by Iluvatar's 4.4.0 too (an unknown key or an empty file is read with a warning, as 4.4.0 reads it).
INVALID_CONFIGS = (
    "flags:\n  splitboard: maybe\n",
    "sharing: [\n",
    "sharing:\n  timeSlicing:\n    replicas: many\n",
    "sharing:\n  timeSlicing:\n    replicas: -1\n",
)
HEALTH_ERRORS = ((), ("OverTemp",), ("ECC", "PCIE"))
BOARDS = tuple(
    (product, [f"GPU-sm-{board}-{chip}" for chip in range(chips)])
    for board, (product, chips) in enumerate((("BI-V150", 2), ("BI-V100", 1), ("BI-V150", 2), ("MR-V100", 1)))
)


def _expected_config(text: str) -> Config:
    return config_from(parse_text(text, "ix-config"), {})


class ReconcileMachine(RuleBasedStateMachine):
    """Drives one in-process daemon and a kubelet stand-in through random events."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = Path(tempfile.mkdtemp(prefix="ixsm-", dir="/tmp"))
        self.plugin_dir = self.root / "device-plugins"
        self.plugin_dir.mkdir()
        self.devices = self.root / "devices.yaml"
        self.boards = {0: {}, 1: {}}  # board index -> chip uuid -> {"health": [...], "present": bool}
        for index in self.boards:
            self.boards[index] = {uuid: {"health": [], "present": True} for uuid in BOARDS[index][1]}
        self._write_devices()
        self.configmap = ConfigMapDir(self.root / "ixconfig")
        self.on_disk = VALID_CONFIGS[0]
        self.configmap.write(self.on_disk)
        self.config = _expected_config(self.on_disk)
        options = Options(
            plugin_dir=self.plugin_dir,
            config_path=self.configmap.path,
            config_required=True,
            dev_root=self.root,
            health_interval=0.1,
            health_address="off",
            poll_interval=0.2,
            rediscover_interval=0.3,
        )
        self.kubelet = KubeletStandIn(self.plugin_dir)
        self.daemon = Daemon(options, backend_factory=lambda: SimulatedBackend(str(self.devices)))
        self._run(self.kubelet.start())
        self._run(self.daemon.start())
        self._run(self._install_signal_handlers())

    async def _install_signal_handlers(self) -> None:
        self.daemon.install_signal_handlers()

    def teardown(self) -> None:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            self.loop.remove_signal_handler(sig)
        self._run(self.daemon.shutdown())
        self._run(self.kubelet.stop())
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, coroutine):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coroutine)

    def _write_devices(self) -> None:
        document = {
            "boards": [
                {
                    "product": BOARDS[index][0],
                    "chips": [{"uuid": uuid, "minor": self._minor(uuid), **state} for uuid, state in chips.items()],
                }
                for index, chips in sorted(self.boards.items())
            ]
        }
        staging = self.devices.with_suffix(".tmp")
        staging.write_text(yaml.safe_dump(document))
        os.replace(staging, self.devices)

    @staticmethod
    def _minor(uuid: str) -> int:
        board, chip = uuid.rsplit("-", 2)[-2:]
        return int(board) * 2 + int(chip)

    # ---- events -------------------------------------------------------------------------------

    @rule(text=st.sampled_from(VALID_CONFIGS))
    def edit_config(self, text: str) -> None:
        self.on_disk = text
        self.configmap.write(text)
        self.config = _expected_config(text)
        self._run(until(lambda: self.daemon.config == self.config, timeout=SETTLE_TIMEOUT))

    @rule(text=st.sampled_from(INVALID_CONFIGS))
    def edit_config_badly(self, text: str) -> None:
        failures = metric(self.daemon, "ix_device_plugin_config_reload_failures_total")
        unchanged, self.on_disk = text == self.on_disk, text
        self.configmap.write(text)
        if unchanged:
            return  # the same bytes again: nothing to re-read
        self._run(
            until(
                lambda: metric(self.daemon, "ix_device_plugin_config_reload_failures_total") > failures,
                timeout=SETTLE_TIMEOUT,
            )
        )

    @rule()
    def sighup(self) -> None:
        os.kill(os.getpid(), signal.SIGHUP)
        self._run(asyncio.sleep(0.05))

    @rule(board=st.sampled_from([0, 1, 2, 3]), chip=st.integers(0, 1), errors=st.sampled_from(HEALTH_ERRORS))
    def flip_health(self, board: int, chip: int, errors: tuple[str, ...]) -> None:
        chips = self.boards.get(board)
        if not chips:
            return
        uuid = list(chips)[chip % len(chips)]
        chips[uuid]["health"] = list(errors)
        self._write_devices()

    @rule(board=st.sampled_from([0, 1, 2, 3]), chip=st.integers(0, 1))
    def chip_falls_off_and_back(self, board: int, chip: int) -> None:
        chips = self.boards.get(board)
        if not chips:
            return
        uuid = list(chips)[chip % len(chips)]
        chips[uuid]["present"] = not chips[uuid]["present"]
        self._write_devices()

    @rule(board=st.sampled_from([1, 2, 3]))
    def hot_plug(self, board: int) -> None:
        if board in self.boards:
            del self.boards[board]
        else:
            self.boards[board] = {uuid: {"health": [], "present": True} for uuid in BOARDS[board][1]}
        self._write_devices()

    @rule()
    def kubelet_restarts(self) -> None:
        self._run(self.kubelet.restart())

    @rule()
    def our_socket_is_deleted(self) -> None:
        self.daemon.socket_path.unlink(missing_ok=True)

    # ---- what must hold once things settle ------------------------------------------------------

    def _expected_plan(self) -> Plan:
        inventory = with_control_nodes(SimulatedBackend(str(self.devices)).discover(), self.root)
        return plan(inventory, self.config)

    def _kubelet_agrees(self, expected: Plan) -> bool:
        view = self.kubelet.resources.get(expected.resource_name)
        if view is None or not view.connected or not self.daemon.registered or not self.daemon.endpoint.serving:
            return False
        wanted = {d.id: HEALTHY if d.healthy else UNHEALTHY for d in expected.devices}
        numa = {d.id: d.numa_nodes for d in expected.devices}
        return view.devices == wanted and view.numa == numa

    @invariant()
    def kubelet_sees_the_plan_and_allocate_follows_it(self) -> None:
        expected = self._expected_plan()
        self._run(until(lambda: self._kubelet_agrees(expected), timeout=SETTLE_TIMEOUT))
        assert self.daemon.config == self.config
        healthy = [d.id for d in expected.devices if d.healthy]
        for count in (1, 2):
            if len(healthy) >= count:
                self._run(self._check_allocate(expected, healthy[:count]))

    async def _check_allocate(self, expected: Plan, ids: list[str]) -> None:
        try:
            wanted = allocate(expected, ids)
        except AllocationError:
            wanted = None
        try:
            response = await self.kubelet.allocate(expected.resource_name, [ids])
        except grpc.aio.AioRpcError as error:
            assert wanted is None, f"Allocate {ids} refused ({error.details()}) but the plan grants it"
            return
        assert wanted is not None, f"Allocate {ids} granted but the plan refuses it"
        container = response.container_responses[0]
        assert [spec.host_path for spec in container.devices] == list(wanted.device_nodes)
        assert dict(container.envs) == wanted.envs


ReconcileMachine.TestCase.settings = settings(
    max_examples=max(3, settings.default.max_examples // 10),
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
test_reconcile_machine = ReconcileMachine.TestCase
