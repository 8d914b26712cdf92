"""The chaos soak's checks of the agent's API load and of the pods it failed (e2e/soak/load.py, checker.py): each
reports a violation when the history shows one, and the audit log reader takes any line without failing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.soak_modules import SOAK, SoakStandIn, imported_modules, load

checker = load("checker")
schedule = load("schedule")
audit = load("load")

DP_ACCOUNT = "system:serviceaccount:kube-system:iluvatar-device-plugin"


def event(user: str, agent: str, at: str, verb: str = "get", uri: str = "/api/v1/nodes/n") -> str:
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": "ResponseComplete",
            "requestURI": uri,
            "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
            "userAgent": agent,
            "requestReceivedTimestamp": at,
            "stageTimestamp": at,
        }
    )


def test_load_imports_nothing_of_the_agent() -> None:
    allowed = {"__future__", "json", "datetime", "pathlib", ".checker"}
    assert imported_modules(SOAK / "load.py") <= allowed


def test_a_minute_over_the_documented_requests_is_a_violation() -> None:
    invariant = checker.Invariant("API requests per minute")
    calm = [checker.Request(at, "get", "/api/v1/nodes/n") for at in range(0, 60, 2)]  # 30 in minute 0
    storm = [checker.Request(60 + at / 10, "patch", "/api/v1/nodes/n/status?x=1") for at in range(200)]
    checker.requests_per_minute(invariant, calm + storm, 150.0, limit=100)
    assert invariant.checks == 3  # minutes 0, 1 and the part of minute 2
    assert [at for at, _ in invariant.violations] == [60.0]
    assert "200 API requests in minute 1" in invariant.violations[0][1]
    assert "200 x patch /api/v1/nodes/n/status" in invariant.violations[0][1]


def test_a_pod_failed_for_a_reason_of_the_agent_is_a_violation() -> None:
    invariant = checker.Invariant("no admission refused by the agent")
    restarts = [(100.0, 105.0)]
    message = "Allocate failed due to requested number of devices unavailable for iluvatar.com/gpu. Requested: 1"
    rightly = [
        checker.Failure(20.0, "no-chip", "UnexpectedAdmissionError", message),
        checker.Failure(30.0, "outof", "OutOfiluvatar.com/gpu", "Node didn't have enough resource"),
        checker.Failure(
            108.0,
            "restart",
            "UnexpectedAdmissionError",
            "Allocate failed due to rpc error: code = Unavailable desc = connection refused, which is unexpected",
        ),
        # Soak seed 855703 (DRA): a pod starting as the kubelet restarted, failed by it with no reason or message
        checker.Failure(107.0, "silent-restart", "", ""),
    ]
    wrongly = [
        checker.Failure(
            40.0, "agent-error", "UnexpectedAdmissionError", "Allocate failed due to rpc error: code = Internal"
        ),
        checker.Failure(
            200.0, "far-from-restart", "UnexpectedAdmissionError", "rpc error: code = Unavailable desc = refused"
        ),
    ]
    wrongly.append(checker.Failure(300.0, "silent-far-from-restart", "", ""))
    checker.admission_failures(invariant, rightly + wrongly, restarts)
    assert invariant.checks == 7
    assert [what.split()[0] for _, what in invariant.violations] == [
        "agent-error",
        "far-from-restart",
        "silent-far-from-restart",
    ]


def test_the_audit_log_counts_the_agents_requests_only(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    lines = [
        event(DP_ACCOUNT, "ix-device-plugin", "2026-12-05T07:00:01.500000Z"),
        event("ix-e2e-admin", "python-httpx2/2.17.0", "2026-12-05T07:00:02Z", "watch", "/api/v1/nodes?watch=true"),
        event("ix-e2e-admin", "kubectl/v1.37.0", "2026-12-05T07:00:03Z"),  # the soak's own kubectl
        event("ix-e2e-admin", "Python-urllib/3.11", "2026-12-05T07:00:04Z"),  # the soak's reader
        event(DP_ACCOUNT, "ix-device-plugin", "2026-12-05T06:59:59Z"),  # before the soak
        '{"kind": "Event", "user": {"usern',  # cut short as the server stopped
        "[1, 2]",
        "",
    ]
    log.write_text("\n".join(lines) + "\n")
    since = 1796454000.0  # 2026-12-05T07:00:00Z
    found = audit.agent_requests(log, since)
    assert [(r.at, r.verb) for r in found] == [(1.5, "get"), (2.0, "watch")]
    assert audit.agent_requests(tmp_path / "none.log", since) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@given(lines=st.lists(st.binary(max_size=80) | JSON.map(lambda v: json.dumps(v).encode()), max_size=8))
def test_the_audit_log_reader_takes_any_bytes(tmp_path_factory, lines: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path_factory.mktemp("audit") / "audit.log"
    log.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
    assert all(isinstance(r, checker.Request) for r in audit.agent_requests(log, 0.0))


def test_the_schedule_draws_the_api_server_and_disk_faults_in_both_modes() -> None:
    for mode in schedule.MODES:
        steps = [s for s in schedule.draw(5, 3, mode) if s.kind in ("apiserver-restart", "apiserver-slow", "disk-full")]
        assert {s.kind for s in steps} == {"apiserver-restart", "apiserver-slow", "disk-full"}
        assert all(s.duration in (2.0, 4.0, 6.0) for s in steps if s.kind == "apiserver-slow")
        assert all(s.duration > 0 for s in steps if s.kind == "disk-full")


def test_a_dra_workload_draws_every_shape_and_the_device_plugin_its_own() -> None:
    dra = {str(s.detail["shape"]) for s in schedule.draw(2, 15, "dra") if s.kind == "pod-create"}
    assert dra == set(schedule.DRA_SHAPES)
    plugin = {str(s.detail["shape"]) for s in schedule.draw(2, 15, "device-plugin") if s.kind == "pod-create"}
    assert plugin == {"gpus-1", "gpus-2"}


def test_a_device_refused_just_after_a_fault_broke_it_is_no_violation_but_later_it_is() -> None:
    """The kubelet chose a device its view still showed healthy, a fault having broken it a moment before: the agent
    rightly refuses it (what the kubelet fails the pod for). Long after the fault, the same refusal is the agent's."""
    invariant = checker.Invariant("no admission refused by the agent")
    unhealthy = (
        "Allocate failed due to rpc error: code = FailedPrecondition desc = device GPU-a::1 is Unhealthy (XID 120)"
    )
    broken = [checker.Broken(1, 50.0, None, "XID 120")]
    failures = [
        checker.Failure(51.1, "just-broken", "UnexpectedAdmissionError", unhealthy),
        checker.Failure(80.0, "long-broken", "UnexpectedAdmissionError", unhealthy),
    ]
    checker.admission_failures(invariant, failures, [], broken)
    assert [what.split()[0] for _, what in invariant.violations] == ["long-broken"]


def test_the_disk_stays_a_quiet_window_until_it_is_freed_however_late_and_a_return_waits_for_it(tmp_path: Path) -> None:
    """A step late on the schedule holds the disk's freeing up (the faults' later actions keep the schedule's order):
    for all that time the agent can record nothing, so an operator's return heard then may die with the process
    that heard it. The quiet window lasts until the disk is freed, and the soak's operator returns once it is over."""
    stand_in = SoakStandIn(tmp_path / "hardware", pid=100)
    timeline, later = stand_in.timeline, stand_in.later
    cluster = SimpleNamespace(plugins_dir=tmp_path / "plugins")
    api_faults = load("apifaults").ApiFaults(cluster, timeline, later, ["iluvatar.com"])
    stand_in.at = 10.0
    api_faults.do(schedule.Step(10.0, "disk-full", duration=6.0))
    stand_in.at = 60.0  # the disk's time is long up, but nothing ran what is due
    assert timeline.quiet_at(60.0)
    stand_in.returns.operator_returns(1)
    assert stand_in.admin_calls == [], "a return made while the agent can record nothing"
    later.run_due(60.0)  # the disk freed, and the return asked again (RETURN_RETRY_S)
    assert timeline.quiet[-1] == (10.0, 60.0 + load("apifaults").AFTER_S)
    assert not returned(stand_in.admin_calls)
    stand_in.at = 71.0
    later.run_due(71.0)
    assert returned(stand_in.admin_calls) == [f"iluvatar.com/gpu.return={stand_in.hardware.uuids[1]}"]


def returned(calls: list[tuple[str, ...]]) -> list[str]:
    return [arg for call in calls for arg in call if arg.startswith("iluvatar.com/gpu.return=")]
