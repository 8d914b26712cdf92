"""The chaos soak's DRA parts (e2e/soak/): its configs and their live change, time-sliced shares in what a container
must show and in what must be in service, and the kubelet's Events of prepares that failed, each check reporting a
violation when the history shows one; the readers of API objects take anything without failing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.soak_modules import SOAK, imported_modules, load

checker = load("checker")
schedule = load("schedule")
draconfig = load("draconfig")
dracheck = load("dracheck")

UUIDS = ["GPU-a0", "GPU-a1", "GPU-b2", "GPU-b3"]
BOARDS = {0: {0, 1}, 1: {0, 1}, 2: {2, 3}, 3: {2, 3}}
CHIP_OF = {uuid: index for index, uuid in enumerate(UUIDS)}
SHARE_A, SHARE_B = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


def chips_of(device: str) -> set[int]:
    kind, _, minor = device.partition("-")
    return {int(minor)} if kind == "gpu" else BOARDS[int(minor)] if kind == "board" else set()


def nodes(*chips: int) -> dict[str, str]:
    return {f"/dev/iluvatar{chip}": f"1fc:{chip:x}" for chip in chips} | {"/dev/itrctl": "1fc:ff"}


def env(visible: str, replicas: str, corex_replicas: str | None = None) -> dict[str, str]:
    twin = replicas if corex_replicas is None else corex_replicas
    shown = {"IX_VISIBLE_DEVICES": visible, "ILUVATAR_COREX_VISIBLE_DEVICES": visible}
    return shown | {"IX_REPLICA_DEVICES": replicas, "ILUVATAR_COREX_REPLICA_DEVICES": twin}


def match(shown: dict[str, str], chips: frozenset[int], devices: tuple, seen_nodes: dict[str, str]) -> bool:
    invariant = checker.Invariant("devices match")
    checker.devices_match(invariant, checker.Seen(1, "p", seen_nodes, shown, (chips,), devices), UUIDS, 0x1FC, 0xFF)
    assert invariant.checks == 1
    return not invariant.violations


def test_the_dra_modules_import_nothing_of_the_agent() -> None:
    allowed = {"__future__", "re", "random", "datetime", "collections.abc", "dataclasses", "typing"}
    for name in ("dracheck", "draconfig"):
        imports = imported_modules(SOAK / f"{name}.py")
        assert imports <= allowed | {".checker", ".schedule"}, (name, imports - allowed)


def test_a_claim_allocation_gives_its_devices_and_shares() -> None:
    claims = [
        {"status": {"allocation": {"devices": {"results": [
            {"driver": "gpu.iluvatar.com", "device": "gpu-2", "shareID": SHARE_A, "consumedCapacity": {"shares": "2"}},
            {"driver": "gpu.iluvatar.com", "device": "board-0"},
            {"driver": "gpu.iluvatar.com", "device": "gpu-3", "shareID": SHARE_B},
            {"driver": "gpu.iluvatar.com", "device": "gpu-1", "shareID": SHARE_B, "adminAccess": True},
            {"driver": "other.example.com", "device": "gpu-0"},
        ]}}}},
        {"status": {}},
    ]  # fmt: skip
    assert dracheck.given(claims, "gpu.iluvatar.com", chips_of, UUIDS) == (
        checker.Given(frozenset({2}), "GPU-b2", 2, SHARE_A),
        checker.Given(frozenset({0, 1}), "GPU-a0", None, ""),
        checker.Given(frozenset({3}), "GPU-b3", 1, SHARE_B),
        checker.Given(frozenset({1}), "GPU-a1", 0, SHARE_B),
    )


nested = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
result = st.fixed_dictionaries(
    {},
    optional={
        "driver": st.just("gpu.iluvatar.com") | st.text(max_size=8),
        "device": st.sampled_from(["gpu-0", "gpu-9", "board-2", "gpu-x", "board-", ""]) | st.text(max_size=8),
        "shareID": st.just(SHARE_A) | nested,
        "consumedCapacity": st.fixed_dictionaries({}, optional={"shares": st.text(max_size=8) | nested}) | nested,
        "adminAccess": nested,
    },
)


allocated = st.builds(lambda r: {"status": {"allocation": {"devices": {"results": r}}}}, st.lists(result))


@settings(max_examples=300)
@given(st.lists(nested | allocated))
def test_any_claim_is_read_without_failing(claims: list[Any]) -> None:
    def lenient(device: str) -> set[int]:
        kind, _, minor = device.partition("-")
        return {int(minor)} if kind == "gpu" and minor.isascii() and minor.isdigit() else set()

    for device in dracheck.given(claims, "gpu.iluvatar.com", lenient, UUIDS):
        assert device.chips and max(device.chips) < len(UUIDS)
        assert device.slots is None or 0 <= device.slots < 10**6


def test_a_container_holding_shares_must_show_their_slots_in_both_replica_variables() -> None:
    share = (checker.Given(frozenset({2}), "GPU-b2", 1, SHARE_A),)
    assert match(env("GPU-b2", "GPU-b2::1"), frozenset({2}), share, nodes(2))
    assert not match(env("GPU-b2", "GPU-b2"), frozenset({2}), share, nodes(2))  # named whole
    assert not match(env("GPU-b2", "GPU-b2::0,GPU-b2::1"), frozenset({2}), share, nodes(2))  # two slots for one
    assert not match(env("GPU-b2", "GPU-b2::1", "GPU-b2::0"), frozenset({2}), share, nodes(2))  # its twin differs
    assert not match(env("GPU-b2", ""), frozenset({2}), share, nodes(2))
    two = (checker.Given(frozenset({2}), "GPU-b2", 2, SHARE_A),)
    assert match(env("GPU-b2", "GPU-b2::0,GPU-b2::1"), frozenset({2}), two, nodes(2))
    assert not match(env("GPU-b2", "GPU-b2::1,GPU-b2::1"), frozenset({2}), two, nodes(2))  # one slot twice
    board = (checker.Given(frozenset({0, 1}), "GPU-a0", 1, SHARE_A),)
    assert match(env("GPU-a0,GPU-a1", "GPU-a0::0"), frozenset({0, 1}), board, nodes(0, 1))
    assert not match(env("GPU-a0,GPU-a1", "GPU-a0::0"), frozenset({0, 1}), board, nodes(0))  # a chip's node missing
    admin = (checker.Given(frozenset({3}), "GPU-b3", 0, SHARE_B),)
    assert match(env("GPU-b3", ""), frozenset({3}), admin, nodes(3))


def test_a_container_holding_whole_devices_must_name_each_once_and_no_slot() -> None:
    whole = (checker.Given(frozenset({0, 1}), "GPU-a0"), checker.Given(frozenset({3}), "GPU-b3"))
    shown = env("GPU-a0,GPU-a1,GPU-b3", "GPU-a0,GPU-b3")
    assert match(shown, frozenset({0, 1, 3}), whole, nodes(0, 1, 3))
    assert not match(shown | {"IX_REPLICA_DEVICES": "GPU-a0,GPU-b3::0"}, frozenset({0, 1, 3}), whole, nodes(0, 1, 3))
    assert not match(env("GPU-a0,GPU-a1,GPU-b3", "GPU-a0"), frozenset({0, 1, 3}), whole, nodes(0, 1, 3))
    # the device plugin's check (no devices given) is what it was: the replica variables are not judged
    assert match(env("GPU-a0", "anything"), frozenset({0}), None, nodes(0))
    assert not match(env("GPU-a1", "GPU-a1"), frozenset({0}), None, nodes(0))


def test_two_claims_shares_of_one_device_showing_one_slot_is_a_violation() -> None:
    invariant = checker.Invariant("devices match")
    first = (checker.Given(frozenset({2}), "GPU-b2", 1, SHARE_A),)
    second = (checker.Given(frozenset({2}), "GPU-b2", 1, SHARE_B),)
    others = {"p": (first, env("GPU-b2", "GPU-b2::0"))}
    checker.slots_apart(invariant, 5, "q", second, env("GPU-b2", "GPU-b2::1"), others)
    assert (invariant.checks, invariant.violations) == (1, [])
    checker.slots_apart(invariant, 6, "r", second, env("GPU-b2", "GPU-b2::0"), others)
    assert invariant.checks == 2 and "GPU-b2::0" in invariant.violations[0][1]
    checker.slots_apart(invariant, 7, "p-b", first, env("GPU-b2", "GPU-b2::0"), others)  # one claim, two pods
    checker.slots_apart(invariant, 8, "s", second, env("GPU-b3", "GPU-b3::0"), others)  # another device
    assert invariant.checks == 2


def test_a_healthy_chip_of_a_shared_board_with_a_broken_chip_is_not_expected_in_service() -> None:
    broken = [checker.Broken(1, 0.0, None, "XID 64")]
    at = checker.BOUND_S + 5
    boards = draconfig.together(schedule.DEVICE_PLUGIN_CONFIGS[2], 4, BOARDS.__getitem__)
    assert boards == [frozenset({0, 1}), frozenset({2, 3})]
    invariant = checker.Invariant("back in service")
    sample = checker.ServiceSample(at, in_service=frozenset({2, 3}))
    checker.back_in_service(invariant, sample, 4, broken, [], together=boards)
    assert (invariant.checks, invariant.violations) == (2, [])
    checker.back_in_service(invariant, sample, 4, broken, [])  # chips held one by one: chip 0 must be in service
    assert invariant.checks == 5 and "chip 0" in invariant.violations[0][1]
    one = checker.ServiceSample(at, in_service=frozenset({2}))
    checker.back_in_service(invariant, one, 4, broken, [], None, boards)
    assert "chip 3" in invariant.violations[-1][1]


def test_the_configs_say_what_is_shared_and_the_first_config_is_drawn_for_dra_only() -> None:
    configs = schedule.DEVICE_PLUGIN_CONFIGS
    assert [draconfig.replicas(c) for c in configs] == [0, 0, 2, 2]
    assert [draconfig.share_class(c) for c in configs] == ["gpu.iluvatar.com"] * 2 + [
        "board.gpu.iluvatar.com",
        "gpu.iluvatar.com",
    ]
    assert draconfig.together(configs[3], 4, BOARDS.__getitem__) == []
    assert {draconfig.first_config(seed, "device-plugin") for seed in range(20)} == {1}
    drawn = [draconfig.first_config(seed, "dra") for seed in range(20)]
    assert drawn == [draconfig.first_config(seed, "dra") for seed in range(20)] and set(drawn) == {0, 1, 2, 3}
    assert "config-change" in schedule.kinds_of("dra")
    assert {"share-1", "shares-2", "share-pair"} <= set(schedule.DRA_SHAPES)


def event(name: str, count: Any, at: str, message: str = "m", pod: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": pod},
        "reason": "FailedPrepareDynamicResources",
        "message": message,
        "count": count,
        "lastTimestamp": at,
    }


def test_each_prepare_failure_the_kubelet_repeats_counts_once_at_its_time() -> None:
    start = 1_796_464_800.0  # 2026-12-05T10:00:00Z
    counted: dict[str, int] = {}
    events = [event("e1", 1, "2026-12-05T10:00:07Z"), {"reason": "Started"}, "junk"]
    first = dracheck.new_failures(events, start, 99.0, counted)
    assert [(f.at, f.pod) for f in first] == [(7.0, "p")]
    assert dracheck.new_failures(events, start, 99.0, counted) == []
    again = [event("e1", 3, "2026-12-05T10:00:12Z"), event("e2", None, "not a time", pod="q")]
    assert [(f.at, f.pod) for f in dracheck.new_failures(again, start, 99.0, counted)] == [(12.0, "p"), (99.0, "q")]


@settings(max_examples=300)
@given(st.lists(nested | st.builds(event, st.text(max_size=4), nested, st.text(max_size=30) | nested, nested, nested)))
def test_any_event_list_is_read_without_failing(events: list[Any]) -> None:
    for failure in dracheck.new_failures(events, 0.0, 1.0, {}):
        assert isinstance(failure.message, str) and isinstance(failure.pod, str)


def test_a_prepare_failure_is_rightly_only_while_the_agent_is_away_or_for_a_chip_broken_then() -> None:
    invariant = checker.Invariant("no admission refused by the agent")
    quiet = [(20.0, 30.0)]
    broken = [checker.Broken(2, 50.0, 60.0, "XID 48")]
    held_out = (
        "prepare dynamic resources: NodePrepareResources failed for ResourceClaim c: claim ns/c (uid u): device gpu-2 "
        "(GPU-b2) is reserved for a GPU reset (self-healing clears an error on it); the kubelet tries again"
    )
    gone = "claim ns/c: device gpu-2 (GPU-b2) cannot be given to a container now: not present; the kubelet tries again"
    out = (
        "claim ns/c: device gpu-2 (GPU-b2) is out of service: XID 48 (self-healing: resetting); its allocation does "
        "not tolerate the taint gpu.iluvatar.com/unhealthy=XID-48:NoSchedule, so it is prepared once the chip is back "
        "in service (healed by a reset or returned by an operator); the kubelet tries again"
    )
    failures = [
        dracheck.PrepareFailure(25.0, "restart", "NodePrepareResources: rpc error: code = Unavailable"),
        dracheck.PrepareFailure(38.0, "registering", "DRA driver gpu.iluvatar.com is not registered"),
        dracheck.PrepareFailure(55.0, "reserved", held_out),
        dracheck.PrepareFailure(58.0, "gone", gone),
        dracheck.PrepareFailure(26.0, "disk", "cannot write .../metadata.json: No space left on device"),
        dracheck.PrepareFailure(80.0, "late", "DRA driver gpu.iluvatar.com is not registered"),
        dracheck.PrepareFailure(25.0, "held", "claim ns/c: device gpu-2 (GPU-b2) is prepared for claim ns/d"),
        dracheck.PrepareFailure(90.0, "not-broken", held_out),
        dracheck.PrepareFailure(57.0, "out", out),
        dracheck.PrepareFailure(95.0, "out-not-broken", out),
    ]
    dracheck.prepare_failures(invariant, failures, quiet, broken, CHIP_OF)
    assert invariant.checks == 10
    assert [what.split(":")[0] for _, what in invariant.violations] == ["late", "held", "not-broken", "out-not-broken"]


def test_a_claim_the_config_in_force_cannot_serve_is_refused_rightly_only_if_allocated_before_the_change() -> None:
    invariant = checker.Invariant("no admission refused by the agent")
    unshared = "claim ns/c: device gpu-0 was allocated as a share, but it is not shared on this node now (...)"
    failures = [
        dracheck.PrepareFailure(100.0, "before", unshared),
        dracheck.PrepareFailure(100.0, "after", unshared),
        dracheck.PrepareFailure(100.0, "gone", "claim ns/c: device 'board-0' is not on this node (pool n)"),
        dracheck.PrepareFailure(100.0, "other", "claim ns/c: GpuConfig sharing.shares is 2, but gpu-0 was ..."),
        dracheck.PrepareFailure(
            100.0, "whole", "claim ns/w-c0: device gpu-1 (GPU-a1) is prepared for claim ns/held-c0"
        ),
        dracheck.PrepareFailure(
            100.0, "whole2", "claim ns/w-c0: device gpu-1 (GPU-a1) is prepared for claim ns/new-c1"
        ),
    ]
    allocated = {"before": 40.0, "after": 60.0, "gone": 10.0, "other": 10.0, "whole": 70.0, "whole2": 70.0}
    allocated |= {"held": 30.0, "new": 65.0}  # held: a share allocated before the change
    dracheck.prepare_failures(invariant, failures, [], [], CHIP_OF, [(48.0, 50.0)], allocated)
    assert [what.split(":")[0] for _, what in invariant.violations] == ["after", "other", "whole2"]


def test_a_claim_allocated_before_a_change_is_in_force_may_be_refused_from_the_change_s_beginning() -> None:
    """Seed 621430: a share claim made at 1110.8 (the soak never saw its allocation: a rollback to a config without
    sharing held the soak up), refused at 1125.2 by the driver the rollback started, before the soak saw the config
    in force (1125.4). Seed 902624: a claim refused at 1484.0 because a share allocated before a config change
    (1481.3 - 1490.9) holds its chip. Neither is the agent's doing; a claim made after the change was in force, or
    refused before it began, is."""
    invariant = checker.Invariant("no admission refused by the agent")
    unshared = "claim ns/soak-124-c0: device board-2 was allocated as a share, but it is not shared on this node now"
    held = "claim ns/soak-166-c0: device gpu-2 (GPU-b2) is prepared for claim ns/soak-165-c1 (uid u)"
    failures = [
        dracheck.PrepareFailure(1125.2, "soak-124", unshared),
        dracheck.PrepareFailure(1484.0, "soak-166", held),
        dracheck.PrepareFailure(1130.0, "late", unshared),
        dracheck.PrepareFailure(1111.0, "early", unshared),
    ]
    changes = [(1111.4, 1125.4), (1481.3, 1490.9)]
    allocated = {"soak-124": 1110.8, "soak-166": 1483.5, "soak-165": 1470.0, "late": 1126.0, "early": 1100.0}
    dracheck.prepare_failures(invariant, failures, [], [], CHIP_OF, changes, allocated)
    assert invariant.checks == 4
    assert [what.split(":")[0] for _, what in invariant.violations] == ["late", "early"]


def test_a_holder_rebuilt_from_its_spec_is_known_by_its_uid() -> None:
    """Seed 845231: soak-15's share of board-0 (allocated at 122.0, before a rollback to split chips at 127.2 -
    154.8) was rebuilt from its CDI spec after the checkpoint was spoiled, so the driver named it by its UID alone
    when it refused soak-18 (167.8) and soak-20 (182.2) a share of gpu-1. Both are the change's doing; a holder
    allocated after the change, or one the soak never saw, is not."""
    invariant = checker.Invariant("no admission refused by the agent")
    uid, late_uid = "88164948-1845-4143-bfd6-d83f75204f7f", "99999999-1845-4143-bfd6-d83f75204f7f"
    held = "claim ns/{0}-c0 (uid u): device gpu-1 (GPU-a1) is prepared for claim unnamed (uid {1}) as part of board-0"
    failures = [
        dracheck.PrepareFailure(167.8, "soak-18", held.format("soak-18", uid)),
        dracheck.PrepareFailure(182.2, "soak-20", held.format("soak-20", uid)),
        dracheck.PrepareFailure(190.0, "late-held", held.format("late-held", late_uid)),
        dracheck.PrepareFailure(190.0, "unknown", held.format("unknown", "00000000-0000-4000-8000-000000000000")),
    ]
    claims = {"soak-15": [{"metadata": {"uid": uid}}], "late": [{"metadata": {"uid": late_uid}}, "nonsense", {}]}
    claim_pods = dracheck.claim_uids(claims)
    assert claim_pods == {uid: "soak-15", late_uid: "late"}
    allocated = {"soak-15": 122.0, "soak-18": 167.0, "soak-20": 181.9, "late": 160.0, "late-held": 189.0}
    allocated["unknown"] = 189.0
    dracheck.prepare_failures(invariant, failures, [], [], CHIP_OF, [(127.2, 154.8)], allocated, claim_pods)
    assert [what.split(":")[0] for _, what in invariant.violations] == ["late-held", "unknown"]


def test_a_chip_that_broke_as_the_driver_was_replaced_may_be_allocated_until_the_new_one_is_ready() -> None:
    """Seed 176345: chip 0's SYSHUB at 981.9, 0.8 s before the driver's pod was deleted, its new pod Ready only at
    1042.1; the scheduler allocated soak-99 on the chip just then from slices no driver could taint meanwhile (its
    prepare refused the chip). A driver's restart is judged as the API server's outages are: the grace runs from the
    new pod's Ready."""
    import sys

    if str(SOAK.parent) not in sys.path:
        sys.path.insert(0, str(SOAK.parent))  # the view names the driver as the e2e harness does
    timeline = load("timeline").Timeline(clock=lambda: 0.0)
    from types import SimpleNamespace

    cluster = SimpleNamespace(admin=None)
    view = load("draview").DraView(cluster, None, "ns", None, None, timeline, None)
    timeline.broken.append(checker.Broken(0, 981.9, 1113.4, "health SYSHUB"))
    timeline.starts += [(982.7, 1042.1), (1200.0, None)]  # the second: a rollout not done
    timeline.allocations += [
        checker.NewAllocation("soak-99", frozenset({0}), 1042.1, 1079.7),
        checker.NewAllocation("late", frozenset({0}), 1046.0, 1050.0),
    ]
    invariant = checker.Invariant("broken not given")
    view.judge_given(invariant)
    assert invariant.checks == 2 and [what.split()[0] for _, what in invariant.violations] == ["late"]


def test_a_board_refused_for_one_chip_is_judged_by_that_chip_alone() -> None:
    """Seed 508062: board-0 refused as gpu-1 was out of service (MC, XID 61, the reset limit); the message names
    both of the board's chips, and chip 0 was healthy: judged by both, the right refusal was a violation."""
    invariant = checker.Invariant("no admission refused by the agent")
    board = (
        "claim ns/c: device board-0 (GPU-a0, GPU-a1) is out of service: gpu-1: MC, gpu-1: XID 61 (self-healing: "
        "reset-limit-reached); its allocation does not tolerate the taint gpu.iluvatar.com/unhealthy=MC:NoSchedule"
    )
    broken = [checker.Broken(1, 50.0, None, "health MC")]
    failures = [dracheck.PrepareFailure(60.0, "board", board), dracheck.PrepareFailure(60.0, "chip-0-only", board)]
    dracheck.prepare_failures(invariant, failures[:1], [], broken, CHIP_OF)
    dracheck.prepare_failures(invariant, failures[1:], [], [checker.Broken(0, 50.0, None, "XID 48")], CHIP_OF)
    assert invariant.checks == 2 and [what.split(":")[0] for _, what in invariant.violations] == ["chip-0-only"]


def test_a_chip_healed_while_the_disk_is_full_may_stay_reserved_until_the_quiet_window_ends() -> None:
    """Seed 712317: chip 1's reset healed it at 1234.7 as the disk filled (until 1241.2); the agent keeps a chip
    reserved after its reset until the node-health record is written, and refused board-0 for it at 1240.1, past
    the grace after the heal. Within the quiet window the chip was broken in, that is right; far from one it is not."""
    invariant = checker.Invariant("no admission refused by the agent")
    reserved = "claim ns/c: device board-0 (GPU-a0, GPU-a1) is out of service: gpu-1: reserved for a GPU reset; its"
    broken = [checker.Broken(1, 1234.6, 1234.7, "health Memory")]
    quiet = [(1234.7, 1251.2)]
    failures = [dracheck.PrepareFailure(at, what, reserved) for at, what in ((1240.1, "disk-full"), (1300.0, "late"))]
    dracheck.prepare_failures(invariant, failures, quiet, broken, CHIP_OF)
    assert invariant.checks == 2 and [what.split(":")[0] for _, what in invariant.violations] == ["late"]
