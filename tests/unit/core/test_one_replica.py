"""`replicas: 1`: devices are named `<uuid>::0` as Iluvatar's plugin 4.4.0 names them, and everything else is as
without replicas: each GPU goes to one container at a time, so nothing that is about sharing applies."""

from __future__ import annotations

from ix_device_plugin.core.allocation import allocate
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import REPLICAS, SHARING_STRATEGY, labels
from ix_device_plugin.core.limits import largest_replicas_that_fit, list_message_size
from ix_device_plugin.core.plan import plan
from ix_device_plugin.core.preferred import preferred
from ix_device_plugin.deviceplugin.features.volcano import device_info, free_devices
from ix_device_plugin.dra.slices import SlicePolicy, slice_content
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config

INVENTORY = Inventory(boards=parse_spec("BI-V150:2,BI-V100:2"), driver_version="4.1.0")
NONE, ONE = Config(), Config(replicas=1)


def replica(device_id: str) -> str:
    return f"{device_id}::0"


def test_the_same_gpus_with_replica_ids() -> None:
    without, with_one = plan(INVENTORY, NONE), plan(INVENTORY, ONE)
    assert [replica(d.id) for d in without.devices] == [d.id for d in with_one.devices]
    assert [(d.gpu, d.chips) for d in without.devices] == [(d.gpu, d.chips) for d in with_one.devices]
    assert not with_one.shared


def test_no_shared_name_and_a_container_may_ask_for_several() -> None:
    config = Config(replicas=1, rename_by_default=True, fail_requests_greater_than_one=True)
    one = plan(INVENTORY, config)
    assert one.resource_name == "iluvatar.com/gpu"
    two = [one.devices[0].id, one.devices[1].id]
    allocation = allocate(one, two)  # two GPUs: not refused as "more than one shared replica"
    assert allocation.envs["IX_REPLICA_DEVICES"] == ",".join(two)


def test_a_container_gets_what_it_gets_without_replicas() -> None:
    without, with_one = plan(INVENTORY, NONE), plan(INVENTORY, ONE)
    for count in (1, 2, len(without.devices)):
        plain = allocate(without, [d.id for d in without.devices[:count]])
        named = allocate(with_one, [d.id for d in with_one.devices[:count]])
        assert named.device_specs == plain.device_specs
        assert named.envs["IX_VISIBLE_DEVICES"] == plain.envs["IX_VISIBLE_DEVICES"]
        assert named.envs["IX_REPLICA_DEVICES"] == ",".join(
            replica(i) for i in plain.envs["IX_REPLICA_DEVICES"].split(",")
        )


def test_preferred_allocation_picks_the_same_gpus() -> None:
    without, with_one = plan(INVENTORY, NONE), plan(INVENTORY, ONE)
    available = [d.id for d in without.devices][1:]
    for size in range(1, len(available) + 1):
        plain = preferred(without, available, [], size)
        named = preferred(with_one, [replica(i) for i in available], [], size)
        assert named == [replica(i) for i in plain]


def test_node_labels_say_no_sharing() -> None:
    node = labels(INVENTORY, plan(INVENTORY, ONE), ONE, None, None)
    assert (node[REPLICAS], node[SHARING_STRATEGY]) == ("1", "none")


def test_volcano_lists_the_ids_the_kubelet_knows() -> None:
    one = plan(INVENTORY, ONE)
    assert free_devices(one, [one.devices[0].id]) == [d.id for d in one.devices[1:]]
    assert sorted(device_info(one)) == sorted(d.gpu for d in one.devices)  # GPUs by UUID, as without replicas


def test_dra_publishes_no_shares() -> None:
    assert slice_content(INVENTORY, policy=SlicePolicy(replicas=1)).devices == slice_content(INVENTORY).devices


def test_the_device_list_size_counts_the_longer_ids() -> None:
    assert list_message_size(INVENTORY, ONE) == list_message_size(INVENTORY, NONE) + 3 * len(
        plan(INVENTORY, NONE).devices
    )
    assert largest_replicas_that_fit(INVENTORY, NONE, limit=list_message_size(INVENTORY, NONE)) == 0
    assert largest_replicas_that_fit(INVENTORY, NONE, limit=list_message_size(INVENTORY, ONE)) == 1
