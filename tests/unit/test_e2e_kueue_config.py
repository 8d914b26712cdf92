"""The Kueue the end-to-end scenarios run (e2e/harness/kueue.py) is configured as docs/quota.md tells users to: the
same deviceClassMappings, feature gates and ResourceFlavor; and the rest of its configuration is what a host process
beside the one-node cluster needs (loopback servers, no leader election, no internal certificates, Jobs only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from e2e.harness import kueue

pytestmark = pytest.mark.unit

QUOTA_DOC = Path(__file__).resolve().parents[2] / "docs" / "quota.md"
FENCED_YAML = re.compile(r"^```yaml\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def documented(kind: str) -> list[dict]:
    """The objects of kind in docs/quota.md's YAML blocks."""
    found = []
    for block in FENCED_YAML.findall(QUOTA_DOC.read_text()):
        found += [doc for doc in yaml.safe_load_all(block) if doc and doc.get("kind") == kind]
    return found


def test_the_device_class_mappings_and_feature_gates_are_the_documented_ones() -> None:
    (configuration,) = documented("Configuration")
    assert kueue.device_class_mappings() == configuration["resources"]["deviceClassMappings"]
    assert configuration["featureGates"].items() <= kueue.FEATURE_GATES.items()


def test_the_resource_flavor_is_the_documented_one() -> None:
    flavors = {flavor["metadata"]["name"]: flavor for flavor in documented("ResourceFlavor")}
    assert flavors[kueue.FLAVOR] == kueue.resource_flavor()


def test_the_manager_serves_on_loopback_alone_without_election_or_certificates_of_its_own() -> None:
    settings = kueue.configuration(9443, 8080, 9444, Path("/run/certs"))
    assert settings["integrations"] == {"frameworks": ["batch/job"]}
    assert settings["leaderElection"] == {"leaderElect": False}
    assert settings["internalCertManagement"] == {"enable": False}
    assert settings["manageJobsWithoutQueueName"] is False
    assert settings["health"]["healthProbeBindAddress"] == "127.0.0.1:9443"
    assert settings["metrics"]["bindAddress"] == "127.0.0.1:8080"
    assert settings["webhook"] == {"host": "127.0.0.1", "port": 9444, "certDir": "/run/certs"}
    assert settings["featureGates"]["VisibilityOnDemand"] is False  # else a server on every address, port 8082


def crd(plural: str, version: str) -> dict:
    """A CustomResourceDefinition as controller-gen writes Kueue's, with a name nested under spec too."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "annotations": {"controller-gen.kubebuilder.io/version": "v0.20.1"},
            "name": f"{plural}.kueue.x-k8s.io",
        },
        "spec": {
            "group": "kueue.x-k8s.io",
            "names": {"plural": plural},
            "versions": [{"name": version, "served": True}],
        },
    }


@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9]{0,20}", fullmatch=True), min_size=1, max_size=12, unique=True),
    st.sampled_from(["v1beta1", "v1beta2"]),
)
def test_the_crd_names_are_read_from_each_documents_metadata_whatever_else_is_named(
    plurals: list[str], version: str
) -> None:
    text = "".join(f"---\n{yaml.safe_dump(crd(plural, version))}" for plural in plurals)
    assert kueue.CRD_NAME.findall(text) == [f"{plural}.kueue.x-k8s.io" for plural in plurals]
