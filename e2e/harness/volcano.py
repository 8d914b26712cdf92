"""Volcano's scheduler as the end-to-end scenarios stand it in (no Volcano runs here): its account as Volcano's
installer makes it, the ServiceAccount volcano-scheduler in volcano-system (volcano-sh/volcano,
installer/volcano-development.yaml), granted the pod writes it makes (patch, and pods/binding), and its two steps
for a pod: its choice written into the pod's annotations under its field manager, then the pod bound to the node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .cluster import Cluster
from .kube import Kubectl, Obj, api_request
from .waits import until

NAMESPACE = "volcano-system"
ACCOUNT = "volcano-scheduler"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"  # the chart's default volcanoSchedulerUsers
# Volcano's scheduler names no field manager, so the API server records its program name (README "Volcano mode").
FIELD_MANAGER = "vc-scheduler"
SCHEDULER_NAME = "volcano"  # no scheduler of that name runs here: such a pod waits until bound
ROLE = "ix-e2e-volcano-scheduler"
DEV_VOLCANO, PREDICATE_TIME = "iluvatar.com/DevVolcano", "predicate-time"  # deviceplugin/features/volcano.py


def _grants() -> list[Obj]:
    """The ServiceAccount and, of Volcano's ClusterRole (its chart's templates/scheduler.yaml), the pod rules."""
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    ]
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": ROLE},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ROLE},
            "roleRef": role_ref,
            "subjects": [subject],
        },
    ]


@contextlib.contextmanager
def volcano_scheduler(cluster: Cluster, kubeconfig: Path) -> Iterator[Kubectl]:
    """kubectl as Volcano's scheduler (a TokenRequest token of its ServiceAccount) while it is granted its pod
    writes; its ServiceAccount, grants and (when made here) namespace are deleted afterwards."""
    admin = cluster.admin
    made_namespace = admin.get_or_none("namespace", NAMESPACE) is None
    if made_namespace:
        admin("create", "namespace", NAMESPACE)
    objects = _grants()
    admin.apply(objects)
    try:
        scheduler = admin.with_kubeconfig(cluster.service_account_kubeconfig(NAMESPACE, ACCOUNT, kubeconfig))
        until(lambda: scheduler.can_i("patch", "pods", "default"), 30, "the scheduler's grants in force")
        yield scheduler
    finally:
        for obj in reversed(objects):
            admin.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"), wait=False)
        if made_namespace:
            admin.delete("namespace", NAMESPACE, wait=False)


def annotate(
    account: Kubectl, namespace: str, pod: str, annotations: dict[str, str], field_manager: str = FIELD_MANAGER
) -> None:
    """Set annotations on the pod as the scheduler writes them (a merge patch), under field_manager."""
    pairs = [f"{key}={value}" for key, value in annotations.items()]
    account("annotate", "pod", pod, *pairs, "--overwrite", f"--field-manager={field_manager}", "-n", namespace)


def bind(account: Kubectl, namespace: str, pod: str, node: str) -> None:
    """Bind the pod to node through pods/binding, as Volcano's scheduler (and any scheduler) places a pod."""
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    api_request(account, "POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", binding)
