"""How much of a resource the node offers over time, as the API server and the kubelet tell it, for the scenarios
where it must never drop: the Node's `status.capacity` and `status.allocatable` (sampled, and every change through a
watch) and the kubelet's device manager itself (its healthy devices, through the pod-resources API's
GetAllocatableResources, which reads them live; the Node only gets them at the kubelet's next status update).

Plain HTTPS with the admin's client certificate and one gRPC channel: a kubectl process per sample would load the
machine more than the plugins it measures.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc

from .cluster import Cluster

SAMPLE = 0.1  # seconds between two looks of each sampler
# The longest time two looks may be apart. 0.25 s was once missed by 4 ms on a 2-CPU machine running three clusters
# side by side and the unit suite: a drop the kubelet shows is a re-registration, longer than this.
MAX_INTERVAL = 0.4
WATCH_SPAN = 5  # seconds one watch lasts before the next takes up where it ended
NODE, WATCH, KUBELET = "node", "watch", "kubelet"  # where a sample comes from


@dataclass(frozen=True)
class Sample:
    """What one look saw: when (monotonic), from where, capacity (None from the kubelet) and allocatable."""

    at: float
    source: str
    capacity: int | None
    allocatable: int


@dataclass
class ResourceRecorder:
    """Records the node's figures for resource from `__enter__` until `__exit__`: the Node sampled every SAMPLE
    seconds and watched, the kubelet's allocatable devices sampled every SAMPLE seconds."""

    cluster: Cluster
    resource: str
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._context = self.cluster.admin_tls()
        self._channel = grpc.insecure_channel(f"unix://{self.cluster.pod_resources_socket}")
        self._lister = api_pb2_grpc.PodResourcesListerStub(self._channel)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._began = time.monotonic()
        self._ended: float | None = None

    def __enter__(self) -> ResourceRecorder:
        self._began = time.monotonic()
        node = self._node()
        self._record(NODE, node)
        version = node["metadata"]["resourceVersion"]
        targets: list[Callable[[], None]] = [
            lambda: self._watch(version),
            lambda: self._every_sample(NODE, lambda: self._record(NODE, self._node())),
            lambda: self._every_sample(KUBELET, self._record_kubelet),
        ]
        for target in targets:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._ended = time.monotonic()
        self._stopping.set()
        for thread in self._threads:
            thread.join(WATCH_SPAN + 15)
        self._channel.close()

    # ---- figures ---------------------------------------------------------------------------

    def of(self, source: str) -> list[Sample]:
        return [sample for sample in self.samples if sample.source == source]

    def seen(self, source: str) -> list[tuple[int | None, int]]:
        """The distinct (capacity, allocatable) source reported, in the order first seen."""
        return list(dict.fromkeys((sample.capacity, sample.allocatable) for sample in self.of(source)))

    def longest_interval(self, source: str) -> float:
        """The longest time between two looks of source (seconds), from the start to the end of the recording."""
        times = [self._began] + [sample.at for sample in self.of(source)] + [self._ended or time.monotonic()]
        return max(b - a for a, b in itertools.pairwise(times))

    def check_steady(self, capacity: int, allocatable: int) -> None:
        """AssertionError naming what differed unless every look, from every source, saw these figures, and the
        samplers looked at least every MAX_INTERVAL seconds without an error."""
        assert self.errors == [], self.errors
        for source in (NODE, WATCH):
            assert set(self.seen(source)) <= {(capacity, allocatable)}, f"{source}: {self.seen(source)}"
        assert set(self.seen(KUBELET)) == {(None, allocatable)}, f"kubelet: {self.seen(KUBELET)}"
        for source in (NODE, KUBELET):
            longest = self.longest_interval(source)
            assert longest <= MAX_INTERVAL, f"{source} sampled only every {longest:.3f} s at worst"

    def summary(self) -> dict[str, Any]:
        """Counts, intervals and the figures seen, for the log."""
        return {
            source: {
                "samples": len(self.of(source)),
                "longest_interval_seconds": round(self.longest_interval(source), 3),
                "seen": self.seen(source),
            }
            for source in (NODE, WATCH, KUBELET)
        }

    # ---- the API server and the kubelet ----------------------------------------------------

    def _record(self, source: str, node: dict[str, Any]) -> None:
        status = node.get("status", {})
        capacity = int(status.get("capacity", {}).get(self.resource, "0"))
        allocatable = int(status.get("allocatable", {}).get(self.resource, "0"))
        self.samples.append(Sample(time.monotonic(), source, capacity, allocatable))

    def _record_kubelet(self) -> None:
        devices = allocatable_devices(self._lister, self.resource)
        self.samples.append(Sample(time.monotonic(), KUBELET, None, devices))

    def _get(self, path: str, timeout: float, **query: str) -> Any:
        url = f"{self.cluster.server}{path}?{urllib.parse.urlencode(query)}" if query else self.cluster.server + path
        return urllib.request.urlopen(url, context=self._context, timeout=timeout)

    def _node(self) -> dict[str, Any]:
        with self._get(f"/api/v1/nodes/{self.cluster.node_name}", 2) as answer:
            return json.loads(answer.read())

    def _every_sample(self, source: str, look: Callable[[], None]) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            try:
                look()
            except (OSError, ValueError, grpc.RpcError) as error:
                self.errors.append(f"a {source} sample failed: {error!r}")
            self._stopping.wait(max(0.0, SAMPLE - (time.monotonic() - began)))

    def _watch(self, version: str) -> None:
        """Every change of the Node after version, through watches the server ends every WATCH_SPAN seconds."""
        selector = f"metadata.name={self.cluster.node_name}"
        while not self._stopping.is_set():
            query = {"fieldSelector": selector, "watch": "1", "resourceVersion": version}
            try:
                with self._get("/api/v1/nodes", WATCH_SPAN + 10, timeoutSeconds=str(WATCH_SPAN), **query) as stream:
                    for line in stream:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise ValueError(f"the watch ended: {event['object']}")
                        version = event["object"]["metadata"]["resourceVersion"]
                        self._record(WATCH, event["object"])
            except (OSError, ValueError, KeyError) as error:
                if not self._stopping.is_set():
                    self.errors.append(f"the Node's watch failed: {error!r}")
                return


def allocatable_devices(lister: api_pb2_grpc.PodResourcesListerStub, resource: str) -> int:
    """How many devices of resource the kubelet's device manager can allocate now (its healthy ones)."""
    answer = lister.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=2)
    return sum(len(devices.device_ids) for devices in answer.devices if devices.resource_name == resource)


def kubelet_allocatable(cluster: Cluster, resource: str) -> int:
    """allocatable_devices, through a channel of its own."""
    with grpc.insecure_channel(f"unix://{cluster.pod_resources_socket}") as channel:
        return allocatable_devices(api_pb2_grpc.PodResourcesListerStub(channel), resource)
