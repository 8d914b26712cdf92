"""What each container is told: the devices the kubelet hands it claim by claim, and the values the claims' CDI specs
set so that it is told exactly what it holds whatever order its claims come in.

Every solution is checked by simulating what the CDI library does with the kubelet's list, in every order of the
container's claims (here, not with the code under test): the spec's own edits at a claim's first device, then each
device's, the last value set winning.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.claimspec import (
    ClaimEnv,
    Holding,
    Relay,
    cdi_device_name,
    claim_env,
    claim_from_spec,
    claim_relay,
    claim_spec,
    record_device_name,
    with_env,
    with_relay_ids,
)
from ix_device_plugin.dra.claimusers import (
    ClaimUse,
    Container,
    PodRef,
    containers_of,
    reserved_for,
    runs_containers,
    used_claims,
)
from ix_device_plugin.dra.containers import solve
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import slice_content
from ix_device_plugin.hardware.simulated import parse_spec

POOL = "node-a"
POD = PodRef("default", "p", "pod-uid")


def claim(name: str, *devices: tuple[str, str, str]) -> PreparedClaim:
    """A prepared claim of devices (device name, chip UUID, request), its spec as the prepare writes it."""
    uid = f"uid-{name}"
    prepared = tuple(
        PreparedDevice((request,), POOL, device, uuid, (f"gpu.iluvatar.com/claim={uid}-{device}",))
        for device, uuid, request in devices
    )
    own = Holding.of(prepared)
    spec = {
        "devices": [{"name": cdi_device_name(uid, d.device), "containerEdits": {"deviceNodes": []}} for d in prepared],
        "containerEdits": {"env": own.env()},
    }
    return PreparedClaim(ClaimRef("default", name, uid), prepared, spec)


def pod(
    containers: Mapping[str, Sequence[str]],
    templates: Sequence[str] = (),
    init: Mapping[str, Sequence[str]] | None = None,
    extended: tuple[str, list[dict[str, str]]] | None = None,
    requests: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A pod whose containers reference claims (`claim` or `claim/request`), those in templates made for it."""
    every = [*containers.values(), *(init or {}).values()]
    names = list(dict.fromkeys(ref.split("/")[0] for refs in every for ref in refs))

    def spec_of(name: str, refs: Sequence[str]) -> dict[str, Any]:
        references = [dict(zip(("name", "request"), ref.split("/"), strict=False)) for ref in refs]
        resources: dict[str, Any] = {"claims": references}
        if requests and name in requests:
            resources["requests"] = dict(requests[name])
        return {"name": name, "resources": resources}

    spec: dict[str, Any] = {
        "containers": [spec_of(name, refs) for name, refs in containers.items()],
        "resourceClaims": [
            {"name": n, "resourceClaimTemplateName": "t"} if n in templates else {"name": n, "resourceClaimName": n}
            for n in names
        ],
    }
    if init:
        spec["initContainers"] = [spec_of(name, refs) for name, refs in init.items()]
    status: dict[str, Any] = {"resourceClaimStatuses": [{"name": n, "resourceClaimName": n} for n in templates]}
    if extended is not None:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended[0], "requestMappings": extended[1]}
    return {"metadata": {"name": POD.name, "namespace": POD.namespace, "uid": POD.uid}, "spec": spec, "status": status}


def simulate(container: Container, envs: Mapping[str, ClaimEnv], order: Sequence[int]) -> frozenset[str] | None:
    """The chips the CDI library tells the container when its claims come in this order."""
    value: Holding | None = None
    for index in order:
        use = container.uses[index]
        env = envs[use.claim]
        value = env.spec if env.spec is not None else value
        for name in use.devices:
            device = env.devices.get(name)
            value = device if device is not None else value
    return None if value is None else frozenset(value.visible)


def exact(container: Container, envs: Mapping[str, ClaimEnv]) -> bool:
    """Told exactly what it holds in every order of its claims."""
    orders = itertools.permutations(range(len(container.uses)))
    return all(simulate(container, envs, order) == frozenset(container.holding.visible) for order in orders)


def solved(shape: dict[str, Any], claims: Sequence[PreparedClaim]) -> tuple[list[Container], Any]:
    by_name = {c.ref.name: c for c in claims}
    containers = containers_of(shape, by_name)
    return containers, solve(containers, {c.ref.uid: c for c in claims}, [c.ref.uid for c in claims])


def by_name(containers: Sequence[Container]) -> dict[str, Container]:
    return {c.name: c for c in containers}


# ------------------------------------------------------------------ what the kubelet hands each container

TWO = claim("t", ("gpu-0", "U0", "first/large"), ("gpu-1", "U1", "second"), ("gpu-2", "U2", "first/large"))


def test_a_whole_reference_gets_every_device_and_a_request_its_own_with_subrequests_stripped() -> None:
    shape = pod({"whole": ["t"], "first": ["t/first"], "both": ["t/second", "t/first"]}, ["t"])
    found = by_name(containers_of(shape, {"t": TWO}))
    names = [cdi_device_name("uid-t", d) for d in ("gpu-0", "gpu-1", "gpu-2")]
    assert [u.devices for u in found["whole"].uses] == [tuple(names)]
    assert [u.devices for u in found["first"].uses] == [(names[0], names[2])]  # `first` is `first/large`'s request
    assert [u.devices for u in found["both"].uses] == [(names[1], names[0], names[2])]  # the references' order
    assert found["first"].holding.visible == ("U0", "U2") and found["first"].pod == POD


def test_the_extended_resource_claim_goes_to_the_containers_its_mappings_name_where_they_ask_for_it() -> None:
    ext = claim("ext", ("gpu-0", "U0", "container-0-request-0"), ("gpu-1", "U1", "container-1-request-0"))
    mappings = [
        {"containerName": "sidecar", "resourceName": "iluvatar.com/gpu", "requestName": "container-0-request-0"},
        {"containerName": "main", "resourceName": "iluvatar.com/gpu", "requestName": "container-1-request-0"},
        {"containerName": "zero", "resourceName": "iluvatar.com/gpu", "requestName": "container-1-request-0"},
    ]
    shape = pod(
        {"main": [], "zero": []},
        init={"sidecar": []},
        extended=("ext", mappings),
        requests={"main": {"iluvatar.com/gpu": "1"}, "sidecar": {"iluvatar.com/gpu": "1"}, "zero": {"cpu": "1"}},
    )
    found = by_name(containers_of(shape, {"ext": ext}))
    assert sorted(found) == ["main", "sidecar"]  # zero does not ask for iluvatar.com/gpu: the kubelet skips it
    assert found["sidecar"].holding.visible == ("U0",) and found["main"].holding.visible == ("U1",)
    assert used_claims(shape) == [ClaimUse("ext", True)]
    told = solve(found.values(), {ext.ref.uid: ext}, [ext.ref.uid])
    assert all(exact(c, told.envs) for c in found.values()) and told.warnings == ()


def test_init_containers_count_and_other_drivers_claims_and_unknown_shapes_are_skipped() -> None:
    a = claim("a", ("gpu-0", "U0", "gpu"))
    shape = pod({"main": ["a", "other"]}, ["a", "other"], init={"setup": ["a"]})
    assert [c.name for c in containers_of(shape, {"a": a})] == ["setup", "main"]
    assert used_claims(shape) == [ClaimUse("a", True), ClaimUse("other", True)]
    for odd in (None, {}, {"metadata": {}}, {"metadata": POD.__dict__, "spec": {"containers": "x"}}):
        assert containers_of(odd, {"a": a}) == []


def test_reserved_for_names_the_pods_or_says_it_cannot_tell() -> None:
    pods = [{"resource": "pods", "name": "p", "uid": "u"}, {"resource": "pods", "name": "q", "uid": "v"}]
    made = {"metadata": {"namespace": "ns"}, "status": {"reservedFor": pods}}
    assert reserved_for(made) == (PodRef("ns", "p", "u"), PodRef("ns", "q", "v"))
    group = {"resource": "podgroups", "apiGroup": "scheduling.k8s.io", "name": "g", "uid": "w"}
    for odd in ({"status": {"reservedFor": [*pods, group]}, "metadata": {"namespace": "ns"}}, {}, "x", {"status": {}}):
        assert reserved_for(odd) is None


def test_a_pod_done_or_being_deleted_creates_no_more_containers() -> None:
    assert runs_containers({"status": {"phase": "Running"}}) and runs_containers({"metadata": {}})
    assert not runs_containers({"status": {"phase": "Succeeded"}})
    assert not runs_containers({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})


# ------------------------------------------------------------------ the values


def test_two_claims_in_one_container_both_tell_the_whole_holding() -> None:
    a, b = claim("a", ("gpu-0", "U0", "gpu")), claim("b", ("gpu-2", "U2", "gpu"), ("gpu-3", "U3", "gpu"))
    containers, told = solved(pod({"main": ["a", "b"]}, ["a", "b"]), [a, b])
    assert exact(containers[0], told.envs) and told.warnings == ()
    assert told.envs[a.ref.uid].devices[cdi_device_name(a.ref.uid, "gpu-0")].visible == ("U0", "U2", "U3")


def test_a_claim_made_on_its_own_beside_the_pods_own_claims_in_two_containers() -> None:
    """The issue's shape (upstream's 'must map configs and devices to the right containers'): a claim made on its
    own (chip 0) in both containers, one with a claim of chip 1, the other with one request (chip 3) of a claim
    of chips 2 and 3. Each is told exactly its chips in every order; later pods of the shared claim are named."""
    shared = claim("all", ("gpu-0", "U0", "gpu"))
    first = claim("c0", ("gpu-1", "U1", "gpu"))
    second = claim("c1", ("gpu-2", "U2", "req0"), ("gpu-3", "U3", "req1"))
    for templates in ([], ["c0"], ["c0", "c1"]):
        shape = pod({"container0": ["all", "c0"], "container1": ["all", "c1/req1"]}, templates)
        containers, told = solved(shape, [shared, first, second])
        found = by_name(containers)
        assert found["container0"].holding.visible == ("U0", "U1")
        assert found["container1"].holding.visible == ("U0", "U3")
        assert all(exact(c, told.envs) for c in containers), told
        assert [w for w in told.warnings if "made on its own" in w and "default/all" in w], told.warnings
        assert not [w for w in told.warnings if "holds" in w], told.warnings


def test_several_requests_of_a_claim_to_different_containers_and_a_spec_that_tells_the_rest() -> None:
    """One container takes both requests of a claim, the other one of them beside a claim of its own. When the
    shared device comes last in the first container's list it sets nothing (the other request's device tells the
    first container, the spec's own edits the second); when it comes first, it tells the second container and the
    device after it the first."""
    pair = claim("pair", ("gpu-0", "U0", "r0"), ("gpu-1", "U1", "r1"))
    own = claim("z", ("gpu-3", "U3", "gpu"))
    shared = cdi_device_name(pair.ref.uid, "gpu-1")
    for refs, told_by_shared in ((["pair/r0", "pair/r1"], None), (["pair/r1", "pair/r0"], ("U1", "U3"))):
        containers, told = solved(pod({"a": refs, "b": ["pair/r1", "z"]}, ["pair", "z"]), [pair, own])
        assert all(exact(c, told.envs) for c in containers) and told.warnings == (), told
        env = told.envs[pair.ref.uid]
        assert (env.devices[shared].visible if env.devices[shared] else None) == told_by_shared
        assert env.spec is not None and env.spec.visible == (("U1", "U3") if told_by_shared is None else ("U0", "U1"))


def test_a_device_the_others_override_later_tells_a_container_that_has_only_it() -> None:
    """a takes the claim whole (gpu-0 then gpu-1), b only gpu-0 beside a claim of its own: gpu-0 tells b, as
    gpu-1 comes after it in a's list and tells a."""
    two = claim("two", ("gpu-0", "U0", "r0"), ("gpu-1", "U1", "r1"))
    own = claim("z", ("gpu-3", "U3", "gpu"))
    containers, told = solved(pod({"a": ["two"], "b": ["two/r0", "z"]}, ["two", "z"]), [two, own])
    env = told.envs[two.ref.uid]
    assert env.devices[cdi_device_name(two.ref.uid, "gpu-0")].visible == ("U0", "U3")
    assert env.devices[cdi_device_name(two.ref.uid, "gpu-1")].visible == ("U0", "U1")
    assert all(exact(c, told.envs) for c in containers) and told.warnings == ()


def test_a_whole_reference_beside_one_per_request_cannot_all_be_told_the_best_is_and_the_rest_named() -> None:
    """No values tell all three: the whole claim's last device is the only one the second request's container
    gets. Two are told exactly, the third a part of what it holds (never nothing: a runtime that reads the
    variable may then give it every GPU; never a chip it does not hold), and the warning names it."""
    two = claim("t", ("gpu-0", "U0", "r0"), ("gpu-1", "U1", "r1"))
    containers, told = solved(pod({"all": ["t"], "one": ["t/r0"], "other": ["t/r1"]}, ["t"]), [two])
    wrong = [c for c in containers if not exact(c, told.envs)]
    assert [c.name for c in wrong] == ["all"] and [w.split()[1] for w in told.warnings] == ["all"]
    assert "holds U0,U1 but its claims' CDI devices tell it U1:" in told.warnings[0]


def test_a_container_whose_only_claim_another_container_shares_with_more_is_told_what_it_holds() -> None:
    """main holds a and b, side b alone: b's devices cannot tell both. Both told exactly is impossible; side is
    told b's chips (rather than nothing), main is named: b's block may come last and tell it b's chips only."""
    a, b = claim("a", ("gpu-0", "U0", "gpu")), claim("b", ("gpu-2", "U2", "gpu"), ("gpu-3", "U3", "gpu"))
    containers, told = solved(pod({"main": ["a", "b"], "side": ["b"]}, ["a", "b"]), [a, b])
    found = by_name(containers)
    assert exact(found["side"], told.envs) and not exact(found["main"], told.envs)
    assert [w.split()[1] for w in told.warnings] == ["main"] and "U0,U2,U3 or U2,U3" in told.warnings[0]


def test_two_blocks_that_need_each_others_device_at_once_are_both_told() -> None:
    """One container references the requests r0 then r1 of a claim, another the claim whole (r1's device first)
    beside a claim of its own: each block ends on a device the other block overrides; set both at once."""
    two = claim("c0", ("gpu-0", "U0", "r1"), ("gpu-1", "U1", "r0"))
    own = claim("c1", ("gpu-2", "U2", "r0"), ("gpu-3", "U3", "r1"))
    containers, told = solved(pod({"k0": ["c0/r0", "c0/r1"], "k1": ["c1", "c0"]}, ["c0", "c1"]), [two, own])
    assert all(exact(c, told.envs) for c in containers) and told.warnings == ()


def test_a_claim_no_one_can_be_asked_about_keeps_what_it_sets_and_a_mix_with_it_is_named() -> None:
    kept, new = claim("kept", ("gpu-0", "U0", "gpu")), claim("new", ("gpu-1", "U1", "gpu"))
    containers = containers_of(pod({"main": ["kept", "new"]}, ["new"]), {"kept": kept, "new": new})
    told = solve(containers, {kept.ref.uid: kept, new.ref.uid: new}, [new.ref.uid])
    assert set(told.envs) == {new.ref.uid}  # kept's spec stays: it names its own chip, main is told one or the other
    (warning,) = told.warnings
    assert "holds U0,U1 but its claims' CDI devices tell it U0 or U0,U1" in warning


def test_a_claim_no_container_uses_names_its_chips() -> None:
    lone = claim("lone", ("gpu-0", "U0", "r0"), ("gpu-1", "U1", "r1"))
    told = solve([], {lone.ref.uid: lone}, [lone.ref.uid])
    env = told.envs[lone.ref.uid]
    assert env.spec is not None and env.spec.visible == ("U0", "U1")
    assert [h.visible for h in env.devices.values() if h is not None] == [("U0",), ("U1",)]


@pytest.mark.parametrize("seed", range(300))
def test_whatever_the_shape_a_container_not_named_in_a_warning_is_told_exactly_in_every_order(seed: int) -> None:
    """Random pods of claims (made for the pod or on their own) with one or two requests, referenced whole or by
    request by two to four containers: a container is told exactly what it holds in every order of its claims,
    or a warning names it, and then some order does tell it otherwise."""
    rng = random.Random(seed)
    chips = iter(range(100))
    claims = []
    for index in range(rng.randint(1, 3)):
        devices = [(f"gpu-{n}", f"U{n}", rng.choice(["r0", "r1"])) for n in itertools.islice(chips, rng.randint(1, 3))]
        claims.append(claim(f"c{index}", *devices))
    refs = [c.ref.name for c in claims] + [f"{c.ref.name}/{r}" for c in claims for r in ("r0", "r1")]
    shape: dict[str, list[str]] = {}
    for index in range(rng.randint(2, 4)):
        picked = rng.sample(refs, rng.randint(1, 3))
        whole = {ref for ref in picked if "/" not in ref}
        shape[f"k{index}"] = [ref for ref in picked if ref.split("/")[0] not in whole or "/" not in ref]
    templates = [c.ref.name for c in claims if rng.random() < 0.5]
    containers, told = solved(pod(shape, templates), claims)
    warned = {w.split()[1] for w in told.warnings if " holds " in w}
    for container in containers:
        assert exact(container, told.envs) == (container.name not in warned), (shape, told)


# ------------------------------------------------------------------ init containers reusing the later containers' chips

GPU = "iluvatar.com/gpu"


def answered(claims: Sequence[PreparedClaim], envs: Mapping[str, ClaimEnv]) -> dict[str, PreparedClaim]:
    """The claims as the driver writes their specs and answers their CDI IDs once told envs, by UID."""
    found = {}
    for claim in claims:
        env = envs.get(claim.ref.uid)
        if env is not None:
            claim = with_relay_ids(dataclasses.replace(claim, spec=with_env(claim.spec, env)), env.relay)
        found[claim.ref.uid] = claim
    return found


def runtime_told(container: Container, claims: Mapping[str, PreparedClaim], drops_repeats: bool = True) -> set[str]:
    """The chips the container's IX_VISIBLE_DEVICES names, built here from the answers and specs alone: the kubelet
    lists the CDI IDs answered for each device the container gets (its claims in the order they come), containerd
    keeps the first of a repeated ID (drops_repeats), the CDI library applies a spec's own edits at its first
    device, then each device's, the last value winning. Every order of the container's claims must agree."""
    found = set()
    for order in itertools.permutations(container.uses):
        ids: list[str] = []
        for use in order:
            by_name = {cdi_device_name(use.claim, d.device, d.share_id): d for d in claims[use.claim].devices}
            ids += [i.partition("=")[2] for name in use.devices for i in by_name[name].cdi_ids]
        if drops_repeats:
            ids = list(dict.fromkeys(ids))
        env: dict[str, str] = {}
        seen: set[str] = set()
        for name in ids:
            uid = next(uid for uid in claims if name.startswith(f"{uid}-"))
            spec = claims[uid].spec
            if uid not in seen:
                seen.add(uid)
                env.update(item.partition("=")[::2] for item in spec.get("containerEdits", {}).get("env", []))
            (entry,) = [d for d in spec["devices"] if d["name"] == name]
            env.update(item.partition("=")[::2] for item in entry.get("containerEdits", {}).get("env", []))
        found.add(env.get("IX_VISIBLE_DEVICES", "(unset)"))
    assert len(found) == 1, found
    return set(found.pop().split(","))


def extended_pod(init: Mapping[str, int], containers: Mapping[str, int], mappings: list[tuple[str, str]]) -> Any:
    """A pod asking for iluvatar.com/gpu in each container (a count), served by the scheduler's claim `ext`."""
    listed = [{"containerName": c, "resourceName": GPU, "requestName": r} for c, r in mappings]
    counts = {name: {GPU: str(count)} for name, count in [*init.items(), *containers.items()]}
    return pod({name: [] for name in containers}, init={name: [] for name in init}, extended=("ext", listed),
               requests=counts)  # fmt: skip


def test_an_init_container_reusing_the_later_containers_requests_is_told_all_it_holds_and_they_theirs() -> None:
    """Upstream's shape: an init container of 2 and two containers of 1 each. The scheduler's claim has a request per
    later container and the init container reuses both (it runs before them), so its block is theirs one after the
    other and no value of a device can tell it and the second container apart. The relay can: answered before the
    first request's device and after the second's, the init container keeps it first and is told the second
    device's value (all it holds), the second container gets it last and is told its own chip. Where the runtime
    keeps a repeated ID, the init container is told the second container's chip, as without the relay."""
    ext = claim("ext", ("gpu-0", "U0", "container-1-request-0"), ("gpu-1", "U1", "container-2-request-0"))
    mappings = [("c1", "container-1-request-0"), ("c2", "container-2-request-0")]
    mappings += [("init", "container-1-request-0"), ("init", "container-2-request-0")]
    found = by_name(containers_of(extended_pod({"init": 2}, {"c1": 1, "c2": 1}, mappings), {"ext": ext}))
    told = solve(found.values(), {ext.ref.uid: ext}, [ext.ref.uid], placeable=[ext.ref.uid])
    claims = answered([ext], told.envs)
    assert told.warnings == ()
    assert [runtime_told(found[name], claims) for name in ("init", "c1", "c2")] == [{"U0", "U1"}, {"U0"}, {"U1"}]
    assert runtime_told(found["init"], claims, drops_repeats=False) == {"U1"}
    again = solve(found.values(), claims, [ext.ref.uid])  # a later call keeps the relay it was answered with
    retold = answered(list(claims.values()), again.envs)
    assert [d.cdi_ids for d in retold[ext.ref.uid].devices] == [d.cdi_ids for d in claims[ext.ref.uid].devices]
    assert [runtime_told(found[name], retold) for name in ("init", "c1", "c2")] == [{"U0", "U1"}, {"U0"}, {"U1"}]
    assert [d.cdi_ids[0] for d in retold[ext.ref.uid].devices] == [
        f"gpu.iluvatar.com/claim={ext.ref.uid}-gpu-{n}" for n in (0, 1)
    ]


def test_without_a_relay_the_init_container_is_told_part_of_what_it_holds_and_named() -> None:
    """A claim whose CDI IDs were answered already gets no relay: the init container is told the last request's
    chip (never nothing, never a chip it does not hold) and the warning names it."""
    ext = claim("ext", ("gpu-0", "U0", "container-1-request-0"), ("gpu-1", "U1", "container-2-request-0"))
    mappings = [("c1", "container-1-request-0"), ("c2", "container-2-request-0")]
    mappings += [("init", "container-1-request-0"), ("init", "container-2-request-0")]
    found = by_name(containers_of(extended_pod({"init": 2}, {"c1": 1, "c2": 1}, mappings), {"ext": ext}))
    told = solve(found.values(), {ext.ref.uid: ext}, [ext.ref.uid])
    claims = answered([ext], told.envs)
    assert [runtime_told(found[name], claims) for name in ("init", "c1", "c2")] == [{"U1"}, {"U0"}, {"U1"}]
    assert [w.split()[1] for w in told.warnings] == ["init"]


@pytest.mark.parametrize("seed", range(200))
def test_init_containers_reusing_later_requests_are_told_exactly_with_a_relay(seed: int) -> None:
    """Random pods asking for iluvatar.com/gpu, shaped as the scheduler maps them (createRequestsAndMappings: a
    request per later container and sidecar, an init container reusing the requests of the containers after it
    until it has its count, then one of its own): with a relay, every container not named in a warning is told
    exactly what it holds; where the runtime keeps a repeated ID, still something and no chip it does not hold."""
    rng = random.Random(seed)
    later = {f"c{i}": rng.randint(1, 2) for i in range(rng.randint(2, 3))}
    inits = {f"i{i}": rng.randint(1, sum(later.values()) + 1) for i in range(rng.randint(1, 2))}
    chips = iter(range(100))
    devices, mappings, requests = [], [], []
    for index, (name, count) in enumerate(later.items(), start=len(inits)):
        request = f"container-{index}-request-0"
        requests.append((request, count))
        mappings.append((name, request))
        devices += [(f"gpu-{n}", f"U{n}", request) for n in itertools.islice(chips, count)]
    own = None
    for name, count in inits.items():
        reused, total = [], 0
        for request, size in requests:
            if total >= count:
                break
            reused.append(request)
            total += size
        mappings += [(name, request) for request in reused]
        if total < count:
            own = own or ("container-0-request-0", count - total)
            own = max(own, ("container-0-request-0", count - total), key=lambda o: o[1])
            mappings.append((name, "container-0-request-0"))
    if own is not None:
        devices += [(f"gpu-{n}", f"U{n}", own[0]) for n in itertools.islice(chips, own[1])]
    ext = claim("ext", *devices)
    found = by_name(containers_of(extended_pod(inits, later, mappings), {"ext": ext}))
    told = solve(found.values(), {ext.ref.uid: ext}, [ext.ref.uid], placeable=[ext.ref.uid])
    before = solve(found.values(), {ext.ref.uid: ext}, [ext.ref.uid])
    claims, plain = answered([ext], told.envs), answered([ext], before.envs)
    warned = {w.split()[1] for w in told.warnings}
    assert len(warned) <= len({w.split()[1] for w in before.warnings}), (mappings, told)
    for name, container in found.items():
        held = set(container.holding.visible)
        assert (runtime_told(container, claims) == held) == (name not in warned), (mappings, told)
        kept = runtime_told(container, claims, drops_repeats=False)
        assert kept <= held or not runtime_told(container, plain) <= held, (name, mappings, told)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
RELAY_IDS = ["gpu.iluvatar.com/claim=uid-ext-relay_env", "gpu.iluvatar.com/claim=uid-ext-relay_first"]


@given(JSON, st.lists(st.sampled_from([*RELAY_IDS, "gpu.iluvatar.com/claim=uid-ext-gpu-0", "x"]), max_size=5), JSON)
def test_a_relay_is_read_back_from_any_spec_and_cdi_ids_or_is_none(devices: Any, ids: list[str], env: Any) -> None:
    """What the checkpoint holds is read back whatever another writer put there: a relay names devices of the
    claim and sets a value, or there is none."""
    ext = claim("ext", ("gpu-0", "U0", "r0"), ("gpu-1", "U1", "r1"))
    first, second = ext.devices
    relays = [{"name": n.partition("=")[2], "containerEdits": {"env": env}} for n in RELAY_IDS]
    spec = {"devices": [devices, *relays]}
    for edited in (dataclasses.replace(ext, spec=spec), dataclasses.replace(ext, spec={"devices": devices})):
        found = claim_relay(
            dataclasses.replace(edited, devices=(dataclasses.replace(first, cdi_ids=tuple(ids)), second))
        )
        assert found is None or {found.lead, found.tail} <= {"uid-ext-gpu-0", "uid-ext-gpu-1"}


def test_a_spec_with_a_relay_is_read_back_as_its_claim_and_keeps_the_relay() -> None:
    chip = slice_content(Inventory(boards=parse_spec("BI-V150:1"))).by_name()
    devices = [
        (PreparedDevice((f"r{n}",), POOL, f"gpu-{n}", chip[f"gpu-{n}"].uuid, ("x",)), chip[f"gpu-{n}"]) for n in (0, 1)
    ]
    spec = claim_spec("uid-a", devices, (), Path("/"))
    one, two = (Holding((d.uuid,), ()) for d, _ in devices)
    relay = Relay("uid-a-relay_env", "uid-a-relay_first", "uid-a-gpu-0", "uid-a-gpu-1", two, one)
    told = with_env(spec, ClaimEnv(None, {}, relay))
    assert with_env(told, ClaimEnv(None, {})) == told  # once written, it stays: the kubelet may hold its ID
    back = claim_from_spec("uid-a", told, POOL)
    assert [d.device for d in back.devices] == ["gpu-0", "gpu-1"]


# ------------------------------------------------------------------ the spec


def test_the_spec_sets_what_the_env_says_keeps_its_record_and_reads_back() -> None:
    chip = slice_content(Inventory(boards=parse_spec("BI-V150:1"))).by_name()["gpu-0"]
    device = PreparedDevice(("gpu",), POOL, "gpu-0", chip.uuid, ("x",))
    spec = claim_spec("uid-a", [(device, chip)], ("/dev/itrctl",), Path("/"))
    own = Holding((chip.uuid,), (chip.uuid,))
    assert claim_env(spec) == ClaimEnv(own, {"uid-a-gpu-0": None})
    assert spec["devices"][-1]["name"] == record_device_name("uid-a")
    whole = Holding((chip.uuid, "U9"), (chip.uuid, "U9"))
    told = with_env(spec, ClaimEnv(None, {"uid-a-gpu-0": whole}))
    assert claim_env(told) == ClaimEnv(None, {"uid-a-gpu-0": whole})
    assert told["containerEdits"] == {"deviceNodes": spec["containerEdits"]["deviceNodes"]}
    assert told["devices"][-1] == spec["devices"][-1]  # the record names the claim's chip, whatever is told
    back = claim_from_spec("uid-a", told, POOL)
    assert [(d.device, d.uuid) for d in back.devices] == [("gpu-0", chip.uuid)]
    assert with_env(told, claim_env(spec)) == spec
    earlier = {**spec, "devices": spec["devices"][:-1]}  # an earlier driver's spec: the spec's own edits name them
    assert [(d.device, d.uuid) for d in claim_from_spec("uid-a", earlier, POOL).devices] == [("gpu-0", chip.uuid)]
