"""The bench's own API client (the cluster admin's certificate) and what it sets up: the chart's DRA objects with
the agents' group bound to its roles, and the hollow Nodes.

The admin's requests are not in the audit log (only the agents' group is), so setting up and measuring never
counts as our agents' traffic.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import httpx2

from bench.fleet.plane import AGENTS, ControlPlane
from e2e.harness.helm import Helm

Obj = dict[str, Any]
CONCURRENCY = 32  # the bench's requests in flight at once
EXTENDED_RESOURCE = "iluvatar.com/gpu"
CHART_VALUES = {
    "dra": {"enabled": True, "extendedResourceName": EXTENDED_RESOURCE},
    "devicePlugin": {"enabled": False},
}
# The device plugin's RBAC for what the fleet's plugins do: per-node config, Volcano mode, self-healing.
DEVICE_PLUGIN_VALUES = {
    "dra": {"enabled": False},
    "devicePlugin": {"enabled": True},
    "features": {"perNodeConfig": True, "volcano": True, "selfHealing": True},
}
NODE_CAPACITY = {"cpu": "128", "memory": "1Ti", "pods": "250"}


class Admin:
    """An async client of the API server as the cluster admin; `async with`."""

    def __init__(self, plane: ControlPlane) -> None:
        assert plane.pki is not None
        context = ssl.create_default_context(cafile=str(plane.ca))
        context.load_cert_chain(str(plane.pki.admin.cert), str(plane.pki.admin.key))
        self.client = httpx2.AsyncClient(
            base_url=plane.server,
            verify=context,
            timeout=httpx2.Timeout(60.0),
            limits=httpx2.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY),
        )

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.client.aclose()

    async def request(self, method: str, path: str, body: Any = None, **params: str) -> Obj:
        """One request; its JSON answer; RuntimeError naming the request and the server's message on failure."""
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        content = json.dumps(body).encode() if body is not None else None
        response = await self.client.request(method, path, content=content, params=params, headers=headers)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json() if response.content else {}

    async def items(self, path: str, **params: str) -> list[Obj]:
        """Every object of a list, page by page."""
        found: list[Obj] = []
        token = ""
        while True:
            page = await self.request("GET", path, limit="500", **({"continue": token} if token else {}), **params)
            found += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return found

    async def watch(self, path: str, version: str, **params: str) -> AsyncIterator[Obj]:
        """The events of a watch from version, until the server ends it."""
        query = {"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true", **params}
        async with self.client.stream("GET", path, params=query, timeout=httpx2.Timeout(None)) as response:
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)


async def bounded_all(calls: Iterable[Callable[[], Awaitable[Any]]], concurrency: int = CONCURRENCY) -> list[Any]:
    """Run the calls, at most concurrency at a time; their results in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls))


def chart_objects(plane: ControlPlane, values: Obj = CHART_VALUES) -> list[Obj]:
    """The chart's DRA DeviceClasses and roles as `helm template` renders them for values, the bindings for the
    agents' group."""
    helm = Helm(plane.binaries["helm"], plane.workdir / "helm")
    objects = []
    for obj in helm.template(values):
        if obj["kind"] in ("DeviceClass", "ClusterRole", "Role"):
            objects.append(obj)
        elif obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            obj["subjects"] = [{"kind": "Group", "name": AGENTS, "apiGroup": "rbac.authorization.k8s.io"}]
            objects.append(obj)
    return objects + claim_status_grant()


def claim_status_grant() -> list[Obj]:
    """`arbitrary-node:patch` of our claims' status.devices for the agents' group: a hollow node's token names no
    node, so the chart's `associated-node:patch` (a pod's token names its node) cannot match it."""
    name = "ix-fleet-claim-status"
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": ["gpu.iluvatar.com"],
        "verbs": ["arbitrary-node:patch"],
    }
    group = {"kind": "Group", "name": AGENTS, "apiGroup": "rbac.authorization.k8s.io"}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [rule],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "subjects": [group],
            "roleRef": role_ref,
        },
    ]


def device_plugin_objects(plane: ControlPlane) -> list[Obj]:
    """The chart's device plugin roles (DEVICE_PLUGIN_VALUES), bound to the agents' group."""
    return chart_objects(plane, DEVICE_PLUGIN_VALUES)


def node_object(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def node_status() -> Obj:
    """A hollow node's status: Ready, with room for any number of the bench's pods."""
    return {
        "status": {
            "capacity": NODE_CAPACITY,
            "allocatable": NODE_CAPACITY,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "hollow node"}],
        }
    }


async def add_nodes(admin: Admin, names: list[str]) -> None:
    """Register the hollow Nodes, Ready and untainted."""

    async def add(name: str) -> None:
        await admin.request("POST", "/api/v1/nodes", node_object(name))
        await admin.request("PATCH", f"/api/v1/nodes/{name}/status", node_status())
        # The API server taints a new Node not-ready; the node lifecycle controller, off here, would lift it.
        await admin.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    await bounded_all([lambda name=name: add(name) for name in names])
