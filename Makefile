# Build, test and packaging entry points. Every Python tool runs from the virtualenv $(VENV), which
# the targets create and fill as needed; point VENV at an existing one to reuse it.
PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' src/ix_device_plugin/__init__.py)
IMAGE ?= ix-device-plugin:$(VERSION)
# Any Debian-like image with CPython >= 3.11 and pip; `make base-image` builds one without a registry.
BASE_IMAGE ?= python:3.11-slim
LOCAL_BASE_IMAGE ?= localhost/ix-python-base:3.11-bookworm
SOURCE_URL ?= $(shell git config --get remote.origin.url 2>/dev/null)
WHEEL := dist/ix_device_plugin-$(VERSION)-py3-none-any.whl
SDIST := dist/ix_device_plugin-$(VERSION).tar.gz
PYZ := dist/ix-device-plugin-$(VERSION).pyz
SOURCES := pyproject.toml README.md $(shell find src -name '*.py' -o -name '*.proto' -o -name '*.pyi' -o -name py.typed)

export VERSION BASE_IMAGE SOURCE_URL

IMAGE_ARCHIVE := dist/ix-device-plugin-$(VERSION)-image.tar
# The NRI device injector, the DaemonSets' sidecar (nri-injector/, Go).
NRI_IMAGE ?= ix-nri-injector:$(VERSION)

.PHONY: all dist pyz image image-smoke image-archive nri-image nri-test base-image test lint format manifests bench bench-fleet clean help \
	e2e e2e-build e2e-packages e2e-root soak e2e-build-lanes e2e-lanes

all: dist pyz image ## wheel, sdist, single-file executable and (when an engine is usable) the image

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.stamp-tools:
	$(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --quiet --upgrade pip build shiv
	touch $@

$(VENV)/.stamp-dev: pyproject.toml | $(VENV)/.stamp-tools
	$(VENV_PY) -m pip install --quiet -e '.[test]'
	touch $@

dist: $(WHEEL) $(SDIST) ## the wheel and sdist in dist/

$(WHEEL) $(SDIST) &: $(SOURCES) | $(VENV)/.stamp-tools
	$(VENV_PY) -m build --outdir dist .

pyz: $(PYZ) ## dist/ix-device-plugin-VERSION.pyz: one file, runs with the system python3 (see docs/deployment.md)

# shiv bundles the plugin and its dependencies' wheels for this interpreter's platform (grpcio is
# compiled), so the file runs on hosts with the same CPython minor version and CPU architecture.
$(PYZ): $(WHEEL) | $(VENV)/.stamp-tools
	$(VENV)/bin/shiv --compressed --reproducible --python '/usr/bin/env python3' \
		--console-script ix-device-plugin --output-file $@ $(WHEEL)
	$@ --version

image: ## the container image $(IMAGE), built with docker, podman or buildah; skipped when none is usable
	scripts/container.sh build $(IMAGE)

image-smoke: ## run --version and demo inside $(IMAGE)
	scripts/container.sh smoke $(IMAGE)

image-archive: ## $(IMAGE) as a docker archive in dist/, for `ctr -n k8s.io images import` on registry-less nodes
	scripts/container.sh save $(IMAGE) $(IMAGE_ARCHIVE)

nri-image: ## the NRI device injector's image $(NRI_IMAGE) (nri-injector/Dockerfile: static Go binary on scratch)
	@engine="$$(scripts/container.sh engine)"; [ -n "$$engine" ] || { echo "make nri-image: no usable container engine" >&2; exit 1; }; \
		scripts/container.sh engine-build "$$engine" -f nri-injector/Dockerfile -t $(NRI_IMAGE) nri-injector

nri-test: ## the NRI device injector's Go tests (as root they make real device nodes; otherwise those skip)
	cd nri-injector && export PATH="$$PATH:/usr/local/go/bin" && go vet ./... && go test -count=1 ./...

base-image: ## a python:3.11-slim stand-in, $(LOCAL_BASE_IMAGE), from Debian packages (root, debootstrap, buildah)
	scripts/build-base-image.sh $(LOCAL_BASE_IMAGE)

test: $(VENV)/.stamp-dev ## the test suite
	$(VENV_PY) -m pytest

lint: $(VENV)/.stamp-dev ## ruff check and ruff format --check
	$(VENV_PY) -m ruff check .
	$(VENV_PY) -m ruff format --check .

format: $(VENV)/.stamp-dev ## apply ruff's fixes and formatting
	$(VENV_PY) -m ruff check --fix .
	$(VENV_PY) -m ruff format .

manifests: $(VENV)/.stamp-dev ## check the Helm chart renders deployments/static (helm: $$HELM, PATH or make e2e-build)
	$(VENV_PY) scripts/helm_chart.py check

bench: $(VENV)/.stamp-dev ## the benchmarks
	$(VENV_PY) -m bench

FLEET_NODES ?= 100,250,500
bench-fleet: $(VENV)/.stamp-dev e2e-build ## the fleet bench on the real control plane (FLEET_NODES; docs/scale.md)
	$(VENV_PY) -m pip install --quiet -e '.[test,bench]'
	$(VENV_PY) -m bench --only fleet --fleet-nodes $(FLEET_NODES) --output bench/results/fleet.json
	$(VENV_PY) -m bench.fleet.report bench/results/fleet.json --plots docs/scale

e2e-packages: ## install the host packages the end-to-end suite needs (root, apt-get); else name the missing ones
	e2e/cluster/packages.sh e2e

e2e-build: e2e-packages ## build the end-to-end cluster (Kubernetes, etcd, containerd, runc, CNI, helm) from Go modules, verified
	e2e/cluster/build.sh

# Lanes: clusters of other releases or configuration (e2e/lanes/NAME.env over e2e/versions.env; docs/testing.md),
# each built into a folder of its own (a lane pinning no version uses the default lane's) and run one after another.
E2E_LANES ?= $(sort $(basename $(notdir $(wildcard e2e/lanes/*.env))))
# What every lane runs: its cluster's smoke test and the scenarios a user meets there (docs/testing.md, "Lanes").
E2E_LANE_TESTS ?= e2e/tests/test_lane_cluster.py e2e/tests/test_lanes.py

e2e-build-lanes: e2e-packages ## build every lane's cluster (E2E_LANES, default e2e/lanes/*.env), verified
	@for lane in $(E2E_LANES); do echo "e2e/cluster/build.sh $$lane"; e2e/cluster/build.sh $$lane || exit 1; done

e2e-lanes: e2e-root e2e-build-lanes $(VENV)/.stamp-dev ## E2E_LANE_TESTS in each of E2E_LANES, one cluster after another (root, Go)
	@failed=""; for lane in $(E2E_LANES); do \
		echo "== lane $$lane: $(E2E_LANE_TESTS)"; \
		IX_E2E_LANE=$$lane $(VENV_PY) -m pytest -p no:cacheprovider -n 0 $(E2E_LANE_TESTS) $(E2E_PYTEST_ARGS) || failed="$$failed $$lane"; \
	done; [ -z "$$failed" ] || { echo "make e2e-lanes: failed in lane(s):$$failed" >&2; exit 1; }

e2e-root:
	@[ "$$(id -u)" = 0 ] || { echo "make e2e: the end-to-end suite needs root (kubelet, containerd, mounts, cgroups, device nodes)" >&2; exit 1; }

# The injector's tests run first, in the end-to-end build's Go caches (its image is built from them too).
E2E_CACHE ?= $(or $(IX_E2E_CACHE),/var/cache/ix-device-plugin-e2e)
# Then e2e/run.py: the suite spread over E2E_WORKERS clusters side by side, and beside them every lane (E2E_LANES)
# built and run in one more, one lane after another (docs/testing.md, "Side by side").
E2E_WORKERS ?= 2
e2e: e2e-root e2e-build $(VENV)/.stamp-dev ## the end-to-end suite on real one-node Kubernetes clusters side by side, and its lanes (root, Go; docs/testing.md)
	$(MAKE) --no-print-directory nri-test GOMODCACHE=$(E2E_CACHE)/go/mod GOCACHE=$(E2E_CACHE)/go/build
	$(VENV_PY) e2e/run.py --workers $(E2E_WORKERS) --lanes "$(E2E_LANES)" --lane-tests "$(E2E_LANE_TESTS)" -- $(E2E_PYTEST_ARGS)

clean: ## remove build outputs (not the virtualenv)
	rm -rf build dist src/*.egg-info

SOAK_MINUTES ?= 3
SOAK_SEED ?= random
SOAK_MODE ?=
soak: e2e-root e2e-build $(VENV)/.stamp-dev ## the chaos soak on the end-to-end cluster (SOAK_MINUTES, SOAK_SEED, SOAK_MODE; docs/testing.md)
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) SOAK_MODE=$(SOAK_MODE) \
		$(VENV_PY) -m pytest -p no:cacheprovider -n 0 e2e/tests/test_soak.py::test_soak -q -rxXs $(E2E_PYTEST_ARGS)
