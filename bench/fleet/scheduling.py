"""How fast the real kube-scheduler places GPU pods on the hollow nodes' slices: pods per second and the time from
a pod's creation to its binding, for one shape of request.

Shapes (each a ResourceClaimTemplate, or the extended resource):
- chip: one chip (DeviceClass gpu.iluvatar.com), on slices with boards and chips from shared counters;
- board: one whole board (board.gpu.iluvatar.com), the same slices;
- extended: `iluvatar.com/gpu: 1` in the container's limits, served through DRA (a whole board per unit);
- share: one share of a time-sliced chip (consumable capacity; slices of nodes with replicas: 4);
- plain: one chip, on slices of chips alone (no counters, no boards, no shares): the baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.fleet.admin import EXTENDED_RESOURCE, Admin, Obj, bounded_all
from bench.stats import percentile
from ix_device_plugin.standins.waits import WaitFailed, until

NAMESPACE = "fleet-bench"
DRIVER = "gpu.iluvatar.com"
CLASS = {
    "chip": "gpu.iluvatar.com",
    "board": "board.gpu.iluvatar.com",
    "share": "gpu.iluvatar.com",
    "plain": "gpu.iluvatar.com",
}
BIND_TIMEOUT = 600.0
CLEAN_TIMEOUT = 300.0
CREATE_CONCURRENCY = 16
CHECK_EVERY = 2.0  # seconds between the checks that every pod is bound


@dataclass(frozen=True)
class Placement:
    """One pod's creation (when the API server answered its create) and binding (when the watch saw it)."""

    created: float
    bound: float | None


def template(shape: str) -> Obj:
    request = {"name": "gpu", "exactly": {"deviceClassName": CLASS[shape]}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": shape, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(shape: str, index: int) -> Obj:
    container: Obj = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    spec: Obj = {"containers": [container], "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0}
    if shape == "extended":
        container["resources"] = {"limits": {EXTENDED_RESOURCE: "1"}}
    else:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": shape}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{shape}-{index}", "namespace": NAMESPACE},
        "spec": spec,
    }


async def prepare_namespace(admin: Admin) -> None:
    """The bench's namespace with its templates, once its default ServiceAccount exists (pods need it)."""
    await admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for shape in CLASS:
        await admin.request(
            "POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", template(shape)
        )

    async def account() -> bool:
        try:
            await admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
        except RuntimeError:
            return False
        return True

    await until(account, timeout=60, interval=0.5, message=f"the default ServiceAccount of {NAMESPACE}")


async def place(admin: Admin, shape: str, count: int) -> dict[str, Any]:
    """Create count pods of shape at once and wait until they are bound; the throughput and latencies."""
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    bound: dict[str, float] = {}
    watcher = asyncio.create_task(_follow_binds(admin, pods_path, bound))
    created: dict[str, float] = {}

    async def create(index: int) -> None:
        manifest = pod(shape, index)
        sent = time.time()
        await admin.request("POST", pods_path, manifest)
        created[manifest["metadata"]["name"]] = sent

    started = time.time()
    try:
        await bounded_all([lambda index=index: create(index) for index in range(count)], CREATE_CONCURRENCY)
        with contextlib.suppress(WaitFailed):  # the figures say how many were bound by then
            await until(lambda: _all_bound(admin, pods_path, count, bound), timeout=BIND_TIMEOUT, interval=CHECK_EVERY)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return _placement_figures(shape, count, started, created, bound)


async def _follow_binds(admin: Admin, pods_path: str, bound: dict[str, float]) -> None:
    """Note when each pod is first seen bound, watching again from where a watch ended."""
    version = (await admin.request("GET", pods_path, limit="1"))["metadata"]["resourceVersion"]
    while True:
        try:
            async for event in admin.watch(pods_path, version):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise RuntimeError(obj.get("message", "watch error"))
                metadata = obj.get("metadata") or {}
                version = metadata.get("resourceVersion", version)
                if (obj.get("spec") or {}).get("nodeName") and metadata.get("name") not in bound:
                    bound[metadata["name"]] = time.time()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # said, and watched again from a fresh list
            print(f"\nthe pods watch ended ({error}); watching again", file=sys.stderr)
            version = (await admin.request("GET", pods_path, limit="1"))["metadata"]["resourceVersion"]


async def _all_bound(admin: Admin, pods_path: str, count: int, bound: dict[str, float]) -> bool:
    """Whether every pod is bound; a pod the watch missed gets its PodScheduled condition's time (to the second)."""
    if len(bound) >= count:
        return True
    pods = await admin.items(pods_path)
    scheduled = [obj for obj in pods if (obj.get("spec") or {}).get("nodeName")]
    if len(scheduled) < count:
        return False
    for obj in scheduled:
        name = obj["metadata"]["name"]
        if name not in bound:
            bound[name] = _scheduled_at(obj)
    return True


def _scheduled_at(obj: Obj) -> float:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return datetime.fromisoformat(condition["lastTransitionTime"]).timestamp()
    return time.time()


def _placement_figures(
    shape: str, count: int, started: float, created: dict[str, float], bound: dict[str, float]
) -> dict[str, Any]:
    latencies = sorted((bound[name] - created[name]) * 1000 for name in created if name in bound)
    last = max(bound.values(), default=started)
    return {
        "shape": shape,
        "pods": count,
        "bound": len(latencies),
        "seconds": round(last - started, 2),
        "pods_per_second": round(len(latencies) / (last - started), 1) if latencies else 0.0,
        "bind_p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
        "bind_p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
    }


async def claims_by_node(admin: Admin) -> dict[str, list[list[dict[str, str]]]]:
    """The bench's allocated claims, as the kubelet of each node would prepare them: by node (our pool's name), a
    list of pods, each the list of its claims (`namespace`, `name`, `uid`)."""
    by_pod: dict[tuple[str, str], list[dict[str, str]]] = {}
    for claim in await admin.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"):
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        pools = {result["pool"] for result in results if result.get("driver") == DRIVER}
        holders = [ref.get("uid", "") for ref in status.get("reservedFor") or []]
        if len(pools) != 1 or not holders:
            continue
        metadata = claim["metadata"]
        ref = {"namespace": metadata["namespace"], "name": metadata["name"], "uid": metadata["uid"]}
        by_pod.setdefault((pools.pop(), holders[0]), []).append(ref)
    pods: dict[str, list[list[dict[str, str]]]] = {}
    for (node, _), claims in sorted(by_pod.items()):
        pods.setdefault(node, []).append(claims)
    return pods


async def clean(admin: Admin) -> None:
    """Delete the bench's pods at once and wait until their claims are gone (their devices free again)."""
    base = f"/api/v1/namespaces/{NAMESPACE}"
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    await admin.request("DELETE", f"{base}/pods", gracePeriodSeconds="0")

    async def gone() -> bool:
        return not (await admin.items(f"{base}/pods") or await admin.items(claims))

    await until(gone, timeout=CLEAN_TIMEOUT, interval=1.0, message="the bench's pods and their claims gone")
