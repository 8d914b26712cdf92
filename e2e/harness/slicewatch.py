"""What happens to the node's ResourceSlices over time, as the API server tells it: every write (a watch) and
whether the node has its devices' slice (a list, sampled every SAMPLE seconds), for the rolling-update scenario.

Plain HTTPS with the admin's client certificate: a kubectl process per sample would load the machine more than
the drivers it measures.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .cluster import Cluster

SAMPLE = 0.25  # seconds between two looks at the node's slices
WATCH_SPAN = 5  # seconds one watch lasts before the next takes up where it ended
WRITES = {"ADDED", "MODIFIED", "DELETED"}
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
OWN = "app.kubernetes.io/managed-by=ix-device-plugin"


@dataclass(frozen=True)
class Write:
    """One change the watch saw: when (monotonic), what (ADDED, MODIFIED, DELETED) and to which slice."""

    at: float
    type: str
    name: str


@dataclass
class Sample:
    at: float
    devices: dict[str, Any] | None  # the devices of the node's slice that has them, by name; None: no such slice


@dataclass
class SliceRecorder:
    """Records the writes to the node's slices and samples them, from `start` until `stop`."""

    cluster: Cluster
    writes: list[Write] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._context = self.cluster.admin_tls()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> SliceRecorder:
        version = self._list()["metadata"]["resourceVersion"]
        for target in (lambda: self._watch(version), self._sample):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(WATCH_SPAN + 15)

    # ---- figures ---------------------------------------------------------------------------

    def writes_between(self, start: float, end: float) -> list[Write]:
        return [write for write in self.writes if start <= write.at < end]

    def longest_gap(self) -> float:
        """The longest time the node had no slice of its devices, as sampled: from the first sample without to the
        next sample with it (seconds; 0: every sample had it)."""
        longest, missing_since = 0.0, None
        for sample in self.samples:
            if sample.devices is None:
                missing_since = sample.at if missing_since is None else missing_since
            elif missing_since is not None:
                longest, missing_since = max(longest, sample.at - missing_since), None
        if missing_since is not None and self.samples:
            longest = max(longest, self.samples[-1].at - missing_since)
        return longest

    def first_sample(self, predicate: Any, after: float) -> float | None:
        """When a sample after `after` first had devices satisfying predicate (monotonic), None if none did."""
        for sample in self.samples:
            if sample.at >= after and sample.devices is not None and predicate(sample.devices):
                return sample.at
        return None

    # ---- the API server --------------------------------------------------------------------

    def _url(self, **query: str) -> str:
        selectors = {"fieldSelector": f"spec.nodeName={self.cluster.node_name}", "labelSelector": OWN}
        return f"{self.cluster.server}{RESOURCE_SLICES}?{urllib.parse.urlencode({**selectors, **query})}"

    def _list(self) -> dict[str, Any]:
        with urllib.request.urlopen(self._url(), context=self._context, timeout=5) as answer:
            return json.loads(answer.read())

    def _watch(self, version: str) -> None:
        """Every change after version, through watches the server ends every WATCH_SPAN seconds (each taken up
        from the last version seen), so that the thread notices the stop without closing a stream in use."""
        while not self._stopping.is_set():
            url = self._url(watch="1", resourceVersion=version, timeoutSeconds=str(WATCH_SPAN))
            try:
                with urllib.request.urlopen(url, context=self._context, timeout=WATCH_SPAN + 10) as stream:
                    for line in stream:
                        event = json.loads(line)
                        metadata = event["object"]["metadata"]
                        version = metadata["resourceVersion"]
                        if event["type"] in WRITES:
                            self.writes.append(Write(time.monotonic(), event["type"], metadata["name"]))
            except (OSError, ValueError, KeyError) as error:
                if not self._stopping.is_set():
                    self.errors.append(f"the watch failed: {error!r}")
                return

    def _sample(self) -> None:
        while not self._stopping.is_set():
            at = time.monotonic()
            try:
                items = self._list()["items"]
            except OSError as error:
                self.errors.append(f"a sample failed: {error}")
            else:
                with_devices = [s for s in items if s["spec"].get("devices")]
                devices = {d["name"]: d for s in with_devices for d in s["spec"]["devices"]} if with_devices else None
                self.samples.append(Sample(at, devices))
            self._stopping.wait(max(0.0, SAMPLE - (time.monotonic() - at)))
