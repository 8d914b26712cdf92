"""The soak's fault and workload schedule: a pure function of (seed, minutes, mode), so a seed replays exactly.

Nothing here touches the cluster; the runner (runner.py) carries the steps out in order, at their times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MODES = ("device-plugin", "dra")
CHIPS = 4  # the e2e node's 2 x BI-V150, chips 0..3 (minors)

RESET_XIDS = (46, 48, 61, 62, 63, 74, 94, 95, 119, 120)  # policy reset: healed by a reset once no container holds it
OPERATOR_XID = 64  # policy operator: out until an operator returns it (the Node annotation)
IGNORED_XIDS = (13, 31, 43)  # a program's fault: the chip stays in service
RESET_HEALTH_BITS = ("SYSHUB", "MC", "ECC", "Memory", "PCIE")  # cleared by the chip's next reset
COOLING_HEALTH_BIT = "OverTemp"  # policy operator, clears by itself once the chip cools

# kind -> weight; every kind has a duration (how long the fault lasts before the runner undoes or resolves it)
COMMON_KINDS = {
    "xid-reset": 5,
    "xid-ignored": 2,
    "xid-operator": 2,
    "xid-storm": 1,
    "health-reset-bit": 3,
    "health-overtemp": 2,
    "off-bus": 2,
    "agent-kill": 2,
    "agent-restart": 1,
    "rollout": 1,  # helm upgrade: the DaemonSet rolls its pods
    "rollback": 1,  # helm rollback to the revision before
    "kubelet-restart": 1,
    "ixsmi-failing": 1,
    "ixsmi-slow": 1,
    "ixsmi-hanging": 1,
    "node-health-unreadable": 1,
    "apiserver-restart": 1,
    "apiserver-slow": 1,
    "disk-full": 1,
}
# A switch of the node to the other mode and back (the node labelled as docs/dra.md "Moving a node to DRA" says,
# without the drain), drawn on a stream of its own so that a seed's other faults stay what they were.
MODE_SWITCH = "mode-switch"
SWITCH_EVERY_S = 600.0  # one switch per this much soak (at least one in a soak of SWITCH_FROM_S or more)
# Not in the end-to-end suite's one-minute replays: a switch takes 15-30 s of such a soak out of judging and starts
# two pods; e2e/tests/test_mode_switch.py runs the switch itself.
SWITCH_FROM_S = 180.0
SWITCH_EARLIEST_S = 10.0
SWITCH_S = (15.0, 30.0)  # how long the other mode acts
# The switch itself (a helm upgrade, the other mode's pod Ready) and the switch back take up to this much beyond its
# `duration`: the next switch starts only after both, or its switch back would end the first one's time away early.
SWITCH_TAKES_S = 60.0
# The reset limit's and the reset proof's faults, drawn on a stream of their own too (weight 0 in the kinds: what a
# seed found its defect with stays as it was). `chip-flapping`: one chip reports a resettable XID again each time it is
# back in service, until the agent's reset limit leaves it to an operator (limits.py). `ixsmi-lying`: a chip gets a
# resettable XID while its resets lie (ixsmi exits 0, the chip is not reset).
FLAPPING, LYING = "chip-flapping", "ixsmi-lying"
FLAPPING_EVERY_S, FLAPPING_FROM_S, FLAPPING_S = 600.0, 180.0, 100.0  # FLAPPING_S: the longest it flaps
LYING_EVERY_S, LYING_FROM_S, LYING_S = 300.0, 60.0, (5.0, 12.0)  # a lie ends before the agent's third attempt
# A lie that no reset of its chip met by its end (a container holds the chip, or the reset limit keeps it out) goes
# on until one does, this long at most: so that each lie proves the agent's distrust, in both modes.
LIE_WAIT_S = 60.0
OWN_STREAMS = (MODE_SWITCH, FLAPPING, LYING)
MODE_KINDS = {
    "device-plugin": {"config-change": 2},
    "dra": {"checkpoint-unreadable": 1, "config-change": 2},
}
# The ix-configs of both modes (DRA: draconfig.py says what each publishes, and how a change is made)
DEVICE_PLUGIN_CONFIGS = (
    {"flags": {"splitboard": True}},
    {},
    {"sharing": {"timeSlicing": {"replicas": 2}}},
    {"flags": {"splitboard": True}, "sharing": {"timeSlicing": {"replicas": 2}}},
)
# The DRA workload's shapes (e2e/soak/workload.py says what each is), a chip claim and one share twice as often as
# the others: a share shape claims what the config in force shares, so that shares are taken whenever they are on
DRA_SHAPES = ("claim-1", "claim-1", "claim-2", "claims-2", "requests-2", "board-1", "shared-claim", "admin-1")
DRA_SHAPES += ("share-1", "share-1", "shares-2", "share-pair")
FIRST_FAULT_S = 5.0
MEAN_GAP_S = 6.0  # between fault starts: faults overlap, since most last longer
MEAN_WORKLOAD_GAP_S = 4.0
MAX_PODS = 3


@dataclass(frozen=True)
class Step:
    """One thing to do at `at` seconds into the soak: a fault (kind in the kinds above) or a workload change
    (`pod-create`, `pod-delete`). `chips` are the chips it targets, `detail` the rest (XIDs, a config, a shape)."""

    at: float
    kind: str
    chips: tuple[int, ...] = ()
    duration: float = 0.0
    detail: dict[str, object] = field(default_factory=dict, compare=True, hash=False)

    @property
    def is_fault(self) -> bool:
        return not self.kind.startswith("pod-")

    def describe(self) -> str:
        return f"t+{self.at:6.1f}s {self.what()}"

    def what(self) -> str:
        chips = f" chips {','.join(map(str, self.chips))}" if self.chips else ""
        detail = "".join(f" {key}={value}" for key, value in sorted(self.detail.items()))
        lasting = f" for {self.duration:.1f}s" if self.duration else ""
        return f"{self.kind}{chips}{detail}{lasting}"


def kinds_of(mode: str) -> dict[str, int]:
    """Every kind of fault a soak in this mode draws (the mode switch's weight 0: it has its own stream)."""
    return drawn_kinds(mode) | dict.fromkeys(OWN_STREAMS, 0)


def drawn_kinds(mode: str) -> dict[str, int]:
    if mode not in MODES:
        raise ValueError(f"soak mode {mode!r}: expected one of {', '.join(MODES)}")
    return COMMON_KINDS | MODE_KINDS[mode]


def other_mode(mode: str) -> str:
    return MODES[1 - MODES.index(mode)]


def draw(seed: int, minutes: float, mode: str) -> list[Step]:
    """The steps of a soak of `minutes` in `mode` for `seed`, in time order (faults end before the soak does)."""
    kinds = drawn_kinds(mode)
    rng = random.Random(f"{seed}:{mode}")
    total = minutes * 60.0
    steps = _faults(rng, kinds, total) + _workload(random.Random(f"{seed}:{mode}:workload"), mode, total)
    steps += _switches(random.Random(f"{seed}:{mode}:switch"), mode, total)
    steps += _healing_faults(random.Random(f"{seed}:{mode}:healing"), total)
    return sorted(steps, key=lambda step: (step.at, step.kind, step.chips))


def _faults(rng: random.Random, kinds: dict[str, int], total: float) -> list[Step]:
    names, weights = list(kinds), list(kinds.values())
    steps, at = [], FIRST_FAULT_S
    unused = list(names)  # every kind once before any twice, where time allows
    rng.shuffle(unused)
    while at < total - 15:
        kind = unused.pop() if unused else rng.choices(names, weights)[0]
        steps.append(_fault(rng, kind, round(at, 1), total))
        at += rng.expovariate(1 / MEAN_GAP_S) + 1.0
    return steps


def _fault(rng: random.Random, kind: str, at: float, total: float) -> Step:
    chip = rng.randrange(CHIPS)
    duration = round(min(rng.uniform(3, 15), max(1.0, total - at - 10)), 1)
    if kind == "xid-reset":
        return Step(at, kind, (chip,), 0.0, {"xid": rng.choice(RESET_XIDS)})
    if kind == "xid-ignored":
        return Step(at, kind, (chip,), 0.0, {"xid": rng.choice(IGNORED_XIDS)})
    if kind == "xid-operator":
        return Step(at, kind, (chip,), duration, {"xid": OPERATOR_XID})
    if kind == "xid-storm":
        chips = tuple(sorted(rng.sample(range(CHIPS), rng.randint(2, CHIPS))))
        return Step(at, kind, chips, 0.0, {"xids": tuple(rng.sample(RESET_XIDS, 3))})
    if kind == "health-reset-bit":
        return Step(at, kind, (chip,), 0.0, {"bit": rng.choice(RESET_HEALTH_BITS)})
    if kind == "health-overtemp":
        return Step(at, kind, (chip,), duration, {"bit": COOLING_HEALTH_BIT})
    if kind == "off-bus":
        return Step(at, kind, (chip,), duration)
    if kind in ("ixsmi-failing", "ixsmi-slow", "ixsmi-hanging"):
        return Step(at, kind, (), duration, {"seconds": rng.choice((2, 5))} if kind == "ixsmi-slow" else {})
    if kind == "apiserver-slow":  # the server stopped for seconds: long enough for every client's request to wait
        return Step(at, kind, (), float(rng.choice((2, 4, 6))))
    if kind == "disk-full":
        return Step(at, kind, (), duration)
    if kind == "config-change":
        return Step(at, kind, (), 0.0, {"config": rng.randrange(len(DEVICE_PLUGIN_CONFIGS))})
    # agent-kill, -restart, rollout, rollback, kubelet- and apiserver-restart, node-health/checkpoint-unreadable
    return Step(at, kind)


def _switches(rng: random.Random, mode: str, total: float) -> list[Step]:
    """The node switched to the other mode and back: one switch in each SWITCH_EVERY_S of the soak, at a random time
    of its share and SWITCH_TAKES_S or more after the last one's time away, over by 15 s before the soak ends (none in
    a soak under SWITCH_FROM_S; one that cannot fit after the last is left out)."""
    latest = total - SWITCH_S[1] - 15.0
    if total < SWITCH_FROM_S or latest <= SWITCH_EARLIEST_S:
        return []
    count = max(1, int(total // SWITCH_EVERY_S))
    share = (latest - SWITCH_EARLIEST_S) / count
    steps: list[Step] = []
    for index in range(count):
        at = round(SWITCH_EARLIEST_S + share * index + rng.uniform(0, share), 1)
        duration = round(rng.uniform(*SWITCH_S), 1)
        if steps:
            at = max(at, round(steps[-1].at + steps[-1].duration + SWITCH_TAKES_S, 1))
        if at <= latest:
            steps.append(Step(at, MODE_SWITCH, (), duration, {"to": other_mode(mode)}))
    return steps


def _healing_faults(rng: random.Random, total: float) -> list[Step]:
    """The flapping chip (one in each FLAPPING_EVERY_S of a soak of FLAPPING_FROM_S or more) and the lying resets (one
    in each LYING_EVERY_S of a soak of LYING_FROM_S or more), each over by 15 s before the soak ends."""
    steps = []
    for kind, every, since, lasting in ((FLAPPING, FLAPPING_EVERY_S, FLAPPING_FROM_S, (FLAPPING_S, FLAPPING_S)),
                                        (LYING, LYING_EVERY_S, LYING_FROM_S, LYING_S)):  # fmt: skip
        latest = total - lasting[1] - 15.0
        if total < since or latest <= FIRST_FAULT_S:
            continue
        count = max(1, int(total // every))
        share = (latest - FIRST_FAULT_S) / count
        for index in range(count):
            at = round(FIRST_FAULT_S + share * index + rng.uniform(0, share), 1)
            steps.append(Step(at, kind, (rng.randrange(CHIPS),), round(rng.uniform(*lasting), 1)))
    return steps


def _workload(rng: random.Random, mode: str, total: float) -> list[Step]:
    """Pods created and deleted at random: up to MAX_PODS at once, each of a shape the mode supports."""
    steps, at, alive, serial = [], 1.0, [], 0
    while at < total - 10:
        if alive and (len(alive) >= MAX_PODS or rng.random() < 0.4):
            victim = alive.pop(rng.randrange(len(alive)))
            steps.append(Step(round(at, 1), "pod-delete", (), 0.0, {"pod": victim}))
        else:
            serial += 1
            name = f"soak-{serial}"
            alive.append(name)
            steps.append(Step(round(at, 1), "pod-create", (), 0.0, {"pod": name, "shape": _shape(rng, mode)}))
        at += rng.expovariate(1 / MEAN_WORKLOAD_GAP_S) + 0.5
    return steps


def _shape(rng: random.Random, mode: str) -> str:
    if mode == "device-plugin":
        return rng.choice(("gpus-1", "gpus-1", "gpus-2"))
    return rng.choice(DRA_SHAPES)


def kinds_used(steps: list[Step]) -> set[str]:
    return {step.kind for step in steps if step.is_fault}
