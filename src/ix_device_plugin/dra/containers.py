"""What each container of a pod holds of this driver's claims, so that every claim's CDI spec can name all of it.

Pure: the Pod (a dict, as the API server returns it) and the claims prepared already in, plain data out.

CDI cannot merge a variable that several specs set: the CDI library appends every spec's and device's edits and a
later value of a name replaces an earlier one, in whatever order the runtime lists the container's devices. A
container with several claims is told all its chips only when each of its CDI devices sets the variables to the
container's whole holding, so each device must be given one value that is right for every container that gets
it. That is known for the pod's own claims (made from its ResourceClaimTemplates, for it alone, and referenced
only by its containers, which never change): a device gets its containers' holding when they all hold the same.
A ResourceClaim made on its own can be referenced by pods not started yet, whose containers' holdings nobody
knows: its devices set nothing of their own, and its spec names its own chips only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.dra.claimspec import Holding, cdi_device_name
from ix_device_plugin.dra.prepared import PreparedClaim, PreparedDevice


@dataclass(frozen=True)
class PodRef:
    """The pod a claim was made for (its controlling owner)."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ContainerHoldings:
    """For each of the pod's own claims (by UID): its CDI device names -> the holding of the containers that get
    the device; and why a device was left out."""

    by_claim: Mapping[str, Mapping[str, Holding]]
    warnings: tuple[str, ...] = ()


def owner_pod(claim: Any) -> PodRef | None:
    """The pod a ResourceClaim was made for from a template (its controlling owner), None for any other claim."""
    metadata = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(metadata, dict):
        return None
    for owner in metadata.get("ownerReferences") or []:
        if not isinstance(owner, dict) or owner.get("controller") is not True:
            continue
        if owner.get("apiVersion") == "v1" and owner.get("kind") == "Pod":
            name, uid, namespace = owner.get("name"), owner.get("uid"), metadata.get("namespace")
            if all(isinstance(value, str) and value for value in (name, uid, namespace)):
                return PodRef(str(namespace), str(name), str(uid))
    return None


def container_holdings(pod: Any, prepared: Mapping[str, PreparedClaim]) -> ContainerHoldings:
    """What each device of the pod's own claims is to name, from its containers' references to claims.

    prepared: the claims this driver prepared in the pod's namespace, by name (other drivers' claims hold none of
    ours and are not there).
    """
    spec = pod.get("spec") if isinstance(pod, dict) else None
    status = pod.get("status") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return ContainerHoldings({})
    generated = _generated_claim_names(status if isinstance(status, dict) else {})
    entries: dict[str, tuple[str | None, bool]] = {}  # pod claim entry -> (claim name, made for this pod)
    for entry in _dicts(spec.get("resourceClaims")):
        name = entry.get("name")
        if isinstance(entry.get("resourceClaimName"), str):
            entries[str(name)] = (entry["resourceClaimName"], False)
        elif isinstance(entry.get("resourceClaimTemplateName"), str):
            entries[str(name)] = (generated.get(str(name)), True)
    users: dict[tuple[str, str], list[tuple[str, Holding]]] = {}  # (claim UID, CDI device) -> [(container, holding)]
    own: set[str] = set()
    for container in [*_dicts(spec.get("initContainers")), *_dicts(spec.get("containers"))]:
        held = _held(container, entries, prepared, own)
        holding = Holding.of(device for _, device in held)
        for claim, device in held:
            key = (claim.ref.uid, cdi_device_name(claim.ref.uid, device.device, device.share_id))
            users.setdefault(key, []).append((str(container.get("name")), holding))
    by_claim: dict[str, dict[str, Holding]] = {}
    warnings: list[str] = []
    for (uid, device), seen in users.items():
        if uid not in own:
            continue
        if len({(frozenset(h.visible), frozenset(h.replicas)) for _, h in seen}) == 1:  # the order is no matter
            by_claim.setdefault(uid, {})[device] = seen[0][1]
            continue
        shown = "; ".join(f"{container}: {','.join(holding.visible)}" for container, holding in seen)
        warnings.append(
            f"CDI device {device}: the containers that get it hold different chips ({shown}): it names its own "
            "claim's chips only, so one of these containers may not see all of its chips in IX_VISIBLE_DEVICES"
        )
    return ContainerHoldings(by_claim, tuple(warnings))


def _held(
    container: dict[str, Any],
    entries: Mapping[str, tuple[str | None, bool]],
    prepared: Mapping[str, PreparedClaim],
    own: set[str],
) -> list[tuple[PreparedClaim, PreparedDevice]]:
    """The devices of this driver the container gets, claim by claim, as the kubelet hands them over."""
    resources = container.get("resources")
    held: list[tuple[PreparedClaim, PreparedDevice]] = []
    for reference in _dicts(resources.get("claims") if isinstance(resources, dict) else None):
        name, made_for_pod = entries.get(str(reference.get("name")), (None, False))
        claim = prepared.get(name) if name is not None else None
        if claim is None:
            continue
        if made_for_pod:
            own.add(claim.ref.uid)
        request = reference.get("request")
        for device in claim.devices:
            if not isinstance(request, str) or not request or _serves(device, request):
                held.append((claim, device))
    return held


def _serves(device: PreparedDevice, request: str) -> bool:
    """The device was allocated for this request (or one of its subrequests, `request/subrequest`)."""
    return any(name == request or name.startswith(f"{request}/") for name in device.requests)


def _generated_claim_names(status: Mapping[str, Any]) -> dict[str, str]:
    """The names of the claims made from the pod's templates, by the pod's claim entry name."""
    return {
        str(entry.get("name")): entry["resourceClaimName"]
        for entry in _dicts(status.get("resourceClaimStatuses"))
        if isinstance(entry.get("resourceClaimName"), str)
    }


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
