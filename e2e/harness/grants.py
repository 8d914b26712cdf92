"""What the admission scenarios share: the chart's grants applied, the API its policies need, and a refusal that must
be one policy's."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster
from .helm import CHART, Helm, load_objects
from .kube import Kubectl, KubectlError, Obj
from .waits import until

# What helm install finds this cluster serves and helm template is told: the chart renders its policies only then.
POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
GRANT_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def refused(call: Callable[[], Any], policy: str) -> str:
    """The API server's refusal of call, which must be policy's; the message."""
    with pytest.raises(KubectlError) as raised:
        call()
    assert f"ValidatingAdmissionPolicy '{policy}'" in raised.value.stderr, raised.value.stderr
    return raised.value.stderr


def until_policies_refuse(account: Kubectl, probe: Obj, what: str) -> None:
    """Wait (60 s at most) until the API server refuses account's dry-run create of probe by an admission policy:
    a policy is in force only some time after it was created."""

    def refused_now() -> bool:
        try:
            account.create(probe, "--dry-run=server")
        except KubectlError as error:
            return "ValidatingAdmissionPolicy" in error.stderr
        return False

    until(refused_now, 60, what)


@contextlib.contextmanager
def applied_grants(cluster: Cluster, workdir: Path, values: dict[str, Any]) -> Iterator[list[Obj]]:
    """The chart's ServiceAccounts, RBAC and admission policies for values, as it renders them where the server serves
    ValidatingAdmissionPolicy, applied; deleted after."""
    helm = Helm(cluster.binaries["helm"], workdir)
    text = helm("template", "ix-device-plugin", str(CHART), "--namespace", "kube-system",
                "--values", str(helm.values_file(values)), "--api-versions", POLICY_API)  # fmt: skip
    objects = [obj for obj in load_objects(text) if obj["kind"] in GRANT_KINDS]
    cluster.admin.apply(objects)
    try:
        yield objects
    finally:
        for obj in reversed(objects):
            cluster.admin.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"), wait=False)
