"""The soak's view of the device plugin: pods asking for `iluvatar.com/gpu`, allocations from the kubelet's device
checkpoint, and what is in service as the Node's allocatable, counted in the units the config in force gives."""

from __future__ import annotations

from collections.abc import Callable

from harness.pods import STAY, busybox_pod

from . import checker as c
from . import draconfig
from .observe import checkpoint_devices
from .schedule import CHIPS, DEVICE_PLUGIN_CONFIGS
from .view import Allocated, ModeView, Pod

RESOURCE = "iluvatar.com/gpu"


class DevicePluginView(ModeView):
    mode = "device-plugin"
    state_directories = ("iluvatar.com",)
    service_label = "allocatable"
    allocatable = -1  # at the last look

    def prepare(self) -> None:
        """Nothing: a pod asks for chips in any namespace."""

    def create(self, name: str, shape: str) -> None:
        self.admin.create(busybox_pod(name, STAY, gpus=int(shape.split("-")[1])), "-n", self.namespace)

    def pods_of(self, name: str) -> list[str]:
        return [name]

    def claims_of(self, name: str) -> list[str]:
        return []

    def allocated(self, pods: list[Pod]) -> Allocated:
        by_uid = checkpoint_devices(self.cluster.device_plugin_dir / "kubelet_internal_checkpoint")
        chip_of = self.hardware.chip_of
        found: Allocated = {}
        for pod in pods:
            ids = by_uid.get(pod["metadata"]["uid"], [])
            chips = frozenset(chip_of[i.split("::")[0]] for i in ids if i.split("::")[0] in chip_of)
            if chips:
                found[pod["metadata"]["name"]] = (pod["metadata"]["uid"], chips)
        return found

    def read_events(self, at: float) -> None:
        """None read: the kubelet fails the pod itself (its admission), which the look at the pods sees."""

    def read_service(self, at: float) -> tuple[c.ServiceSample, int]:
        node = self.api.get(f"/api/v1/nodes/{self.cluster.node_name}")
        self.allocatable = int(node["status"].get("allocatable", {}).get(RESOURCE, "0"))
        return c.ServiceSample(at, allocatable=self.allocatable), self.allocatable

    def in_service(self, chip: int) -> bool:
        """As far as one count tells (Windows.counted_in)."""
        return self.windows.counted_in(self.allocatable, chip, self.timeline.now(), self.units_of)

    def judge_service(self, invariant: c.Invariant, sample: c.ServiceSample) -> None:
        timeline = self.timeline
        expected = self.units_of(lambda chip: c.healthy_since(chip, sample.at, timeline.broken, timeline.quiet))
        c.back_in_service(invariant, sample, CHIPS, [], [], expected)

    def judge_rollout(self, invariant: c.Invariant, rollout: c.Rollout, sample: c.ServiceSample) -> None:
        timeline, without = self.timeline, self.ceiling_without
        c.kept_in_rollout(invariant, rollout, sample, timeline.broken, timeline.quiet, without, [])

    def ceiling_without(self, out: frozenset[int]) -> int:
        return self.units_of(lambda chip: chip not in out)

    def before_rollout(self) -> int:
        return self.allocatable

    def full_units(self) -> int:
        return self.units_of(lambda chip: True)

    def all_back(self, invariant: c.Invariant, at: float) -> None:
        units, full = self.allocatable, self.full_units()
        invariant.check(units == full, at, f"allocatable {units} at the end, not {full}")

    def units_of(self, healthy: Callable[[int], bool]) -> int:
        """Allocatable of the config now when exactly the chips healthy(chip) are healthy."""
        config = self.config(self.timeline.now())
        replicas = max(1, draconfig.replicas(config))
        if draconfig.splitboard(config):
            return replicas * sum(1 for chip in range(CHIPS) if healthy(chip))
        boards = {frozenset(self.hardware.board_of(chip)) for chip in range(CHIPS)}
        return replicas * sum(1 for board in boards if all(healthy(chip) for chip in board))

    def expected_sets(self, name: str, named: frozenset[int]) -> tuple[frozenset[int], ...]:
        """A whole board's chips unless the board was split when the allocation was made; both when the config
        changed around then."""
        timeline = self.timeline
        boards = frozenset(chip for n in named for chip in self.hardware.board_of(n))
        allocation = next(a for a in reversed(timeline.allocations) if a.pod == name)
        configs = {index for t, index in timeline.configs if allocation.after - 3 <= t <= allocation.seen}
        configs.add(timeline.config_at(allocation.after - 3))
        split = {draconfig.splitboard(DEVICE_PLUGIN_CONFIGS[i]) for i in configs}
        return tuple(named if s else boards for s in sorted(split, reverse=True))

    def given_to(self, pod: str) -> None:
        return None

    def verified(self, invariant: c.Invariant, at: float, pod: str, env: dict[str, str]) -> None:
        """Nothing more: what the allocation names is what the container holds."""

    def judge_given(self, invariant: c.Invariant) -> None:
        # The device plugin tells the kubelet directly: the API server's outages do not delay what it says.
        c.broken_not_given(invariant, self.timeline.allocations, self.timeline.broken, [])

    def judge(self, invariant: c.Invariant) -> None:
        """Nothing more: a refused admission fails the pod, which the look at the pods saw."""
