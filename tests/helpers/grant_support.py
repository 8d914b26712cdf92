"""The API grants of a set of manifests, and the admission policies that bind each write grant to the node.

A write grant is a verb of a Role or ClusterRole that changes objects (create, update, patch, delete,
deletecollection or *), held by a ServiceAccount through a binding. It is covered when a ValidatingAdmissionPolicy
matches every write that verb allows (the resource's group, name and operation, at every API version) for that
ServiceAccount's user, refuses a token without a node name, and a binding enforces it (Deny) on every object.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

WRITE_OPERATIONS = {
    "create": ("CREATE",),
    "update": ("UPDATE",),
    "patch": ("UPDATE",),
    "delete": ("DELETE",),
    "deletecollection": ("DELETE",),
    "*": ("CREATE", "UPDATE", "DELETE"),
}
NODE_CLAIM = "authentication.kubernetes.io/node-name"
NO_NODE_REFUSED = 'variables.node != ""'


@dataclass(frozen=True)
class Grant:
    """One verb on one resource, held by one ServiceAccount through one role."""

    user: str  # system:serviceaccount:<namespace>:<name>
    role: str  # <kind>/<namespace>/<name>
    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource or '*'}.{self.group or 'core'} for {self.user} ({self.role})"


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def grants(objects: Iterable[dict[str, Any]]) -> list[Grant]:
    """Every (user, role, group, resource, verb) the roles of objects give the ServiceAccounts bound to them."""
    objects = list(objects)
    roles = {_key(obj): obj for obj in objects if obj.get("kind") in ("Role", "ClusterRole")}
    found: list[Grant] = []
    for binding in (obj for obj in objects if obj.get("kind") in ("RoleBinding", "ClusterRoleBinding")):
        namespace = (binding.get("metadata") or {}).get("namespace", "")
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"]))
        if role is None:
            continue
        users = [
            f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
            for subject in binding.get("subjects") or []
            if subject.get("kind") == "ServiceAccount"
        ]
        role_name = "/".join(_key(role))
        for rule in role.get("rules") or []:
            for user in users:
                found += [
                    Grant(user, role_name, group, resource, verb)
                    for group in rule.get("apiGroups") or [""]
                    for resource in rule.get("resources") or []
                    for verb in rule.get("verbs") or []
                ]
    return found


def write_grants(objects: Iterable[dict[str, Any]]) -> list[Grant]:
    """The grants that change objects."""
    return [grant for grant in grants(objects) if grant.verb in WRITE_OPERATIONS]


def _matches(rule: dict[str, Any], grant: Grant, operation: str) -> bool:
    return (
        any(group in ("*", grant.group) for group in rule.get("apiGroups") or [])
        and "*" in (rule.get("apiVersions") or [])
        and any(resource in ("*", grant.resource) for resource in rule.get("resources") or [])
        and any(op in ("*", operation) for op in rule.get("operations") or [])
    )


def _enforced(policy: dict[str, Any], objects: list[dict[str, Any]]) -> bool:
    """A binding denies what the policy refuses, on every object (no narrowing of its own)."""
    name = policy["metadata"]["name"]
    return any(
        obj.get("kind") == "ValidatingAdmissionPolicyBinding"
        and obj["spec"].get("policyName") == name
        and "Deny" in (obj["spec"].get("validationActions") or [])
        and not obj["spec"].get("matchResources")
        and not obj["spec"].get("paramRef")
        for obj in objects
    )


def _covers(policy: dict[str, Any], grant: Grant, operation: str) -> bool:
    spec = policy["spec"]
    constraints = spec.get("matchConstraints") or {}
    conditions = " ".join(condition["expression"] for condition in spec.get("matchConditions") or [])
    variables = " ".join(variable["expression"] for variable in spec.get("variables") or [])
    return (
        spec.get("failurePolicy") == "Fail"
        and constraints.get("matchPolicy") == "Equivalent"
        and not constraints.get("namespaceSelector")
        and not constraints.get("objectSelector")
        and any(_matches(rule, grant, operation) for rule in constraints.get("resourceRules") or [])
        and f'request.userInfo.username == "{grant.user}"' in conditions
        and NODE_CLAIM in variables
        and any(check["expression"] == NO_NODE_REFUSED for check in spec.get("validations") or [])
    )


def uncovered(objects: Iterable[dict[str, Any]]) -> list[str]:
    """Each write grant, and operation it allows, that no enforced node-binding policy covers."""
    objects = list(objects)
    policies = [
        obj
        for obj in objects
        if obj.get("kind") == "ValidatingAdmissionPolicy"
        and obj.get("apiVersion") == "admissionregistration.k8s.io/v1"
        and _enforced(obj, objects)
    ]
    return [
        f"{grant}: {operation} is bound by no policy"
        for grant in write_grants(objects)
        for operation in WRITE_OPERATIONS[grant.verb]
        if not any(_covers(policy, grant, operation) for policy in policies)
    ]


def grant_table(objects: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(resource.group, verb, user's ServiceAccount) of every grant: what a change of the RBAC changes."""
    return {
        (f"{grant.resource}.{grant.group or 'core'}", grant.verb, grant.user.rpartition(":")[2])
        for grant in grants(objects)
    }
