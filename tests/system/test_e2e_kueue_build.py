"""e2e/cluster/build.sh's Kueue: the manager (`sigs.k8s.io/kueue/cmd/kueue`, the version e2e/versions.env pins) and
the CRDs of its module, verified like every component. Go and the built binaries are stand-ins (those of
test_e2e_fresh_machine): nothing is compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e_fresh_machine import FakeBuildHost, version_outputs, versions, write_script

# The stand-in go also names a module folder holding Kueue's CRD bases, as `go mod download -json` does.
KUEUE_MODULE_GO = """#!/bin/bash
"$(dirname "$0")/go.stand-in" "$@"
if [[ $1 == mod && $2 == download ]]; then
    bases="$FAKE_BUILDS/module/config/components/crd/bases"
    mkdir -p "$bases"
    for kind in clusterqueues localqueues resourceflavors workloads; do
        printf -- '---\\nkind: CustomResourceDefinition\\nmetadata:\\n  name: %s.kueue.x-k8s.io\\n' $kind \\
            >"$bases/kueue.x-k8s.io_$kind.yaml"
    done
    printf '\\t"Dir": "%s",\\n' "$FAKE_BUILDS/module"
fi
"""


@pytest.fixture
def host(tmp_path: Path) -> FakeBuildHost:
    made = FakeBuildHost(tmp_path)
    made.wrap_go(KUEUE_MODULE_GO)
    return made


def test_a_cache_from_before_kueue_builds_kueue_alone_with_its_version_and_crds(host: FakeBuildHost) -> None:
    earlier = version_outputs()
    del earlier["bin/kueue"], earlier["kueue/kueue-crds.yaml"]
    host.fill_cache(earlier)
    host.go_builds(version_outputs())
    result = host.build()
    assert result.returncode == 0, result.stderr
    assert host.go_installs() == ["kueue"]
    version = versions()["KUEUE_VERSION"]
    log = host.go_log.read_text()
    assert f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={version} sigs.k8s.io/kueue/cmd/kueue@{version}" in log
    assert f"mod download -json sigs.k8s.io/kueue@{version}" in log
    crds = (host.dest / "kueue" / "kueue-crds.yaml").read_text()
    assert crds.count("kind: CustomResourceDefinition") == 4
    assert "  name: workloads.kueue.x-k8s.io\n" in crds
    assert (host.dest / "complete").exists()


def test_verify_names_a_kueue_of_another_version_and_crds_without_workloads(host: FakeBuildHost) -> None:
    outputs = version_outputs()
    outputs["bin/kueue"] = outputs["bin/kueue"].replace(versions()["KUEUE_VERSION"], "v0.18.0")
    host.fill_cache(outputs)
    crds = host.dest / "kueue" / "kueue-crds.yaml"
    crds.write_text(crds.read_text().replace("workloads.kueue", "cohorts.kueue"))
    result = host.build("--verify")
    assert result.returncode == 1
    complaints = sorted(result.stderr.splitlines())
    assert len(complaints) == 2, complaints
    assert "bin/kueue: `kueue` does not say" in complaints[0] and '"gitVersion":"v0.18.0"' in complaints[0]
    assert complaints[1].endswith("kueue-crds.yaml: no CustomResourceDefinition workloads.kueue.x-k8s.io")


def test_kueue_is_verified_without_reaching_a_cluster(host: FakeBuildHost) -> None:
    """Kueue has no version flag: it runs until it looks for a cluster, and KUEUE_VERSION names none it could find."""
    outputs = version_outputs()
    host.fill_cache(outputs)
    said = outputs["bin/kueue"].replace("\n", "")
    write_script(host.dest / "bin/kueue", f"#!/bin/sh\n[ \"$KUBECONFIG\" = /nonexistent ] && printf '%s' '{said}'\n")
    assert host.build("--verify").returncode == 0
