"""Which containers use which claims, and the CDI devices the kubelet hands each of them, as Kubernetes 1.37 does.

Pure: Pods and ResourceClaims (dicts, as the API server returns them) and the prepared claims in, plain data out.

- the kubelet (`pkg/kubelet/cm/dra/manager.go`, GetResources) collects, claim by claim, the requests a container
  uses: its references (`resources.claims`: a claim whole, or some of its requests, in the container's order) and,
  for the pod's extended-resource claim, the requests `status.extendedResourceClaimStatus.requestMappings` maps to
  it (where the container asks for that resource; an init container that is not a sidecar reuses the requests of
  the containers after it, as the scheduler maps them); then, for each claim in the order of a Go map, that is in
  no fixed order, and each of its requests, the CDI IDs of the devices answered for the request (a whole
  reference: every device), in the order the driver answered them (`claiminfo.go`, cdiDevicesAsList: request
  names matched exactly, which is why a subrequest is answered as its request).

Who uses a claim: one made from a template of the pod, or the pod's extended-resource claim, the pod's containers
(they never change); one made on its own (`resourceClaimName`), the containers of the pods its
`status.reservedFor` lists when the driver looks. The kubelet prepares a claim once: a pod that starts using an
already prepared claim later is told what the claim's CDI devices were written for.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.dra.claimspec import Holding, cdi_device_name
from ix_device_plugin.dra.pool import quantity
from ix_device_plugin.dra.prepared import PreparedClaim

# What the kubelet counts as an extended resource a DRA claim may serve (IsDRAExtendedResourceName).
_NATIVE = "kubernetes.io/"
_IMPLICIT_CLASS = "deviceclass.resource.kubernetes.io/"


@dataclass(frozen=True)
class PodRef:
    """A pod, as a claim's reservedFor or owner names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClaimUse:
    """A claim a pod uses, by name; own: made for the pod (from its template, or its extended-resource claim)."""

    name: str
    own: bool


@dataclass(frozen=True)
class Use:
    """One claim of a container: the CDI devices of it the container gets, in the kubelet's order, each once."""

    claim: str  # the claim's UID
    devices: tuple[str, ...]
    own: bool = True  # made for the container's pod


@dataclass(frozen=True)
class Container:
    """A container of a pod, the claims of this driver it uses and what it holds through them."""

    pod: PodRef
    name: str
    uses: tuple[Use, ...]
    holding: Holding

    def __str__(self) -> str:
        return f"container {self.name} of pod {self.pod}"


def pod_ref(pod: Any) -> PodRef | None:
    """The pod's namespace, name and UID (None when one is missing)."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        return None
    found = [metadata.get(key) for key in ("namespace", "name", "uid")]
    return PodRef(*found) if all(isinstance(v, str) and v for v in found) else None


def runs_containers(pod: Any) -> bool:
    """The pod may still create containers: not Succeeded or Failed, not being deleted."""
    if not isinstance(pod, dict):
        return False
    metadata, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    return not metadata.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")


def reserved_for(claim: Any) -> tuple[PodRef, ...] | None:
    """The pods a ResourceClaim's status.reservedFor lists; None where it lists none, or anything else (then who
    uses the claim is not known)."""
    metadata, status = _dict(_dict(claim).get("metadata")), _dict(_dict(claim).get("status"))
    namespace = metadata.get("namespace")
    pods = []
    for consumer in _dicts(status.get("reservedFor")):
        name, uid = consumer.get("name"), consumer.get("uid")
        if consumer.get("resource") != "pods" or consumer.get("apiGroup") or not isinstance(namespace, str):
            return None
        if not (isinstance(name, str) and isinstance(uid, str) and name and uid):
            return None
        pods.append(PodRef(namespace, name, uid))
    return tuple(pods) or None  # the kubelet prepares a claim only for a pod it is reserved for


def used_claims(pod: Any) -> list[ClaimUse]:
    """The claims the pod uses, by name (those it makes from templates once they are made)."""
    entries, extended = _entries(pod)
    uses = {name: ClaimUse(name, own) for name, own in entries.values() if name is not None}
    if extended is not None:
        uses[extended[0]] = ClaimUse(extended[0], True)
    return list(uses.values())


def containers_of(pod: Any, prepared: Mapping[str, PreparedClaim]) -> list[Container]:
    """The pod's containers (init containers too) that use claims of this driver, as the kubelet hands them the
    claims' CDI devices. prepared: the claims this driver prepared in the pod's namespace, by name."""
    ref = pod_ref(pod)
    spec = _dict(_dict(pod).get("spec"))
    if ref is None:
        return []
    entries, extended = _entries(pod)
    found = []
    for container in [*_dicts(spec.get("initContainers")), *_dicts(spec.get("containers"))]:
        requests: dict[str, list[str]] = {}  # claim name -> the requests used ("" whole), as the kubelet collects
        by_entry: dict[str, list[str]] = {}
        for reference in _dicts(_dict(container.get("resources")).get("claims")):
            request = reference.get("request")
            by_entry.setdefault(str(reference.get("name")), []).append(request if isinstance(request, str) else "")
        for entry, (name, _) in entries.items():
            if entry in by_entry and name is not None:
                requests.setdefault(name, []).extend(by_entry[entry])
        if extended is not None:
            asked = _extended_requests(container)
            mapped = [str(m.get("requestName")) for m in extended[1] if _maps(m, container, asked)]
            if mapped:
                requests.setdefault(extended[0], []).extend(mapped)
        uses = []
        for name, asked_for in requests.items():
            claim = prepared.get(name)
            own = next((o for n, o in entries.values() if n == name), True)
            if claim is not None and asked_for:
                uses.append(Use(claim.ref.uid, _block(claim, asked_for), own))
        uses = [use for use in uses if use.devices]
        if uses:
            devices = [d for use in uses for d in _devices(prepared, use)]
            found.append(Container(ref, str(container.get("name")), tuple(uses), Holding.of(devices)))
    return found


def _maps(mapping: dict[str, Any], container: dict[str, Any], asked: Collection[str]) -> bool:
    return mapping.get("containerName") == container.get("name") and mapping.get("resourceName") in asked


def _extended_requests(container: dict[str, Any]) -> set[str]:
    """The extended resources the container asks for (a quantity other than zero)."""
    requests = _dict(_dict(container.get("resources")).get("requests"))
    asked = set()
    for name, value in requests.items():
        number = quantity(value) if isinstance(value, str) else None
        if number is not None and number != 0 and _extended_resource(str(name)):
            asked.add(str(name))
    return asked


def _extended_resource(name: str) -> bool:
    """IsDRAExtendedResourceName: an extended resource (a domain of its own) or a DeviceClass's implicit name."""
    if name.startswith(_IMPLICIT_CLASS):
        return True
    return "/" in name and _NATIVE not in name and not name.startswith("requests.")


def _block(claim: PreparedClaim, requests: list[str]) -> tuple[str, ...]:
    """The claim's CDI devices for these requests ("" whole), in the kubelet's order, each once."""
    names = []
    for request in requests:
        for device in claim.devices:
            if not request or request in device.request_refs:
                names.append(cdi_device_name(claim.ref.uid, device.device, device.share_id))
    return tuple(dict.fromkeys(names))


def _devices(prepared: Mapping[str, PreparedClaim], use: Use) -> Iterable[Any]:
    claim = next(c for c in prepared.values() if c.ref.uid == use.claim)
    by_name = {cdi_device_name(claim.ref.uid, d.device, d.share_id): d for d in claim.devices}
    return (by_name[name] for name in use.devices)


def _entries(pod: Any) -> tuple[dict[str, tuple[str | None, bool]], tuple[str, list[dict[str, Any]]] | None]:
    """The pod's claim entries (entry name -> (claim name, made for the pod)) and its extended-resource claim
    (name, request mappings)."""
    spec, status = _dict(_dict(pod).get("spec")), _dict(_dict(pod).get("status"))
    generated = {
        str(entry.get("name")): entry["resourceClaimName"]
        for entry in _dicts(status.get("resourceClaimStatuses"))
        if isinstance(entry.get("resourceClaimName"), str)
    }
    entries: dict[str, tuple[str | None, bool]] = {}
    for entry in _dicts(spec.get("resourceClaims")):
        name = str(entry.get("name"))
        if isinstance(entry.get("resourceClaimName"), str):
            entries[name] = (entry["resourceClaimName"], False)
        elif isinstance(entry.get("resourceClaimTemplateName"), str):
            entries[name] = (generated.get(name), True)
    extended_status = _dict(status.get("extendedResourceClaimStatus"))
    claim = extended_status.get("resourceClaimName")
    extended = (claim, _dicts(extended_status.get("requestMappings"))) if isinstance(claim, str) and claim else None
    return entries, extended


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
