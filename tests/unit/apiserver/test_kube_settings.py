"""settings_from: who the plugin runs for and how it reaches the API server, or what is missing, named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_device_plugin.apiserver.settings import KubeConfigError, settings_from

NODE = "gpu-node-1"
FEATURE = "flags.usevolcano"


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    return path


def test_missing_node_name_names_the_feature_and_the_downward_api(kubeconfig):
    with pytest.raises(KubeConfigError) as caught:
        settings_from({"KUBECONFIG": str(kubeconfig)}, None, FEATURE)
    assert str(caught.value) == (
        "flags.usevolcano needs NODE_NAME (set it from the downward API: fieldRef spec.nodeName)"
    )


@pytest.mark.parametrize("name", ["Node_1", "-node", "node..a", "a" * 254])
def test_invalid_node_name_is_refused(kubeconfig, name):
    with pytest.raises(KubeConfigError, match=r"flags.usevolcano: NODE_NAME .* is not a valid node name"):
        settings_from({"NODE_NAME": name, "KUBECONFIG": str(kubeconfig)}, None, FEATURE)


def test_kubeconfig_flag_wins_over_the_variable(kubeconfig, tmp_path):
    other = tmp_path / "other"
    other.write_text("{}")
    settings = settings_from({"NODE_NAME": NODE, "KUBECONFIG": str(other)}, str(kubeconfig), FEATURE)
    assert settings.kubeconfig == kubeconfig
    assert settings.in_cluster is None
    assert settings.namespace == "kube-system"
    assert settings.source == f"kubeconfig {kubeconfig}"


def test_missing_kubeconfig_files_are_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(KubeConfigError, match=rf"^flags.usevolcano: --kubeconfig {missing}: no such file$"):
        settings_from({"NODE_NAME": NODE}, str(missing), FEATURE)
    with pytest.raises(KubeConfigError, match=rf"^flags.usevolcano: KUBECONFIG={missing}: no such file$"):
        settings_from({"NODE_NAME": NODE, "KUBECONFIG": str(missing)}, None, FEATURE)


def test_kubeconfig_variable_takes_the_first_existing_file_of_a_list(kubeconfig, tmp_path):
    listed = f"{tmp_path / 'absent'}:{kubeconfig}"
    assert settings_from({"NODE_NAME": NODE, "KUBECONFIG": listed}, None, FEATURE).kubeconfig == kubeconfig


def test_no_api_server_at_all_says_what_is_missing(tmp_path):
    with pytest.raises(KubeConfigError) as caught:
        settings_from({"NODE_NAME": NODE}, None, "flags.reset_gpu", service_account_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith("flags.reset_gpu needs the Kubernetes API server: give --kubeconfig or KUBECONFIG")
    assert "KUBERNETES_SERVICE_HOST" in message and "KUBERNETES_SERVICE_PORT" in message
    assert str(tmp_path / "token") in message and str(tmp_path / "ca.crt") in message


def _service_account(directory: Path, namespace: str = "ix-system") -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text("in-cluster-token\n")
    (directory / "ca.crt").write_text("not a real certificate\n")
    (directory / "namespace").write_text(namespace)
    return directory


def test_in_cluster_service_account(tmp_path):
    account = _service_account(tmp_path / "sa")
    env = {"NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    settings = settings_from(env, None, FEATURE, service_account_dir=account)
    assert settings.kubeconfig is None
    assert settings.in_cluster is not None
    assert settings.in_cluster.server == "https://10.96.0.1:443"
    assert settings.in_cluster.token_file == account / "token"
    assert settings.in_cluster.ca_file == account / "ca.crt"
    assert settings.namespace == "ix-system"
    ipv6 = settings_from({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, None, FEATURE, service_account_dir=account)
    assert ipv6.in_cluster is not None and ipv6.in_cluster.server == "https://[fd00::1]:443"
    assert settings_from({**env, "POD_NAMESPACE": "gpu"}, None, FEATURE, service_account_dir=account).namespace == "gpu"
