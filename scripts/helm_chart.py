#!/usr/bin/env python3
"""Render the Helm chart with the real helm and check it against deployments/static.

Data functions for the tests (render_chart, load_objects, static_objects, dra_objects, differences, notes).
helm is found as $HELM, on PATH, or in the end-to-end build cache (e2e/cluster/build.sh, `make e2e-build`).

The admission policies render only where the cluster serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy (Kubernetes 1.30+): helm install reads that from the API server, helm template is told
with --api-versions (POLICY_API). So the static files come in two: ix-device-plugin.yaml, the chart without policies
(Kubernetes 1.29+), and ix-device-plugin-admission.yaml, its policies (1.30+); the same for ix-dra-driver.yaml.

    helm_chart.py check                      the chart with default values renders ix-config.yaml,
                                             ix-device-plugin.yaml and (with POLICY_API) its -admission.yaml,
                                             and with DRA_VALUES ix-dra-driver.yaml and its -admission.yaml
    helm_chart.py render [--set-yaml YAML] [--no-policies]
                                             print the chart's objects (with the policies unless --no-policies)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "deployments" / "helm" / "ix-device-plugin"
STATIC_DIR = ROOT / "deployments" / "static"
# What helm template is told the cluster serves, so that the admission policies render (as helm install finds it).
POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
# The static files the chart with default values renders: with POLICY_API all three, without it the first two.
ADMISSION_FILES = ("ix-device-plugin-admission.yaml", "ix-dra-driver-admission.yaml")
STATIC_FILES = ("ix-config.yaml", "ix-device-plugin.yaml", "ix-device-plugin-admission.yaml")
DRA_VALUES: dict[str, Any] = {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}
DRA_STATIC_FILES = ("ix-config.yaml", "ix-dra-driver.yaml", "ix-dra-driver-admission.yaml")
EXAMPLE_FILES = ("corex-example.yaml", "dra-examples.yaml")
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_RELEASE = "ix-device-plugin"
BUILD_SCRIPT = ROOT / "e2e" / "cluster" / "build.sh"


class HelmMissing(RuntimeError):
    """No helm binary: set HELM, put helm on PATH, or build it with `make e2e-build`."""


def find_helm() -> str | None:
    """$HELM, helm on PATH, or the helm of a complete end-to-end build; None when there is none."""
    for candidate in (os.environ.get("HELM"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    if BUILD_SCRIPT.exists():
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=60, check=False
        )
        built = Path(result.stdout.strip()) / "bin" / "helm"
        if result.returncode == 0 and built.is_file():
            return str(built)
    return None


def helm(*args: str) -> str:
    """Run helm with private cache and config directories; its stdout (CalledProcessError on failure)."""
    binary = find_helm()
    if binary is None:
        raise HelmMissing(HelmMissing.__doc__)
    with tempfile.TemporaryDirectory(prefix="helm-") as home:
        env = dict(os.environ, HELM_CACHE_HOME=f"{home}/cache", HELM_CONFIG_HOME=f"{home}/config")
        env["HELM_DATA_HOME"] = f"{home}/data"
        return subprocess.run([binary, *args], check=True, capture_output=True, text=True, env=env).stdout


def render_chart(
    chart_dir: Path = CHART_DIR,
    overrides: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    policies: bool = True,
) -> str:
    """`helm template` of the chart with overrides merged over values.yaml (as `helm -f`); policies: as for a
    cluster that serves ValidatingAdmissionPolicy (1.30+), else as for one that does not (1.29)."""
    api_versions = ["--api-versions", POLICY_API] if policies else []
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        yaml.safe_dump(dict(overrides or {}), values)
        values.flush()
        return helm(
            "template", release, str(chart_dir), "--namespace", namespace, "--values", values.name, *api_versions
        )


def helm_render(chart_dir: Path = CHART_DIR, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """`helm template` with default values, or None when there is no helm."""
    return None if find_helm() is None else render_chart(chart_dir, None, namespace)


def notes(chart_dir: Path = CHART_DIR, overrides: Mapping[str, Any] | None = None) -> str:
    """The chart's NOTES.txt as `helm install` prints it (a client-side dry run: no cluster needed, and so no
    ValidatingAdmissionPolicy known: the notes of a cluster without the admission policies)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        yaml.safe_dump(dict(overrides or {}), values)
        values.flush()
        output = helm(
            "install",
            DEFAULT_RELEASE,
            str(chart_dir),
            "--namespace",
            DEFAULT_NAMESPACE,
            "--dry-run=client",
            "--values",
            values.name,
        )
    return output.split("NOTES:", 1)[1] if "NOTES:" in output else ""


def load_objects(text: str) -> list[dict[str, Any]]:
    """Parse a multi-document YAML stream, dropping empty documents."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name)."""
    result = {}
    for obj in objects:
        meta = obj.get("metadata", {})
        result[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return result


def without_policies(names: tuple[str, ...]) -> tuple[str, ...]:
    """The static files among names that a cluster without ValidatingAdmissionPolicy (1.29) takes."""
    return tuple(name for name in names if name not in ADMISSION_FILES)


def static_objects(
    static_dir: Path = STATIC_DIR, names: tuple[str, ...] = STATIC_FILES, policies: bool = True
) -> list[dict[str, Any]]:
    """The objects of the static files that the chart reproduces (with default values, or DRA_VALUES); without
    policies, those of the files but the admission ones."""
    names = names if policies else without_policies(names)
    return [obj for name in names for obj in load_objects((static_dir / name).read_text())]


def dra_objects(static_dir: Path = STATIC_DIR, policies: bool = True) -> list[dict[str, Any]]:
    """The objects of the DRA static files, which the chart renders with DRA_VALUES."""
    return static_objects(static_dir, DRA_STATIC_FILES, policies)


def differences(rendered: list[dict[str, Any]], static: list[dict[str, Any]]) -> list[str]:
    """Human-readable differences between two sets of objects; empty when they are the same."""
    left, right = keyed(rendered), keyed(static)
    problems = [f"only in the chart: {key}" for key in left.keys() - right.keys()]
    problems += [f"only in the static files: {key}" for key in right.keys() - left.keys()]
    for key in sorted(left.keys() & right.keys()):
        problems += [f"{key}: {line}" for line in _diff(left[key], right[key], "")]
    return problems


def _diff(a: object, b: object, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for key in sorted(a.keys() | b.keys(), key=str):
            lines += _diff(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}")
        return lines
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=True)) for line in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: chart {a!r} != static {b!r}"]


def _check() -> int:
    problems: list[str] = []
    for policies, what in ((True, "1.30+"), (False, "without policies")):
        plugin = differences(load_objects(render_chart(policies=policies)), static_objects(policies=policies))
        dra = differences(
            load_objects(render_chart(overrides=DRA_VALUES, policies=policies)), dra_objects(policies=policies)
        )
        problems += [f"{what}: {line}" for line in plugin] + [f"{what}: dra: {line}" for line in dra]
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("chart and static manifests differ (helm template)", file=sys.stderr)
        return 1
    print("chart renders the static manifests (helm template)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="print the chart's objects")
    render.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    render.add_argument("--set-yaml", default="", help="values to merge, as a YAML mapping")
    render.add_argument(
        "--no-policies", action="store_true", help="as for a cluster without ValidatingAdmissionPolicy (1.29)"
    )
    commands.add_parser("check", help="check the chart renders the static manifests")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            return _check()
        overrides = yaml.safe_load(args.set_yaml) or {}
        print(render_chart(overrides=overrides, namespace=args.namespace, policies=not args.no_policies), end="")
    except HelmMissing as error:
        print(f"helm_chart.py: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        print(f"helm_chart.py: helm failed: {error.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
