"""The real helm (v4, built by build.sh) on the project's chart: lint, template, install."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .build import REPO_ROOT
from .cluster import Cluster
from .kube import Obj
from .plugin import DEVICE_MAJOR
from .procs import run

CHART = REPO_ROOT / "deployments" / "helm" / "ix-device-plugin"
STATIC = REPO_ROOT / "deployments" / "static"


@dataclass(frozen=True)
class Helm:
    binary: Path
    workdir: Path
    kubeconfig: Path | None = None

    def __call__(self, *args: str, timeout: float = 300) -> str:
        """helm args (its caches and config under workdir); stdout, or AssertionError with stderr."""
        home = self.workdir / "helm-home"
        env = dict(os.environ)
        env.update(
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return run([str(self.binary), *args], timeout=timeout, env=env).stdout

    def values_file(self, values: dict[str, Any], name: str = "values") -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    def template(self, values: dict[str, Any] | None = None, namespace: str = "kube-system") -> list[Obj]:
        """The chart's objects for values, as `helm template` renders them (release name ix-device-plugin)."""
        args = ["template", "ix-device-plugin", str(CHART), "--namespace", namespace]
        if values:
            args += ["--values", str(self.values_file(values))]
        return load_objects(self(*args))

    def lint(self, values: dict[str, Any] | None = None) -> str:
        args = ["lint", "--strict", str(CHART)]
        if values:
            args += ["--values", str(self.values_file(values, "lint-values"))]
        return self(*args)


def node_values(
    cluster: Cluster, workdir: Path, plugins_dir: Path, simulated_devices: str | None = None
) -> dict[str, Any]:
    """The chart's values that put a release on the test node: the simulated backend, the simulated nodes' major, the
    node's device plugin, CDI and pod-resources folders, and the release's own folders (CoreX under workdir/corex,
    NFD features, and plugins_dir for the node-health record, the node's role and DRA state) instead of the host's.

    With simulated_devices (the devices file as the pod sees it), the chips are split (a device each) and their
    health looked at every 0.5 s.
    """
    values: dict[str, Any] = {
        "backend": "simulated",
        "devicePluginPath": str(cluster.device_plugin_dir),
        "kubeletPluginsPath": str(plugins_dir),
        "corexPath": str(workdir / "corex"),
        "cdi": {"specDir": str(cluster.cdi_dir)},
        "nodeFeatures": {"dir": str(workdir / "features.d")},
        "telemetry": {"interval": 2, "podResources": {"dir": str(cluster.pod_resources_socket.parent)}},
        # The simulated GPUs' nodes have a major no driver registered (plugin.DEVICE_MAJOR): the injector is told it.
        "nriInjector": {"deviceMajors": [DEVICE_MAJOR]},
    }
    if simulated_devices is not None:
        values["config"] = {"content": "flags:\n  splitboard: true\n"}
        values["extraEnv"] = [
            {"name": "IX_SIMULATED_DEVICES", "value": simulated_devices},
            {"name": "IX_HEALTH_INTERVAL", "value": "0.5"},
        ]
    return values


def load_objects(text: str) -> list[Obj]:
    """The non-empty YAML documents of text."""
    return [obj for obj in yaml.safe_load_all(text) if obj]


def static_objects(names: Iterable[str]) -> list[Obj]:
    """The objects of deployments/static/<name> for each name."""
    return [obj for name in names for obj in load_objects((STATIC / name).read_text())]


def key(obj: Obj) -> tuple[str, str, str]:
    """kind, namespace, name: how objects of two renderings are matched."""
    metadata = obj.get("metadata", {})
    return obj["kind"], metadata.get("namespace", ""), metadata["name"]


def by_key(objects: Iterable[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(obj): obj for obj in objects}


def of_kind(objects: Iterable[Obj], *kinds: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in kinds]
