"""Where the physical GPUs sit: groups from the facts the library gives, nested even where they disagree."""

from __future__ import annotations

from ix_device_plugin.core.topology import BOARD, CPUS, HOST_BRIDGE, NODE, NUMA_NODE, SWITCH, SWITCHES, build_topology


def test_chips_of_one_board_share_it_whatever_the_link_level_says() -> None:
    # The IXML double (and a driver without topology for chips of one board) says 50 between them.
    topology = build_topology(["a0", "a1", "b0"], {"a0": "a0", "a1": "a0"}, {}, {("a0", "a1"): 50})
    assert topology.shared_level("a0", "a1") == BOARD
    assert topology.shared_level("a0", "b0") == NODE


def test_each_link_level_places_a_pair_at_its_level() -> None:
    gpus = ["a", "b", "c", "d", "e", "f"]
    links = {("a", "b"): 10, ("a", "c"): 20, ("a", "d"): 30, ("a", "e"): 40, ("a", "f"): 50}
    topology = build_topology(gpus, {}, {}, links)
    assert [topology.shared_level("a", other) for other in gpus] == [
        BOARD,
        SWITCH,
        SWITCHES,
        HOST_BRIDGE,
        NUMA_NODE,
        CPUS,
    ]


def test_groups_nest_where_the_facts_disagree() -> None:
    # a-b and b-c under one switch but a-c across the CPUs: one switch holds all three.
    topology = build_topology(["a", "b", "c"], {}, {}, {("a", "b"): 10, ("b", "c"): 10, ("a", "c"): 50})
    assert topology.shared_level("a", "c") == SWITCH
    (group,) = topology.groups
    assert group.gpus == ("a", "b", "c") and group.levels == (SWITCH, SWITCHES, HOST_BRIDGE, NUMA_NODE, CPUS, NODE)


def test_numa_nodes_join_what_links_do_not_and_unknown_is_farthest() -> None:
    topology = build_topology(["a", "b", "c", "d"], {}, {"a": 0, "b": 0, "c": 1}, {("a", "d"): 99, ("b", "d"): -1})
    assert topology.shared_level("a", "b") == NUMA_NODE
    assert topology.shared_level("a", "c") == CPUS
    assert topology.shared_level("a", "d") == NODE  # levels outside NVML's scale say nothing


def test_groups_list_smaller_groups_first_and_the_whole_node_last() -> None:
    boards = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
    topology = build_topology(["a0", "a1", "b0", "b1", "c"], boards, {}, {("a0", "b0"): 10})
    board_a, board_b, switch, node = topology.groups
    assert (board_a.gpus, board_b.gpus) == (("a0", "a1"), ("b0", "b1"))
    assert switch.groups == (0, 1) and switch.levels[0] == SWITCH
    assert node.groups == (2,) and node.gpus == ("c",) and node.levels == (NODE,)
    assert build_topology(["only"], {}, {}, {}).groups[-1].gpus == ("only",)
