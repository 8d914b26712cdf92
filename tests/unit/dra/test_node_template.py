"""Node templates (`ix-device-plugin template`): the shapes, the inputs refused, and the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.cli import main
from ix_device_plugin.core.products import PRODUCTS
from ix_device_plugin.dra.slices import SlicePolicy
from ix_device_plugin.dra.template import TemplateError, template_slices
from ix_device_plugin.hardware.simulated import MAX_BOARDS


def devices(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {device["name"]: device for obj in objects for device in obj["spec"].get("devices") or []}


def test_a_template_is_a_fresh_unowned_pool_of_resource_slices() -> None:
    objects = template_slices("BI-V150", 2, SlicePolicy(), node="gpu-node-7")
    assert [obj["metadata"]["name"] for obj in objects] == [
        "gpu-node-7-gpu.iluvatar.com",
        "gpu-node-7-gpu.iluvatar.com-1",
    ]
    for obj in objects:
        assert (obj["apiVersion"], obj["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "ix-device-plugin"}
        assert obj["spec"]["pool"] == {"name": "gpu-node-7", "generation": 1, "resourceSliceCount": 2}
        assert obj["spec"]["nodeName"] == "gpu-node-7"
    assert sorted(devices(objects)) == ["board-0", "board-2", "gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [s["name"] for s in objects[1]["spec"]["sharedCounters"]] == ["board-0", "board-2"]


def test_the_product_name_is_read_as_the_simulated_backend_reads_it() -> None:
    assert template_slices("iluvatar bi-v150", 1, SlicePolicy()) == template_slices("BI-V150", 1, SlicePolicy())


def test_shared_chips_carry_shares_and_no_counters() -> None:
    objects = template_slices("BI-V150", 1, SlicePolicy(splitboard=True, replicas=4))
    assert len(objects) == 1
    shared = devices(objects)
    assert sorted(shared) == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] and d["capacity"]["shares"]["value"] == "4" for d in shared.values())


@pytest.mark.parametrize(
    ("product", "boards", "version", "said"),
    [
        ("BI-V999", 1, "4.4.0", "--product: unknown product 'BI-V999' (known: " + ", ".join(PRODUCTS) + ")"),
        ("BI-V150", 0, "4.4.0", f"--boards: expected a whole number from 1 to {MAX_BOARDS}, got '0'"),
        ("BI-V150", MAX_BOARDS + 1, "4.4.0", f"--boards: expected a whole number from 1 to {MAX_BOARDS}, got '257'"),
        ("BI-V150", "two", "4.4.0", f"--boards: expected a whole number from 1 to {MAX_BOARDS}, got 'two'"),
        ("BI-V150", 1, "latest", "--driver-version: 'latest' is not a version such as 4.4.0"),
    ],
)
def test_a_shape_no_node_can_have_is_refused(product: str, boards: Any, version: str, said: str) -> None:
    with pytest.raises(TemplateError) as refused:
        template_slices(product, boards, SlicePolicy(), driver_version=version)
    assert str(refused.value) == said


@pytest.mark.parametrize("node", ["Node_A", "", "a" * 254, "-a"])
def test_a_node_name_that_names_no_node_is_refused(node: str) -> None:
    with pytest.raises(TemplateError, match=r"^--node: .* is not a node name"):
        template_slices("BI-V150", 1, SlicePolicy(), node=node)


@given(st.text(max_size=12), st.text(max_size=12))
def test_any_text_as_product_or_boards_gives_slices_or_says_what_is_wrong(product: str, boards: str) -> None:
    try:
        objects = template_slices(product, boards, SlicePolicy())
    except TemplateError as error:
        assert str(error).startswith(("--product: ", "--boards: "))
    else:
        assert objects and all(obj["kind"] == "ResourceSlice" for obj in objects)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["template", *argv])
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def test_the_command_prints_yaml_documents_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 2\n")
    code, out, err = run(capsys, "--product", "BI-V150", "--boards", "8", "--config", str(config))
    assert (code, err) == (0, "")
    assert out.startswith("---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\n")
    documents = list(yaml.safe_load_all(out))
    assert documents == template_slices("BI-V150", 8, SlicePolicy(splitboard=True, replicas=2))
    code, out, _ = run(capsys, "--product", "BI-V150", "--boards", "8", "--config", str(config), "--output", "json")
    assert json.loads(out) == {"apiVersion": "v1", "kind": "List", "items": documents}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--product", "BI-V999", "--boards", "1"], "--product: unknown product 'BI-V999' (known: BI-V150, "),
        (["--product", "BI-V150", "--boards", "1000"], "--boards: expected a whole number from 1 to 256"),
        (["--product", "BI-V150", "--boards", "1", "--node", "A"], "--node: 'A' is not a node name"),
        (["--product", "BI-V150", "--boards", "1", "--config", "/nonexistent/ix"], "/nonexistent/ix: cannot read"),
    ],
)
def test_bad_input_exits_2_saying_what_was_wrong(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"ix-device-plugin template: error: {said}")
    assert "Traceback" not in err


def test_a_bad_config_file_is_refused_naming_the_key_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: many\n")
    code, out, err = run(capsys, "--product", "BI-V150", "--boards", "1", "--config", str(config))
    assert (code, out) == (2, "")
    assert f"{config}: line 5: sharing.timeSlicing.replicas: expected a whole number >= 0, got 'many'" in err
    assert "Traceback" not in err


def test_product_and_boards_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["template", "--boards", "1"])
    assert exit_.value.code == 2
    assert "the following arguments are required: --product" in capsys.readouterr().err
