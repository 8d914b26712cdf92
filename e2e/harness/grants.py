"""What the admission scenarios share: the kinds of the chart's grants, the API its policies need, and a refusal that
must be one policy's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .kube import KubectlError

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
