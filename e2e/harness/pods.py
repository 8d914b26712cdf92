"""Test pods on the busybox image and bounded waits on them, reporting events and logs when they time out."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from .images import BUSYBOX_IMAGE
from .kube import Kubectl, KubectlError, Obj
from .waits import WaitFailed, until

# A container that prints what it was given (device nodes, their numbers, the GPU variables) and stays up.
SHOW_DEVICES = (
    "echo BEGIN; for f in /dev/iluvatar* /dev/itrctl; do [ -e $f ] && stat -c '%n %t:%T %F' $f; done; "
    "env | grep -E '^(IX_|ILUVATAR_)' | sort; echo END; "
)
STAY = "trap 'exit 0' TERM; while true; do sleep 1; done"


def busybox_pod(
    name: str,
    script: str,
    gpus: int | None = None,
    resource: str = "iluvatar.com/gpu",
    claims: list[dict[str, Any]] | None = None,
    restart_policy: str = "Never",
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A pod running `sh -c script` on the busybox image, asking for gpus of resource or for claims."""
    container: Obj = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    if gpus is not None:
        container["resources"] = {"limits": {resource: str(gpus)}}
    spec: Obj = {"containers": [container], "restartPolicy": restart_policy, "terminationGracePeriodSeconds": 2}
    if claims:
        spec["resourceClaims"] = claims
        container["resources"] = {"claims": [{"name": claim["name"]} for claim in claims]}
    metadata: Obj = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def describe_pod(kubectl: Kubectl, namespace: str, name: str) -> str:
    """kubectl describe and logs of the pod, for a failure message."""
    parts = []
    for args in (["describe", "pod", name, "-n", namespace], ["logs", name, "-n", namespace, "--all-containers"]):
        try:
            parts.append(kubectl(*args, timeout=30)[-4000:])
        except (KubectlError, AssertionError) as error:
            parts.append(str(error)[-1000:])
    return "\n".join(parts)


def wait_pod(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    condition: Callable[[Obj], bool],
    what: str,
    timeout: float = 120,
    logs: Iterable[Any] = (),
) -> Obj:
    """The pod once condition(pod) holds; WaitFailed with its description, events and logs otherwise."""

    def matching() -> Obj | None:
        pod = kubectl.get_or_none("pod", name, namespace)
        return pod if pod is not None and condition(pod) else None

    try:
        return until(matching, timeout, f"pod {namespace}/{name}: {what}", interval=1)
    except WaitFailed as failed:
        tails = "".join(f"\n{log}" for log in logs)
        raise WaitFailed(f"{failed}\n{describe_pod(kubectl, namespace, name)}{tails}") from None


def phase_is(*phases: str) -> Callable[[Obj], bool]:
    return lambda pod: pod.get("status", {}).get("phase") in phases


def running_and_printed(kubectl: Kubectl, namespace: str) -> Callable[[Obj], bool]:
    """Running (or Succeeded) and its log holds the END marker of SHOW_DEVICES."""

    def check(pod: Obj) -> bool:
        if pod.get("status", {}).get("phase") not in ("Running", "Succeeded"):
            return False
        return "END" in kubectl("logs", pod["metadata"]["name"], "-n", namespace, timeout=30)

    return check


def run_and_read(
    kubectl: Kubectl, namespace: str, pod: Obj, timeout: float = 120, create_args: tuple[str, ...] = ()
) -> tuple[Obj, str]:
    """Create pod (kubectl create with create_args), wait until it has printed SHOW_DEVICES's output; the pod and
    that output."""
    kubectl.create(pod, "-n", namespace, *create_args)
    name = pod["metadata"]["name"]
    current = wait_pod(
        kubectl, namespace, name, running_and_printed(kubectl, namespace), "printed its devices", timeout
    )
    return current, kubectl("logs", name, "-n", namespace)


def shown_devices(output: str) -> tuple[dict[str, str], dict[str, str]]:
    """From SHOW_DEVICES's output: {device path: 'major:minor' (hex)} and {variable: value}."""
    block = output.split("BEGIN", 1)[-1].split("END", 1)[0]
    nodes: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in block.strip().splitlines():
        match = re.match(r"^(/dev/\S+) (\w+:\w+) character special file$", line)
        if match:
            nodes[match.group(1)] = match.group(2)
        elif "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
    return nodes, env


def node_resource(kubectl: Kubectl, node: str, resource: str) -> tuple[int, int]:
    """(capacity, allocatable) of resource on node; 0 when absent."""
    status = kubectl.get("node", node)["status"]
    return int(status.get("capacity", {}).get(resource, "0")), int(status.get("allocatable", {}).get(resource, "0"))


def to_json(obj: Obj) -> str:
    return json.dumps(obj, indent=1)
