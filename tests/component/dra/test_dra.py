"""The DRA driver end to end: real gRPC over unix sockets, the kubelet and API server stand-ins."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import yaml
from helpers.dra_support import EVERY_TAINT, DraNode, answer
from helpers.waits import stays, until

from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.registration import DRA_SOCKET, SUPPORTED_VERSIONS, dra_socket, registration_socket
from ix_device_plugin.dra.slices import DRIVER, HEALING_TAINT, UNHEALTHY_TAINT
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn, RegistrationRefused

VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def chip_uuids(node: DraNode) -> dict[str, str]:
    return {
        name: d["attributes"]["uuid"]["string"] for name, d in node.slice_devices().items() if "uuid" in d["attributes"]
    }


async def test_registration_answers_get_info_and_accepts_the_kubelets_verdict(node: DraNode) -> None:
    driver = await node.start()
    assert registration_socket(driver.options.registrar_dir).name == "gpu.iluvatar.com-reg.sock"
    kubelet = await node.kubelet(driver)
    assert kubelet.info is not None
    assert (kubelet.info.type, kubelet.info.name) == ("DRAPlugin", DRIVER)
    assert kubelet.info.endpoint == str(node.root / "plugins" / DRIVER / DRA_SOCKET)
    assert tuple(kubelet.info.supported_versions) == SUPPORTED_VERSIONS
    assert kubelet.version == "v1.DRAPlugin"
    assert driver.registration.registered.is_set()
    await kubelet.close()


async def test_a_refusal_is_logged_with_its_reason(node: DraNode, caplog: pytest.LogCaptureFixture) -> None:
    driver = await node.start()
    kubelet = DraKubeletStandIn(DRIVER, known_versions=["v2.DRAPlugin"])
    with caplog.at_level(logging.ERROR), pytest.raises(RegistrationRefused):
        await kubelet.register(registration_socket(driver.options.registrar_dir))
    assert not driver.registration.registered.is_set()
    assert any("refused" in r.message and "v2.DRAPlugin" in r.message for r in caplog.records)


async def test_the_slice_holds_every_chip_with_its_attributes(node: DraNode) -> None:
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    stored = node.slice()
    assert stored["spec"]["driver"] == DRIVER and stored["spec"]["nodeName"] == node.node
    # the devices, then the boards' counters in a slice of their own; the boards in the first write (generation 1)
    assert stored["spec"]["pool"] == {"name": node.node, "generation": 1, "resourceSliceCount": 2}
    counters = node.api.get("resourceslices", f"{node.slice()['metadata']['name']}-1")
    assert counters["spec"]["sharedCounters"] == [
        {"name": "board-0", "counters": {"gpu-0": {"value": "2"}, "gpu-1": {"value": "2"}, "chips": {"value": "4"}}},
        {"name": "board-2", "counters": {"gpu-2": {"value": "2"}, "gpu-3": {"value": "2"}, "chips": {"value": "4"}}},
    ]
    devices = node.slice_devices()
    assert sorted(devices) == ["board-0", "board-2", "gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    first = devices["gpu-0"]["attributes"]
    # No NUMA node or PCIe root for simulated chips; the bus ID is the standard attribute.
    assert set(first) == {
        "uuid", "productName", "boardUUID", "minor", "resource.kubernetes.io/pciBusID", "type", "wholeBoard",
        "extendedResource", "shared", "driverVersion",
    }  # fmt: skip
    assert first["driverVersion"] == {"version": "4.4.0"}
    assert first["productName"] == {"string": "BI-V150"} and first["minor"] == {"int": 0}
    assert (first["type"], first["wholeBoard"]) == ({"string": "chip"}, {"bool": False})
    boards = [devices[name]["attributes"]["boardUUID"]["string"] for name in ("gpu-0", "gpu-1", "gpu-2", "gpu-3")]
    assert boards[0] == boards[1] != boards[2] == boards[3]
    assert devices["gpu-0"]["capacity"]["memory"]["value"].endswith("Mi")
    board = devices["board-2"]
    assert board["attributes"]["boardUUID"] == {"string": boards[2]} and board["attributes"]["type"] == {
        "string": "board"
    }
    assert board["consumesCounters"] == [
        {
            "counterSet": "board-2",
            "counters": {"gpu-2": {"value": "2"}, "gpu-3": {"value": "2"}, "chips": {"value": "2"}},
        }
    ]


@pytest.mark.parametrize("version", VERSIONS)
async def test_prepare_and_unprepare_round_trip(node: DraNode, version: str) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("one-gpu", ["gpu-1"])
    uid = claim[2]
    response = await kubelet.prepare([claim], version)
    result = answer(response, uid)
    assert result.error == ""
    [device] = result.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (["gpu"], node.node, "gpu-1")
    mount = f"gpu.iluvatar.com/metadata={uid}_gpu"  # the request's device metadata
    assert list(device.cdi_device_ids) == [f"gpu.iluvatar.com/claim={uid}-gpu-1", mount]
    spec = yaml.safe_load((node.cdi_dir / cdi_spec_file(uid)).read_text())
    assert spec["kind"] == "gpu.iluvatar.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-1", f"{uid}-record"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/iluvatar1"
    visible = chip_uuids(node)["gpu-1"]  # no pod uses it (no reservedFor): the spec names its chip
    assert (
        spec["containerEdits"]["env"]
        == spec["devices"][1]["containerEdits"]["env"]
        == [
            f"IX_VISIBLE_DEVICES={visible}",
            f"ILUVATAR_COREX_VISIBLE_DEVICES={visible}",
            f"IX_REPLICA_DEVICES={visible}",
            f"ILUVATAR_COREX_REPLICA_DEVICES={visible}",
        ]
    )
    checkpoint = json.loads(node.checkpoint_file.read_text())
    assert list(checkpoint["claims"]) == [uid]

    unprepared = await kubelet.unprepare([claim], version)
    assert answer(unprepared, uid).error == ""
    assert not (node.cdi_dir / cdi_spec_file(uid)).exists()
    checkpoint = json.loads(node.checkpoint_file.read_text())
    assert checkpoint["claims"] == {}
    again = await kubelet.unprepare([claim], version)  # idempotent
    assert answer(again, uid).error == ""
    await kubelet.close()


async def test_a_whole_board_and_a_shared_claim(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    board = node.claim("board", ["gpu-2", "gpu-3"])
    first = answer(await kubelet.prepare([board]), board[2])
    assert [d.device_name for d in first.devices] == ["gpu-2", "gpu-3"]
    second = answer(await kubelet.prepare([board]), board[2])  # a second pod sharing the claim
    assert second == first
    assert len(list(node.cdi_dir.glob("*.yaml"))) == 1
    await kubelet.close()


async def test_a_chip_is_never_prepared_for_two_claims(node: DraNode, caplog: pytest.LogCaptureFixture) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    holder = node.claim("holder", ["gpu-0"])
    other = node.claim("other", ["gpu-0", "gpu-1"])
    assert answer(await kubelet.prepare([holder]), holder[2]).error == ""
    with caplog.at_level(logging.WARNING):
        refused = answer(await kubelet.prepare([other]), other[2])
    assert "gpu-0" in refused.error and "default/holder" in refused.error and holder[2] in refused.error
    assert list(refused.devices) == []  # no partial answer
    assert any("default/holder" in r.message for r in caplog.records)
    assert not (node.cdi_dir / cdi_spec_file(other[2])).exists()
    await kubelet.unprepare([holder])
    assert answer(await kubelet.prepare([other]), other[2]).error == ""
    await kubelet.close()


async def test_concurrent_and_duplicate_calls(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claims = [node.claim(f"c{i}", [f"gpu-{i}"]) for i in range(4)]
    rivals = [node.claim(f"r{i}", [f"gpu-{i}"]) for i in range(4)]
    calls = [kubelet.prepare([claim]) for claim in claims * 3] + [kubelet.prepare([r]) for r in rivals]
    await asyncio.gather(*calls)
    prepared = {uid: c.ref.name for uid, c in driver.state.claims.items()}
    holders = [chip for claim in driver.state.claims.values() for chip in claim.uuids]
    assert len(holders) == len(set(holders)) == 4  # each chip held by exactly one claim
    assert len(prepared) == 4
    await asyncio.gather(*(kubelet.unprepare([claim]) for claim in claims + rivals + claims))
    assert driver.state.claims == {} and list(node.cdi_dir.glob("*.yaml")) == []
    await kubelet.close()


async def test_claims_that_are_not_ours_get_their_own_errors(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    good = node.claim("good", ["gpu-0"])
    other_driver = node.claim("other-driver", ["gpu-1"], driver="gpu.example.com")
    other_node = node.claim("other-node", ["gpu-1"], pool="node-b")
    unknown = node.claim("unknown", ["gpu-9"])
    replaced = node.claim("replaced", ["gpu-2"])
    missing = ("default", "missing", "0000")
    stale = (replaced[0], replaced[1], "not-the-uid")
    response = await kubelet.prepare([good, other_driver, other_node, unknown, stale, missing])
    assert answer(response, good[2]).error == "" and len(answer(response, good[2]).devices) == 1
    assert "no device of its allocation is from driver gpu.iluvatar.com" in answer(response, other_driver[2]).error
    assert "pool node-b" in answer(response, other_node[2]).error
    assert "'gpu-9' is not on this node" in answer(response, unknown[2]).error
    assert "the claim was replaced" in answer(response, "not-the-uid").error
    assert "no such ResourceClaim" in answer(response, "0000").error
    for uid in (other_driver[2], other_node[2], unknown[2], "not-the-uid", "0000"):
        assert list(answer(response, uid).devices) == []
    await kubelet.close()


async def test_restart_between_prepare_and_unprepare_loses_nothing(node: DraNode, api: ApiServerStandIn) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("survivor", ["gpu-3"])
    before = answer(await kubelet.prepare([claim]), claim[2])
    await kubelet.close()
    await node.stop(driver)
    await api.refuse()  # the restarted driver must not need the API server for what it prepared
    restarted = await node.start()
    kubelet = await node.kubelet(restarted)
    assert answer(await kubelet.prepare([claim]), claim[2]) == before
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""
    assert not (node.cdi_dir / cdi_spec_file(claim[2])).exists()
    assert restarted.state.claims == {}
    await api.accept()
    await kubelet.close()


async def test_a_subrequest_is_answered_as_its_request_which_is_what_containers_reference(node: DraNode) -> None:
    """A prioritized list's choice is allocated as `request-1/sub-request-2`; a container references `request-1`
    and the kubelet matches names exactly, so the answer names the request (the checkpoint keeps the result's)."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("pick", ["gpu-0", "gpu-1"], request="request-1/sub-request-2")
    result = answer(await kubelet.prepare([claim]), claim[2])
    assert result.error == ""
    assert [list(device.request_names) for device in result.devices] == [["request-1"], ["request-1"]]
    assert [d.requests for d in driver.state.claims[claim[2]].devices] == [("request-1/sub-request-2",)] * 2
    await kubelet.close()


async def test_a_tainted_chip_a_claim_tolerates_is_prepared(node: DraNode) -> None:
    """The scheduler gives a tainted chip only to a request that tolerates the taint (a burn-in job): that is the
    user's decision, and the prepare follows it, reading the tolerations the allocation result copied from the
    request; the chip stays tainted for everyone else."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["OverTemp"]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))
    kubelet = await node.kubelet(driver)
    claim = node.claim("burn-in", ["gpu-1"], tolerations=EVERY_TAINT)
    result = answer(await kubelet.prepare([claim]), claim[2])
    assert result.error == "" and [d.device_name for d in result.devices] == ["gpu-1"]
    assert node.slice_devices()["gpu-1"]["taints"][0]["value"] == "OverTemp"
    await kubelet.close()


async def test_a_chip_that_is_gone_cannot_be_prepared_and_the_error_says_the_kubelet_tries_again(
    node: DraNode,
) -> None:
    """A chip gone from enumeration (fallen off the bus) cannot be given to a container (its device node is
    gone, and the runtime would fail to create it): that claim's prepare fails, naming the chip and why, until
    the chip is back; admin access too."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    node.write_boards([{"product": "BI-V150", "chips": [None, {"present": False}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))
    kubelet = await node.kubelet(driver)
    uuid = chip_uuids(node)["gpu-1"]
    claims = (node.claim("work", ["gpu-1"]), node.claim("look", ["gpu-1"], admin_access=True))
    for claim in claims:
        result = answer(await kubelet.prepare([claim]), claim[2])
        assert "device gpu-1" in result.error and "not present" in result.error, result.error
        assert "the kubelet tries again" in result.error and list(result.devices) == []
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}])  # back (tainted until an operator acts)
    await until(lambda: not any(c.uuid == uuid and not c.status.present for c in driver.inventory.chips()), timeout=5)
    for claim in claims:
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()


async def test_an_unhealthy_chip_is_refused_to_a_claim_that_does_not_tolerate_its_taints_until_it_is_back(
    node: DraNode,
) -> None:
    """Seed 133482: claims allocated on a chip from slices nobody updated (the kubelet keeps a gone driver's slices
    for a while) were prepared on it once the driver was back and had tainted it. A chip out of service is given
    only to a claim whose allocation tolerates every taint it carries now; the others wait in ContainerCreating,
    and the kubelet's next try prepares them once the chip is back in service."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["OverVoltage"]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: len(devices.get("gpu-1", {}).get("taints", [])) == 2)
    taint = {"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "value": "OverVoltage"}
    waits = {"key": HEALING_TAINT, "effect": "NoSchedule", "value": "needs-operator"}  # what is done
    assert node.slice_devices()["gpu-1"]["taints"] == [taint, waits]
    assert node.slice_devices()["board-0"]["taints"] == [
        {"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "value": "gpu-1-OverVoltage"},
        waits,
    ]  # the board of a sick chip is sick too
    kubelet = await node.kubelet(driver)  # an operator's error: no reset reserves the chip
    uuid = chip_uuids(node)["gpu-1"]
    stale = node.claim("stale", ["gpu-1"])  # allocated before it broke, or from a slice nobody updated
    half = node.claim("half", ["gpu-1"], tolerations=[{"key": UNHEALTHY_TAINT, "operator": "Exists"}])
    for claim, untolerated in ((stale, "gpu.iluvatar.com/unhealthy=OverVoltage"), (half, "healing=needs-operator")):
        result = answer(await kubelet.prepare([claim]), claim[2])
        assert f"device gpu-1 ({uuid}) is out of service: OverVoltage (self-healing: needs-operator)" in result.error
        assert f"{untolerated}:NoSchedule" in result.error and list(result.devices) == []
        assert result.error.endswith("the kubelet tries again"), result.error
    both = [{"key": UNHEALTHY_TAINT, "operator": "Exists"}, {"key": HEALING_TAINT, "value": "needs-operator"}]
    tolerant = node.claim("tolerant", ["gpu-1"], tolerations=both)
    result = answer(await kubelet.prepare([tolerant]), tolerant[2])
    assert result.error == "" and [d.device_name for d in result.devices] == ["gpu-1"]
    assert answer(await kubelet.unprepare([tolerant]), tolerant[2]).error == ""
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}])  # it recovers: back in service
    await node.wait_slice(lambda devices: "taints" not in devices["gpu-1"])
    result = answer(await kubelet.prepare([stale]), stale[2])  # the kubelet's next try
    assert result.error == "" and [d.device_name for d in result.devices] == ["gpu-1"]
    await kubelet.close()


async def test_without_device_taints_an_unhealthy_chip_is_left_out(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    api.device_taints = False
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["MC"]}]}, {"product": "BI-V150"}])
    with caplog.at_level(logging.INFO):
        await node.start()
        await node.wait_slice(lambda devices: sorted(devices) == ["board-2", "gpu-0", "gpu-2", "gpu-3"])
        # The driver logs what it published once the API server has answered, just after the slice is stored.
        await until(lambda: any("left out: gpu-1" in r.message for r in caplog.records), timeout=5)
    assert any("drops device taints" in r.message for r in caplog.records)


async def test_hot_plug_changes_the_slice(node: DraNode) -> None:
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}, {"product": "BI-V100"}])
    await node.wait_slice(
        lambda devices: sorted(devices) == ["board-0", "board-2", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    )
    single = node.slice_devices()["gpu-4"]["attributes"]  # a single-chip board is its chip, and a whole board
    assert single["productName"] == {"string": "BI-V100"} and single["wholeBoard"] == {"bool": True}
    node.write_boards([{"product": "BI-V150"}])
    await node.wait_slice(lambda devices: sorted(devices) == ["board-0", "gpu-0", "gpu-1"])
    # The removed board's chips are first tainted (health: not present), then gone (rediscovery).
    assert node.slice()["spec"]["pool"]["generation"] >= 3


async def test_the_api_server_down_at_start_and_mid_run(node: DraNode, api: ApiServerStandIn) -> None:
    await api.refuse()
    driver = await node.start()  # starts and serves without the API server
    kubelet = await node.kubelet(driver)
    assert dra_socket(driver.options.plugins_dir).is_socket()
    await stays(lambda: node.slice() is None, for_=0.3, message="node.slice() is None")
    await api.accept()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await api.refuse()
    node.write_boards([{"product": "BI-V150"}])
    claim = node.claim("while-down", ["gpu-0"])
    down = answer(await kubelet.prepare([claim]), claim[2])
    assert "API server" in down.error  # a per-claim error, the driver goes on
    await asyncio.sleep(0.3)
    await api.accept()
    await node.wait_slice(lambda devices: sorted(devices) == ["board-0", "gpu-0", "gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()


async def test_a_chip_that_broke_while_the_api_server_was_down_is_tainted_as_soon_as_it_is_back(
    node: DraNode, api: ApiServerStandIn
) -> None:
    """Seed 845231: chip 0 overheated as the API server restarted (8.5 s); the driver's retries had backed off to
    6.4 s, so the scheduler, its server back, gave the chip from the untainted slice 3 s later. A try that finds no
    server is made again within a second, whatever the backoff has reached."""
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await api.refuse()
    node.write_boards([{"product": "BI-V150", "chips": [{"health": ["OverTemp"]}, None]}, {"product": "BI-V150"}])
    await asyncio.sleep(8.0)  # the retries back off past 6 s (0.2 s doubling) while nothing answers
    await api.accept()
    taint = {"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "value": "OverTemp"}
    await node.wait_slice(lambda devices: taint in devices.get("gpu-0", {}).get("taints", []), timeout=2.0)


async def test_a_corrupt_checkpoint_is_moved_aside(node: DraNode, caplog: pytest.LogCaptureFixture) -> None:
    directory = node.root / "plugins" / DRIVER
    directory.mkdir(parents=True)
    (directory / CHECKPOINT_FILE).write_text("{not json")
    with caplog.at_level(logging.ERROR):
        driver = await node.start()
    assert driver.state.claims == {}
    assert any("not JSON" in r.message and "kept as" in r.message for r in caplog.records)
    assert list(directory.glob(f"{CHECKPOINT_FILE}.corrupt-*"))


async def test_probes_and_metrics_follow_registration_and_the_slice(node: DraNode) -> None:
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    driver = await node.start(health_address="127.0.0.1:0")

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{driver.node.probe_port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    status, body = await asyncio.to_thread(get, "/healthz")
    assert (status, body) == (200, f"ok: serving DRA driver {DRIVER} for {len(driver.content.devices)} devices\n")
    status, body = await asyncio.to_thread(get, "/readyz")
    assert (status, body) == (503, "not ok: not registered with the kubelet's plugin watcher\n")
    await DraKubeletStandIn(DRIVER).register(registration_socket(driver.options.registrar_dir))
    await until(lambda: driver.publisher is not None and driver.publisher.published is not None, timeout=5)
    assert (await asyncio.to_thread(get, "/readyz"))[0] == 200
    text = (await asyncio.to_thread(get, "/metrics"))[1]
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["ix_device_plugin_dra_registered"] == 1
    assert values["ix_device_plugin_dra_slice_devices"] == len(driver.content.devices) > 0
    assert values["ix_device_plugin_dra_prepared_claims"] == 0
    kubelet = await node.kubelet(driver)
    good, bad = node.claim("good", ["gpu-0"]), node.claim("bad", ["gpu-9"])
    await kubelet.prepare([good, bad])
    await kubelet.unprepare([good])
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))
    text = (await asyncio.to_thread(get, "/metrics"))[1]
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
              for s in f.samples}  # fmt: skip
    assert values[("ix_device_plugin_dra_claims_total", (("call", "prepare"), ("result", "ok")))] == 1
    assert values[("ix_device_plugin_dra_claims_total", (("call", "prepare"), ("result", "error")))] == 1
    assert values[("ix_device_plugin_dra_claims_total", (("call", "unprepare"), ("result", "ok")))] == 1
    assert values[("ix_device_plugin_dra_claim_duration_seconds_count", (("call", "prepare"),))] == 2
    assert values[("ix_device_plugin_dra_health_changes_total", ())] == 2  # gpu-1 and its board
    assert values[("ix_device_plugin_dra_restored_claims", ())] == 0
    await kubelet.close()
