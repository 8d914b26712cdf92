"""Socket names that fit every supported kubelet root: the kubelet dials `<its directory>/<name>`, and a unix
socket's path is at most 107 bytes. Per pod, a name carries a short tag of the pod's UID, never the UID itself."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from ix_device_plugin.deviceplugin.endpoint import SHORTER_PATH as DEVICE_PLUGIN_FIX
from ix_device_plugin.deviceplugin.endpoint import plugin_socket
from ix_device_plugin.dra.registration import dra_socket, registration_socket, socket_paths_problem, staging_socket
from ix_device_plugin.kubelet.sockets import PATH_LIMIT, path_too_long, pod_tag

# The kubelet's root directory (--root-dir) of each supported distribution (see docs/deployment.md).
ROOTS = {
    "kubeadm": "/var/lib/kubelet",
    "OpenShift": "/var/lib/kubelet",
    "RKE2": "/var/lib/kubelet",
    "k3s": "/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "MicroK8s": "/var/snap/microk8s/common/var/lib/kubelet",
}
POD_UID = "7c4b2e1a-93f0-4d2b-8a6e-1f0c9d3b5e27"
LONGEST_POD_UID = "p" * 63  # the longest a POD_UID may be


def size(path: Path) -> int:
    return len(str(path).encode())


@pytest.mark.parametrize("pod_uid", ["", POD_UID, LONGEST_POD_UID])
@pytest.mark.parametrize("distribution", ROOTS)
def test_the_device_plugin_socket_fits_every_distribution(distribution: str, pod_uid: str) -> None:
    # The kubelet serves the device-plugin API in /var/lib/kubelet/device-plugins whatever its root; a pod may
    # mount it at <root>/device-plugins all the same (on MicroK8s that is the longer of the two).
    for directory in ("/var/lib/kubelet/device-plugins", f"{ROOTS[distribution]}/device-plugins"):
        path = plugin_socket(Path(directory), pod_uid)
        assert path_too_long(path, DEVICE_PLUGIN_FIX) is None, path
        assert size(path) <= PATH_LIMIT


@pytest.mark.parametrize("pod_uid", ["", POD_UID, LONGEST_POD_UID])
@pytest.mark.parametrize("distribution", ROOTS)
def test_the_dra_registration_socket_fits_every_distribution(distribution: str, pod_uid: str) -> None:
    path = registration_socket(Path(ROOTS[distribution]) / "plugins_registry", pod_uid)
    assert socket_paths_problem([path]) is None, path
    assert max(size(path), size(staging_socket(path))) <= PATH_LIMIT


@pytest.mark.parametrize("pod_uid", ["", POD_UID, LONGEST_POD_UID])
@pytest.mark.parametrize("distribution", ROOTS)
def test_the_dra_plugin_socket_fits_every_distribution(distribution: str, pod_uid: str) -> None:
    path = dra_socket(Path(ROOTS[distribution]) / "plugins", pod_uid)
    assert socket_paths_problem([path]) is None, path
    assert max(size(path), size(staging_socket(path))) <= PATH_LIMIT


def test_names_per_pod_carry_a_tag_of_eight_hex_digits_and_keep_the_prefixes_of_earlier_releases() -> None:
    tag = pod_tag(POD_UID)
    assert re.fullmatch(r"[0-9a-f]{8}", tag) and tag == pod_tag(POD_UID)
    assert plugin_socket(Path("/d"), POD_UID).name == f"iluvatar-gpu-{tag}.sock"
    assert registration_socket(Path("/d"), POD_UID).name == f"gpu.iluvatar.com-{tag}-reg.sock"
    assert dra_socket(Path("/d"), POD_UID).name == f"dra-{tag}.sock"


def test_the_pods_of_an_update_get_tags_of_their_own() -> None:
    uids = [str(uuid.UUID(int=n * 0x9E3779B97F4A7C15 % 2**128, version=4)) for n in range(1, 2001)]
    assert len({pod_tag(uid) for uid in uids}) == len(uids)
    assert pod_tag("pod-a") != pod_tag("pod-b")  # UIDs that differ late, too


def test_a_device_plugin_socket_path_too_long_names_the_path_its_length_the_limit_and_the_fix() -> None:
    directory = Path("/" + "d" * (PATH_LIMIT - len("//iluvatar-gpu-12345678.sock") + 1))
    path = plugin_socket(directory, POD_UID)
    assert size(path) == PATH_LIMIT + 1
    assert path_too_long(path, DEVICE_PLUGIN_FIX) == (
        f"cannot serve the kubelet at {path}: the path has 108 bytes, and a unix socket's path is at most 107; "
        "mount the kubelet's device-plugin directory (/var/lib/kubelet/device-plugins on the host) at a shorter "
        "path and name it with --device-plugin-path (IX_DEVICE_PLUGIN_PATH; the chart's devicePluginPath)"
    )


@pytest.mark.parametrize("socket", ["registration", "plugin"])
def test_a_dra_socket_path_too_long_names_the_path_its_length_the_limit_and_the_fix(socket: str) -> None:
    root = Path("/" + "r" * 69)
    if socket == "registration":
        path = registration_socket(root / "plugins_registry", POD_UID)
    else:
        path = dra_socket(root / "plugins", POD_UID)
    assert socket_paths_problem([path]) == (
        f"cannot serve the kubelet at {path}: the path has {size(path)} bytes, and a unix socket's path is at most "
        "107; the kubelet dials this path itself, so it must be shorter on the host too: a kubelet with a shorter "
        "root directory (--root-dir), named here by --kubelet-registrar-directory-path and "
        "--kubelet-plugins-directory-path (the chart's dra.kubeletRegistrarDirectoryPath and "
        "dra.kubeletPluginsDirectoryPath)"
    )


def test_a_dra_staging_name_longer_than_the_socket_is_checked_too() -> None:
    # Without POD_UID the socket is dra.sock, and the staging name it is served on first (.dra-<8 hex>.sock) is
    # longer: a path where dra.sock would fit but the staging name would not is refused all the same.
    directory = Path("/" + "s" * (PATH_LIMIT - len("//.dra-12345678.sock") + 1))
    path = directory / "dra.sock"
    assert size(path) <= PATH_LIMIT
    problem = socket_paths_problem([path])
    assert problem is not None and "/.dra-" in problem and "the path has 108 bytes" in problem


def test_the_pod_tag_is_the_sha_256_of_the_uid_without_loading_openssls_hashes() -> None:
    import hashlib

    assert pod_tag(POD_UID) == hashlib.sha256(POD_UID.encode()).hexdigest()[:8]
