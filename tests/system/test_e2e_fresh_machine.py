"""`make e2e` on a fresh machine: the package step (e2e/cluster/packages.sh), the build's verification of every
binary it caches (e2e/cluster/build.sh) and the suite's skip report (e2e/harness/skips.py).

The package manager, Go and the built binaries are stand-ins on PATH or in a temporary cache: the scripts
themselves run for real, nothing is installed and nothing is compiled.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import REPO_ROOT

E2E_DIR = REPO_ROOT / "e2e"
PACKAGES = E2E_DIR / "cluster" / "packages.sh"
BUILD = E2E_DIR / "cluster" / "build.sh"
BASH = shutil.which("bash") or "/bin/bash"
E2E_PACKAGES = ("python3-venv", "gcc", "pkg-config", "libseccomp-dev", "ca-certificates", "make", "openssl", "iproute2")
E2E_PACKAGES += ("nftables", "busybox-static", "debootstrap", "buildah")


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IX_", "PYTEST_", "CI"))}
    return {**env, **extra}


# ------------------------------------------------------------------ packages.sh


FAKE_DPKG_QUERY = """#!/bin/bash
# dpkg-query -W -f=FORMAT PACKAGE: "ii " when PACKAGE is a line of $FAKE_INSTALLED, else not found
package=${!#}
if grep -qxF "$package" "$FAKE_INSTALLED"; then printf 'ii '; exit 0; fi
echo "dpkg-query: no packages found matching $package" >&2
exit 1
"""
FAKE_APT_GET = """#!/bin/bash
# records its arguments; `install` adds its packages to $FAKE_INSTALLED but those in $FAKE_APT_BROKEN
echo "$*" >>"$FAKE_APT_LOG"
[[ $1 == install ]] || exit 0
for arg in "$@"; do
    case $arg in install | -*) continue ;; esac
    [[ " ${FAKE_APT_BROKEN:-} " == *" $arg "* ]] || echo "$arg" >>"$FAKE_INSTALLED"
done
"""
FAKE_ID = """#!/bin/bash
echo "$FAKE_UID"
"""


class FakeDebian:
    """A PATH where dpkg-query, apt-get and id are stand-ins over a list of installed packages."""

    def __init__(self, directory: Path) -> None:
        self.bin = directory / "bin"
        self.installed = directory / "installed"
        self.apt_log = directory / "apt.log"
        write_script(self.bin / "dpkg-query", FAKE_DPKG_QUERY)
        write_script(self.bin / "apt-get", FAKE_APT_GET)
        write_script(self.bin / "id", FAKE_ID)
        self.installed.write_text("")
        self.apt_log.write_text("")

    def install(self, *packages: str) -> None:
        with self.installed.open("a") as file:
            file.writelines(f"{package}\n" for package in packages)

    def run(self, *groups: str, uid: int, broken: str = "") -> subprocess.CompletedProcess[str]:
        env = clean_env(
            PATH=f"{self.bin}:{os.environ['PATH']}",
            FAKE_INSTALLED=str(self.installed),
            FAKE_APT_LOG=str(self.apt_log),
            FAKE_APT_BROKEN=broken,
            FAKE_UID=str(uid),
        )
        return subprocess.run(
            [BASH, str(PACKAGES), *groups], capture_output=True, text=True, timeout=60, env=env, check=False
        )

    def apt_calls(self) -> list[str]:
        return self.apt_log.read_text().splitlines()


@pytest.fixture
def debian(tmp_path: Path) -> FakeDebian:
    return FakeDebian(tmp_path)


def test_packages_not_root_names_each_missing_package_and_refuses(debian: FakeDebian) -> None:
    debian.install(*(p for p in E2E_PACKAGES if p not in ("libseccomp-dev", "debootstrap")))
    result = debian.run("e2e", uid=1000)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any(line.split()[:1] == ["libseccomp-dev"] and "runc with seccomp" in line for line in lines), lines
    assert any(line.split()[:1] == ["debootstrap"] for line in lines), lines
    assert "apt-get install libseccomp-dev debootstrap" in result.stderr
    assert "gcc" not in result.stderr.split()
    assert debian.apt_calls() == []


def test_packages_as_root_installs_exactly_the_missing_ones(debian: FakeDebian) -> None:
    debian.install(*(p for p in E2E_PACKAGES if p not in ("libseccomp-dev", "busybox-static")))
    result = debian.run("e2e", uid=0)
    assert result.returncode == 0, result.stderr
    calls = debian.apt_calls()
    assert calls[0].split()[0] == "update"
    assert calls[1].split()[0] == "install"
    assert [arg for arg in calls[1].split()[1:] if not arg.startswith("-")] == ["libseccomp-dev", "busybox-static"]


def test_packages_unit_group_adds_the_cdi_tests_runtime(debian: FakeDebian) -> None:
    debian.install(*E2E_PACKAGES)
    result = debian.run("e2e", "unit", uid=0)
    assert result.returncode == 0, result.stderr
    installed = [arg for arg in debian.apt_calls()[1].split()[1:] if not arg.startswith("-")]
    assert installed == ["podman", "runc"]


def test_packages_all_installed_does_nothing(debian: FakeDebian) -> None:
    debian.install(*E2E_PACKAGES)
    for uid in (0, 1000):
        result = debian.run(uid=uid)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
    assert debian.apt_calls() == []


def test_packages_apt_get_failure_is_reported_by_name(debian: FakeDebian) -> None:
    debian.install(*(p for p in E2E_PACKAGES if p not in ("buildah", "openssl")))
    result = debian.run("e2e", uid=0, broken="buildah")
    assert result.returncode == 1
    assert "apt-get could not install" in result.stderr
    refused = result.stderr.split("apt-get could not install:")[1].split()
    assert "buildah" in refused and "openssl" not in refused


def test_packages_outside_debian_probes_and_names_what_is_missing(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    write_script(fake_bin / "id", "#!/bin/sh\necho 0\n")
    for tool in ("head", "grep"):
        (fake_bin / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = subprocess.run(
        [BASH, str(PACKAGES)], capture_output=True, text=True, timeout=60, env=clean_env(PATH=str(fake_bin))
    )
    assert result.returncode == 1
    assert "not a Debian/Ubuntu system" in result.stderr
    named = {line.split()[0] for line in result.stderr.splitlines() if line.startswith("  ")}
    assert {"gcc", "pkg-config", "libseccomp-dev", "debootstrap", "buildah", "busybox-static"} <= named


def test_packages_unknown_group_is_an_error(debian: FakeDebian) -> None:
    result = debian.run("everything", uid=0)
    assert result.returncode == 2
    assert "unknown group everything" in result.stderr


# ------------------------------------------------------------------ the virtual environment on a fresh Debian
# Debian's python3 has no ensurepip without python3-venv, so `python3 -m venv` stops there: the README says to
# install it before its first command, and `make e2e` and .ci/run install it before they make theirs.


def test_packages_installs_python3_venv_on_a_debian_without_it(debian: FakeDebian) -> None:
    debian.install(*(p for p in E2E_PACKAGES if p != "python3-venv"))
    result = debian.run("e2e", uid=0)
    assert result.returncode == 0, result.stderr
    assert [arg for arg in debian.apt_calls()[1].split()[1:] if not arg.startswith("-")] == ["python3-venv"]


def test_make_e2e_installs_the_packages_before_it_makes_the_virtual_environment(tmp_path: Path) -> None:
    make = shutil.which("make")
    assert make is not None, "make is one of the e2e packages, and the tests run where it is"
    dry_run = subprocess.run(
        [make, "-n", "e2e", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
    )  # fmt: skip
    lines = dry_run.stdout.splitlines()
    packages = next(i for i, line in enumerate(lines) if "packages.sh" in line)
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert packages < venv, lines


def test_ci_installs_the_packages_before_it_makes_the_virtual_environment() -> None:
    lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()]
    packages = next(i for i, line in enumerate(lines) if line.startswith("e2e/cluster/packages.sh"))
    venv = next(i for i, line in enumerate(lines) if line.startswith("python3 -m venv"))
    assert packages < venv


def test_the_readme_says_to_install_python3_venv_before_its_first_command() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    first = text.index("python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/ix-device-plugin demo")
    assert "apt-get install python3-venv" in text[text.index("## Try it") : first]


# ------------------------------------------------------------------ build.sh: verified binaries


def versions() -> dict[str, str]:
    pairs = {}
    for line in (E2E_DIR / "versions.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pairs[key] = value
    return pairs


def version_outputs(*, seccomp: bool = True, containerd: str | None = None) -> dict[str, str]:
    """What each binary of a good build prints when build.sh asks its version (runc without libseccomp
    when not seccomp, containerd and its tools of another version when containerd is given).
    """
    v = versions()
    kube = v["KUBERNETES_VERSION"]
    containerd = containerd or v["CONTAINERD_VERSION"]
    runc = f"runc version {v['RUNC_VERSION'].removeprefix('v')}\nspec: 1.3.0\ngo: go1.26.8\n"
    if seccomp:
        runc += "libseccomp: 2.5.4\n"
    outputs = {
        "bin/pause": "",
        "bin/cdi-validate": "usage: cdi-validate [--inject NAME[,NAME...]] SPEC_DIR...\n",
        "bin/dra-metadata-check": "usage: dra-metadata-check FILE...\n",
        "bin/runc": runc,
        "bin/containerd": f"containerd github.com/containerd/containerd/v2 {containerd} \n",
        "bin/ctr": f"ctr github.com/containerd/containerd/v2 {containerd}\n",
        "bin/containerd-shim-runc-v2": f"containerd-shim-runc-v2:\n  Version:  {containerd}\n  Revision: \n",
        "bin/etcd": f"etcd Version: {v['ETCD_VERSION'].removeprefix('v')}\nGit SHA: Not provided\n",
        "bin/helm": v["HELM_VERSION"],
        "bin/kubectl": f"Client Version: {kube}\nKustomize Version: v5.7.1\n",
        "bin/kueue": f'{{"level":"info","msg":"Initializing","gitVersion":"{v["KUEUE_VERSION"]}"}}\n',
        "kueue/kueue-crds.yaml": "".join(
            f"---\nkind: CustomResourceDefinition\nmetadata:\n  name: {kind}.kueue.x-k8s.io\n"
            for kind in ("clusterqueues", "localqueues", "resourceflavors", "workloads")
        ),
    }
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"):
        outputs[f"bin/{name}"] = f"Kubernetes {kube}\n"
    for name in ("bridge", "host-local", "loopback"):
        outputs[f"cni/bin/{name}"] = f"CNI {name} plugin {v['CNI_PLUGINS_VERSION']}\nCNI protocol versions ...\n"
    return outputs


def fake_binary(path: Path, output: str) -> Path:
    """A script that prints output whatever it is asked (a built binary, as build.sh sees it)."""
    text = output.replace("'", "'\\''")
    return write_script(path, f"#!/bin/sh\nprintf '%s' '{text}'\n")


FAKE_GO = """#!/bin/bash
# go install ... PKG@VERSION... copies $FAKE_BUILDS/<last path element of PKG> into $GOBIN;
# go build -o DIR/ ./NAME... or k8s.io/kubernetes/cmd/NAME... copies $FAKE_BUILDS/NAME into DIR;
# go mod download -json names an empty go.mod; anything else does nothing
echo "$*" >>"$FAKE_GO_LOG"
case $1 in
install)
    for arg in "$@"; do
        case $arg in *@*) name=${arg%@*}; name=${name##*/}; cp "$FAKE_BUILDS/$name" "$GOBIN/$name" ;; esac
    done
    ;;
build)
    shift
    while (($#)); do
        case $1 in
        -o) out=$2; shift ;;
        ./* | k8s.io/kubernetes/cmd/*) cp "$FAKE_BUILDS/${1##*/}" "$out${1##*/}" ;;
        esac
        shift
    done
    ;;
mod)
    if [[ $2 == download ]]; then
        : >"$FAKE_BUILDS/go.mod"
        printf '\\t"GoMod": "%s",\\n' "$FAKE_BUILDS/go.mod"
    fi
    ;;
esac
"""
FAKE_PKG_CONFIG = """#!/bin/bash
[[ $FAKE_LIBSECCOMP == yes ]]
"""


class FakeBuildHost:
    """A cache folder for build.sh, a fake go (its `builds` are what it produces) and a fake pkg-config."""

    def __init__(self, directory: Path) -> None:
        self.cache = directory / "cache"
        self.bin = directory / "bin"
        self.builds = directory / "builds"
        self.go_log = directory / "go.log"
        write_script(self.bin / "go", FAKE_GO)
        write_script(self.bin / "pkg-config", FAKE_PKG_CONFIG)
        self.go_log.write_text("")
        self.dest = Path(self.build("--print-dir").stdout.strip())

    def wrap_go(self, script: str) -> None:
        """Put script in front of the fake go, which it runs as `go.stand-in` (to add what a module download leaves)."""
        (self.bin / "go").rename(self.bin / "go.stand-in")
        write_script(self.bin / "go", script)

    def fill_cache(self, outputs: dict[str, str]) -> None:
        for relative, output in outputs.items():
            fake_binary(self.dest / relative, output)

    def go_builds(self, outputs: dict[str, str]) -> None:
        for relative, output in outputs.items():
            fake_binary(self.builds / Path(relative).name, output)

    def build(self, *args: str, libseccomp: bool = True) -> subprocess.CompletedProcess[str]:
        env = clean_env(
            PATH=f"{self.bin}:{os.environ['PATH']}",
            IX_E2E_CACHE=str(self.cache),
            FAKE_BUILDS=str(self.builds),
            FAKE_GO_LOG=str(self.go_log),
            FAKE_LIBSECCOMP="yes" if libseccomp else "no",
        )
        return subprocess.run(
            [BASH, str(BUILD), *args], capture_output=True, text=True, timeout=120, env=env, check=False
        )

    def go_installs(self) -> list[str]:
        """The last path element of each package `go install` was asked for (runc, containerd, ...)."""
        names = []
        for line in self.go_log.read_text().splitlines():
            if line.startswith("install "):
                names += [arg.split("@")[0].rsplit("/", 1)[-1] for arg in line.split() if "@" in arg]
        return names

    def says(self, relative: str) -> str:
        return subprocess.run([str(self.dest / relative)], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def host(tmp_path: Path) -> FakeBuildHost:
    return FakeBuildHost(tmp_path)


def test_verify_accepts_a_good_cache(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs())
    result = host.build("--verify")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_verify_refuses_a_cached_runc_without_seccomp_and_says_what_to_install(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(seccomp=False))
    result = host.build("--verify")
    assert result.returncode == 1
    (complaint,) = result.stderr.splitlines()
    assert complaint.startswith(f"build.sh: {host.dest}/bin/runc: built without seccomp")
    assert "libseccomp-dev" in complaint


def test_verify_names_a_binary_of_another_version_and_what_it_said(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(containerd="v2.3.0"))
    result = host.build("--verify")
    assert result.returncode == 1
    complaints = result.stderr.splitlines()
    assert len(complaints) == 3, complaints
    assert any(
        "bin/ctr" in line and "it says: ctr github.com/containerd/containerd/v2 v2.3.0" in line for line in complaints
    )


def test_a_cache_filled_without_libseccomp_heals_once_it_is_installed(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(seccomp=False))
    host.go_builds(version_outputs())
    result = host.build(libseccomp=True)
    assert result.returncode == 0, result.stderr
    assert "the cached bin/runc is not usable, rebuilding runc: built without seccomp" in result.stderr
    assert "libseccomp: 2.5.4" in host.says("bin/runc")
    assert host.go_installs() == ["runc"]  # the good binaries stay as they were
    assert (host.dest / "complete").exists()
    assert not (host.dest / "staging" / "runc").exists()


def test_runc_is_not_built_without_libseccomp_and_the_cached_one_is_kept(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(seccomp=False))
    host.go_builds(version_outputs())
    before = (host.dest / "bin/runc").read_bytes()
    result = host.build(libseccomp=False)
    assert result.returncode == 1
    assert "runc needs libseccomp to build with seccomp: install libseccomp-dev and pkg-config" in result.stderr
    assert host.go_installs() == []
    assert (host.dest / "bin/runc").read_bytes() == before
    assert not (host.dest / "complete").exists()


def test_a_runc_built_without_seccomp_is_refused_never_cached(host: FakeBuildHost) -> None:
    good = version_outputs()
    del good["bin/runc"]
    host.fill_cache(good)
    host.go_builds(version_outputs(seccomp=False))  # the toolchain somehow drops the seccomp tag
    result = host.build(libseccomp=True)
    assert result.returncode == 1
    assert "runc: the bin/runc just built is refused: built without seccomp" in result.stderr
    assert not (host.dest / "bin/runc").exists()
    assert not (host.dest / "complete").exists()
    assert (host.build("--print-dir")).returncode == 1


def test_a_cached_binary_of_another_version_is_rebuilt(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(containerd="v2.3.0"))
    host.go_builds(version_outputs())
    result = host.build()
    assert result.returncode == 0, result.stderr
    assert host.go_installs() == ["containerd", "containerd-shim-runc-v2", "ctr"]
    assert versions()["CONTAINERD_VERSION"] in host.says("bin/ctr")


def test_a_cache_from_before_kube_proxy_builds_kube_proxy_alone(host: FakeBuildHost) -> None:
    """kube-proxy joined the cluster's components later: a cache complete without it builds it and nothing else."""
    earlier = version_outputs()
    del earlier["bin/kube-proxy"]
    host.fill_cache(earlier)
    host.go_builds(version_outputs())
    result = host.build()
    assert result.returncode == 0, result.stderr
    assert host.go_installs() == []
    built = [arg for line in host.go_log.read_text().splitlines() if line.startswith("build ") for arg in line.split()]
    commands = [arg for arg in built if arg.startswith("k8s.io/kubernetes/cmd/")]
    assert commands == ["k8s.io/kubernetes/cmd/kube-proxy"], built
    assert host.says("bin/kube-proxy") == f"Kubernetes {versions()['KUBERNETES_VERSION']}\n"
    assert (host.dest / "complete").exists()


HARNESS_LOOKUP = """
import sys
sys.path.insert(0, sys.argv[1])
from harness.build import built_binaries
found, why = built_binaries()
print(why if found is None else f"using {found.bin_dir}")
"""


def harness_lookup(host: FakeBuildHost) -> str:
    """What the suite's harness says of host's cache (harness.build.built_binaries)."""
    env = clean_env(PATH=f"{host.bin}:{os.environ['PATH']}", IX_E2E_CACHE=str(host.cache))
    result = subprocess.run(
        [sys.executable, "-c", HARNESS_LOOKUP, str(E2E_DIR)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_suite_refuses_a_complete_cache_whose_runc_lacks_seccomp(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs())
    (host.dest / "complete").touch()
    assert harness_lookup(host).startswith("using ")
    fake_binary(host.dest / "bin/runc", version_outputs(seccomp=False)["bin/runc"])
    said = harness_lookup(host)
    assert "bin/runc: built without seccomp" in said
    assert "run `make e2e-build`" in said


# ------------------------------------------------------------------ the skip report


SKIP_CONFTEST = f"""
import sys
sys.path.insert(0, {str(E2E_DIR)!r})
from harness.skips import register

def pytest_configure(config):
    register(config)
"""
SKIP_TESTS = """
import pytest

@pytest.fixture(scope="module")
def image():
    pytest.skip("building the image offline needs debootstrap")

def test_runs():
    pass

def test_needs_the_image(image):
    pass

@pytest.mark.xfail(reason="known")
def test_expected_to_fail():
    raise AssertionError
"""


def run_skip_suite(directory: Path, tests: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    (directory / "conftest.py").write_text(SKIP_CONFTEST)
    (directory / "test_scenarios.py").write_text(tests)
    env = clean_env() if ci is None else clean_env(CI=ci)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=directory,
        env=env,
        check=False,
    )


def test_a_skip_fails_the_run_in_ci_naming_the_scenario_and_why(tmp_path: Path) -> None:
    result = run_skip_suite(tmp_path, SKIP_TESTS, ci="true")
    assert result.returncode == 1, result.stdout
    assert "e2e: 1 scenario(s) skipped: a failure in CI" in result.stdout
    assert "SKIPPED test_scenarios.py::test_needs_the_image: building the image offline needs debootstrap" in (
        result.stdout
    )
    assert "test_expected_to_fail" not in result.stdout.split("skipped: a failure in CI")[1].split("FAILED:")[0]


def test_a_skip_outside_ci_is_reported_last_and_does_not_fail(tmp_path: Path) -> None:
    result = run_skip_suite(tmp_path, SKIP_TESTS, ci=None)
    assert result.returncode == 0, result.stdout
    block = result.stdout.split("e2e: 1 scenario(s) skipped: not run")[1]
    assert "SKIPPED test_scenarios.py::test_needs_the_image: building the image offline needs debootstrap" in block


def test_ci_without_skips_passes_quietly(tmp_path: Path) -> None:
    result = run_skip_suite(tmp_path, "def test_runs():\n    pass\n", ci="true")
    assert result.returncode == 0, result.stdout
    assert "skipped" not in result.stdout
