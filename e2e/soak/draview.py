"""The soak's view of the DRA driver: claims of the mode's shapes, allocations from the claims, what is in service
as the untainted devices of the driver's slices, what each allocation gives (shares included) against what its
container shows, and the kubelet's Events of prepares that failed."""

from __future__ import annotations

from typing import Any

from harness.dra import DRIVER

from . import checker as c
from . import dracheck, draconfig, workload
from .observe import claim_devices
from .schedule import CHIPS
from .view import Allocated, ModeView, Pod

EVENT_LAG_S = 2.0  # an Event's time is in whole seconds and the soak notes a deletion at its next tick


class DraView(ModeView):
    mode = "dra"
    state_directories = ("iluvatar.com", "gpu.iluvatar.com")
    restarts_for_config = True  # the driver reads its config at start (docs/dra.md)
    service_label = "chips untainted"

    def __init__(self, *parts: Any) -> None:
        super().__init__(*parts)
        self.last_up: frozenset[int] = frozenset()  # the chips in service at the last look
        self.given: dict[str, tuple[c.Given, ...]] = {}  # pod -> the devices and shares its claims give
        self.shown: dict[str, tuple[tuple[c.Given, ...], dict[str, str]]] = {}  # pod -> (given, its variables)
        self.counted: dict[str, int] = {}  # Event name -> its count seen
        self.failures: list[dracheck.PrepareFailure] = []
        self.deleted_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}  # pod -> when the soak created it (its claims with it)
        self.claim_pods: dict[str, str] = {}  # claim UID -> its pod, of every claim seen allocated

    def prepare(self) -> None:
        """Admin-access claims (workload.py) are allowed in such a namespace only."""
        self.admin("label", "namespace", self.namespace, f"{workload.ADMIN_LABEL}=true", "--overwrite")

    def together(self, at: float) -> list[frozenset[int]]:
        return draconfig.together(self.config(at), CHIPS, self.hardware.board_of)

    # ------------------------------------------------------------------ the workload

    def create(self, name: str, shape: str) -> None:
        claims, pods = workload.objects(name, shape, draconfig.share_class(self.config(self.timeline.now())))
        for pod in workload.pods_of(name):  # none of its claims was allocated before
            self.created_at[pod] = self.timeline.now()
        self.admin.create(claims, "-n", self.namespace)
        self.admin.create(pods, "-n", self.namespace)

    def pods_of(self, name: str) -> list[str]:
        return workload.pods_of(name)

    def claims_of(self, name: str) -> list[str]:
        return workload.claims_of(name)

    def allocated(self, pods: list[Pod]) -> Allocated:
        """From the API server: the pod's claims' allocations; and what each allocation gives."""
        claims = {
            x["metadata"]["name"]: x
            for x in self.api.items(f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims")
        }
        found: Allocated = {}
        made: dict[str, list[dict[str, Any]]] = {}  # pod -> its claims, for what each allocation gives (shares)
        board_of = self.hardware.board_of
        for pod in pods:
            names = [ref.get("resourceClaimName") for ref in pod["spec"].get("resourceClaims") or []]
            devices = [d for n in names if n in claims for d in claim_devices(claims[n], DRIVER)]
            chips = frozenset(chip for d in devices for chip in workload.chips_of(d, board_of))
            if chips:
                found[pod["metadata"]["name"]] = (pod["metadata"]["uid"], chips)
                made[pod["metadata"]["name"]] = [claims[n] for n in names if n in claims]
        chips_of = lambda device: workload.chips_of(device, board_of)  # noqa: E731
        uuids = self.hardware.uuids
        self.given = {pod: dracheck.given(mine, draconfig.DRIVER, chips_of, uuids) for pod, mine in made.items()}
        self.claim_pods |= dracheck.claim_uids(made)
        return found

    # ------------------------------------------------------------------ in service

    def read_service(self, at: float) -> tuple[c.ServiceSample, int]:
        slices = self.api.items("/apis/resource.k8s.io/v1/resourceslices")
        devices = [d for s in slices if s["spec"].get("driver") == DRIVER for d in s["spec"].get("devices") or []]
        board_of = self.hardware.board_of
        self.last_up = frozenset(
            chip for d in devices if not d.get("taints") for chip in workload.chips_of(d["name"], board_of)
        )
        return c.ServiceSample(at, in_service=self.last_up), len(self.last_up)

    def in_service(self, chip: int) -> bool:
        return chip in self.last_up

    def judge_service(self, invariant: c.Invariant, sample: c.ServiceSample) -> None:
        timeline, together = self.timeline, self.together(sample.at)
        c.back_in_service(invariant, sample, CHIPS, timeline.broken, timeline.quiet, together=together)

    def judge_rollout(self, invariant: c.Invariant, rollout: c.Rollout, sample: c.ServiceSample) -> None:
        timeline, together = self.timeline, self.together(sample.at)
        c.kept_in_rollout(invariant, rollout, sample, timeline.broken, timeline.quiet, None, together)

    def ceiling_without(self, out: frozenset[int]) -> None:
        return None

    def before_rollout(self) -> frozenset[int]:
        return self.last_up

    def full_units(self) -> int:
        return CHIPS

    def all_back(self, invariant: c.Invariant, at: float) -> None:
        for chip in range(CHIPS):
            invariant.check(
                chip in self.last_up, at, f"chip {chip} not in service at the end (in service: {sorted(self.last_up)})"
            )

    # ------------------------------------------------------------------ what containers hold

    def expected_sets(self, name: str, named: frozenset[int]) -> tuple[frozenset[int], ...]:
        return (named,)

    def given_to(self, pod: str) -> tuple[c.Given, ...] | None:
        return self.given.get(pod)

    def verified(self, invariant: c.Invariant, at: float, pod: str, env: dict[str, str]) -> None:
        """Its share slots apart from every other container's that still holds its allocation."""
        self.shown = {name: shown for name, shown in self.shown.items() if name in self.given}
        mine = self.given.get(pod, ())
        if any(device.share for device in mine):
            c.slots_apart(invariant, at, pod, mine, env, self.shown)
            self.timeline.note(f"{pod} shows its shares: IX_REPLICA_DEVICES={env.get(c.REPLICAS, '')}")
        self.shown[pod] = (mine, env)

    # ------------------------------------------------------------------ afterwards

    def judge_given(self, invariant: c.Invariant) -> None:
        """Allocations made while the soak's mode was away were given by no agent of its own (the kubelet's slices);
        what the driver says waits for the API server, and for a driver that runs: a chip that broke just before or
        while its pod was replaced can be tainted only once the new one is Ready (its prepare refuses the chip)."""
        timeline = self.timeline
        given = c.given_by_prepare(timeline.allocations, timeline.away, timeline.running)
        restarts = [(began, ready) for began, ready in timeline.starts if ready is not None]
        c.broken_not_given(invariant, given, timeline.broken, [*timeline.outages, *restarts])

    def read_events(self, at: float) -> None:
        """The kubelet's FailedPrepareDynamicResources Events on the soak's pods since the last read; those of a
        pod the soak has deleted by then are its own doing (the claim deleted with it)."""
        timeline = self.timeline
        for name in timeline.deleted:
            self.deleted_at.setdefault(name, at)
        query = f"fieldSelector=reason%3D{dracheck.REASON}"
        events = self.api.items(f"/api/v1/namespaces/{self.namespace}/events?{query}")
        for failure in dracheck.new_failures(events, timeline.start, at, self.counted):
            deleted = self.deleted_at.get(failure.pod)
            if deleted is not None and failure.at >= deleted - EVENT_LAG_S:
                continue
            self.failures.append(failure)
            timeline.note(f"{failure.pod} prepare failed: {failure.message[:240]}")

    def judge(self, invariant: c.Invariant) -> None:
        timeline = self.timeline
        # the earliest its claims may have been allocated: the soak's last look before it saw them allocated, else
        # the pod's creation (the soak does not look while it restarts the agent)
        allocated = self.created_at | {a.pod: a.after for a in reversed(timeline.allocations)}
        dracheck.prepare_failures(
            invariant,
            self.failures,
            timeline.quiet,
            timeline.broken,
            self.hardware.chip_of,
            timeline.config_changes,
            allocated,
            self.claim_pods,
        )
