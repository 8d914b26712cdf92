"""What each container is told: where the claims' CDI specs set the GPU variables, worked out from what every
container using the claims holds, so that each is told exactly its chips whatever order its claims come in.

Pure: Pods and ResourceClaims (dicts, as the API server returns them) and the prepared claims in, plain data out.

How a container gets the variables (Kubernetes 1.37, containerd 2.4, the CDI library 1.1):

- the kubelet (`pkg/kubelet/cm/dra/manager.go`, GetResources) collects, claim by claim, the requests a container
  uses: its references (`resources.claims`: a claim whole, or some of its requests, in the container's order) and,
  for the pod's extended-resource claim, the requests `status.extendedResourceClaimStatus.requestMappings` maps to
  it (where the container asks for that resource); then, for each claim in the order of a Go map, that is in no
  fixed order, and each of its requests, the CDI IDs of the devices answered for the request (a whole reference:
  every device), in the order the driver answered them (`claiminfo.go`, cdiDevicesAsList: request names matched
  exactly, which is why a subrequest is answered as its request);
- containerd (`internal/cri/opts/spec_linux.go`, WithCDI) keeps that order and drops an ID named twice;
- the CDI library (`pkg/cdi/cache.go`, InjectDevices) applies a spec's own edits before its first device's, then
  each device's, and a variable set again replaces the earlier value.

So each claim is a block of the container's devices, in a fixed order inside, in no order between blocks: a block
tells the last value set in it (the spec's own, then its devices' in order), and the container is told what the
block that comes last tells. It is told exactly its holding in every order when at least one of its blocks tells
something and every block that does tells its holding. A CDI device and a spec's own edits set one value, for
every container that gets them; `solve` chooses them claim by claim:

1. a device every container that gets it holds the same chips through sets that holding;
2. for a container still told nothing by a claim, one of its devices there that every other container getting
   it has a later device of the claim override sets its holding (the order inside a claim is fixed);
3. the spec's own edits set what every container still told nothing by the claim holds, when they all agree.

Where that leaves a container told the wrong chips or nothing, no values can do better (a container that
references a claim whole beside containers that each reference one of its requests, for one): the log says
which container, what it holds and what it is told.

Who uses a claim: one made from a template of the pod, or the pod's extended-resource claim, the pod's containers
(they never change); one made on its own (`resourceClaimName`), the containers of the pods its
`status.reservedFor` lists when the driver looks. The kubelet prepares a claim once: a pod that starts using an
already prepared claim later is told what the claim's CDI devices were written for.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ix_device_plugin.dra.claimspec import (
    ClaimEnv,
    Holding,
    Relay,
    cdi_device_name,
    claim_env,
    claim_relay,
    relay_device_name,
)
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


@dataclass(frozen=True)
class Told:
    """Where each claim's spec sets the variables (by claim UID), and what could not be told exactly."""

    envs: Mapping[str, ClaimEnv]
    warnings: tuple[str, ...] = field(default=())


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


# ---- choosing the values --------------------------------------------------------------------------------


SEARCH_LIMIT = 4096  # assignments tried when the rules leave a container told wrongly or nothing


def solve(
    containers: Iterable[Container],
    claims: Mapping[str, PreparedClaim],
    open_claims: Collection[str],
    placeable: Collection[str] = (),
) -> Told:
    """Where each claim's spec sets the variables: open_claims (by UID) are chosen for the containers that use
    them (they are all of their users); the other claims keep what their specs set now. A claim in placeable (its
    CDI IDs not yet answered) made for its pod may get a relay (see relayed). Warnings name every container that is
    not told exactly what it holds, and every claim made on its own whose lone users would not be."""
    listed = list(containers)
    users: dict[str, list[tuple[Container, tuple[str, ...]]]] = {}
    for container in listed:
        for use in container.uses:
            users.setdefault(use.claim, []).append((container, use.devices))
    envs = {uid: replace(claim_env(claim.spec), relay=claim_relay(claim)) for uid, claim in claims.items()}
    problems = {uid: _Problem(claims[uid], users.get(uid, []), envs[uid].relay) for uid in open_claims if uid in claims}
    envs.update({uid: problem.rules() for uid, problem in problems.items()})
    if any(_not_exact(container, envs) for container in listed):
        envs.update(_searched(listed, envs, problems))
    standalone = {use.claim for container in listed for use in container.uses if not use.own}
    if any(_not_exact(container, envs) for container in listed):
        envs.update(_relayed(listed, envs, problems, set(placeable) - standalone))
    warnings = [warning for container in listed if (warning := _not_exact(container, envs)) is not None]
    for uid in sorted(standalone & set(problems)):
        if (warning := _later_pods(claims[uid], envs[uid])) is not None:
            warnings.append(warning)
    return Told({uid: envs[uid] for uid in problems}, tuple(warnings))


def told(env: ClaimEnv, block: Iterable[str], repeats_dropped: bool = True) -> Holding | None:
    """What a claim's block of devices tells a container: the last value set in it (the spec's own first), the
    relay before its lead's and after its tail's, where it comes first when the runtime drops a repeated ID (as
    containerd does), else where it comes last."""
    relay, names = env.relay, []
    for name in block:
        names += [relay.name, name] if relay is not None and name == relay.lead else [name]
        names += [relay.name] if relay is not None and name == relay.tail else []
    value = env.spec
    for name in dict.fromkeys(names) if repeats_dropped else names:
        device = relay.value if relay is not None and name == relay.name else env.devices.get(name)
        value = device if device is not None else value
    return value


def _relayed(
    containers: list[Container], envs: Mapping[str, ClaimEnv], problems: Mapping[str, _Problem], placeable: set[str]
) -> dict[str, ClaimEnv]:
    """Where a container is still not told exactly: a claim's relay, placed where none is (a claim in placeable),
    or its value chosen again, when that tells more containers exactly (see the module's doc)."""
    best = dict(envs)
    for uid, problem in problems.items():
        if best[uid].relay is None and uid not in placeable:
            continue
        for trial in problem.relay_trials(best[uid]):
            trials = {**best, uid: trial}
            if _score(containers, trials) > _score(containers, best) and _kept_repeats_safe(containers, trials):
                best[uid] = trial
    return {uid: best[uid] for uid in problems}


class _Problem:
    """One claim's choice: the value of each of its CDI devices and of its spec's own edits, for its containers
    (users: each container with the block of the claim it gets)."""

    def __init__(
        self, claim: PreparedClaim, users: list[tuple[Container, tuple[str, ...]]], relay: Relay | None = None
    ) -> None:
        self.claim, self.relay = claim, relay
        self.names = [cdi_device_name(claim.ref.uid, d.device, d.share_id) for d in claim.devices]
        self.targets: dict[tuple[str, ...], Holding | None] = {}  # a block -> what its containers hold (None: differ)
        self.holdings: dict[tuple[str, ...], list[Holding]] = {}
        for container, block in users:
            held = self.targets.get(block, container.holding)
            self.targets[block] = held if held is not None and held.key == container.holding.key else None
            self.holdings.setdefault(block, []).append(container.holding)
        self.fixed: dict[str, Holding] = {}  # devices whose value no choice improves on
        self.open: list[str] = []
        for name in self.names:
            blocks = [block for block in self.targets if name in block]
            wanted = {held.key if (held := self.targets[block]) is not None else None for block in blocks}
            if not blocks:  # no known container gets it: what a lone reference to its request holds
                self.fixed[name] = _lone(claim, name)
            elif len(wanted) == 1 and None not in wanted:  # right for every container that gets it (rule 1)
                self.fixed[name] = next(held for block in blocks if (held := self.targets[block]) is not None)
            else:
                self.open.append(name)

    def rules(self) -> ClaimEnv:
        """Rules 1 to 3 (see the module's doc): every block ends on its containers' holding or tells nothing."""
        values: dict[str, Holding | None] = {name: self.fixed.get(name) for name in self.names}
        changed = True
        while changed:  # rule 2: a bare block gets a device the other blocks that have it override later
            changed = False
            for block, target in self.targets.items():
                if target is None or any(values[name] is not None for name in block):
                    continue
                for name in reversed(block):
                    others = [other for other in self.targets if other != block and name in other]
                    if all(self._overridden(other, name, target, values) for other in others):
                        values[name], changed = target, True
                        break
        return ClaimEnv(self._spec(values), values, self.relay)

    def relay_trials(self, env: ClaimEnv) -> Iterator[ClaimEnv]:
        """env with a relay (where it has one, the same lead and tail) and a value for it and for its tail: a
        container whose block runs from lead to tail is told tail's value, one given tail without lead the
        relay's."""
        placements = [(env.relay.lead, env.relay.tail)] if env.relay is not None else []
        placements += [(b[0], b[-1]) for b in self.targets if env.relay is None and len(b) > 1 and b[0] != b[-1]]
        for lead, tail in dict.fromkeys(placements):
            held = self._distinct(h for block, found in self.holdings.items() if tail in block for h in found)
            for tail_value, value in itertools.product(held, held):
                relay = Relay(relay_device_name(self.claim.ref.uid), lead, tail, value)
                yield ClaimEnv(env.spec, {**env.devices, tail: tail_value}, relay)

    def choices(self) -> list[list[Holding | None]]:
        """The values worth trying for the spec's own edits, then for each open device."""
        spec: list[Holding | None] = [None, *self._distinct(h for held in self.holdings.values() for h in held)]
        per_device = [
            [None, *self._distinct(h for block, held in self.holdings.items() if name in block for h in held)]
            for name in self.open
        ]
        return [spec, *per_device]

    def env(self, chosen: Sequence[Holding | None]) -> ClaimEnv:
        """The claim's values with the spec's and the open devices' chosen."""
        values: dict[str, Holding | None] = {name: self.fixed.get(name) for name in self.names}
        values.update(zip(self.open, chosen[1:], strict=True))
        return ClaimEnv(chosen[0], values, self.relay)

    def _overridden(self, block: tuple[str, ...], name: str, target: Holding, values: Mapping[str, Any]) -> bool:
        """Setting name to target leaves what block tells its containers right."""
        held = self.targets[block]
        if held is None:
            return False
        return held.key == target.key or any(values[later] is not None for later in block[block.index(name) + 1 :])

    def _spec(self, values: Mapping[str, Holding | None]) -> Holding | None:
        """Rule 3: what the blocks no device tells hold, when they agree; the claim's chips when there is none."""
        bare = [block for block in self.targets if not any(values[name] is not None for name in block)]
        wanted = {held.key if (held := self.targets[block]) is not None else None for block in bare}
        if not bare:
            return Holding.of(self.claim.devices)  # never what a container is told; it names the claim's chips
        return self.targets[bare[0]] if len(wanted) == 1 and None not in wanted else None

    @staticmethod
    def _distinct(holdings: Iterable[Holding]) -> list[Holding]:
        return list({holding.key: holding for holding in holdings}.values())


def _searched(
    containers: list[Container], envs: Mapping[str, ClaimEnv], problems: Mapping[str, _Problem]
) -> dict[str, ClaimEnv]:
    """Where the rules leave a container told wrongly or nothing: the best of every assignment of the open values
    (most containers told exactly, then fewest told nothing, then fewest told a chip they do not hold; the rules'
    own on a tie), when there are at most SEARCH_LIMIT; else the rules'."""
    choices = {uid: problem.choices() for uid, problem in problems.items()}
    count = 1
    for options in choices.values():
        for values in options:
            count *= len(values)
    best = {uid: envs[uid] for uid in problems}
    if count > SEARCH_LIMIT:
        return best
    best_score = _score(containers, envs)
    for picked in itertools.product(*(itertools.product(*options) for options in choices.values())):
        trial = {**envs, **{uid: problems[uid].env(chosen) for uid, chosen in zip(choices, picked, strict=True)}}
        score = _score(containers, trial)
        if score > best_score:
            best_score, best = score, {uid: trial[uid] for uid in problems}
    return best


def _score(containers: list[Container], envs: Mapping[str, ClaimEnv]) -> tuple[int, int, int]:
    exact = nothing = false = 0
    for container in containers:
        values = {v.key: v for use in container.uses if (v := told(envs[use.claim], use.devices)) is not None}
        exact += list(values) == [container.holding.key]
        nothing += not values
        false += any(not set(v.visible) <= set(container.holding.visible) for v in values.values())
    return exact, -nothing, -false


def _kept_repeats_safe(containers: list[Container], envs: Mapping[str, ClaimEnv]) -> bool:
    """Under a runtime that keeps a repeated CDI ID, every container is still told something and no chip it does
    not hold."""
    for container in containers:
        values = [told(envs[use.claim], use.devices, repeats_dropped=False) for use in container.uses]
        held = set(container.holding.visible)
        if all(v is None for v in values) or any(v is not None and not set(v.visible) <= held for v in values):
            return False
    return True


def _lone(claim: PreparedClaim, name: str) -> Holding:
    """What a container referencing the requests of the device alone holds."""
    device = next(d for d in claim.devices if cdi_device_name(claim.ref.uid, d.device, d.share_id) == name)
    return Holding.of(d for d in claim.devices if set(d.request_refs) & set(device.request_refs))


def _not_exact(container: Container, envs: Mapping[str, ClaimEnv]) -> str | None:
    """Why the container is not told exactly what it holds in every order of its claims, or None."""
    values = [told(envs[use.claim], use.devices) for use in container.uses if use.claim in envs]
    seen = list({value.key: value for value in values if value is not None}.values())
    if len(seen) == 1 and seen[0].key == container.holding.key:
        return None
    if not seen:
        said = "nothing (no GPU variable)"
    elif len(seen) == 1:
        said = str(seen[0])
    else:
        said = " or ".join(str(value) for value in seen) + ", as the runtime takes its claims in no fixed order"
    return (
        f"{container} holds {container.holding} but its claims' CDI devices tell it {said}: the containers that "
        "share its devices hold other chips, and no value every one of them gets is right for all"
    )


def _later_pods(claim: PreparedClaim, env: ClaimEnv) -> str | None:
    """For a claim made on its own: what a pod that starts using it later (and alone, whole) would be told, when
    that is not the claim's chips."""
    names = tuple(cdi_device_name(claim.ref.uid, d.device, d.share_id) for d in claim.devices)
    value, own = told(env, names), Holding.of(claim.devices)
    if value is not None and value.key == own.key:
        return None
    return (
        f"claim {claim.ref} is made on its own and its CDI devices are written for the containers that use it now: "
        f"a pod that starts using it later on this node, alone and whole, is told {value or 'nothing'} instead of "
        f"{own} (the kubelet prepares a claim once)"
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
