"""`ix-device-plugin template` against the driver: for each shape and ix-config, the template is what the DRA driver
publishes on a fresh node of that shape (the simulated backend, the API server stand-in), slice for slice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.dra_support import DraNode
from helpers.waits import until

from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.options import load_config
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.tools.nodetemplate import template_command

SERVER_SET = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "ownerReferences")
UNSPLIT = ""
SPLIT = "flags:\n  splitboard: true\n"
SHARED_BOARDS = "sharing:\n  timeSlicing:\n    replicas: 2\n"
SHARED_CHIPS = "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n"
SHAPES = [  # product, boards, ix-config, what the pool holds (devices, slices)
    pytest.param("BI-V150", 2, UNSPLIT, (6, 2), id="unsplit"),
    pytest.param("BI-V150", 2, SPLIT, (6, 2), id="split"),
    pytest.param("BI-V150", 2, SHARED_BOARDS, (2, 1), id="replicas-2-boards"),
    pytest.param("BI-V150", 2, SHARED_CHIPS, (4, 1), id="replicas-4-chips"),
    pytest.param("MR-V50", 3, SPLIT, (3, 2), id="single-chip"),  # a counter set per board: chips
    pytest.param("BI-V150", 40, UNSPLIT, (120, 2 + 5), id="40-boards-in-7-slices"),
]


def stored_pool(api: ApiServerStandIn, node: str) -> list[dict[str, Any]] | None:
    """The node's slices of this driver once the pool is whole (every slice at one generation, all of them there),
    without what the server sets; None until then."""
    slices = [s for s in api.objects("resourceslices") if s["spec"]["driver"] == DRIVER]
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    if len(pools) != 1 or next(iter(pools))[1] != len(slices) or any(s["spec"]["nodeName"] != node for s in slices):
        return None
    for obj in slices:
        for field in SERVER_SET:
            obj["metadata"].pop(field, None)
    return sorted(slices, key=lambda s: s["metadata"]["name"])


def printed_template(capsys: pytest.CaptureFixture[str], *arguments: tuple[str, str], output: str) -> str:
    code = template_command(dict(arguments), output)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return printed.out


@pytest.mark.parametrize(("product", "boards", "ix_config", "pool"), SHAPES)
async def test_the_template_is_what_the_driver_publishes(
    node: DraNode,
    api: ApiServerStandIn,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    product: str,
    boards: int,
    ix_config: str,
    pool: tuple[int, int],
) -> None:
    config_file = tmp_path / "ix-config.yaml"
    config_file.write_text(ix_config)
    options = node.options(config_path=config_file, config_required=True)
    config, _ = load_config(options.base)  # as `ix-device-plugin dra` reads it
    await node.start(simulated_devices=f"{product}:{boards}", config_path=config_file, config=config)
    stored = await until(lambda: stored_pool(api, node.node), timeout=10)
    devices = sum(len(s["spec"].get("devices") or []) for s in stored)
    assert (devices, len(stored)) == pool
    assert {s["spec"]["pool"]["generation"] for s in stored} == {1}, "a fresh node's first write"

    given = (("product", product), ("boards", str(boards)), ("config_file", str(config_file)), ("node", node.node))
    as_yaml = printed_template(capsys, *given, output="yaml")
    as_json = printed_template(capsys, *given, output="json")
    assert json.loads(as_json)["items"] == stored
    assert list(yaml.safe_load_all(as_yaml)) == stored
