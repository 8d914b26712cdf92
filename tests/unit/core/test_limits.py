"""The ListAndWatch size arithmetic matches protobuf exactly; oversized device lists are refused with advice."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.core.limits import device_list_problem, largest_replicas_that_fit, list_message_size
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.service import list_response
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config

chips = st.builds(
    Chip,
    uuid=st.uuids().map(lambda u: f"GPU-{u}"),
    minor=st.integers(0, 255),
    product=st.just("BI-V150"),
    numa_node=st.one_of(st.none(), st.integers(0, 300)),
    status=st.sampled_from([ChipStatus(), ChipStatus(errors=frozenset({"ECC"})), ChipStatus(present=False)]),
)
boards = st.tuples(st.lists(chips, min_size=1, max_size=2), st.booleans()).map(
    lambda drawn: Board("BI-V150", tuple(drawn[0]), membership_known=drawn[1] or len(drawn[0]) > 1)
)
inventories = st.lists(boards, min_size=1, max_size=6).map(lambda drawn: Inventory(boards=tuple(drawn)))


@given(inventories, st.integers(0, 50), st.booleans())
def test_the_size_is_exactly_what_protobuf_serializes(inventory: Inventory, replicas: int, split: bool) -> None:
    config = Config(replicas=replicas, splitboard=split)
    assert list_message_size(inventory, config) == list_response(plan(inventory, config)).ByteSize()


def test_a_hundred_thousand_replicas_cost_nothing_to_refuse() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:2"))
    config = Config(replicas=1024)
    huge = replace(inventory, boards=inventory.boards * 40)  # 80 boards: 81,920 devices
    problem = device_list_problem(huge, config)
    assert problem is not None
    best = largest_replicas_that_fit(huge, config)
    assert f"the largest value that fits is {best}" in problem
    assert list_message_size(huge, replace(config, replicas=best)) <= 4 * 1024 * 1024
    assert list_message_size(huge, replace(config, replicas=best + 1)) > 4 * 1024 * 1024
    assert device_list_problem(inventory, config) is None  # 2 boards x 1024 fit easily
