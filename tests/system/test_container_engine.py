"""scripts/container.sh picks the container engine by what it can do: the first of docker, podman and buildah
(or CONTAINER_ENGINE alone) that builds a one-step image here, saying on stderr which one and why each before it
was skipped. An engine that answers `info` but cannot start a container (podman's crun on a cgroup v1 host)
is skipped, where it used to be chosen and fail the image build.

The engines here are fakes on a PATH of their own: each logs its calls, keeps the Containerfile it was asked to
build and succeeds or fails as the test says.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.support import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "container.sh"
ENGINES = ("docker", "podman", "buildah")
# What the script (and the fake engines) run besides the engines.
BASE_TOOLS = (
    "bash", "cat", "cp", "cut", "dirname", "env", "grep", "ldd", "ls", "mkdir", "mktemp", "paste", "rm", "sed",
    "sh", "tail", "timeout", "tr", "true",
)  # fmt: skip
CRUN_ON_CGROUP_V1 = (
    "Error: crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2: OCI runtime error"
)
FAKE_ENGINE = """#!/bin/bash
# A container engine: logs its arguments; `build`/`bud` keeps the Containerfile (-f) and succeeds or fails as
# $FAKE_<NAME> says ("ok", or the message to fail with); `info` and the rest always succeed.
name=${0##*/}
echo "$name $*" >>"$FAKE_DIR/calls"
verb="" file=""
previous=""
for arg in "$@"; do
    case $arg in
        build | bud) [ -z "$verb" ] && verb=build ;;
        rmi | info | images | image) [ -z "$verb" ] && verb=$arg ;;
    esac
    [ "$previous" = -f ] && file=$arg
    previous=$arg
done
[ "$verb" = build ] || exit 0
context=${@: -1}
cp "$file" "$FAKE_DIR/$name.Containerfile"
ls -R "$context" >"$FAKE_DIR/$name.context"
outcome_var="FAKE_${name^^}"
if [ "${!outcome_var:-ok}" = ok ]; then exit 0; fi
echo "STEP 2/2: RUN" >&2
echo "${!outcome_var}" >&2
exit 1
"""


class Host:
    """A PATH of the base tools and the fake engines installed; runs container.sh there."""

    def __init__(self, directory: Path, installed: tuple[str, ...] = ENGINES) -> None:
        self.dir = directory
        self.bin = directory / "bin"
        self.bin.mkdir()
        for tool in BASE_TOOLS:
            found = shutil.which(tool)
            assert found is not None, f"the test needs {tool}"
            (self.bin / tool).symlink_to(found)
        for name in installed:
            (self.bin / name).write_text(FAKE_ENGINE)
            (self.bin / name).chmod(0o755)
        self.outcomes: dict[str, str] = {}

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environment = {"PATH": str(self.bin), "HOME": str(self.dir), "FAKE_DIR": str(self.dir), **env}
        environment.update({f"FAKE_{name.upper()}": outcome for name, outcome in self.outcomes.items()})
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd=REPO_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def calls(self) -> list[str]:
        calls = self.dir / "calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def builds(self, name: str) -> list[str]:
        return [call for call in self.calls() if call.startswith(f"{name} ") and (" build " in call or " bud " in call)]


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_an_engine_that_cannot_build_is_skipped_saying_why_and_the_next_is_chosen(host: Host) -> None:
    host.outcomes = {"docker": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
                     "podman": CRUN_ON_CGROUP_V1}  # fmt: skip
    result = host.run("engine")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "buildah\n"
    lines = result.stderr.splitlines()
    assert lines[0].startswith("container.sh: docker: skipped, it cannot build a one-step image here:")
    assert "Cannot connect to the Docker daemon" in lines[0]
    assert lines[1].startswith("container.sh: podman: skipped, it cannot build a one-step image here:")
    assert "cgroups in hybrid mode not supported" in lines[1]
    assert lines[2] == "container.sh: using buildah: it builds an image here"


def test_the_first_engine_that_builds_is_chosen_and_the_others_are_not_tried(host: Host) -> None:
    result = host.run("engine")
    assert result.stdout == "docker\n"
    assert result.stderr == "container.sh: using docker: it builds an image here\n"
    assert host.builds("podman") == host.builds("buildah") == []


def test_an_engine_not_installed_is_named_as_such(tmp_path: Path) -> None:
    host = Host(tmp_path, installed=("podman", "buildah"))
    result = host.run("engine")
    assert result.stdout == "podman\n"
    assert "container.sh: docker: not installed" in result.stderr


def test_the_probe_is_a_real_one_step_build_run_as_the_image_build_runs_the_engine(host: Host) -> None:
    """The probe runs a command (a RUN step: where a runtime that cannot start containers fails), from the host's
    own files (nothing pulled), with the flags `build` gives the engine, and removes its image afterwards."""
    host.outcomes = {"docker": "no daemon", "podman": "no runtime"}
    assert host.run("engine").stdout == "buildah\n"
    (probe,) = host.builds("podman")
    assert probe.startswith("podman --storage-driver vfs build --layers=false -f ")
    (probe,) = host.builds("buildah")
    assert probe.startswith("buildah --storage-driver vfs bud --isolation chroot --layers=false -f ")
    containerfile = (host.dir / "buildah.Containerfile").read_text().splitlines()
    assert containerfile[:2] == ["FROM scratch", "COPY rootfs/ /"]
    run = containerfile[2]
    assert run.startswith('RUN ["') and run.endswith('"]')
    binary = run[len('RUN ["') : -len('"]')]
    context = (host.dir / "buildah.context").read_text()
    assert Path(binary).name in context and "ld-linux" in context  # the command and its loader
    removed = [call for call in host.calls() if " rmi " in call]
    assert len(removed) == 3 and all("ix-device-plugin-engine-probe" in call for call in removed)


def test_container_engine_is_the_only_candidate(host: Host) -> None:
    host.outcomes = {"podman": CRUN_ON_CGROUP_V1}
    result = host.run("engine", CONTAINER_ENGINE="podman")
    assert result.stdout == ""
    assert "podman: skipped" in result.stderr
    assert "no engine can build an image here (tried podman, as CONTAINER_ENGINE says)" in result.stderr
    assert host.builds("docker") == host.builds("buildah") == []
    assert host.run("engine", CONTAINER_ENGINE="buildah").stdout == "buildah\n"
    assert "unknown engine rkt" in host.run("engine", CONTAINER_ENGINE="rkt").stderr


def test_the_image_is_built_with_the_engine_that_can(host: Host) -> None:
    host.outcomes = {"docker": "no daemon", "podman": CRUN_ON_CGROUP_V1}
    result = host.run("build", "ix-device-plugin:test", BASE_IMAGE="localhost/base:1")
    assert result.returncode == 0, result.stderr
    assert "building ix-device-plugin:test with buildah" in result.stdout
    image_build = [call for call in host.builds("buildah") if "-f Dockerfile" in call]
    assert len(image_build) == 1 and "--build-arg BASE_IMAGE=localhost/base:1" in image_build[0]
    assert [call for call in host.builds("podman") if "-f Dockerfile" in call] == []


def test_no_engine_that_builds_skips_the_image_saying_so(host: Host) -> None:
    host.outcomes = {name: f"{name} cannot" for name in ENGINES}
    result = host.run("build", "ix-device-plugin:test")
    assert result.returncode == 0
    assert "no engine can build an image here (tried docker, podman, buildah)" in result.stderr
    assert "SKIPPING the image ix-device-plugin:test" in result.stderr
