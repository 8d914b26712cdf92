"""What each container is told of its chips through the claims' CDI specs.

Where the claims' CDI specs set the GPU variables, worked out from what every container using the claims holds
(claimusers.py), so that each is told exactly its chips whatever order its claims come in.

Pure: the containers and the prepared claims in, plain data out. Besides the kubelet's lists (claimusers.py):

- containerd (`internal/cri/opts/spec_linux.go`, WithCDI) keeps the kubelet's order and drops an ID named twice
  (its first place stays);
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

Where that leaves a container told the wrong chips or nothing, the values still open are searched. One shape no
values can tell: an init container reusing the requests of the containers after it (iluvatar.com/gpu through DRA)
gets their devices one block after the other, so it ends on the last one's devices and is told what that one
holds. A claim whose CDI IDs are being answered may then get a relay (claimspec.Relay): env-only devices answered
after the first reused device's own ID and after the last's; the init container keeps the relay's first place and
is told the last device's value (all it holds), the last container gets the relay after its device and is told its
value (its own chips), the first container the value of the relay's second device (its own chips). A relay is
placed only where, under a runtime that keeps a repeated ID, every container is still told something and no chip
it does not hold. What no choice tells exactly (a container that references a claim whole beside containers that
each reference one of its requests, for one) the log names: which container, what it holds and what it is told.
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
    relay_device_names,
)
from ix_device_plugin.dra.claimusers import Container
from ix_device_plugin.dra.prepared import PreparedClaim


@dataclass(frozen=True)
class Told:
    """Where each claim's spec sets the variables (by claim UID), and what could not be told exactly."""

    envs: Mapping[str, ClaimEnv]
    warnings: tuple[str, ...] = field(default=())


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
    relay's devices after its lead's and its tail's (claimspec.Relay), where they come first when the runtime drops
    a repeated ID (as containerd does), else where they come last."""
    relay, names = env.relay, []
    for name in block:
        names.append(name)
        names += [relay.name, relay.first] if relay is not None and name == relay.lead else []
        names += [relay.name] if relay is not None and name == relay.tail else []
    relayed = {relay.name: relay.value, relay.first: relay.first_value} if relay is not None else {}
    value = env.spec
    for name in dict.fromkeys(names) if repeats_dropped else names:
        device = relayed.get(name) or env.devices.get(name)
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
        """env with a relay (where it has one, the same lead and tail) and values for its devices and for tail: a
        container whose block runs from lead to tail is told tail's value, one given tail without lead the
        relay's, one given lead the relay's first."""
        placements = [(env.relay.lead, env.relay.tail)] if env.relay is not None else []
        placements += [(b[0], b[-1]) for b in self.targets if env.relay is None and len(b) > 1 and b[0] != b[-1]]
        name, first = relay_device_names(self.claim.ref.uid)
        for lead, tail in dict.fromkeys(placements):
            at_tail = self._distinct(h for block, found in self.holdings.items() if tail in block for h in found)
            at_lead = self._distinct(h for block, found in self.holdings.items() if lead in block for h in found)
            for tail_value, value, first_value in itertools.product(at_tail, at_tail, at_lead):
                relay = Relay(name, first, lead, tail, value, first_value)
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
