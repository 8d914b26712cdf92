"""Whether a new pod of the plugin registers beside the one serving the node: the kubelet's version decides under
auto, the setting otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_device_plugin.deviceplugin.endpoint import ENDPOINT, plugin_socket
from ix_device_plugin.kubelet.endpoints import keeps_several_endpoints, register_beside
from ix_device_plugin.kubelet.sockets import pod_tag


@pytest.mark.parametrize(
    ("version", "several"),
    [
        ("v1.37.2", True),
        ("v1.37.0-alpha.1+abc", True),
        ("1.38.0", True),
        ("v2.0.0", True),
        ("v1.36.9", False),
        ("v1.33.1-eks-1234", False),
        ("", None),
        ("unknown", None),
        ("v1", None),
    ],
)
def test_the_kubelet_keeps_several_endpoints_from_1_37(version: str, several: bool | None) -> None:
    assert keeps_several_endpoints(version) is several


def test_auto_registers_beside_only_a_kubelet_known_to_keep_several_endpoints() -> None:
    assert register_beside("auto", "v1.37.1") == (True, "kubelet v1.37.1 keeps several endpoints per resource")
    beside, why = register_beside("auto", "v1.36.0")
    assert not beside and "older than 1.37" in why
    assert register_beside("auto", None) == (
        False,
        "the kubelet's version is not known (no API access to read the Node)",
    )
    assert register_beside("auto", "garbage") == (False, "the kubelet's version 'garbage' cannot be read")


def test_true_and_false_decide_whatever_the_kubelet() -> None:
    assert register_beside("true", "v1.30.0")[0] is True
    assert register_beside("false", "v1.40.0")[0] is False


def test_each_pod_has_a_socket_of_its_own_and_a_hand_started_plugin_the_fixed_name() -> None:
    directory = Path("/var/lib/kubelet/device-plugins")
    assert plugin_socket(directory) == directory / ENDPOINT == directory / "iluvatar-gpu.sock"
    uid = "0b1d0000-0000-4000-8000-000000000001"
    assert plugin_socket(directory, uid) == directory / f"iluvatar-gpu-{pod_tag(uid)}.sock"
